//! Deadlines, aborts and faults on the simulated NCCL: a rank that never arrives, a peer
//! that stops, an abort from another thread, injected errors; nothing leaks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use crate::common::{OneRank, Rig, assert_nccl_error, on_one_rank};
use cuda_hal::{Context, DeviceBuffer, Stream};
use nccl_channel::{CommConfig, Communicator, Error, ReduceOp, UniqueId};
use nccl_sys::{NcclVersion, ncclResult_t};

const DEADLINE: Duration = Duration::from_millis(400);
const MARGIN: Duration = Duration::from_millis(600);

/// Rank `rank` of `size` in `ctx`, non-blocking with the tests' deadline.
fn non_blocking(
    rig: &Rig,
    ctx: &Context,
    id: &UniqueId,
    size: usize,
    rank: usize,
) -> nccl_channel::Result<Communicator> {
    Communicator::init_rank_with(
        &rig.nccl,
        ctx,
        id,
        size,
        rank,
        &CommConfig::non_blocking(DEADLINE),
    )
}

#[test]
fn a_rank_that_never_arrives_times_out_within_the_deadline() {
    Rig::new(2).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let ctx = rig.context(0);
        let t = Instant::now();
        let e = non_blocking(rig, &ctx, &id, 2, 0).unwrap_err();
        let took = t.elapsed();
        assert!(
            matches!(&e, Error::Timeout { what, after } if what == "ncclCommInitRankConfig" && *after == DEADLINE),
            "{e}"
        );
        assert!(took >= DEADLINE && took < DEADLINE + MARGIN, "{took:?}");
        assert!(e.to_string().contains("timed out after 400ms"), "{e}");
    });
}

#[test]
fn non_blocking_communicators_work_and_wait_checks_the_stream() {
    Rig::new(2).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let out = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let rig = &rig;
                    s.spawn(move || {
                        let ctx = rig.context(r);
                        let cfg = CommConfig::non_blocking(Duration::from_secs(10));
                        let comm =
                            Communicator::init_rank_with(&rig.nccl, &ctx, &id, 2, r, &cfg).unwrap();
                        assert!(!comm.config().is_blocking());
                        let st = Stream::new(&ctx).unwrap();
                        let a = DeviceBuffer::from_slice(&ctx, &[r as u64 + 1; 8]).unwrap();
                        let mut b = DeviceBuffer::<u64>::zeroed(&ctx, 8).unwrap();
                        for _ in 0..50 {
                            comm.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap();
                            comm.wait(&st).unwrap();
                        }
                        let v = b.to_vec().unwrap();
                        drop((a, b));
                        comm.close().unwrap();
                        v
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(out, vec![vec![3u64; 8]; 2]);
    });
}

/// Rank 1 joins, then stops taking part (a dead peer); rank 0 keeps calling collectives.
#[test]
fn a_peer_that_stops_gives_an_error_within_the_deadline_and_nothing_leaks() {
    Rig::new(2).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let (took, e, after) = std::thread::scope(|s| {
            let peer = s.spawn(|| {
                let ctx = rig.context(1);
                let comm = non_blocking(rig, &ctx, &id, 2, 1).unwrap();
                // Dies: aborts without ever joining rank 0's all-reduce.
                std::thread::sleep(Duration::from_millis(50));
                comm.abort().unwrap();
            });
            let ctx = rig.context(0);
            let comm = non_blocking(rig, &ctx, &id, 2, 0).unwrap();
            let st = Stream::new(&ctx).unwrap();
            let a = DeviceBuffer::from_slice(&ctx, &[1.0f32; 4]).unwrap();
            let mut b = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
            peer.join().unwrap();
            let t = Instant::now();
            let e = comm
                .all_reduce(&a, &mut b, ReduceOp::Sum, &st)
                .and_then(|_| comm.wait(&st))
                .unwrap_err();
            let took = t.elapsed();
            assert!(comm.is_aborted());
            let after = comm.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap_err();
            (took, e, after)
        });
        assert!(took < DEADLINE + MARGIN, "{took:?}");
        // The peer's abort is done before the all-reduce is issued (joined above): the
        // simulated NCCL refuses the collective at once with a remote error, never a timeout.
        assert_nccl_error(&e, "ncclAllReduce", ncclResult_t::ncclRemoteError);
        assert_eq!(after, Error::Aborted);
    });
}

/// A non-blocking init whose background work is slow (NCCL answers "in progress" a few
/// times) is polled until it is ready, not given up at the first answer.
#[test]
fn a_slow_non_blocking_init_is_polled_until_ready() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        rig.world.slow_new_communicators(5);
        let polls = rig.world.calls("ncclCommGetAsyncError");
        let comm = non_blocking(rig, &ctx, &id, 1, 0).unwrap();
        assert!(rig.world.calls("ncclCommGetAsyncError") >= polls + 6);
        assert!(!comm.is_aborted());
    });
}

