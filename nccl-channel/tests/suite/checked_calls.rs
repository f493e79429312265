//! Ranks that call different collectives: the simulator names both calls, and the checked
//! mode (`CommConfig::check_calls`, `NCCL_CHANNEL_CHECK_CALLS`) turns the mismatch into
//! `Error::CallMismatch` on every rank before anything is issued.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;
use std::time::Duration;

use crate::common::Rig;
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{CHECK_CALLS_ENV, CommConfig, Communicator, Error, ReduceOp, Result, group};
use nccl_sys::ncclResult_t;

/// What a rank calls in a scenario, given its rank, communicator and stream.
type Calls = dyn Fn(usize, &Communicator, &Stream) -> Result<()> + Sync;

/// Runs `calls` on two ranks with `config`; each rank's result, and the rig checked clean.
fn two_ranks(config: &CommConfig, calls: &Calls) -> Vec<Result<()>> {
    let rig = Rig::with_timeout(
        2,
        nccl_sys::NcclVersion(nccl_sys::NCCL_VERSION_CODE as i32),
        Duration::from_secs(10),
    );
    let results = rig.run_with(2, config, |comm, stream| {
        calls(comm.rank(), comm, stream)?;
        Ok(stream.synchronize()?)
    });
    rig.assert_clean();
    results
}

/// An all-gather of `count` ones on this rank.
fn all_gather(comm: &Communicator, stream: &Stream, count: usize) -> Result<()> {
    let ctx = comm.context();
    let send = DeviceBuffer::from_slice(ctx, &vec![1i32; count])?;
    let mut recv = DeviceBuffer::<i32>::zeroed(ctx, count * comm.size())?;
    comm.all_gather(&send, &mut recv, stream)?;
    stream.synchronize()?;
    Ok(())
}

/// Every rank's error, as text.
fn messages(results: Vec<Result<()>>) -> Vec<String> {
    results
        .into_iter()
        .map(|r| r.expect_err("the ranks disagree").to_string())
        .collect()
}

fn checked() -> CommConfig {
    CommConfig::new().check_calls(true)
}

/// Asserts that `message` contains `part`.
#[track_caller]
fn assert_contains(message: &str, part: &str) {
    assert!(message.contains(part), "{message}");
}

/// Asserts that `message` begins with `start`.
#[track_caller]
fn assert_starts_with(message: &str, start: &str) {
    assert!(message.starts_with(start), "{message}");
}

#[test]
fn without_the_checked_mode_the_simulator_names_both_calls() {
    let results = two_ranks(&CommConfig::new(), &|r, comm, s| {
        all_gather(comm, s, 4 + 2 * r)
    });
    for r in results {
        let Err(Error::Nccl { code, detail, .. }) = r else {
            panic!("{r:?}");
        };
        assert_eq!(code, ncclResult_t::ncclInvalidUsage);
        assert_eq!(
            detail,
            "the ranks disagree on a collective: rank 0 calls ncclAllGather of 4 ncclInt32, \
             rank 1 ncclAllGather of 6 ncclInt32"
        );
    }
}

#[test]
fn a_non_blocking_communicator_reads_the_simulators_naming_too() {
    let config = CommConfig::non_blocking(Duration::from_secs(10));
    let results = two_ranks(&config, &|r, comm, s| {
        all_gather(comm, s, 4 + 2 * r)?;
        comm.wait(s)
    });
    for m in messages(results) {
        assert!(
            m.contains("rank 0 calls ncclAllGather of 4 ncclInt32, rank 1 ncclAllGather of 6"),
            "{m}"
        );
    }
}

#[test]
fn a_count_that_differs_is_an_error_on_every_rank_naming_both_calls() {
    let results = two_ranks(&checked(), &|r, comm, s| all_gather(comm, s, 4 + 2 * r));
    assert_eq!(
        messages(results),
        [
            "all_gather: the ranks' calls differ: this rank (0) calls all_gather of 4 int32 \
             (call 0), rank 1 calls all_gather of 6 int32 (call 0)",
            "all_gather: the ranks' calls differ: this rank (1) calls all_gather of 6 int32 \
             (call 0), rank 0 calls all_gather of 4 int32 (call 0)",
        ]
    );
}

