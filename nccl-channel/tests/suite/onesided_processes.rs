//! One-sided puts, signals and waits, suspend/resume and simulated group ends across
//! simulated processes (`MockNccl::multi_process`): each rank with its own simulated
//! driver and NCCL, the ranks meeting over loopback through a hub, as separate OS
//! processes would. The results are those of one process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use cuda_hal::{Context, Cuda, DeviceBuffer, Stream};
use cuda_mock::{MockDriver, MockWorld};
use nccl_channel::{
    CommConfig, Communicator, Error, Group, ReduceOp, Signal, SignalWait, SuspendFlags, UniqueId,
    WindowFlags,
};
use nccl_mock::MockNccl;
use nccl_sys::Nccl;

const SYM: WindowFlags = WindowFlags::COLL_SYMMETRIC;

/// One simulated process: its own GPU, driver and NCCL.
struct Process {
    _cuda: Cuda,
    gpus: MockWorld,
    nccl: Arc<Nccl>,
    ctx: Context,
}

fn process() -> Process {
    let (cuda, gpus) = MockDriver::with_devices(1)
        .build_with(Cuda::from_driver)
        .unwrap();
    let (nccl, _world) = MockNccl::new(&gpus)
        .multi_process(true)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    Process {
        _cuda: cuda,
        gpus,
        nccl: Arc::new(nccl),
        ctx,
    }
}

/// Runs `f` as each of `n` ranks, each in its own simulated process (a thread of the
/// test); the id travels as plain bytes from rank 0, as through a launcher. Each rank's
/// sanitizer must have found nothing.
fn processes<R: Send>(
    n: usize,
    config: &CommConfig,
    f: impl Fn(usize, &Communicator, &Stream) -> R + Sync,
) -> Vec<R> {
    let out = processes_reporting(n, config, |rank, _, comm, stream| f(rank, comm, stream));
    out.into_iter()
        .enumerate()
        .map(|(rank, (r, violations))| {
            assert_eq!(violations, Vec::<String>::new(), "rank {rank}");
            r
        })
        .collect()
}

