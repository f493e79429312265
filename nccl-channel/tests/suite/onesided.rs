//! One-sided puts, signals and waits on windows, on the simulated driver and NCCL, whose
//! sanitizers check when a put runs that its source and both windows are still there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{Rig, streams};
use cuda_hal::{CaptureMode, DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, ReduceOp, Signal, SignalWait, Window, WindowFlags, group};
use nccl_sys::NcclVersion;

const SYM: WindowFlags = WindowFlags::COLL_SYMMETRIC;

/// `n` ranks from one thread: communicators, streams, source and target buffers (1024
/// u32 each) and their windows.
struct Ring {
    comms: Vec<Communicator>,
    streams: Vec<Stream>,
}

fn ring(rig: &Rig, n: usize) -> Ring {
    let (ctxs, comms) = rig.all_ranks(n);
    let streams = streams(&ctxs);
    Ring { comms, streams }
}

fn windows<'c>(comms: &'c [Communicator], bufs: &[DeviceBuffer<u32>]) -> Vec<Window<'c>> {
    let pairs: Vec<_> = comms.iter().zip(bufs).collect();
    Communicator::register_windows(&pairs, SYM).unwrap()
}

fn nccl_bufs(comms: &[Communicator], fill: impl Fn(usize) -> u32) -> Vec<DeviceBuffer<u32>> {
    comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let mut b = c.alloc_nccl::<u32>(1024).unwrap();
            b.fill(fill(r)).unwrap();
            b
        })
        .collect()
}

#[test]
fn a_ring_of_puts_among_three_ranks_delivers_each_ranks_data_to_the_next() {
    Rig::new(3).check(|rig| {
        let Ring { comms, streams } = ring(rig, 3);
        let src = nccl_bufs(&comms, |r| 100 + r as u32);
        let dst = nccl_bufs(&comms, |_| 0);
        let src_w = windows(&comms, &src);
        let dst_w = windows(&comms, &dst);
        for r in 0..3 {
            // Rank r writes 4 elements at element 4 * r of rank r + 1's window.
            let next = (r + 1) % 3;
            dst_w[r]
                .put_signal(
                    &src[r].slice(0..4).unwrap(),
                    next,
                    16 * r,
                    Signal::DEFAULT,
                    &streams[r],
                )
                .unwrap();
            // And a plain signal after it.
            comms[r].signal(next, Signal::DEFAULT, &streams[r]).unwrap();
        }
        for r in 0..3 {
            comms[r]
                .wait_signal(&[SignalWait::new((r + 2) % 3, 2)], &streams[r])
                .unwrap();
        }
        for (r, s) in streams.iter().enumerate() {
            s.synchronize().unwrap();
            let prev = (r + 2) % 3;
            let mut want = vec![0u32; 1024];
            want[4 * prev..4 * prev + 4].fill(100 + prev as u32);
            assert_eq!(dst[r].to_vec().unwrap(), want, "rank {r}");
        }
        assert_eq!(rig.world.calls("ncclPutSignal"), 3);
        assert_eq!(rig.world.calls("ncclSignal"), 3);
        assert_eq!(rig.world.calls("ncclWaitSignal"), 3);
        drop((src_w, dst_w));
    });
}

#[test]
fn ranks_on_threads_ping_pong_with_puts_and_waits() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let mut src = c.alloc_nccl::<u32>(1024).unwrap();
            let mut dst = c.alloc_nccl::<u32>(1024).unwrap();
            src.fill(c.rank() as u32 + 1).unwrap();
            dst.fill(0).unwrap();
            let _sw = c.register_window(&src, SYM).unwrap();
            let dw = c.register_window(&dst, SYM).unwrap();
            let peer = 1 - c.rank();
            if c.rank() == 0 {
                dw.put_signal(&src.slice(0..2).unwrap(), peer, 0, Signal::DEFAULT, s)
                    .unwrap();
                c.wait_signal(&[SignalWait::new(peer, 1)], s).unwrap();
            } else {
                c.wait_signal(&[SignalWait::new(peer, 1)], s).unwrap();
                dw.put_signal(&src.slice(0..2).unwrap(), peer, 0, Signal::DEFAULT, s)
                    .unwrap();
            }
            s.synchronize().unwrap();
            dst.to_vec().unwrap()[..3].to_vec()
        });
        assert_eq!(out, vec![vec![2, 2, 0], vec![1, 1, 0]]);
    });
}