#[test]
fn another_collective_type_op_or_root_is_a_mismatch_too() {
    // Rank 1's call differs from rank 0's in one field each time.
    let cases: [(&Calls, &str); 4] = [
        (
            &|r, comm, s| {
                let mut b = DeviceBuffer::from_slice(comm.context(), &[1i32; 4])?;
                if r == 0 {
                    comm.all_reduce_in_place(&mut b, ReduceOp::Sum, s)
                } else {
                    comm.broadcast_in_place(&mut b, 0, s)
                }
            },
            "rank 1 calls broadcast of 4 int32 (root 0, call 0)",
        ),
        (
            &|r, comm, s| {
                if r == 0 {
                    let mut b = DeviceBuffer::from_slice(comm.context(), &[1i32; 4])?;
                    comm.all_reduce_in_place(&mut b, ReduceOp::Sum, s)
                } else {
                    let mut b = DeviceBuffer::from_slice(comm.context(), &[1u32; 4])?;
                    comm.all_reduce_in_place(&mut b, ReduceOp::Sum, s)
                }
            },
            "rank 1 calls all_reduce of 4 uint32 (sum, call 0)",
        ),
        (
            &|r, comm, s| {
                let mut b = DeviceBuffer::from_slice(comm.context(), &[1i32; 4])?;
                let op = if r == 0 { ReduceOp::Sum } else { ReduceOp::Max };
                comm.all_reduce_in_place(&mut b, op, s)
            },
            "rank 1 calls all_reduce of 4 int32 (max, call 0)",
        ),
        (
            &|r, comm, s| {
                let mut b = DeviceBuffer::from_slice(comm.context(), &[1i32; 4])?;
                comm.broadcast_in_place(&mut b, r, s)
            },
            "rank 1 calls broadcast of 4 int32 (root 1, call 0)",
        ),
    ];
    for (calls, rank1) in cases {
        let m = messages(two_ranks(&checked(), calls));
        assert!(m[0].ends_with(rank1), "{}", m[0]);
    }
}

#[test]
fn calls_that_agree_run_as_without_the_check_and_are_numbered() {
    let results = two_ranks(&checked(), &|r, comm, s| {
        let ctx = comm.context();
        let mut sum = DeviceBuffer::from_slice(ctx, &[r as i32 + 1; 3])?;
        comm.all_reduce_in_place(&mut sum, ReduceOp::Sum, s)?;
        comm.barrier(s)?;
        let mut b = DeviceBuffer::from_slice(ctx, &[r as i32 * 10; 2])?;
        comm.broadcast_in_place(&mut b, 1, s)?;
        s.synchronize()?;
        assert_eq!(sum.to_vec()?, [3, 3, 3]);
        assert_eq!(b.to_vec()?, [10, 10]);
        // The fourth checked call: a mismatch now names its number.
        all_gather(comm, s, 1 + r)
    });
    let m = messages(results);
    assert_contains(
        &m[0],
        "all_gather of 1 int32 (call 3), rank 1 calls all_gather of 2 int32 (call 3)",
    );
}

#[test]
fn a_non_blocking_communicator_is_checked_too() {
    let config = CommConfig::non_blocking(Duration::from_secs(10)).check_calls(true);
    let m = messages(two_ranks(&config, &|r, comm, s| {
        all_gather(comm, s, 4 + 2 * r)
    }));
    assert_contains(&m[1], "this rank (1) calls all_gather of 6 int32");
}

#[test]
fn grouped_calls_are_left_to_nccl() {
    // A group cannot wait for the comparison: the simulator reports the mismatch instead.
    let results = two_ranks(&checked(), &|r, comm, s| {
        let ctx = comm.context();
        let send = DeviceBuffer::from_slice(ctx, &vec![1i32; 4 + 2 * r])?;
        let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 2 * send.len())?;
        group(comm.nccl(), || comm.all_gather(&send, &mut recv, s))?;
        s.synchronize()?;
        Ok(())
    });
    for m in messages(results) {
        assert!(m.contains("ncclInvalidUsage"), "{m}");
    }
}

