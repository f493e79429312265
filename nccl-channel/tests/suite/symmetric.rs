//! Symmetric memory ([`Communicator::symmetric`]): allocated by every rank together,
//! registered as a symmetric window, usable as any buffer, released after its work; and
//! every misuse a typed error on every rank.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use cuda_hal::{CaptureMode, DeviceSlice, Stream};
use nccl_channel::{Communicator, Error, ReduceOp, WindowFlags, group};
use nccl_mock::MockNccl;
use nccl_sys::{NcclVersion, ncclResult_t};

use crate::common::{OneRank, Rig, on_one_rank};

/// Two ranks, one thread each, each asking `len(rank)` elements: what each got.
fn each_asks(rig: &Rig, len: impl Fn(usize) -> usize + Sync) -> Vec<Result<usize, Error>> {
    rig.run(2, |c, _| {
        c.symmetric::<f32>(len(c.rank())).map(|b| b.window_bytes())
    })
}

fn disagreement(r: &Result<usize, Error>) -> String {
    match r {
        Err(Error::Disagreement {
            what,
            topic,
            problem,
        }) => {
            assert_eq!(*what, "Communicator::symmetric");
            assert_eq!(*topic, "a symmetric buffer's size");
            problem.clone()
        }
        other => panic!("not a disagreement: {other:?}"),
    }
}

#[test]
fn every_rank_gets_its_part_registered_as_a_symmetric_window() {
    let rig = Rig::new(2);
    let out = rig.run(2, |c, s| {
        let mut b = c.symmetric::<f32>(1024).unwrap();
        assert_eq!(b.len(), 1024);
        assert_eq!(b.window_bytes(), 4096);
        b.fill(c.rank() as f32 + 1.0).unwrap();
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, s).unwrap();
        // A bucket: a view at the same offset on every rank.
        c.all_reduce_in_place(&mut b.slice_mut(256..512).unwrap(), ReduceOp::Sum, s)
            .unwrap();
        s.synchronize().unwrap();
        b.to_vec().unwrap()
    });
    for v in out {
        assert_eq!(v[..256], [3.0; 256]);
        assert_eq!(v[256..512], [6.0; 256]);
    }
    assert_eq!(rig.world.calls("ncclMemAlloc"), 2);
    assert_eq!(rig.world.calls("ncclCommWindowRegister"), 2);
    // Released with the communicators (each buffer went first, on its rank's thread),
    // then the memory.
    assert_eq!(rig.world.calls("ncclMemFree"), 2);
    rig.assert_clean();
}

#[test]
fn one_thread_driving_both_ranks_allocates_them_at_once() {
    let rig = Rig::new(2);
    let ctxs = rig.contexts(2);
    let comms = Communicator::init_all(&rig.nccl, &ctxs).unwrap();
    let streams = [
        Stream::new(&ctxs[0]).unwrap(),
        Stream::new(&ctxs[1]).unwrap(),
    ];
    let mut bufs = Communicator::symmetric_all::<i32>(&[&comms[0], &comms[1]], 8).unwrap();
    bufs[0].fill(5).unwrap();
    bufs[1].fill(7).unwrap();
    group(&rig.nccl, || {
        for (r, b) in bufs.iter_mut().enumerate() {
            comms[r].all_reduce_in_place(b, ReduceOp::Max, &streams[r])?;
        }
        Ok(())
    })
    .unwrap();
    for (b, s) in bufs.iter().zip(&streams) {
        s.synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [7; 8]);
    }
    drop(bufs);
    drop((streams, comms, ctxs));
    rig.assert_clean();
}

#[test]
fn ranks_asking_different_sizes_are_told_so_on_every_rank() {
    let rig = Rig::new(2);
    let out = each_asks(&rig, |r| 1024 * (r + 1));
    for r in &out {
        assert_eq!(
            disagreement(r),
            "the ranks ask different sizes: rank 0 4096 bytes, rank 1 8192 bytes"
        );
    }
    // Nothing was registered, and what was allocated is freed.
    assert_eq!(rig.world.calls("ncclCommWindowRegister"), 0);
    assert_eq!(
        rig.world.calls("ncclMemAlloc"),
        rig.world.calls("ncclMemFree")
    );
    rig.assert_clean();
}

