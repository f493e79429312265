//! The memory model through NCCL, on the simulated driver and NCCL, whose sanitizer checks
//! device addresses when work executes (stream order, graph replay, group end) and every
//! call's communicator handle. Each test is a way safe code could once make NCCL touch
//! freed memory or a freed communicator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{Rig, assert_nccl_error, capture};
use cuda_hal::{CaptureMode, DeviceBuffer, Stream};
use nccl_channel::{CommConfig, Communicator, Error, ReduceOp, UniqueId, group};
use nccl_sys::ncclResult_t;

/// Two ranks driven from one thread, one communicator and stream each.
fn pair(rig: &Rig) -> Vec<(Communicator, Stream)> {
    let ctxs = rig.contexts(2);
    Communicator::init_all(&rig.nccl, &ctxs)
        .unwrap()
        .into_iter()
        .zip(&ctxs)
        .map(|(c, x)| (c, Stream::non_blocking(x).unwrap()))
        .collect()
}

/// Buffers made and dropped inside a group closure live until the group has launched.
#[test]
fn buffers_dropped_inside_a_group_live_until_it_ends() {
    Rig::new(2).check(|rig| {
        let ranks = pair(rig);
        let mut outs: Vec<DeviceBuffer<i32>> = ranks
            .iter()
            .map(|(c, _)| DeviceBuffer::zeroed(c.context(), 2).unwrap())
            .collect();
        group(&rig.nccl, || {
            for ((c, s), out) in ranks.iter().zip(outs.iter_mut()) {
                let send = DeviceBuffer::from_slice(c.context(), &[1 + c.rank() as i32, 10])?;
                c.all_reduce(&send, out, ReduceOp::Sum, s)?;
                // `send` is dropped here, before ncclGroupEnd launched the all-reduce.
            }
            Ok(())
        })
        .unwrap();
        for ((_, s), out) in ranks.iter().zip(&outs) {
            s.synchronize().unwrap();
            assert_eq!(out.to_vec().unwrap(), [3, 20]);
        }
    });
}

/// A captured all-reduce replayed after its buffers and its communicator were dropped:
/// the graph owns them. Once the communicator is aborted, the graph refuses to launch.
#[test]
fn a_graph_owns_its_buffers_and_communicator_and_refuses_an_aborted_one() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let comm = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let send = DeviceBuffer::from_slice(&ctx, &[4.0f32, 5.0]).unwrap();
        let mut recv = DeviceBuffer::<f32>::zeroed(&ctx, 2).unwrap();
        let mut out = DeviceBuffer::<f32>::zeroed(&ctx, 2).unwrap();
        let exec = capture(&s, || {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &s)
                .unwrap();
            out.copy_from_async(&recv, &s).unwrap();
        });
        drop((send, recv));
        let abort = comm.abort_handle();
        drop(comm);
        assert_eq!(rig.world.live().comms, 2, "held by the graph");
        exec.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(out.to_vec().unwrap(), [4.0, 5.0]);
        drop(exec);
        assert_eq!(rig.world.live().comms, 0, "released with the graph");

        // The same graph over a communicator that is aborted before the launch.
        let comm = Communicator::init_rank(
            &rig.nccl,
            &ctx,
            &UniqueId::generate(&rig.nccl).unwrap(),
            1,
            0,
        )
        .unwrap();
        let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 2).unwrap();
        let exec = capture(&s, || {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
                .unwrap();
        });
        comm.abort().unwrap();
        let e = exec.launch(&s).unwrap_err();
        assert!(
            matches!(&e, cuda_hal::Error::Unusable { what } if what.contains("aborted or destroyed")),
            "{e}"
        );
        drop((exec, buf, out, s, ctx, abort));
    });
}

/// Stream-ordered memory used by a collective on the communicator's stream and freed on
/// its allocation stream: the free is ordered after the collective.
#[test]
fn a_pooled_buffer_is_freed_after_the_collective_on_another_stream() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let comm = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap();
        let (pool, comm_stream) = (
            Stream::non_blocking(&ctx).unwrap(),
            Stream::non_blocking(&ctx).unwrap(),
        );
        let mut buf = DeviceBuffer::<u64>::alloc_on(&pool, 1024).unwrap();
        pool.synchronize().unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Max, &comm_stream)
            .unwrap();
        drop(buf);
        pool.synchronize().unwrap();
        comm_stream.synchronize().unwrap();
    });
}