/// As [`processes`], `f` also given its process; each rank's result with what its
/// process's sanitizer reported.
fn processes_reporting<R: Send>(
    n: usize,
    config: &CommConfig,
    f: impl Fn(usize, &Process, &Communicator, &Stream) -> R + Sync,
) -> Vec<(R, Vec<String>)> {
    let (txs, mut rxs): (Vec<_>, Vec<_>) = (1..n).map(|_| channel::<[u8; 128]>()).unzip();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let rx = (rank > 0).then(|| rxs.remove(0));
                let (f, txs) = (&f, &txs);
                s.spawn(move || {
                    let p = process();
                    let id = match rx {
                        Some(rx) => UniqueId::from_raw(&nccl_sys::ncclUniqueId {
                            internal: rx.recv().unwrap().map(|b| b as std::ffi::c_char),
                        }),
                        None => {
                            let id = UniqueId::generate(&p.nccl).unwrap();
                            txs.iter().for_each(|tx| tx.send(*id.as_bytes()).unwrap());
                            id
                        }
                    };
                    let comm = Communicator::init_rank_with(&p.nccl, &p.ctx, &id, n, rank, config)
                        .unwrap();
                    let stream = Stream::new(&p.ctx).unwrap();
                    let out = f(rank, &p, &comm, &stream);
                    drop(stream);
                    // Closed, not dropped: a dropped blocking communicator aborts, which
                    // would fail its peers' waits for it.
                    if !comm.is_aborted() {
                        comm.close().unwrap();
                    }
                    (out, p.gpus.violations())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn blocking() -> CommConfig {
    CommConfig::new()
}

/// Each rank puts 4 elements of its own into the next rank's window (at its own place)
/// and signals it once more; each waits for the previous rank's two signals. The data
/// crossed from one process's simulated device to the next one's.
#[test]
fn a_ring_of_puts_among_three_processes_delivers_each_ranks_data_to_the_next() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let out = processes(3, &blocking(), |rank, comm, stream| {
        let mut src = comm.alloc_nccl::<u32>(1024).unwrap();
        src.fill(100 + rank as u32).unwrap();
        let mut dst = comm.alloc_nccl::<u32>(1024).unwrap();
        dst.fill(0).unwrap();
        let src_w = comm.register_window(&src, SYM).unwrap();
        let dst_w = comm.register_window(&dst, SYM).unwrap();
        let (next, prev) = ((rank + 1) % 3, (rank + 2) % 3);
        dst_w
            .put_signal(
                &src.slice(0..4).unwrap(),
                next,
                16 * rank,
                Signal::DEFAULT,
                stream,
            )
            .unwrap();
        comm.signal(next, Signal::DEFAULT, stream).unwrap();
        comm.wait_signal(&[SignalWait::new(prev, 2)], stream)
            .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(dst_w.user_ptr().unwrap(), Some(dst.as_raw()));
        let got = dst.to_vec().unwrap();
        drop((src_w, dst_w));
        got
    });
    for (r, got) in out.iter().enumerate() {
        let prev = (r + 2) % 3;
        let mut want = vec![0u32; 1024];
        want[4 * prev..4 * prev + 4].fill(100 + prev as u32);
        assert_eq!(*got, want, "rank {r}");
    }
}

/// Signals count per (receiver, sender), across processes as in one: rank 2 gets three
/// from rank 0 and one from rank 1; a wait for two of rank 0's and one of rank 1's
/// completes, a second wait for rank 1 (whose signal was consumed) is not satisfied by
/// rank 0's spare one and ends at the non-blocking communicator's deadline.
#[test]
fn signals_count_per_sender_and_a_wait_without_signal_times_out_across_processes() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let deadline = Duration::from_millis(400);
    let done = AtomicBool::new(false);
    let out = processes(
        3,
        &CommConfig::non_blocking(deadline),
        |rank, comm, stream| {
            let out = match rank {
                0 | 1 => {
                    for _ in 0..3 - 2 * rank {
                        comm.signal(2, Signal::DEFAULT, stream).unwrap();
                    }
                    comm.wait(stream).unwrap();
                    None
                }
                _ => {
                    let first =
                        comm.wait_signal(&[SignalWait::new(0, 2), SignalWait::new(1, 1)], stream);
                    let first = first.and_then(|()| comm.wait(stream));
                    let second = comm
                        .wait_signal(&[SignalWait::new(1, 1)], stream)
                        .and_then(|()| comm.wait(stream));
                    Some((first, second))
                }
            };
            // Peers stay until rank 2 is done (or a while, should it fail), so no departure
            // ends its wait.
            if rank == 2 {
                done.store(true, Ordering::Release);
            }
            let until = Instant::now() + Duration::from_secs(20);
            while !done.load(Ordering::Acquire) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            out
        },
    );
    assert_eq!(out[..2], [None, None]);
    match &out[2] {
        Some((Ok(()), Err(Error::Timeout { after, .. }))) => assert_eq!(*after, deadline),
        other => panic!("{other:?}"),
    }
}

/// A suspended rank's collectives are refused while its peers in other processes wait;
/// resumed, the collective runs across the processes. A simulated group end predicts a
/// rank's own part, launches nothing, and leaves the ranks in step for the next one.
#[test]
fn suspend_resume_and_simulated_group_ends_across_processes_are_those_of_one_process() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let out = processes(2, &blocking(), |rank, comm, stream| {
        let ctx = comm.context();
        let mut buf = DeviceBuffer::from_slice(ctx, &[rank as u32 + 1; 250_000]).unwrap();
        let mut refused = None;
        if rank == 0 {
            comm.suspend(SuspendFlags::MEM).unwrap();
            assert!(comm.is_suspended());
            refused = Some(comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, stream));
            comm.resume().unwrap();
        }
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, stream)
            .unwrap();
        stream.synchronize().unwrap();
        let summed = buf.to_vec().unwrap()[249_999];

        let g = Group::start(comm.nccl()).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, stream)
            .unwrap();
        // One part of 1 MB: 10 µs + 1 MB at 100 GB/s.
        let predicted = g.simulate_end().unwrap();
        stream.synchronize().unwrap();
        let untouched = buf.to_vec().unwrap()[0];

        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, stream)
            .unwrap();
        stream.synchronize().unwrap();
        (
            refused,
            summed,
            predicted,
            untouched,
            buf.to_vec().unwrap()[7],
        )
    });
    let suspended = Err(Error::Suspended {
        what: "all_reduce_in_place",
    });
    assert_eq!(
        out,
        [
            (Some(suspended), 3, Duration::from_micros(20), 3, 6),
            (None, 3, Duration::from_micros(20), 3, 6),
        ]
    );
}