#[test]
fn a_rank_that_cannot_allocate_fails_with_its_error_and_its_peers_are_told() {
    let rig = Rig::new(2);
    rig.world
        .fail_next("ncclMemAlloc", ncclResult_t::ncclSystemError);
    let out = each_asks(&rig, |_| 1024);
    let failed: Vec<usize> = (0..2)
        .filter(|&r| matches!(out[r], Err(Error::Nccl { .. })))
        .collect();
    assert_eq!(failed.len(), 1, "{out:?}");
    let peer = 1 - failed[0];
    assert_eq!(
        disagreement(&out[peer]),
        format!("rank {} could not allocate its part", failed[0])
    );
    assert_eq!(rig.world.calls("ncclCommWindowRegister"), 0);
    rig.assert_clean();
}

#[test]
fn an_empty_buffer_is_refused_on_every_rank() {
    let rig = Rig::new(2);
    for r in each_asks(&rig, |_| 0) {
        assert!(
            matches!(&r, Err(Error::InvalidArgument { what: "Communicator::symmetric", problem })
                if problem.contains("empty")),
            "{r:?}"
        );
    }
    // A rank asking nothing beside one asking something is a disagreement, on both.
    for r in &each_asks(&rig, |r| r * 16) {
        assert_eq!(
            disagreement(r),
            "the ranks ask different sizes: rank 0 0 bytes, rank 1 64 bytes"
        );
    }
    rig.assert_clean();
}

#[test]
fn a_size_past_the_address_space_is_refused_on_every_rank() {
    let rig = Rig::new(2);
    let out = each_asks(&rig, |r| if r == 0 { usize::MAX } else { 8 });
    assert!(
        matches!(&out[0], Err(Error::InvalidArgument { problem, .. }) if problem.contains("overflow")),
        "{:?}",
        out[0]
    );
    assert_eq!(disagreement(&out[1]), "rank 0 could not allocate its part");
    rig.assert_clean();
}

#[test]
fn windows_switched_off_on_a_rank_are_unsupported_on_every_rank() {
    let (cuda, gpus) = cuda_mock::MockDriver::with_devices(2)
        .build_with(cuda_hal::Cuda::from_driver)
        .unwrap();
    let (nccl, world) = MockNccl::new(&gpus).windows(false).build().unwrap();
    let nccl = std::sync::Arc::new(nccl);
    let ctxs: Vec<_> = (0..2)
        .map(|d| cuda.device(d).unwrap().primary_context().unwrap())
        .collect();
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let r = Communicator::symmetric_all::<u8>(&[&comms[0], &comms[1]], 4096);
    assert!(
        matches!(&r, Err(Error::Unsupported { feature: "symmetric memory", found, .. })
            if found.contains("rank 0 made no window")),
        "{r:?}"
    );
    drop((comms, ctxs));
    assert_eq!(world.calls("ncclMemAlloc"), world.calls("ncclMemFree"));
    assert!(world.violations().is_empty(), "{:?}", world.violations());
    drop((nccl, cuda));
}

#[test]
fn an_nccl_before_windows_is_unsupported_before_anything_is_allocated() {
    Rig::with_version(1, NcclVersion(22605)).check_on_one_rank(|rig, OneRank { comm, .. }| {
        let r = comm.symmetric::<f32>(16);
        assert!(
            matches!(
                &r,
                Err(Error::Unsupported {
                    feature: "ncclCommWindowRegister",
                    ..
                })
            ),
            "{r:?}"
        );
        assert_eq!(rig.world.calls("ncclMemAlloc"), 0);
    });
}