/// A pre-multiplied sum whose call fails fatally aborts the communicator, which frees the
/// op too: it is not destroyed again on the freed handle; later calls are refused
/// without reaching NCCL.
#[test]
fn nothing_reaches_nccl_after_an_abort() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let comm = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let mut buf = DeviceBuffer::from_slice(&ctx, &[2.0f64]).unwrap();
        rig.fail_next("ncclAllReduce", ncclResult_t::ncclSystemError);
        let e = comm
            .all_reduce_in_place(&mut buf, ReduceOp::PreMulSum(0.5), &s)
            .unwrap_err();
        assert_nccl_error(&e, "ncclAllReduce", ncclResult_t::ncclSystemError);
        assert!(comm.is_aborted());
        assert_eq!(rig.world.calls("ncclRedOpDestroy"), 0);
        let before = rig.world.calls("ncclCommGetAsyncError") + rig.world.calls("ncclCommSplit");
        assert_eq!(comm.async_error().unwrap_err(), Error::Aborted);
        assert_eq!(comm.split(Some(0), 0).unwrap_err(), Error::Aborted);
        assert_eq!(comm.barrier(&s).unwrap_err(), Error::Aborted);
        assert_eq!(
            rig.world.calls("ncclCommGetAsyncError") + rig.world.calls("ncclCommSplit"),
            before
        );
        drop((comm, buf, s, ctx));
        rig.assert_no_nccl_violations();
    });
}

/// A non-blocking parent gives a non-blocking child (NCCL's rule for a NULL config); the
/// split waits for the child, not the parent, and the child works.
#[test]
fn split_children_keep_the_parents_blocking_mode() {
    Rig::new(2).check(|rig| {
        let results = rig.non_blocking_ranks(Duration::from_secs(5), |rank, ctx, parent| {
            let child = parent.split(Some(0), 0).unwrap().unwrap();
            assert!(!child.config().is_blocking());
            assert_eq!(child.config().get_timeout(), Duration::from_secs(5));
            let s = Stream::non_blocking(ctx).unwrap();
            let mut buf = DeviceBuffer::from_slice(ctx, &[rank as u32 + 1]).unwrap();
            child
                .all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
                .unwrap();
            child.wait(&s).unwrap();
            buf.to_vec().unwrap()
        });
        assert_eq!(results, [[3], [3]]);
    });
}

/// Dropping a blocking communicator never waits for its peers: it aborts instead of
/// finalising (a finalize can wait forever for a peer that is gone). `close` finalises.
#[test]
fn dropping_a_blocking_communicator_aborts_and_close_finalises() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let comm = Communicator::init_rank(
            &rig.nccl,
            &ctx,
            &UniqueId::generate(&rig.nccl).unwrap(),
            1,
            0,
        )
        .unwrap();
        drop(comm);
        assert_eq!(rig.world.calls("ncclCommFinalize"), 0);
        assert_eq!(rig.world.calls("ncclCommAbort"), 2);
        let comm = Communicator::init_rank(
            &rig.nccl,
            &ctx,
            &UniqueId::generate(&rig.nccl).unwrap(),
            1,
            0,
        )
        .unwrap();
        comm.close().unwrap();
        assert_eq!(rig.world.calls("ncclCommFinalize"), 2);
        assert_eq!(rig.world.calls("ncclCommDestroy"), 2);
    });
}