/// A window's smallest size is agreed by the crate itself, on the private channel. Here
/// each rank issues a collective of its own where the other registers its window (the
/// same collective, in another order on each rank), shaped as an agreement was (a
/// one-element minimum) and as its record was (a gather of 5 words per rank), with data
/// that would make a rank believe the peer's window larger. The program's collective
/// cannot pair with the agreement: the rank that issued it first waits for a peer that is
/// in the agreement, and both end in a typed error at the deadline; nothing is written
/// past rank 1's 1024-byte window.
#[test]
fn a_users_collective_in_place_of_the_window_agreement_is_an_error_on_every_rank() {
    for shape in ["all_reduce", "all_gather"] {
        // The peers' waits end after 2 s.
        let rig = Rig::with_timeout(2, NcclVersion::new(2, 32, 3), Duration::from_secs(2));
        let out = rig.run(2, |c, s| {
            let theirs = |c: &Communicator| {
                let r = if shape == "all_reduce" {
                    let mut v = DeviceBuffer::from_slice(c.context(), &[u64::MAX]).unwrap();
                    c.all_reduce_in_place(&mut v, ReduceOp::Min, s)
                } else {
                    let v = DeviceBuffer::from_slice(c.context(), &[u64::MAX; 5]).unwrap();
                    let mut all = DeviceBuffer::<u64>::zeroed(c.context(), 10).unwrap();
                    c.all_gather(&v, &mut all, s)
                };
                r.and_then(|()| Ok(s.synchronize()?))
            };
            // 4096 bytes on rank 0, 1024 on rank 1.
            let buf = c.alloc_nccl::<u32>(1024 >> (2 * c.rank())).unwrap();
            if c.rank() == 1 {
                theirs(c)?;
            }
            let window = c.register_window(&buf, SYM);
            if c.rank() == 0 {
                theirs(c)?;
            }
            let window = window?;
            // Had a wrong size been agreed, this put would pass and overrun rank 1.
            if c.rank() == 0 {
                let put = window.put_signal(&buf, 1, 0, Signal::DEFAULT, s);
                if put.is_err() {
                    c.signal(1, Signal::DEFAULT, s)?;
                }
            } else {
                c.wait_signal(&[SignalWait::new(0, 1)], s)?;
            }
            s.synchronize()?;
            Ok::<_, Error>(())
        });
        for (rank, r) in out.iter().enumerate() {
            assert!(
                r.is_err(),
                "{shape}: rank {rank} registered its window: {r:?}"
            );
        }
        rig.assert_clean();
    }
}

/// The agreement's record, copied: rank 1 all-gathers a record shaped as the crate's
/// window-size agreement's once was (its mark, its topic, the first exchange's number and
/// a window of 1 TiB) on the program's communicator and then registers its 1024-byte
/// window; rank 0 registers its 4096-byte window, then all-gathers on its own. When the
/// agreement travelled on the program's communicator, rank 1's copy answered rank 0's
/// agreement: rank 0 believed rank 1's window was 1 TiB, and its put of 4096 bytes overran
/// rank 1's window. On the private channel no program's collective meets the agreement:
/// rank 1's gather waits for rank 0's, which comes only after the agreement that waits for
/// rank 1: both end at the deadline with an error, and nothing is written past a window.
#[test]
fn a_copied_agreement_record_on_the_programs_communicator_is_never_read() {
    // The peers' waits end after 2 s.
    let rig = Rig::with_timeout(2, NcclVersion::new(2, 32, 3), Duration::from_secs(2));
    let out = rig.run(2, |c, s| {
        let forged: [u64; 5] = [
            u64::from_be_bytes(*b"nccl-cha"),
            u64::from_be_bytes(*b"nnel-agr"),
            1,
            0,
            1 << 40,
        ];
        let mine = if c.rank() == 1 { forged } else { [7; 5] };
        let v = DeviceBuffer::from_slice(c.context(), &mine)?;
        let mut all = DeviceBuffer::<u64>::zeroed(c.context(), 10)?;
        let buf = c.alloc_nccl::<u32>(1024 >> (2 * c.rank()))?;
        if c.rank() == 1 {
            c.all_gather(&v, &mut all, s)?;
        }
        let window = c.register_window(&buf, SYM)?;
        if c.rank() == 0 {
            c.all_gather(&v, &mut all, s)?;
            let put = window.put_signal(&buf, 1, 0, Signal::DEFAULT, s);
            s.synchronize()?;
            return Ok(Some(put));
        }
        s.synchronize()?;
        Ok::<_, Error>(None)
    });
    assert!(
        !matches!(&out[0], Ok(Some(Ok(())))),
        "rank 0 put 4096 bytes into rank 1's 1024-byte window: {:?}",
        out[0]
    );
    rig.assert_clean();
}