/// Work still running when `wait` starts is waited for, not taken for a missed deadline:
/// the simulated stream answers "not ready" a few times, then is idle.
#[test]
fn wait_polls_a_busy_stream_until_it_is_idle() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s: st }| {
        let a = DeviceBuffer::from_slice(&ctx, &[5u32; 4]).unwrap();
        let mut b = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
        comm.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap();
        let before = rig.gpus.calls("cuStreamQuery");
        for _ in 0..3 {
            rig.gpus.fail_next(
                "cuStreamQuery",
                cuda_hal::cuda_sys::CUresult::CUDA_ERROR_NOT_READY,
            );
        }
        comm.wait(&st).unwrap();
        // Three "not ready" answers, then the idle one.
        assert_eq!(rig.gpus.calls("cuStreamQuery") - before, 4);
        assert!(!comm.is_aborted());
        assert_eq!(b.to_vec().unwrap(), [5; 4]);
    });
}

/// A stream that never becomes idle: `wait` gives up at the deadline and aborts.
#[test]
fn wait_on_a_stream_that_stays_busy_times_out_at_the_deadline() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let comm = non_blocking(rig, &ctx, &id, 1, 0).unwrap();
        let st = Stream::new(&ctx).unwrap();
        // More "not ready" answers than polls fit in the deadline, even at the shortest
        // pause (20 µs).
        for _ in 0..(DEADLINE.as_micros() / 20) {
            rig.gpus.fail_next(
                "cuStreamQuery",
                cuda_hal::cuda_sys::CUresult::CUDA_ERROR_NOT_READY,
            );
        }
        let t = Instant::now();
        let e = comm.wait(&st).unwrap_err();
        let took = t.elapsed();
        rig.gpus.clear_faults();
        assert_eq!(
            e,
            Error::Timeout {
                what: "the stream work of rank 0 (communicator aborted)".into(),
                after: DEADLINE,
            }
        );
        assert!(took >= DEADLINE && took < DEADLINE + MARGIN, "{took:?}");
        assert!(comm.is_aborted());
    });
}

#[test]
fn an_abort_handle_stops_a_wait_from_another_thread() {
    Rig::new(2).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let ctx = rig.context(0);
        // Rank 1 exists but never calls the collective; the deadline is long.
        let other = std::thread::scope(|s| {
            let peer = s.spawn(|| {
                let c1 = rig.context(1);
                Communicator::init_rank_with(
                    &rig.nccl,
                    &c1,
                    &id,
                    2,
                    1,
                    &CommConfig::non_blocking(Duration::from_secs(30)),
                )
                .unwrap()
            });
            let comm = Communicator::init_rank_with(
                &rig.nccl,
                &ctx,
                &id,
                2,
                0,
                &CommConfig::non_blocking(Duration::from_secs(30)),
            )
            .unwrap();
            let peer_comm = peer.join().unwrap();
            let handle = comm.abort_handle();
            let st = Stream::new(&ctx).unwrap();
            let a = DeviceBuffer::from_slice(&ctx, &[1i32; 4]).unwrap();
            let mut b = DeviceBuffer::<i32>::zeroed(&ctx, 4).unwrap();
            let aborter = s.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                handle.abort();
            });
            let t = Instant::now();
            let e = comm.all_reduce(&a, &mut b, ReduceOp::Sum, &st).unwrap_err();
            assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
            assert_eq!(e, Error::Aborted);
            aborter.join().unwrap();
            drop(comm);
            peer_comm
        });
        // The survivor's peer sees the abort as a remote error on its next wait.
        drop(other);
    });
}

#[test]
fn injected_errors_in_reliability_calls_surface_typed() {
    Rig::new(1).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let ctx = rig.context(0);
        for f in ["ncclCommInitRankConfig", "ncclCommGetAsyncError"] {
            rig.fail_next(f, ncclResult_t::ncclSystemError);
            let e = non_blocking(rig, &ctx, &id, 1, 0).unwrap_err();
            assert!(
                matches!(&e, Error::Nccl { call, code, .. } if *call == f && *code == ncclResult_t::ncclSystemError),
                "{f}: {e}"
            );
        }
        let comm = non_blocking(rig, &ctx, &id, 1, 0).unwrap();
        rig.fail_next("ncclCommFinalize", ncclResult_t::ncclInternalError);
        let e = comm.close().unwrap_err();
        assert_nccl_error(&e, "ncclCommFinalize", ncclResult_t::ncclInternalError);
    });
}

#[test]
fn revoke_and_shrink_need_their_nccl_versions() {
    Rig::with_version(1, NcclVersion::new(2, 26, 5)).check(|rig| {
        let out = rig.run(1, |comm, _| {
            (
                comm.revoke().unwrap_err(),
                comm.shrink(&[]).unwrap_err(),
                comm.shrink(&[3]).unwrap_err(),
            )
        });
        assert_eq!(
            out[0].0,
            Error::Unsupported {
                feature: "ncclCommRevoke",
                needed: "2.28.7".into(),
                found: "2.26.5".into()
            }
        );
        assert_eq!(
            out[0].1,
            Error::Unsupported {
                feature: "ncclCommShrink",
                needed: "2.27.3".into(),
                found: "2.26.5".into()
            }
        );
        assert!(out[0].2.to_string().contains("needs NCCL 2.27.3"));
    });
}