/// Inside an open group, closing a communicator whose grouped work is pending is refused
/// and the communicator is released after the group.
#[test]
fn a_communicator_closed_inside_a_group_outlives_the_group() {
    Rig::new(2).check(|rig| {
        let mut ranks = pair(rig);
        let mut bufs: Vec<DeviceBuffer<u8>> = ranks
            .iter()
            .map(|(c, _)| DeviceBuffer::from_slice(c.context(), &[1, 2]).unwrap())
            .collect();
        let (c1, s1) = ranks.pop().unwrap();
        let (c0, s0) = ranks.pop().unwrap();
        let r = group(&rig.nccl, || {
            c0.all_reduce_in_place(&mut bufs[0], ReduceOp::Sum, &s0)?;
            c1.all_reduce_in_place(&mut bufs[1], ReduceOp::Sum, &s1)?;
            let e = c1.close().unwrap_err();
            assert!(
                matches!(
                    &e,
                    Error::InvalidArgument {
                        what: "Communicator::close",
                        ..
                    }
                ),
                "{e}"
            );
            Ok(())
        });
        r.unwrap();
        assert_eq!(rig.world.live().comms, 2, "rank 1 released after the group");
        s0.synchronize().unwrap();
        s1.synchronize().unwrap();
        assert_eq!(bufs[0].to_vec().unwrap(), [2, 4]);
        assert_eq!(bufs[1].to_vec().unwrap(), [2, 4]);
    });
}

/// What a scenario of [`behind_a_polling_collective`] does with memory whose home is
/// rank 0's stream.
#[derive(Clone, Copy, PartialEq)]
enum HomeMemory {
    /// Dropped on the test's thread while the capture waits.
    Dropped,
    /// Read synchronously by rank 1 before its own collective.
    ReadByRank1,
}

/// Two ranks on threads with non-blocking communicators (3 s deadline). Rank 0's
/// all-reduce holds its stream's enqueue lock while it polls for rank 1; meanwhile another
/// thread begins a capture of that stream (and waits for the lock), and memory whose home
/// is that stream is used as `home` says; then rank 1 comes. Returns both ranks' results,
/// after ending the capture and checking that nothing leaked and the sanitizer saw nothing.
fn behind_a_polling_collective(home: HomeMemory) -> (Result<(), Error>, Result<(), Error>) {
    let rig = Rig::new(2);
    let ctxs = rig.contexts(2);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let config = CommConfig::non_blocking(Duration::from_secs(3));
    let s0 = Stream::non_blocking(&ctxs[0]).unwrap();
    // Stream-ordered memory not yet known to be ready: a synchronous call waits for s0.
    let memory = DeviceBuffer::<u8>::alloc_on(&s0, 64).unwrap();
    let (mut dropped, mut read) = (None, None);
    match home {
        HomeMemory::Dropped => dropped = Some(memory),
        HomeMemory::ReadByRank1 => read = Some(memory),
    }
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let results = std::thread::scope(|sc| {
        let (rig, ctxs, id, config, s0) = (&rig, &ctxs, &id, &config, &s0);
        let rank = |r: usize| Communicator::init_rank_with(&rig.nccl, &ctxs[r], id, 2, r, config);
        let rank1 = sc.spawn(move || {
            let comm = rank(1).unwrap();
            let s1 = Stream::non_blocking(&ctxs[1]).unwrap();
            let mut buf = DeviceBuffer::from_slice(&ctxs[1], &[2i32]).unwrap();
            wait_go.recv().unwrap();
            // Must not wait for the lock: the capture waits for rank 0, rank 0 for us.
            match read.as_ref().map(DeviceBuffer::to_vec) {
                None | Some(Ok(_)) | Some(Err(cuda_hal::Error::Capturing { .. })) => {}
                Some(Err(e)) => panic!("{e}"),
            }
            let r = comm
                .all_reduce_in_place(&mut buf, ReduceOp::Sum, &s1)
                .and_then(|()| Ok(s1.synchronize()?));
            comm.close().unwrap();
            r
        });
        let rank0 = sc.spawn(move || {
            let comm = rank(0).unwrap();
            let mut buf = DeviceBuffer::from_slice(&ctxs[0], &[1i32]).unwrap();
            // Polls, holding s0's enqueue lock, until rank 1 comes. Once it returns, the
            // capture may begin at any moment: nothing more may touch s0 here (a
            // synchronize would be refused by the driver and invalidate the capture).
            let r = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s0);
            (r, comm, buf)
        });
        // Rank 0 must be in its collective before the capture begins; however long the
        // machine takes to get it there.
        let start = std::time::Instant::now();
        while rig.world.calls("ncclAllReduce") == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "rank 0 never reached its all-reduce"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        let capture = sc.spawn(move || s0.begin_capture(CaptureMode::Relaxed));
        // Time for the capture to wait for the lock (without it the scenario still holds,
        // only less is at stake).
        std::thread::sleep(Duration::from_millis(300));
        drop(dropped.take());
        go.send(()).unwrap();
        let r1 = rank1.join().unwrap();
        let rank0 = rank0.join().unwrap();
        capture.join().unwrap().unwrap();
        (rank0, r1)
    });
    let ((r0, comm0, buf0), r1) = results;
    drop(s0.end_capture().unwrap());
    s0.synchronize().unwrap();
    if r0.is_ok() {
        assert_eq!(buf0.to_vec().unwrap(), [3]);
    }
    comm0.close().unwrap();
    drop((buf0, s0, ctxs));
    rig.assert_clean();
    (r0, r1)
}