#[test]
fn inside_an_open_group_it_is_refused_before_anything_is_allocated() {
    on_one_rank(1, |rig, OneRank { comm, .. }| {
        let r = group(&rig.nccl, || comm.symmetric::<f32>(16).map(drop));
        assert!(
            matches!(&r, Err(Error::InvalidArgument { what: "Communicator::symmetric", problem })
                if problem.contains("open group")),
            "{r:?}"
        );
        assert_eq!(rig.world.calls("ncclMemAlloc"), 0);
    });
}

/// A symmetric buffer dropped on another thread while a collective on it may still run:
/// its window is released on the communicator's thread at its next call, after that
/// work, then its memory (the simulator checks both when the work runs).
#[test]
fn dropped_on_another_thread_it_is_released_after_its_work_at_the_next_call() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut b = comm.symmetric::<f32>(64).unwrap();
        b.fill(2.0).unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
        std::thread::scope(|t| {
            t.spawn(move || drop(b));
        });
        assert_eq!(rig.world.calls("ncclCommWindowDeregister"), 0);
        comm.barrier(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(rig.world.calls("ncclCommWindowDeregister"), 1);
    });
}

/// A graph that recorded a collective on a symmetric buffer keeps the window and the
/// memory until it goes, wherever the buffer was dropped.
#[test]
fn a_graph_keeps_a_dropped_symmetric_buffer_until_it_goes() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let deregistered = || rig.world.calls("ncclCommWindowDeregister");
        let mut b = comm.symmetric::<f32>(64).unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
        let graph = s.end_capture().unwrap();
        drop(b);
        let exec = graph.instantiate().unwrap();
        drop(graph);
        for _ in 0..3 {
            exec.launch(&s).unwrap();
        }
        comm.barrier(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(deregistered(), 0, "the graph holds it");
        drop(exec);
        comm.barrier(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(deregistered(), 1);
    });
}

/// A peer that never comes: a non-blocking communicator's allocation ends at its
/// deadline with a typed error, never a hang.
#[test]
fn a_peer_that_never_allocates_ends_at_the_deadline() {
    let rig = Rig::with_timeout(
        2,
        NcclVersion(nccl_sys::NCCL_VERSION_CODE as i32),
        Duration::from_secs(20),
    );
    let out = rig.non_blocking_ranks(Duration::from_millis(500), |rank, _, c| {
        if rank == 0 {
            c.symmetric::<f32>(16).map(drop)
        } else {
            Ok(())
        }
    });
    assert!(
        matches!(&out[0], Err(Error::Timeout { .. })),
        "{:?}",
        out[0]
    );
    rig.assert_clean();
}

#[test]
fn it_is_a_device_slice_that_may_cross_threads() {
    fn takes<S: DeviceSlice + Send + Sync>(_: &S) {}
    on_one_rank(1, |_, OneRank { comm, .. }| {
        let b = comm.symmetric::<u8>(16).unwrap();
        takes(&b);
        assert_eq!(b.size_bytes(), 16);
    });
}

/// NCCL's symmetric kernels reach a peer's buffer at this rank's offset: ranks whose
/// buffers sit at different offsets of their symmetric buffers (or one outside it) are
/// a sanitizer finding naming both.
#[test]
fn buffers_at_different_offsets_are_a_sanitizer_finding() {
    let rig = Rig::new(2);
    for (case, want) in [
        (
            1,
            "ncclAllReduce: the ranks' sendbuffs are not symmetric: rank 0's is at offset 0 of \
             window 1, rank 1's is at offset 64 of window 1",
        ),
        (
            2,
            "ncclAllReduce: the ranks' sendbuffs are not symmetric: rank 0's is at offset 0 of \
             window 1, rank 1's lies in no symmetric window",
        ),
    ] {
        rig.run(2, |c, s| {
            let mut b = c.symmetric::<f32>(64).unwrap();
            let mut plain = c.alloc_nccl::<f32>(16).unwrap();
            let _ = match (case, c.rank()) {
                (_, 0) => c.all_reduce_in_place(&mut b.slice_mut(0..16).unwrap(), ReduceOp::Sum, s),
                (1, _) => {
                    c.all_reduce_in_place(&mut b.slice_mut(16..32).unwrap(), ReduceOp::Sum, s)
                }
                _ => c.all_reduce_in_place(&mut plain, ReduceOp::Sum, s),
            };
            s.synchronize().unwrap();
        });
        let found = rig.gpus.take_violations();
        assert!(found.iter().any(|v| v == want), "{found:?}");
    }
    rig.assert_clean();
}