#[test]
fn the_variable_turns_the_checked_mode_on_and_an_explicit_choice_wins() {
    if !test_support::this_test_in_scrubbed_child!(&[(CHECK_CALLS_ENV, OsStr::new("1"))]) {
        return;
    }
    let m = messages(two_ranks(&CommConfig::new(), &|r, comm, s| {
        all_gather(comm, s, 4 + 2 * r)
    }));
    assert_contains(&m[0], "the ranks' calls differ");
    let off = CommConfig::new().check_calls(false);
    let m = messages(two_ranks(&off, &|r, comm, s| {
        all_gather(comm, s, 4 + 2 * r)
    }));
    assert_contains(&m[0], "ncclInvalidUsage");
}

#[test]
fn a_malformed_variable_is_an_error_at_the_init() {
    if !test_support::this_test_in_scrubbed_child!(&[(CHECK_CALLS_ENV, OsStr::new("yes"))]) {
        return;
    }
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let e = Communicator::init_all(&rig.nccl, std::slice::from_ref(&ctx)).unwrap_err();
        assert!(
            matches!(&e, Error::Env { variable, value, .. } if variable == CHECK_CALLS_ENV && value == "yes"),
            "{e}"
        );
    });
}

crate::on_every_backend! {
    /// One rank in the checked mode runs every collective as without it (each one's
    /// comparison is an all-gather of its record on the rank's own stream), blocking and
    /// non-blocking: on the GPU, that is real NCCL running the check's exchange.
    fn every_collective_runs_checked_on_one_rank(m, gpus = 1) {
        use nccl_channel::UniqueId;
        for config in [
            CommConfig::new().check_calls(true),
            CommConfig::non_blocking(Duration::from_secs(60)).check_calls(true),
        ] {
            let ctx = &m.ctxs[0];
            let id = UniqueId::generate(&m.nccl).unwrap();
            let comm = Communicator::init_rank_with(&m.nccl, ctx, &id, 1, 0, &config).unwrap();
            let s = Stream::new(ctx).unwrap();
            let send = DeviceBuffer::from_slice(ctx, &[3i32, 4]).unwrap();
            let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 2).unwrap();
            let mut got = Vec::new();
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &s).unwrap();
            comm.wait(&s).unwrap();
            got.push(recv.to_vec().unwrap());
            comm.all_gather(&send, &mut recv, &s).unwrap();
            comm.reduce_scatter(&send, &mut recv, ReduceOp::Max, &s).unwrap();
            comm.broadcast(Some(send.as_view()), &mut recv, 0, &s).unwrap();
            comm.reduce(&send, Some(recv.as_view_mut()), ReduceOp::Sum, 0, &s).unwrap();
            comm.all_to_all(&send, &mut recv, &s).unwrap();
            comm.gather(&send, Some(recv.as_view_mut()), 0, &s).unwrap();
            comm.scatter(Some(send.as_view()), &mut recv, 0, &s).unwrap();
            comm.all_to_all_v(&send, &[2], &[0], &mut recv, &[2], &[0], &s).unwrap();
            comm.barrier(&s).unwrap();
            comm.wait(&s).unwrap();
            got.push(recv.to_vec().unwrap());
            assert_eq!(got, [[3, 4], [3, 4]]);
            comm.close().unwrap();
        }
        if let Some((_, nccl)) = &m.sim {
            // Per configuration: the user's all-gather and the ten calls' records.
            assert_eq!(nccl.calls("ncclAllGather"), 2 * (1 + 10));
        }
        m.check();
        println!("checked mode: every collective on one rank, blocking and non-blocking: ok");
    }
}

/// Rank `r`'s buffer of `4 + 2r` elements (a multiple of the two ranks either way).
fn buf(comm: &Communicator, r: usize) -> Result<DeviceBuffer<i32>> {
    Ok(DeviceBuffer::from_slice(
        comm.context(),
        &vec![1i32; 4 + 2 * r],
    )?)
}