/// Memory dropped while a capture waits behind a non-blocking collective's poll: its
/// release cannot take the stream's lock, so it waits, whole, and finishes once the
/// capture has let the lock go (the memory then belongs to the capture's graph). Nothing
/// leaks and no context goes under memory (it leaked, and let its context go).
#[test]
fn memory_dropped_while_a_capture_waits_behind_a_polling_collective_is_released() {
    let (r0, r1) = behind_a_polling_collective(HomeMemory::Dropped);
    assert!(r0.is_ok() && r1.is_ok(), "rank 0 {r0:?}, rank 1 {r1:?}");
}

/// A synchronous call on that memory by rank 1, before its own collective, must not wait
/// for the lock (a cycle only the deadline broke): it is refused or succeeds, and both
/// collectives complete.
#[test]
fn a_synchronous_call_never_waits_in_a_cycle_through_a_peers_collective() {
    let (r0, r1) = behind_a_polling_collective(HomeMemory::ReadByRank1);
    assert!(r0.is_ok() && r1.is_ok(), "rank 0 {r0:?}, rank 1 {r1:?}");
}

/// One rank, one device, a non-blocking communicator with a 5 s deadline.
fn one_non_blocking(rig: &Rig) -> (cuda_hal::Context, Communicator) {
    let ctx = rig.context(0);
    let config = CommConfig::non_blocking(Duration::from_secs(5));
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
    (ctx, comm)
}

/// One rank, one device: its context, communicator and a stream.
fn one(rig: &Rig) -> (cuda_hal::Context, Communicator, Stream) {
    let ctx = rig.context(0);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    (ctx, comm, s)
}

/// A communicator moved to another thread while this thread's group holds work on it:
/// the other thread can neither use it nor tear it down before the group ends (NCCL
/// allows one thread at a time); an abort asked for there happens after the group.
#[test]
fn a_communicator_in_a_group_is_refused_to_other_threads() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut a = DeviceBuffer::from_slice(&ctx, &[1i32, 2]).unwrap();
        let mut b = DeviceBuffer::from_slice(&ctx, &[3i32, 4]).unwrap();
        let s2 = s.clone();
        group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut a, ReduceOp::Sum, &s)?;
            std::thread::scope(|sc| {
                sc.spawn(move || {
                    let e = comm
                        .all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
                        .unwrap_err();
                    assert_eq!(
                        e,
                        Error::GroupedElsewhere {
                            what: "Communicator"
                        }
                    );
                    let e = comm.close().unwrap_err();
                    assert!(
                        matches!(
                            e,
                            Error::InvalidArgument {
                                what: "Communicator::close",
                                ..
                            }
                        ),
                        "{e}"
                    );
                })
                .join()
                .unwrap();
            });
            Ok(())
        })
        .unwrap();
        assert_eq!(rig.world.live().comms, 0, "released when the group ended");
        assert_eq!(rig.world.calls("ncclCommFinalize"), 0);
        s.synchronize().unwrap();
        assert_eq!(a.to_vec().unwrap(), [1, 2]);
    });
}

/// `abort` from another thread while this thread's group holds work: it happens after
/// the group launched that work.
#[test]
fn an_abort_from_another_thread_waits_for_the_group() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2]).unwrap();
        group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)?;
            std::thread::scope(|sc| sc.spawn(move || comm.abort()).join().unwrap())?;
            assert_eq!(rig.world.calls("ncclCommAbort"), 0, "not inside the group");
            Ok(())
        })
        .unwrap();
        assert_eq!(rig.world.calls("ncclCommAbort"), 2);
    });
}