/// Every collective, out of place and in place, on symmetric buffers used alike on every
/// rank: right results and no finding (an in-place all-gather sends each rank's own
/// share, at another offset on every rank, as NCCL expects).
#[test]
fn every_collective_runs_on_symmetric_memory_without_a_finding() {
    let rig = Rig::new(2);
    rig.run(2, |c, s| {
        let n = 2;
        let me = c.rank() as i32;
        let mut a = c.symmetric::<i32>(8).unwrap();
        let mut b = c.symmetric::<i32>(8).unwrap();
        a.fill(me + 1).unwrap();
        let run = |what: &str, r: nccl_channel::Result<()>| {
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
        };
        run("all_reduce", c.all_reduce(&a, &mut b, ReduceOp::Sum, s));
        run(
            "all_reduce_in_place",
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, s),
        );
        run(
            "all_gather",
            c.all_gather(&a.slice(0..4).unwrap(), &mut b, s),
        );
        run("all_gather_in_place", c.all_gather_in_place(&mut b, s));
        run(
            "reduce_scatter",
            c.reduce_scatter(&a, &mut b.slice_mut(0..4).unwrap(), ReduceOp::Sum, s),
        );
        run(
            "reduce_scatter_in_place",
            c.reduce_scatter_in_place(&mut b, ReduceOp::Sum, s),
        );
        let root_send = (c.rank() == 0).then(|| a.as_view());
        run("broadcast", c.broadcast(root_send, &mut b, 0, s));
        run("broadcast_in_place", c.broadcast_in_place(&mut b, 0, s));
        let root_recv = (c.rank() == 0).then(|| b.as_view_mut());
        run("reduce", c.reduce(&a, root_recv, ReduceOp::Sum, 0, s));
        run(
            "reduce_in_place",
            c.reduce_in_place(&mut b, ReduceOp::Sum, 0, s),
        );
        run("all_to_all", c.all_to_all(&a, &mut b, s));
        let root_recv = (c.rank() == 0).then(|| b.as_view_mut());
        run("gather", c.gather(&a.slice(0..4).unwrap(), root_recv, 0, s));
        let root_send = (c.rank() == 0).then(|| a.as_view());
        run(
            "scatter",
            c.scatter(root_send, &mut b.slice_mut(0..4).unwrap(), 0, s),
        );
        let counts = vec![4; n];
        let displs = [0, 4];
        run(
            "all_to_all_v",
            c.all_to_all_v(&a, &counts, &displs, &mut b, &counts, &displs, s),
        );
        s.synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [1, 1, 1, 1, 2, 2, 2, 2]);
    });
    // No finding: assert_clean fails on any.
    rig.assert_clean();
}