#[test]
fn every_collective_whose_count_differs_on_one_rank_is_a_mismatch() {
    // Each collective, out of place and in place, with rank 1's buffers larger than rank
    // 0's: the comparison catches each before NCCL gets it.
    let cases: [(&str, &Calls); 14] = [
        ("all_reduce", &|r, c, s| {
            c.all_reduce(&buf(c, r)?, &mut buf(c, r)?, ReduceOp::Sum, s)
        }),
        ("all_reduce", &|r, c, s| {
            c.all_reduce_in_place(&mut buf(c, r)?, ReduceOp::Sum, s)
        }),
        ("all_gather", &|r, c, s| {
            let send = buf(c, r)?;
            let mut recv = DeviceBuffer::<i32>::zeroed(c.context(), 2 * send.len())?;
            c.all_gather(&send, &mut recv, s)
        }),
        ("all_gather", &|r, c, s| {
            c.all_gather_in_place(&mut buf(c, r)?, s)
        }),
        ("reduce_scatter", &|r, c, s| {
            let send = buf(c, r)?;
            let mut recv = DeviceBuffer::<i32>::zeroed(c.context(), send.len() / 2)?;
            c.reduce_scatter(&send, &mut recv, ReduceOp::Sum, s)
        }),
        ("reduce_scatter", &|r, c, s| {
            c.reduce_scatter_in_place(&mut buf(c, r)?, ReduceOp::Sum, s)
        }),
        ("broadcast", &|r, c, s| {
            let send = buf(c, r)?;
            let send = (r == 0).then(|| send.as_view());
            c.broadcast(send, &mut buf(c, r)?, 0, s)
        }),
        ("broadcast", &|r, c, s| {
            c.broadcast_in_place(&mut buf(c, r)?, 0, s)
        }),
        ("reduce", &|r, c, s| {
            let mut recv = buf(c, r)?;
            let recv = (r == 0).then(|| recv.as_view_mut());
            c.reduce(&buf(c, r)?, recv, ReduceOp::Sum, 0, s)
        }),
        ("reduce", &|r, c, s| {
            c.reduce_in_place(&mut buf(c, r)?, ReduceOp::Sum, 0, s)
        }),
        ("all_to_all", &|r, c, s| {
            c.all_to_all(&buf(c, r)?, &mut buf(c, r)?, s)
        }),
        ("gather", &|r, c, s| {
            let send = buf(c, r)?;
            let mut recv = DeviceBuffer::<i32>::zeroed(c.context(), 2 * send.len())?;
            let recv = (r == 0).then(|| recv.as_view_mut());
            c.gather(&send, recv, 0, s)
        }),
        ("scatter", &|r, c, s| {
            let mut recv = buf(c, r)?;
            let send = DeviceBuffer::<i32>::zeroed(c.context(), 2 * recv.len())?;
            let send = (r == 0).then(|| send.as_view());
            c.scatter(send, &mut recv, 0, s)
        }),
        // A variable all-to-all's counts may differ: its element type may not.
        ("all_to_all_v", &|r, c, s| {
            if r == 0 {
                let b = DeviceBuffer::from_slice(c.context(), &[1i32, 2])?;
                c.all_to_all_v(&b, &[1, 1], &[0, 1], &mut buf(c, r)?, &[1, 1], &[0, 1], s)
            } else {
                let b = DeviceBuffer::from_slice(c.context(), &[1u32, 2])?;
                let mut out = DeviceBuffer::<u32>::zeroed(c.context(), 2)?;
                c.all_to_all_v(&b, &[1, 1], &[0, 1], &mut out, &[1, 1], &[0, 1], s)
            }
        }),
    ];
    let mut named = std::collections::BTreeSet::new();
    for (name, calls) in cases {
        let results = two_ranks(&checked(), calls);
        for (r, result) in results.into_iter().enumerate() {
            let e = result.expect_err(name);
            assert!(
                matches!(&e, Error::CallMismatch { what: _, rank, other_rank, .. } if *rank == r && *other_rank == 1 - r),
                "{name}, rank {r}: {e}"
            );
            assert!(e.to_string().contains(&format!("calls {name} of")), "{e}");
            // The method is named as called, in place or not (gathered below).
            if let Error::CallMismatch { what, .. } = e {
                assert!(what.starts_with(name), "{name}: {what}");
                named.insert(what);
            }
        }
    }
    for in_place in [
        "all_reduce_in_place",
        "all_gather_in_place",
        "reduce_scatter_in_place",
        "broadcast_in_place",
        "reduce_in_place",
    ] {
        assert!(named.contains(in_place), "{in_place} not named: {named:?}");
    }
}