/// A fatal error inside a group aborts the communicator only after the group, whose
/// work still names it.
#[test]
fn a_fatal_error_inside_a_group_aborts_after_it() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut a = DeviceBuffer::from_slice(&ctx, &[1i32]).unwrap();
        let mut b = DeviceBuffer::from_slice(&ctx, &[1i32]).unwrap();
        let r = group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut a, ReduceOp::Sum, &s)?;
            rig.fail_next("ncclAllReduce", ncclResult_t::ncclSystemError);
            let e = comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s);
            assert_eq!(rig.world.calls("ncclCommAbort"), 0, "not inside the group");
            e
        });
        assert_nccl_error(
            r.as_ref().unwrap_err(),
            "ncclAllReduce",
            ncclResult_t::ncclSystemError,
        );
        assert_eq!(comm.async_error().unwrap_err(), Error::Aborted);
        assert_eq!(rig.world.calls("ncclCommAbort"), 2);
    });
}

/// `abort` inside the group itself also waits for the group; `close` of a communicator
/// the group did not use is not deferred (it finalises).
#[test]
fn abort_inside_a_group_waits_and_close_of_an_unused_one_finalises() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let (_, other, _) = one(rig);
        let mut buf = DeviceBuffer::from_slice(&ctx, &[1i32]).unwrap();
        group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)?;
            comm.abort()?;
            assert_eq!(rig.world.calls("ncclCommAbort"), 0, "not inside the group");
            other.close()?;
            assert_eq!(rig.world.calls("ncclCommFinalize"), 2);
            Ok(())
        })
        .unwrap();
        assert_eq!(rig.world.calls("ncclCommAbort"), 2);
    });
}

/// Split and shrink inside an open group are refused (NCCL gives the new communicator
/// only after the group ends), with an error that names the grouped API to use; nothing
/// reaches NCCL and nothing panics. The grouped API is refused there too.
#[test]
fn split_inside_a_group_is_refused() {
    Rig::new(2).check(|rig| {
        let ranks = pair(rig);
        let r = group(&rig.nccl, || {
            let e = ranks[0].0.split(Some(0), 0).unwrap_err();
            assert_eq!(
                e,
                Error::SplitInGroup {
                    what: "split",
                    instead: "Communicator::split_all"
                }
            );
            assert!(e.to_string().contains("Communicator::split_all"), "{e}");
            let e = ranks[0].0.shrink(&[1]).unwrap_err();
            assert_eq!(
                e,
                Error::SplitInGroup {
                    what: "shrink",
                    instead: "Communicator::shrink_all"
                }
            );
            let e = Communicator::split_all(&[(&ranks[0].0, Some(0), 0)]).unwrap_err();
            assert_eq!(
                e,
                Error::SplitInGroup {
                    what: "Communicator::split_all",
                    instead: "Communicator::split_all"
                }
            );
            Ok(())
        });
        r.unwrap();
        assert_eq!(rig.world.calls("ncclCommSplit"), 2);
        assert_eq!(rig.world.calls("ncclCommShrink"), 0);
    });
}

/// Non-blocking communicators enqueue a group's work in the background after
/// `ncclGroupEnd` returned: what the group's calls use is released only once it is
/// enqueued (the group settles), so buffers dropped inside the group stay valid.
#[test]
fn a_non_blocking_group_is_settled_before_its_buffers_go() {
    Rig::new(2).check(|rig| {
        let results = rig.non_blocking_ranks(Duration::from_secs(5), |rank, ctx, comm| {
            let s = Stream::non_blocking(ctx).unwrap();
            let mut out = DeviceBuffer::<u32>::zeroed(ctx, 1).unwrap();
            group(&rig.nccl, || {
                let send = DeviceBuffer::from_slice(ctx, &[rank as u32 + 1])?;
                comm.all_reduce(&send, &mut out, ReduceOp::Sum, &s)
            })
            .unwrap();
            comm.wait(&s).unwrap();
            out.to_vec().unwrap()
        });
        assert_eq!(results, [[3], [3]]);
    });
}