crate::on_every_backend! {
    /// One rank allocates symmetric memory, runs every collective on it out of place and
    /// in place and drops it while a graph that recorded an all-reduce on it may still be
    /// launched: on the GPU, real ncclMemAlloc and symmetric windows under NCCL's
    /// symmetric kernels (and compute-sanitizer where the runner runs it).
    fn one_rank_runs_every_collective_on_symmetric_memory(m, gpus = 1) {
        use nccl_channel::UniqueId;
        let ctx = &m.ctxs[0];
        let id = UniqueId::generate(&m.nccl).unwrap();
        let comm = Communicator::init_rank(&m.nccl, ctx, &id, 1, 0).unwrap();
        let s = Stream::non_blocking(ctx).unwrap();
        // Every NCCL the GPU runner uses (2.28.3, 2.30.7) has windows: a refusal fails.
        let mut a = comm.symmetric::<f32>(1 << 20).unwrap();
        let mut b = comm.symmetric::<f32>(1 << 20).unwrap();
        a.fill(1.5).unwrap();
        comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s).unwrap();
        comm.all_reduce_in_place(&mut b.slice_mut(4096..8192).unwrap(), ReduceOp::Max, &s)
            .unwrap();
        comm.all_gather(&a, &mut b, &s).unwrap();
        comm.all_gather_in_place(&mut b, &s).unwrap();
        comm.reduce_scatter(&a, &mut b, ReduceOp::Sum, &s).unwrap();
        comm.broadcast_in_place(&mut b, 0, &s).unwrap();
        comm.all_to_all(&a, &mut b, &s).unwrap();
        s.synchronize().unwrap();
        assert!(b.to_vec().unwrap().iter().all(|&v| v == 1.5));
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        comm.all_reduce_in_place(&mut a, ReduceOp::Sum, &s).unwrap();
        let graph = s.end_capture().unwrap().instantiate().unwrap();
        drop(a);
        for _ in 0..4 {
            graph.launch(&s).unwrap();
        }
        s.synchronize().unwrap();
        drop(graph);
        drop(b);
        comm.close().unwrap();
        println!("symmetric memory on one rank: every collective, a graph past the buffer's drop: ok");
    }
}