/// Windows of one place may differ in size from process to process (NCCL allows it and
/// does not check a put against the peer's): registration agrees on the smallest, across
/// the processes, and a put past it is refused on the sender, before NCCL.
#[test]
fn a_put_past_the_receivers_smaller_window_is_refused_by_the_sender() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let out = processes_reporting(2, &blocking(), |rank, _, comm, stream| {
        let mut src = comm.alloc_nccl::<u32>(1024).unwrap();
        src.fill(9).unwrap();
        let mut dst = comm.alloc_nccl::<u32>(1024).unwrap();
        dst.fill(0).unwrap();
        let src_w = comm.register_window(&src, SYM).unwrap();
        // Rank 1's window of the place is 1 KiB, rank 0's 4 KiB.
        let len = if rank == 0 { 1024 } else { 256 };
        let dst_w = comm
            .register_window(&dst.slice(0..len).unwrap(), SYM)
            .unwrap();
        let out = if rank == 0 {
            let r = dst_w.put_signal(&src.slice(0..4).unwrap(), 1, 2048, Signal::DEFAULT, stream);
            Some(format!("{r:?}"))
        } else {
            Some(format!("{}", dst.to_vec().unwrap().iter().all(|&x| x == 0)))
        };
        drop((src_w, dst_w));
        out
    });
    assert_eq!(
        out[0],
        (
            Some(
                "Err(OutOfWindow { what: \"Window::put_signal\", offset: 2048, bytes: 16, window: 1024 })"
                    .to_string()
            ),
            vec![]
        )
    );
    assert_eq!(out[1], (Some("true".to_string()), vec![]));
}

/// A wait for a peer whose process aborted its communicator fails with a remote error
/// instead of waiting out its deadline, as in one process.
#[test]
fn a_wait_for_a_peer_that_aborted_in_its_process_is_a_remote_error() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let aborted = AtomicBool::new(false);
    let out = processes(2, &blocking(), |rank, comm, stream| {
        if rank == 0 {
            // The abort requested, the next wait aborts the communicator.
            comm.abort_handle().abort();
            let mut buf = DeviceBuffer::from_slice(comm.context(), &[1u32]).unwrap();
            let r = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, stream);
            assert_eq!(r, Err(Error::Aborted));
            assert!(comm.is_aborted());
            aborted.store(true, Ordering::Release);
            return None;
        }
        while !aborted.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let started = Instant::now();
        let waited = comm.wait_signal(&[SignalWait::new(0, 1)], stream);
        Some((waited, started.elapsed() < Duration::from_secs(10)))
    });
    match &out[1] {
        Some((Err(Error::Nccl { call, name, .. }), true)) => {
            assert_eq!(
                (*call, name.as_str()),
                ("ncclWaitSignal", "ncclRemoteError")
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A put naming a window its process already released is reported and refused at the
/// call, across processes as in one (raw calls: the safe API's lifetimes rule it out).
#[test]
fn a_put_into_a_released_window_is_reported_across_processes() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let out = processes_reporting(2, &blocking(), |rank, p, comm, stream| {
        let mut src = comm.alloc_nccl::<u32>(1024).unwrap();
        src.fill(1).unwrap();
        let src_w = comm.register_window(&src, SYM).unwrap();
        let dst = comm.alloc_nccl::<u32>(1024).unwrap();
        let f = p.nccl.fns();
        let mut win = std::ptr::null_mut();
        let ptr = std::ptr::without_provenance_mut(dst.as_raw() as usize);
        let sym = nccl_sys::NCCL_WIN_COLL_SYMMETRIC as i32;
        // SAFETY: a live communicator and NCCL memory of 4096 bytes; valid out-pointer.
        let rc =
            unsafe { f.ncclCommWindowRegister.unwrap()(comm.as_raw(), ptr, 4096, &mut win, sym) };
        assert_eq!(rc, nccl_sys::ncclResult_t::ncclSuccess);
        // SAFETY: the window just registered, released once.
        let rc = unsafe { f.ncclCommWindowDeregister.unwrap()(comm.as_raw(), win) };
        assert_eq!(rc, nccl_sys::ncclResult_t::ncclSuccess);
        let src_ptr = std::ptr::without_provenance(src.as_raw() as usize);
        // SAFETY: the mock checks the window handle (released) before anything else runs.
        let rc = unsafe {
            f.ncclPutSignal.unwrap()(
                src_ptr,
                4,
                nccl_sys::ncclDataType_t::ncclUint32,
                1 - rank as i32,
                win,
                0,
                0,
                0,
                0,
                comm.as_raw(),
                stream.as_raw().cast(),
            )
        };
        drop(src_w);
        (rc, format!("{win:p}"))
    });
    for ((rc, win), violations) in out {
        assert_eq!(rc, nccl_sys::ncclResult_t::ncclInvalidArgument);
        assert_eq!(
            violations,
            [format!(
                "ncclPutSignal: window {win} was already released by ncclCommWindowDeregister"
            )]
        );
    }
}