/// A pre-multiplied sum's op is destroyed after its call, on the live communicator.
#[test]
fn a_pre_multiplied_sum_destroys_its_op() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut buf = DeviceBuffer::from_slice(&ctx, &[2.0f32, 4.0]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::PreMulSum(0.5), &s)
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(buf.to_vec().unwrap(), [1.0, 2.0]);
        assert_eq!(rig.world.calls("ncclRedOpDestroy"), 1);
        assert_eq!(rig.world.live().reduction_ops, 0);
    });
}

/// Errors that are not fatal (bad arguments) are returned as NCCL's error and leave the
/// communicator usable; a failing split is that call's error.
#[test]
fn usage_errors_are_returned_and_keep_the_communicator() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut buf = DeviceBuffer::from_slice(&ctx, &[1u8]).unwrap();
        rig.fail_next("ncclAllReduce", ncclResult_t::ncclInvalidArgument);
        let e = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
            .unwrap_err();
        assert_nccl_error(&e, "ncclAllReduce", ncclResult_t::ncclInvalidArgument);
        assert!(!comm.is_aborted());
        rig.fail_next("ncclCommSplit", ncclResult_t::ncclInvalidUsage);
        let e = comm.split(Some(0), 0).unwrap_err();
        assert_nccl_error(&e, "ncclCommSplit", ncclResult_t::ncclInvalidUsage);
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
            .unwrap();
        let e = Communicator::init_rank(
            &rig.nccl,
            &ctx,
            &UniqueId::generate(&rig.nccl).unwrap(),
            1,
            1,
        )
        .unwrap_err();
        assert_eq!(
            e,
            Error::InvalidRank {
                what: "Communicator::init_rank",
                rank: 1,
                size: 1
            }
        );
    });
}

/// A non-blocking split whose wait fails aborts the parent, which stops the split (NCCL
/// writes the child only when the split completes, so returning while it may still run
/// would leave NCCL writing into a freed slot), then aborts the child the split handed
/// over: nothing leaks, and the error is returned.
#[test]
fn a_failed_wait_for_a_split_aborts_the_parent_and_the_child() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let config = CommConfig::non_blocking(Duration::from_secs(5));
        let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
        rig.fail_next("ncclCommGetAsyncError", ncclResult_t::ncclInternalError);
        let e = comm.split(Some(0), 0).unwrap_err();
        assert_nccl_error(&e, "ncclCommGetAsyncError", ncclResult_t::ncclInternalError);
        assert!(comm.is_aborted());
        assert_eq!(
            rig.world.calls("ncclCommAbort"),
            3,
            "the parent, then the child"
        );
        assert_eq!(rig.world.live().comms, 0);
    });
}

/// Data types are gated on the release that introduced them, that release included.
#[test]
fn fp8_works_from_the_release_that_introduced_it() {
    use nccl_channel::Fp8E4M3;
    use nccl_sys::NcclVersion;
    for (version, works) in [(NcclVersion(22400), true), (NcclVersion(22306), false)] {
        let rig = Rig::with_version(1, version);
        let (ctx, comm, s) = one(&rig);
        let mut buf = DeviceBuffer::<Fp8E4M3>::zeroed(&ctx, 4).unwrap();
        let r = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s);
        match (r, works) {
            (Ok(()), true) => {}
            (
                Err(Error::Unsupported {
                    feature, needed, ..
                }),
                false,
            ) => {
                assert_eq!((feature, needed.as_str()), ("fp8e4m3", "2.24.0"));
            }
            (r, _) => panic!("NCCL {version}: {r:?}"),
        }
        drop((comm, buf, s, ctx));
        rig.assert_clean();
    }
}

/// Non-blocking communicators: a usage error of a call or of a split is returned, not
/// waited away; dropping one after an abort was asked for aborts instead of finalising.
#[test]
fn non_blocking_errors_are_returned_and_a_requested_abort_is_kept() {
    Rig::new(1).check(|rig| {
        let (ctx, comm) = one_non_blocking(rig);
        let s = Stream::non_blocking(&ctx).unwrap();
        let mut buf = DeviceBuffer::from_slice(&ctx, &[1u32]).unwrap();
        rig.fail_next("ncclAllReduce", ncclResult_t::ncclInvalidArgument);
        let e = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
            .unwrap_err();
        assert_nccl_error(&e, "ncclAllReduce", ncclResult_t::ncclInvalidArgument);
        rig.fail_next("ncclCommSplit", ncclResult_t::ncclInvalidUsage);
        let e = comm.split(Some(0), 0).unwrap_err();
        assert_nccl_error(&e, "ncclCommSplit", ncclResult_t::ncclInvalidUsage);
        assert!(
            format!("{comm:?}").ends_with("aborted: false }"),
            "{comm:?}"
        );
        comm.abort_handle().abort();
        drop(comm);
        assert_eq!(rig.world.calls("ncclCommAbort"), 2);
        assert_eq!(rig.world.calls("ncclCommFinalize"), 0);
    });
}