#[test]
fn a_call_refused_on_one_rank_is_not_taken_for_its_next() {
    // Rank 1's receive buffer is one element short: its all-gather is refused before the
    // comparison, and its barrier's comparison then meets rank 0's all-gather's.
    let results = two_ranks(&checked(), &|r, comm, s| {
        let send = DeviceBuffer::from_slice(comm.context(), &[1i32, 2])?;
        let mut recv = DeviceBuffer::<i32>::zeroed(comm.context(), 4 - r)?;
        match comm.all_gather(&send, &mut recv, s) {
            Err(Error::LengthMismatch { .. }) if r == 1 => comm.barrier(s),
            other => other,
        }
    });
    let m = messages(results);
    assert_eq!(
        m[0],
        "all_gather: the ranks' calls differ: this rank (0) calls all_gather of 2 int32 (call 0), \
         rank 1 calls barrier (call 0)"
    );
    assert_starts_with(
        &m[1],
        "barrier: the ranks' calls differ: this rank (1) calls barrier (call 0)",
    );
}

#[test]
fn a_captured_call_is_not_compared_and_a_capture_that_forbids_waits_is_an_error() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = nccl_channel::UniqueId::generate(&rig.nccl).unwrap();
        let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &checked()).unwrap();
        let (s, captured) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut b = DeviceBuffer::from_slice(&ctx, &[1i32, 2]).unwrap();
        // A collective captured into a graph (a relaxed capture, which forbids no wait): its
        // comparison would run once, at the capture, not at each launch, so there is none.
        s.begin_capture(cuda_hal::CaptureMode::Relaxed).unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
        let graph = s.end_capture().unwrap();
        assert_eq!(rig.world.calls("ncclAllGather"), 0);
        drop(graph);
        // Another stream captured in thread-local mode forbids this thread host waits: the
        // comparison cannot wait, so the call fails before anything is issued (thread-local,
        // not global: a global capture would forbid the waits of this binary's other tests).
        captured
            .begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        let e = comm
            .all_reduce_in_place(&mut b, ReduceOp::Sum, &s)
            .unwrap_err();
        assert!(
            matches!(&e, Error::Cuda(cuda_hal::Error::Capturing { what }) if what.starts_with("the checked mode's comparison")),
            "{e}"
        );
        drop(captured.end_capture().unwrap());
        assert_eq!(rig.world.calls("ncclAllGather"), 0);
        // Then compared again, numbered as if the refused call had not been.
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
        assert_eq!(rig.world.calls("ncclAllGather"), 1);
        s.synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [1, 2]);
    });
}

#[test]
fn a_peer_that_never_compares_is_the_deadlines_error_not_a_mismatch() {
    // Rank 1 holds its communicator and calls nothing: rank 0's comparison waits until its
    // deadline and says so; the records it has are no answer.
    let config = CommConfig::non_blocking(Duration::from_secs(2)).check_calls(true);
    let results = two_ranks(&config, &|r, comm, s| {
        if r == 1 {
            std::thread::sleep(Duration::from_secs(4));
            return Ok(());
        }
        all_gather(comm, s, 2)
    });
    assert!(results[1].is_ok());
    let e = results[0].as_ref().unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
}

/// Device memory whose owner refuses every use on a stream (as borrowed memory refuses a
/// use it cannot outlive): a refusal that only noting the use finds.
struct Refusing(DeviceBuffer<i32>);