/// A rank whose part of the window-size exchange fails before it is issued (here its
/// stream cannot be made) does not fall out of step with its peers: the next
/// registration's exchange still matches on every rank.
#[test]
fn a_window_exchange_that_fails_before_it_is_issued_leaves_the_next_one_in_step() {
    Rig::new(2).check(|rig| {
        let Ring { comms, .. } = ring(rig, 2);
        let bufs = nccl_bufs(&comms, |_| 0);
        let pairs: Vec<_> = comms.iter().zip(&bufs).collect();
        let oom = cuda_hal::cuda_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        rig.gpus.fail_next("cuStreamCreate", oom);
        let failed = Communicator::register_windows(&pairs, SYM);
        assert!(
            matches!(failed, Err(Error::Cuda(cuda_hal::Error::Driver { .. }))),
            "{failed:?}"
        );
        let windows = Communicator::register_windows(&pairs, SYM).unwrap();
        assert!(windows.iter().all(Window::is_active));
    });
}

#[test]
fn a_put_past_the_window_and_a_source_outside_any_window_are_typed_errors() {
    Rig::new(2).check(|rig| {
        let Ring { comms, streams } = ring(rig, 2);
        let src = nccl_bufs(&comms, |_| 1);
        let dst = nccl_bufs(&comms, |_| 0);
        let src_w = windows(&comms, &src);
        let dst_w = windows(&comms, &dst);
        assert_eq!(
            dst_w[0].put_signal(
                &src[0].slice(0..4).unwrap(),
                1,
                4084,
                Signal::DEFAULT,
                &streams[0]
            ),
            Err(Error::OutOfWindow {
                what: "Window::put_signal",
                offset: 4084,
                bytes: 16,
                window: 4096
            })
        );
        assert_eq!(
            dst_w[0].put_signal(
                &src[0].slice(0..1).unwrap(),
                1,
                usize::MAX,
                Signal::DEFAULT,
                &streams[0]
            ),
            Err(Error::OutOfWindow {
                what: "Window::put_signal",
                offset: usize::MAX,
                bytes: 4,
                window: 4096
            })
        );
        let plain = comms[0].alloc_nccl::<u32>(4).unwrap();
        match dst_w[0].put_signal(&plain, 1, 0, Signal::DEFAULT, &streams[0]) {
            Err(Error::InvalidArgument { what, problem }) => {
                assert_eq!(what, "Window::put_signal");
                assert!(
                    problem.starts_with("the source must lie in a window"),
                    "{problem}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            dst_w[0].put_signal(&src[0], 2, 0, Signal::DEFAULT, &streams[0]),
            Err(Error::InvalidRank {
                what: "Window::put_signal",
                rank: 2,
                size: 2
            })
        );
        // NCCL has only signal 0 of context 0.
        match comms[0].signal(
            1,
            Signal {
                index: 1,
                context: 0,
            },
            &streams[0],
        ) {
            Err(Error::Nccl { call, name, .. }) => {
                assert_eq!((call, name.as_str()), ("ncclSignal", "ncclInvalidArgument"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rig.world.calls("ncclPutSignal"), 0);
        assert_eq!(dst_w[0].user_ptr().unwrap(), Some(dst[0].as_raw()));
        drop((src_w, dst_w));
    });
}

#[test]
fn a_wait_for_a_signal_that_never_comes_is_a_timeout_not_a_hang() {
    let rig = Rig::new(2);
    let out = rig.non_blocking_ranks(Duration::from_millis(300), |rank, ctx, c| {
        let s = Stream::new(ctx).unwrap();
        if rank == 0 {
            Some(c.wait_signal(&[SignalWait::new(1, 1)], &s))
        } else {
            None
        }
    });
    match &out[0] {
        Some(Err(Error::Timeout { after, .. })) => assert_eq!(*after, Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    rig.assert_no_gpu_violations();
}

/// Drops the source, its window and the target window right after the put: they stay
/// alive until the put ran (or the group or graph that holds it let go).
#[test]
fn dropping_the_source_and_the_windows_after_a_put_stays_sound() {
    for how in ["plain", "group", "capture"] {
        let rig = Rig::new(2);
        let Ring { comms, streams } = ring(&rig, 2);
        let mut dst1 = comms[1].alloc_nccl::<u32>(1024).unwrap();
        dst1.fill(0).unwrap();
        let dst0 = comms[0].alloc_nccl::<u32>(1024).unwrap();
        let mut src = nccl_bufs(&comms, |r| 5 + r as u32);
        let mut src_w = windows(&comms, &src);
        let mut dst_w =
            Communicator::register_windows(&[(&comms[0], &dst0), (&comms[1], &dst1)], SYM).unwrap();
        let (s0, w0, sw0) = (src.remove(0), dst_w.remove(0), src_w.remove(0));
        let st0 = &streams[0];
        let put = move || {
            w0.put_signal(&s0.slice(0..8).unwrap(), 1, 32, Signal::DEFAULT, st0)
                .unwrap();
            drop((s0, w0, sw0, dst0));
        };
        match how {
            "plain" => put(),
            "group" => group(&rig.nccl, || {
                put();
                Ok(())
            })
            .unwrap(),
            _ => {
                streams[0].begin_capture(CaptureMode::ThreadLocal).unwrap();
                put();
                let graph = streams[0].end_capture().unwrap().instantiate().unwrap();
                assert_eq!(rig.world.calls("ncclCommWindowDeregister"), 0, "{how}");
                graph.launch(&streams[0]).unwrap();
                streams[0].synchronize().unwrap();
                drop(graph);
            }
        }
        comms[1]
            .wait_signal(&[SignalWait::new(0, 1)], &streams[1])
            .unwrap();
        streams[1].synchronize().unwrap();
        let mut want = vec![0u32; 1024];
        want[8..16].fill(5);
        assert_eq!(dst1.to_vec().unwrap(), want, "{how}");
        assert!(
            rig.gpus.violations().is_empty(),
            "{how}: {:?}",
            rig.gpus.violations()
        );
        drop((dst_w, src_w));
        drop((src, dst1, streams, comms));
        rig.assert_clean();
    }
}

#[test]
fn older_nccl_says_one_sided_operations_need_2_29_2() {
    Rig::with_version(2, NcclVersion::new(2, 28, 9)).check(|rig| {
        let Ring { comms, streams } = ring(rig, 2);
        let unsupported = |feature| {
            Err(Error::Unsupported {
                feature,
                needed: "2.29.2".into(),
                found: "2.28.9".into(),
            })
        };
        assert_eq!(
            comms[0].signal(1, Signal::DEFAULT, &streams[0]),
            unsupported("ncclSignal")
        );
        assert_eq!(
            comms[0].wait_signal(&[SignalWait::new(1, 1)], &streams[0]),
            unsupported("ncclWaitSignal")
        );
        let src = nccl_bufs(&comms, |_| 1);
        let w = windows(&comms, &src);
        assert_eq!(
            w[0].put_signal(&src[0], 1, 0, Signal::DEFAULT, &streams[0]),
            unsupported("ncclPutSignal")
        );
        assert_eq!(
            w[0].user_ptr(),
            unsupported("ncclWinGetUserPtr").map(|()| None)
        );
        drop(w);
    });
}