/// A group value dropped without `end` still ends the group; blocking communicators'
/// groups need no settling (no async-error polls).
#[test]
fn a_dropped_group_ends_and_blocking_groups_do_not_poll() {
    Rig::new(2).check(|rig| {
        let ranks = pair(rig);
        let g = nccl_channel::Group::start(&rig.nccl).unwrap();
        assert_eq!(format!("{g:?}"), "Group { open: true }");
        drop(g);
        assert_eq!(rig.world.calls("ncclGroupEnd"), 2);
        let mut bufs: Vec<DeviceBuffer<u8>> = ranks
            .iter()
            .map(|(c, _)| DeviceBuffer::from_slice(c.context(), &[1]).unwrap())
            .collect();
        group(&rig.nccl, || {
            for ((c, s), b) in ranks.iter().zip(bufs.iter_mut()) {
                c.all_reduce_in_place(b, ReduceOp::Sum, s)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(rig.world.calls("ncclCommGetAsyncError"), 0);
        assert_eq!(rig.world.live().unmatched_operations, 0);
    });
}

/// A graph whose work uses a communicator, launched inside another capture: the outer
/// graph is gated by that communicator too, and refuses to launch once it is aborted.
#[test]
fn an_outer_graph_is_gated_by_the_inner_graphs_communicator() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 2).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
            .unwrap();
        let inner = capture(&s, || {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
                .unwrap();
        });
        let outer = capture(&s, || {
            inner.launch(&s).unwrap();
        });
        outer.launch(&s).unwrap();
        comm.abort().unwrap();
        for g in [&inner, &outer] {
            let e = g.launch(&s).unwrap_err();
            assert!(matches!(&e, cuda_hal::Error::Unusable { .. }), "{e}");
        }
        s.synchronize().unwrap();
    });
}

/// When a non-blocking group's background work cannot be confirmed (the poll fails), the
/// group's release asks for an abort but frees nothing: no NCCL teardown from the
/// releasing thread, and the buffers the group used stay allocated; the owner's next
/// call performs the abort.
#[test]
fn an_unsettled_group_asks_for_an_abort_and_frees_nothing() {
    let rig = Rig::new(1);
    let (ctx, comm) = one_non_blocking(&rig);
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    let before = rig.gpus.live().device_allocations;
    rig.fail_next("ncclCommGetAsyncError", ncclResult_t::ncclInternalError);
    group(&rig.nccl, || {
        let send = DeviceBuffer::from_slice(&ctx, &[7u32])?;
        comm.all_reduce(&send, &mut out, ReduceOp::Sum, &s)
    })
    .unwrap();
    assert_eq!(
        rig.world.calls("ncclCommAbort"),
        0,
        "not from the group's release"
    );
    assert_eq!(rig.gpus.live().device_allocations, before + 1, "send kept");
    assert_eq!(comm.async_error().unwrap_err(), Error::Aborted);
    assert_eq!(rig.world.calls("ncclCommAbort"), 2, "the owner aborts");
    rig.assert_no_gpu_violations();
}

/// A collective captured on a stream whose last handle goes before the capture ends: the
/// capture is abandoned, and the communicator, the memory and the stream it held go with
/// it (before, the communicator's list of streams held the stream, which held the
/// capture's record, which held the communicator: all of it stayed).
#[test]
fn a_capture_of_a_collective_whose_stream_goes_is_abandoned_with_the_communicator() {
    Rig::new(1).check(|rig| {
        let (ctx, comm, s) = one(rig);
        let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
        s.begin_capture(CaptureMode::Relaxed).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
            .unwrap();
    });
}