// SAFETY: forwards to the `DeviceBuffer`, except that every use is refused (nothing is
// enqueued with it then).
unsafe impl cuda_hal::DeviceSlice for Refusing {
    type Elem = i32;
    fn device_ptr(&self) -> cuda_hal::cuda_sys::CUdeviceptr {
        self.0.as_raw()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn context(&self) -> &cuda_hal::Context {
        self.0.context()
    }
    fn used_on(&self, _stream: &Stream) -> cuda_hal::Result<()> {
        Err(cuda_hal::Error::Deferred {
            what: "refusing memory",
            why: "its owner refuses every use",
        })
    }
    fn used_synchronously(&self) -> cuda_hal::Result<()> {
        cuda_hal::DeviceSlice::used_synchronously(&self.0)
    }
}

/// Rank 1's variable all-to-all is refused while its send buffer's use is noted, a check
/// that comes after the counts' and the regions'. It compares only after every local
/// check, so it never took part in a comparison: its next call's comparison meets rank 0's
/// all-to-all, and both ranks get the mismatch. Before, the comparison came first: rank 0
/// passed it and waited in NCCL for sends that never came.
#[test]
fn a_variable_all_to_all_refused_locally_compares_nothing() {
    let results = two_ranks(&checked(), &|r, comm, s| {
        let ctx = comm.context();
        let counts = [1usize, 1];
        let displs = [0usize, 1];
        let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 2)?;
        let send = DeviceBuffer::from_slice(ctx, &[r as i32, r as i32])?;
        if r == 0 {
            return comm.all_to_all_v(&send, &counts, &displs, &mut recv, &counts, &displs, s);
        }
        let refused = Refusing(send);
        match comm.all_to_all_v(&refused, &counts, &displs, &mut recv, &counts, &displs, s) {
            Err(Error::Cuda(cuda_hal::Error::Deferred { .. })) => all_gather(comm, s, 2),
            other => panic!("{other:?}"),
        }
    });
    let m = messages(results);
    assert_eq!(
        m[0],
        "all_to_all_v: the ranks' calls differ: this rank (0) calls all_to_all_v of its counts \
         int32 (call 0), rank 1 calls all_gather of 2 int32 (call 0)"
    );
    assert_starts_with(
        &m[1],
        "all_gather: the ranks' calls differ: this rank (1) calls all_gather",
    );
}

/// A rank that allocates symmetric memory (the crate's own collective: an allocation,
/// agreements and a window's registration) while its peer all-reduces: in the checked
/// mode both get `CallMismatch` naming both, before anything reaches NCCL. Before, the
/// crate's exchanges were never compared: the allocation's agreement met the all-reduce
/// inside NCCL.
#[test]
fn a_peer_allocating_symmetric_memory_while_the_other_collects_is_a_mismatch() {
    let results = two_ranks(&checked(), &|r, comm, s| {
        if r == 0 {
            comm.symmetric::<f32>(64).map(drop)
        } else {
            let mut b = DeviceBuffer::from_slice(comm.context(), &[1i32; 4])?;
            comm.all_reduce_in_place(&mut b, ReduceOp::Sum, s)
        }
    });
    let m = messages(results);
    assert_eq!(
        m[0],
        "Communicator::symmetric: the ranks' calls differ: this rank (0) calls the crate's \
         agreement on a symmetric buffer's size (call 0), rank 1 calls all_reduce of 4 int32 \
         (sum, call 0)"
    );
    assert_eq!(
        m[1],
        "all_reduce_in_place: the ranks' calls differ: this rank (1) calls all_reduce of 4 \
         int32 (sum, call 0), rank 0 calls the crate's agreement on a symmetric buffer's size \
         (call 0)"
    );
}

/// A window's registration is an NCCL collective of the program's communicator: in the
/// checked mode it is compared first, so a peer that all-gathers meanwhile gets the
/// mismatch on both ranks instead of meeting the registration inside NCCL.
#[test]
fn a_window_registration_is_compared_in_the_checked_mode() {
    let results = two_ranks(&checked(), &|r, comm, s| {
        if r == 0 {
            let buf = comm.alloc_nccl::<u32>(1024)?;
            comm.register_window(&buf, nccl_channel::WindowFlags::COLL_SYMMETRIC)
                .map(drop)
        } else {
            all_gather(comm, s, 2)
        }
    });
    let m = messages(results);
    assert_eq!(
        m[0],
        "Communicator::register_window: the ranks' calls differ: this rank (0) calls the \
         crate's agreement on registering a window (call 0), rank 1 calls all_gather of 2 \
         int32 (call 0)"
    );
    assert_starts_with(
        &m[1],
        "all_gather: the ranks' calls differ: this rank (1) calls all_gather of 2 int32",
    );
}