/// A put into a peer's symmetric buffer: from a communicator that did not allocate it,
/// or past its end, a typed error before anything is issued.
#[test]
fn a_put_from_another_communicator_or_past_the_end_is_refused() {
    let rig = Rig::new(1);
    let ctx = rig.contexts(1).remove(0);
    let comms = Communicator::init_all(&rig.nccl, std::slice::from_ref(&ctx)).unwrap();
    let other = Communicator::init_all(&rig.nccl, std::slice::from_ref(&ctx)).unwrap();
    let s = Stream::new(&ctx).unwrap();
    let src = comms[0].symmetric::<u32>(8).unwrap();
    let dst = comms[0].symmetric::<u32>(8).unwrap();
    let signal = nccl_channel::Signal::DEFAULT;
    let r = dst.put_signal(&other[0], &src.slice(0..4).unwrap(), 0, 0, signal, &s);
    assert!(
        matches!(&r, Err(Error::InvalidArgument { what: "SymmetricBuffer::put_signal", problem })
            if problem.contains("did not allocate")),
        "{r:?}"
    );
    let r = dst.put_signal(&comms[0], &src.slice(0..4).unwrap(), 0, 20, signal, &s);
    assert!(
        matches!(
            &r,
            Err(Error::OutOfWindow {
                offset: 20,
                bytes: 16,
                window: 32,
                ..
            })
        ),
        "{r:?}"
    );
    dst.put_signal(&comms[0], &src.slice(0..4).unwrap(), 0, 16, signal, &s)
        .unwrap();
    comms[0]
        .wait_signal(&[nccl_channel::SignalWait::new(0, 1)], &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(rig.world.calls("ncclPutSignal"), 1);
    drop((src, dst));
    drop((s, comms, other, ctx));
    rig.assert_clean();
}

/// Four ranks, one thread each: each allocates two symmetric buffers, all-reduces and
/// all-gathers on them, and the simulator finds every rank's buffers at the same places.
#[test]
fn four_ranks_allocate_together_and_run_on_it() {
    let rig = Rig::new(4);
    let out = rig.run(4, |c, s| {
        let mut a = c.symmetric::<i32>(4).unwrap();
        let mut b = c.symmetric::<i32>(16).unwrap();
        a.fill(c.rank() as i32).unwrap();
        c.all_reduce_in_place(&mut a, ReduceOp::Sum, s).unwrap();
        c.all_gather(&a, &mut b, s).unwrap();
        s.synchronize().unwrap();
        b.to_vec().unwrap()
    });
    for v in out {
        assert_eq!(v, [6; 16]);
    }
    // No finding: assert_clean fails on any.
    rig.assert_clean();
}

/// The simulator finds a buffer's window as NCCL does (the window with the greatest start
/// at or below the buffer's that holds it): a buffer that starts before a window is in
/// none, and of two windows holding a buffer the later-starting one is its, every time.
/// Correct programs, no finding.
#[test]
fn buffers_are_placed_in_windows_as_nccl_finds_them() {
    let rig = Rig::new(2);
    for _ in 0..5 {
        rig.run(2, |c, s| {
            // A window over the upper half only; the whole buffer starts outside it.
            let mut buf = c.alloc_nccl::<f32>(2048).unwrap();
            let upper = c
                .register_window(&buf.slice(1024..).unwrap(), WindowFlags::COLL_SYMMETRIC)
                .unwrap();
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
            // A symmetric buffer with a second window over its upper half: a bucket there
            // is at offset 0 of that window on every rank.
            let mut sym = c.symmetric::<f32>(2048).unwrap();
            let inner = c
                .register_window(&sym.slice(1024..).unwrap(), WindowFlags::COLL_SYMMETRIC)
                .unwrap();
            c.all_reduce_in_place(&mut sym.slice_mut(1024..1280).unwrap(), ReduceOp::Sum, s)
                .unwrap();
            c.all_reduce_in_place(&mut sym.slice_mut(0..1024).unwrap(), ReduceOp::Sum, s)
                .unwrap();
            s.synchronize().unwrap();
            drop((upper, inner));
        });
    }
    // No finding: assert_clean fails on any.
    rig.assert_clean();
}

/// A blocking communicator too: a peer refused before its exchange (here inside a group)
/// leaves this rank waiting only until the communicator's deadline or the peer's end,
/// then a typed error (the simulated NCCL runs a blocking collective in its call, and
/// ends it when the peer's communicator goes; real NCCL enqueues it, and the exchange's
/// wait ends at the deadline).
#[test]
fn on_a_blocking_communicator_a_peer_that_never_comes_ends_at_the_deadline() {
    let rig = Rig::new(2);
    let config = nccl_channel::CommConfig::new().timeout(Duration::from_millis(500));
    let start = std::time::Instant::now();
    let out = rig.run_with(2, &config, |c, _| {
        let r = if c.rank() == 0 {
            group(&rig.nccl, || c.symmetric::<f32>(16).map(drop))
        } else {
            c.symmetric::<f32>(16).map(drop)
        };
        // Rank 0 stays until rank 1 gave up, so its communicator cannot answer for it.
        std::thread::sleep(Duration::from_secs(1));
        r
    });
    assert!(
        matches!(&out[0], Err(Error::InvalidArgument { .. })),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(&out[1], Err(Error::Timeout { .. } | Error::Nccl { .. })),
        "{:?}",
        out[1]
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    rig.assert_clean();
}

/// Inside a strict capture of this thread, nothing is allocated and the capture goes on.
#[test]
fn inside_a_strict_capture_it_is_refused_and_the_capture_survives() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let r = comm.symmetric::<f32>(16);
        assert!(
            matches!(&r, Err(Error::Cuda(cuda_hal::Error::Capturing { .. }))),
            "{r:?}"
        );
        drop(s.end_capture().unwrap());
        assert_eq!(rig.world.calls("ncclMemAlloc"), 0);
    });
}