/// NCCL's symmetric kernels reach a peer's buffer at this rank's offset: in the checked
/// mode, views of symmetric buffers at different offsets on different ranks (or one in
/// a symmetric window and one not) are a `CallMismatch` on every rank, before NCCL gets
/// them. Before, only the simulator's sanitizer saw it; on a GPU the data was wrong.
#[test]
fn symmetric_views_at_different_offsets_are_a_mismatch() {
    for case in ["offset", "plain"] {
        let results = two_ranks(&checked(), &move |r, comm, s| {
            let mut b = comm.symmetric::<i32>(64)?;
            let mut plain = comm.alloc_nccl::<i32>(16)?;
            match (case, r) {
                (_, 0) => comm.all_reduce_in_place(&mut b.slice_mut(0..16)?, ReduceOp::Sum, s),
                ("offset", _) => {
                    comm.all_reduce_in_place(&mut b.slice_mut(16..32)?, ReduceOp::Sum, s)
                }
                _ => comm.all_reduce_in_place(&mut plain, ReduceOp::Sum, s),
            }
        });
        let m = messages(results);
        let theirs = if case == "offset" {
            "all_reduce of 16 int32 (sum, send at byte 64 of symmetric window 1, recv at byte \
             64 of symmetric window 1"
        } else {
            "all_reduce of 16 int32 (sum, call"
        };
        assert_starts_with(
            &m[0],
            "all_reduce_in_place: the ranks' calls differ: this rank (0) calls all_reduce of 16 \
             int32 (sum, send at byte 0 of symmetric window 1, recv at byte 0 of symmetric \
             window 1",
        );
        assert_contains(&m[0], &format!("rank 1 calls {theirs}"));
    }
}

/// The same offset of two different symmetric buffers (rank 0 reduces the first, rank 1 the
/// second) is no more symmetric than two offsets: a `CallMismatch` naming each window.
#[test]
fn the_same_offset_of_another_symmetric_buffer_is_a_mismatch() {
    let results = two_ranks(&checked(), &|r, comm, s| {
        let mut a = comm.symmetric::<i32>(16)?;
        let mut b = comm.symmetric::<i32>(16)?;
        let mine = if r == 0 { &mut a } else { &mut b };
        comm.all_reduce_in_place(&mut **mine, ReduceOp::Sum, s)
    });
    let m = messages(results);
    assert_contains(
        &m[0],
        "this rank (0) calls all_reduce of 16 int32 (sum, send at byte 0 of \
                            symmetric window 1",
    );
    assert_contains(
        &m[0],
        "rank 1 calls all_reduce of 16 int32 (sum, send at byte 0 of \
                            symmetric window 2",
    );
}

/// A barrier is the crate's all-reduce of one `i32`: a program's all-reduce of one `i32`
/// on its peer is a mismatch, not a barrier.
#[test]
fn a_barrier_against_a_programs_all_reduce_of_one_element_is_a_mismatch() {
    let results = two_ranks(&checked(), &|r, comm, s| {
        if r == 0 {
            comm.barrier(s)
        } else {
            let mut b = DeviceBuffer::from_slice(comm.context(), &[1i32])?;
            comm.all_reduce_in_place(&mut b, ReduceOp::Sum, s)
        }
    });
    let m = messages(results);
    assert_eq!(
        m[0],
        "barrier: the ranks' calls differ: this rank (0) calls barrier (call 0), rank 1 calls \
         all_reduce of 1 int32 (sum, call 0)"
    );
    assert_starts_with(&m[1], "all_reduce_in_place: the ranks' calls differ");
}