/// Windows switched off in one process only (two simulated processes, one rank each):
/// the rank whose NCCL made its window learns from the exchange that its peer's made none,
/// so both get `Unsupported`, and nothing is left behind.
#[test]
fn windows_off_in_one_process_only_are_unsupported_on_both() {
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel::<nccl_channel::UniqueId>();
    let rx = std::sync::Mutex::new(rx);
    let out: Vec<String> = std::thread::scope(|sc| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (tx, rx) = (tx.clone(), &rx);
                sc.spawn(move || {
                    let (cuda, gpus) = cuda_mock::MockDriver::with_devices(1)
                        .build_with(cuda_hal::Cuda::from_driver)
                        .unwrap();
                    let (nccl, world) = MockNccl::new(&gpus)
                        .multi_process(true)
                        .windows(rank == 0)
                        .timeout(Duration::from_secs(20))
                        .build()
                        .unwrap();
                    let nccl = std::sync::Arc::new(nccl);
                    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
                    let id = if rank == 0 {
                        let id = nccl_channel::UniqueId::generate(&nccl).unwrap();
                        tx.send(id).unwrap();
                        id
                    } else {
                        rx.lock().unwrap().recv().unwrap()
                    };
                    let comm = Communicator::init_rank(&nccl, &ctx, &id, 2, rank).unwrap();
                    let r = comm.symmetric::<f32>(1024).map(drop);
                    comm.close().unwrap();
                    drop(ctx);
                    assert!(world.violations().is_empty(), "{:?}", world.violations());
                    assert!(gpus.violations().is_empty(), "{:?}", gpus.violations());
                    drop((nccl, cuda));
                    assert_eq!(gpus.live().device_allocations, 0);
                    match r {
                        Err(Error::Unsupported { found, .. }) => found,
                        other => panic!("rank {rank}: {other:?}"),
                    }
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for found in out {
        assert!(found.contains("rank 1 made no window"), "{found}");
    }
}

/// A symmetric buffer passed where any device slice goes keeps the promises of one: its
/// uses are noted on the buffer (`synchronize_uses` waits for them), it can be held past
/// its borrow (so registrations and graphs can keep it), and it prints as what it is.
#[test]
fn it_notes_its_uses_and_can_be_held_like_any_buffer() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let s = Stream::non_blocking(&ctx).unwrap();
        let mut b = comm.symmetric::<f32>(64).unwrap();
        let syncs = || rig.gpus.calls("cuStreamSynchronize");
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
        let before = syncs();
        b.synchronize_uses().unwrap();
        assert_eq!(syncs() - before, 1, "the all-reduce's stream is waited for");
        let reg = comm.register(&b).unwrap();
        drop(reg);
        let shown = format!("{b:?}");
        assert!(shown.starts_with("SymmetricBuffer { buffer: "), "{shown}");
        assert!(shown.contains("window: 0x"), "{shown}");
        drop((b, s));
    });
}

/// Of two windows holding a buffer's start, NCCL takes the later-starting one: a buffer
/// that runs past that window's end is a finding even where an outer window would hold it.
#[test]
fn a_buffer_past_the_end_of_its_inner_window_is_a_finding() {
    let rig = Rig::new(2);
    rig.run(2, |c, s| {
        let mut sym = c.symmetric::<f32>(2048).unwrap();
        let inner = c
            .register_window(&sym.slice(1024..1536).unwrap(), WindowFlags::COLL_SYMMETRIC)
            .unwrap();
        c.all_reduce_in_place(&mut sym.slice_mut(1280..1792).unwrap(), ReduceOp::Sum, s)
            .unwrap();
        s.synchronize().unwrap();
        drop(inner);
    });
    let found = rig.gpus.take_violations();
    assert!(
        found
            .iter()
            .any(|v| v == "ncclAllReduce: the sendbuff of rank 0 runs past the end of window 2"),
        "{found:?}"
    );
    rig.assert_clean();
}

/// A suspended communicator refuses the crate's collectives as it refuses the program's:
/// a symmetric allocation and a window's registration are `Error::Suspended` before
/// anything reaches NCCL, and work again after the resume.
#[test]
fn a_suspended_communicator_refuses_symmetric_memory_and_windows() {
    on_one_rank(1, |_rig, OneRank { comm, .. }| {
        let buf = comm.alloc_nccl::<u32>(1024).unwrap();
        comm.suspend(nccl_channel::SuspendFlags::MEM).unwrap();
        assert!(
            matches!(comm.symmetric::<f32>(16), Err(Error::Suspended { .. })),
            "a symmetric allocation on a suspended communicator"
        );
        assert!(
            matches!(
                comm.register_window(&buf, WindowFlags::COLL_SYMMETRIC),
                Err(Error::Suspended { .. })
            ),
            "a window on a suspended communicator"
        );
        comm.resume().unwrap();
        assert!(comm.symmetric::<f32>(16).is_ok());
    });
}
