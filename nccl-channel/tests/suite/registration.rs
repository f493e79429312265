//! NCCL memory, buffer registrations, windows and the default pool, on the simulated
//! driver and NCCL, whose sanitizers check when work runs that the memory and the
//! registrations it resolved are still there, and that releases wait for that work.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{
    MIB_F32, OneRank, Rig, capture, graph_holding_a_registration, on_one_rank, pooled, streams,
};
use cuda_hal::{CaptureMode, DeviceBuffer, DeviceView, Stream};
use nccl_channel::{Communicator, Error, ReduceOp, WindowFlags, group};
use nccl_sys::NcclVersion;

#[test]
fn registered_nccl_memory_all_reduces_and_is_released_after_its_work() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let mut b = c.alloc_nccl::<f32>(8).unwrap();
            b.copy_from_host(&[c.rank() as f32 + 1.0; 8]).unwrap();
            let reg = c.register(&b).unwrap();
            assert_eq!(reg.device_ptr(), b.as_raw());
            assert_eq!(reg.size_bytes(), 32);
            c.all_reduce_in_place(&mut b, ReduceOp::Sum, s).unwrap();
            // Dropped with the all-reduce possibly still running: the release waits for it
            // (the mock reports a deregistration the host did not wait for).
            drop(reg);
            b.to_vec().unwrap()
        });
        assert_eq!(out, vec![vec![3.0f32; 8]; 2]);
        assert_eq!(rig.world.calls("ncclCommRegister"), 2);
        assert_eq!(rig.world.calls("ncclCommDeregister"), 2);
        assert_eq!(rig.world.calls("ncclMemAlloc"), 2);
        assert_eq!(rig.world.calls("ncclMemFree"), 2);
    });
}

#[test]
fn a_registration_keeps_its_memory_until_it_is_released() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let b = comm.alloc_nccl::<u32>(64).unwrap();
        let reg = comm.register(&b.slice(16..32).unwrap()).unwrap();
        assert_eq!(reg.size_bytes(), 64);
        drop(b);
        // The buffer is gone, the registration still holds the memory (freeing registered
        // memory is a violation in the mock).
        assert_eq!(rig.world.calls("ncclMemFree"), 0);
        drop(reg);
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        assert_eq!(rig.world.calls("ncclMemFree"), 1);
        drop(comm);
        drop(ctx);
    });
}

#[test]
fn a_graph_keeps_the_registration_its_collectives_resolved() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut b = comm.alloc_nccl::<i32>(4).unwrap();
        b.copy_from_host(&[1, 2, 3, 4]).unwrap();
        let graph = graph_holding_a_registration(&comm, &mut b, ReduceOp::Sum, &s);
        drop(b);
        // The captured all-reduce still resolves the registration: it must stay.
        assert_eq!(rig.world.calls("ncclCommDeregister"), 0);
        graph.launch(&s).unwrap();
        graph.launch(&s).unwrap();
        s.synchronize().unwrap();
        drop(graph);
        // Released at the owner's next call.
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        s.synchronize().unwrap();
        drop(comm);
        drop(s);
    });
}

#[test]
fn a_graph_dropped_on_another_thread_hands_the_release_to_the_owner() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let graph = graph_holding_a_registration(&comm, &mut b, ReduceOp::Max, &s);
        graph.launch(&s).unwrap();
        s.synchronize().unwrap();
        std::thread::spawn(move || drop(graph)).join().unwrap();
        // No NCCL call from the other thread.
        assert_eq!(rig.world.calls("ncclCommDeregister"), 0);
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        drop(b);
        drop(comm);
        drop(s);
    });
}

#[test]
fn grouped_work_keeps_the_registration_until_the_group_ends() {
    Rig::new(2).check(|rig| {
        let (ctxs, comms) = rig.all_ranks(2);
        let streams: Vec<Stream> = streams(&ctxs);
        let mut bufs: Vec<DeviceBuffer<i32>> = comms
            .iter()
            .map(|c| {
                let mut b = c.alloc_nccl::<i32>(4).unwrap();
                b.fill(c.rank() as i32 + 1).unwrap();
                b
            })
            .collect();
        group(&rig.nccl, || {
            for ((c, b), s) in comms.iter().zip(bufs.iter_mut()).zip(&streams) {
                let reg = c.register(&*b)?;
                c.all_reduce_in_place(b, ReduceOp::Sum, s)?;
                // Dropped inside the group, before NCCL enqueued the work.
                drop(reg);
            }
            assert_eq!(rig.world.calls("ncclCommDeregister"), 0);
            Ok(())
        })
        .unwrap();
        for (c, s) in comms.iter().zip(&streams) {
            s.synchronize().unwrap();
            // Any call of the owner releases what waits for it.
            c.async_error().unwrap();
        }
        assert_eq!(rig.world.calls("ncclCommDeregister"), 2);
        for b in &bufs {
            assert_eq!(b.to_vec().unwrap(), [3; 4]);
        }
        drop(bufs);
        drop(comms);
        drop(streams);
    });
}

#[test]
fn windows_are_registered_collectively_and_used_by_collectives() {
    Rig::new(2).check(|rig| {
        let (ctxs, comms) = rig.all_ranks(2);
        let streams: Vec<Stream> = streams(&ctxs);
        let mut bufs: Vec<DeviceBuffer<f32>> = comms
            .iter()
            .map(|c| {
                let mut b = c.alloc_nccl::<f32>(1024).unwrap();
                b.fill(c.rank() as f32).unwrap();
                b
            })
            .collect();
        let pairs: Vec<(&Communicator, &DeviceBuffer<f32>)> =
            comms.iter().zip(bufs.iter()).collect();
        let wins = Communicator::register_windows(&pairs, WindowFlags::COLL_SYMMETRIC).unwrap();
        assert_eq!(wins.len(), 2);
        assert!(wins.iter().all(|w| w.is_active()));
        assert_eq!(wins[1].size_bytes(), 4096);
        group(&rig.nccl, || {
            for ((c, b), s) in comms.iter().zip(bufs.iter_mut()).zip(&streams) {
                c.all_reduce_in_place(b, ReduceOp::Sum, s)?;
            }
            Ok(())
        })
        .unwrap();
        drop(wins);
        assert_eq!(rig.world.calls("ncclCommWindowDeregister"), 2);
        for b in &bufs {
            assert_eq!(b.to_vec().unwrap(), vec![1.0f32; 1024]);
        }
        drop(bufs);
        drop(comms);
        drop(streams);
    });
}

#[test]
fn window_on_plain_memory_is_nccls_invalid_argument() {
    on_one_rank(1, |_, OneRank { ctx, comm, .. }| {
        let plain = DeviceBuffer::<f32>::zeroed(&ctx, 1024).unwrap();
        match comm.register_window(&plain, WindowFlags::COLL_SYMMETRIC) {
            Err(Error::Nccl { call, code, .. }) => {
                assert_eq!(call, "ncclCommWindowRegister");
                assert_eq!(code, nccl_sys::ncclResult_t::ncclInvalidArgument);
            }
            other => panic!("expected NCCL's invalid argument, got {other:?}"),
        }
        // A misaligned offset into NCCL memory is refused too.
        let nm = comm.alloc_nccl::<f32>(2048).unwrap();
        let r = comm
            .register_window(&nm.slice(1..).unwrap(), WindowFlags::DEFAULT)
            .map(drop);
        assert!(
            matches!(
                r,
                Err(Error::Nccl {
                    call: "ncclCommWindowRegister",
                    ..
                })
            ),
            "{r:?}"
        );
        // 4096 bytes in is aligned.
        let w = comm
            .register_window(&nm.slice(1024..).unwrap(), WindowFlags::DEFAULT)
            .unwrap();
        assert_eq!(w.device_ptr(), nm.as_raw() + 4096);
        w.deregister().unwrap();
        drop((plain, nm));
        drop(comm);
    });
}

#[test]
fn older_nccl_says_which_release_it_needs() {
    let rig = Rig::with_version(1, NcclVersion::new(2, 26, 5));
    let (ctx, comm) = rig.one_rank(0);
    let b = comm.alloc_nccl::<f32>(1024).unwrap();
    match comm.register_window(&b, WindowFlags::COLL_SYMMETRIC) {
        Err(Error::Unsupported {
            feature,
            needed,
            found,
        }) => {
            assert_eq!(feature, "ncclCommWindowRegister");
            assert_eq!(needed, "2.27.3");
            assert_eq!(found, "2.26.5");
        }
        other => panic!("{other:?}"),
    }
    // Local registration exists in 2.26.
    comm.register(&b).unwrap().deregister().unwrap();
    drop((b, comm));
    drop(ctx);
    rig.assert_clean();

    let rig = Rig::with_version(1, NcclVersion::new(2, 18, 3));
    let (ctx, comm) = rig.one_rank(0);
    match comm.alloc_nccl::<f32>(4) {
        Err(Error::Unsupported {
            feature, needed, ..
        }) => {
            assert_eq!(feature, "ncclMemAlloc");
            assert_eq!(needed, "2.19.3");
        }
        other => panic!("{other:?}"),
    }
    let plain = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
    assert!(matches!(
        comm.register(&plain),
        Err(Error::Unsupported {
            feature: "ncclCommRegister",
            ..
        })
    ));
    // The pool falls back to plain memory.
    let p = pooled(&comm).buffer::<f32>(4).unwrap();
    assert!(!p.is_registered());
    drop((p, plain));
    drop(comm);
    drop(ctx);
    rig.assert_clean();
}

#[test]
fn registering_what_cannot_be_held_or_is_elsewhere_is_refused() {
    Rig::new(2).check(|rig| {
        let (ctxs, comms) = rig.all_ranks(2);
        let other = DeviceBuffer::<f32>::zeroed(&ctxs[1], 4).unwrap();
        assert!(matches!(
            comms[0].register(&other),
            Err(Error::WrongDevice {
                expected: 0,
                found: 1,
                ..
            })
        ));
        let mine = DeviceBuffer::<f32>::zeroed(&ctxs[0], 4).unwrap();
        match comms[0].register(&mine.slice(2..2).unwrap()) {
            Err(Error::InvalidArgument { problem, .. }) => {
                assert!(problem.contains("empty"), "{problem}")
            }
            other => panic!("{other:?}"),
        }
        // An address vouched for by the caller cannot be held past its borrow.
        // SAFETY: `mine` holds 4 f32 and outlives the view.
        let raw = unsafe { DeviceView::<f32>::from_raw_parts(&ctxs[0], mine.as_raw(), 4) };
        match comms[0].register(&raw) {
            Err(Error::InvalidArgument { problem, .. }) => {
                assert!(problem.contains("keep_alive"), "{problem}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rig.world.calls("ncclCommRegister"), 0);
        drop((other, mine, comms));
    });
}

#[test]
fn the_pool_reuses_its_memory_and_registers_it_once_for_collectives_that_gain() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut addrs = Vec::new();
        for step in 0..4 {
            let mut g = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
            // All-reduce does not gain from registration: the buffer stays unregistered.
            g.fill(step as f32).unwrap();
            comm.all_reduce_in_place(&mut g, ReduceOp::Sum, &s).unwrap();
            assert_eq!(g.is_registered(), step > 0, "step {step}");
            // All-gather does: registered at its first use, then kept.
            comm.all_gather_in_place(&mut g, &s).unwrap();
            assert!(g.is_registered());
            addrs.push(g.as_raw());
        }
        assert!(addrs.iter().all(|a| *a == addrs[0]), "{addrs:x?}");
        assert_eq!(rig.world.calls("ncclCommRegister"), 1);
        assert_eq!(rig.world.calls("ncclMemAlloc"), 1);
        // Two at once: two buffers; another length or type: another buffer.
        let a = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let b = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let c = pooled(&comm).buffer::<i32>(MIB_F32).unwrap();
        assert!(a.is_registered() && !b.is_registered() && !c.is_registered());
        assert_ne!(a.as_raw(), b.as_raw());
        drop((a, b, c));
        assert_eq!(comm.pooled_buffers(), 3);
        comm.trim_pool().unwrap();
        assert_eq!(comm.pooled_buffers(), 0);
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        assert_eq!(rig.world.calls("ncclMemFree"), 3);
        drop(comm);
        drop(s);
    });
}

#[test]
fn the_pool_registers_only_for_collectives_and_sizes_that_gain() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let mut big = pooled(c).buffer::<f32>(2 * MIB_F32).unwrap();
            big.fill(c.rank() as f32).unwrap();
            // Broadcast and the reductions never register (broadcast got slower with it).
            c.broadcast_in_place(&mut big, 1, s).unwrap();
            c.reduce_scatter_in_place(&mut big, ReduceOp::Sum, s)
                .unwrap();
            c.reduce_in_place(&mut big, ReduceOp::Sum, 0, s).unwrap();
            let after_reductions = big.is_registered();
            // An all-gather of less than the test table's 1 MiB per buffer does not either...
            let mut small = pooled(c).buffer::<f32>(MIB_F32 / 2).unwrap();
            c.all_gather_in_place(&mut small, s).unwrap();
            // ...a send/receive of a whole buffer does.
            let peer = 1 - c.rank();
            let mut pair = pooled(c).buffer::<f32>(MIB_F32).unwrap();
            pair.fill(c.rank() as f32 + 7.0).unwrap();
            if c.rank() == 0 {
                c.send(&*pair, peer, s).unwrap();
            } else {
                c.recv(&mut pair, peer, s).unwrap();
            }
            s.synchronize().unwrap();
            let got = pair.to_vec().unwrap()[0];
            (
                after_reductions,
                small.is_registered(),
                pair.is_registered(),
                got,
            )
        });
        assert_eq!(
            out,
            vec![(false, false, true, 7.0), (false, false, true, 7.0)]
        );
        assert_eq!(rig.world.calls("ncclCommRegister"), 2);
    });
}

#[test]
fn a_pooled_buffer_held_by_a_graph_is_not_handed_out_again() {
    on_one_rank(1, |_, OneRank { comm, s, .. }| {
        let mut g = pooled(&comm).buffer::<f32>(64).unwrap();
        let first = g.as_raw();
        let graph = capture(&s, || {
            comm.all_reduce_in_place(&mut g, ReduceOp::Sum, &s).unwrap();
        });
        drop(g);
        // The graph may still write it: the next buffer is other memory.
        let h = pooled(&comm).buffer::<f32>(64).unwrap();
        assert_ne!(h.as_raw(), first);
        graph.launch(&s).unwrap();
        s.synchronize().unwrap();
        drop((h, graph));
        drop(comm);
        drop(s);
    });
}

#[test]
fn pooled_buffers_of_an_aborted_communicator_are_released() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        drop(pooled(&comm).buffer::<u8>(100).unwrap());
        assert_eq!(comm.pooled_buffers(), 1);
        comm.abort().unwrap();
        // NCCL released the registration with the communicator; the memory went after.
        assert_eq!(rig.world.calls("ncclCommDeregister"), 0);
        assert_eq!(rig.world.calls("ncclMemFree"), 1);
        drop(ctx);
    });
}

#[test]
fn window_flags_are_a_bit_set() {
    assert_eq!(
        WindowFlags::COLL_SYMMETRIC | WindowFlags::STRICT_ORDERING,
        WindowFlags(3)
    );
    assert_eq!(
        WindowFlags::DEFAULT | WindowFlags::STRICT_ORDERING,
        WindowFlags(2)
    );
    // A union: a flag given twice stays set.
    assert_eq!(
        WindowFlags::COLL_SYMMETRIC | WindowFlags::COLL_SYMMETRIC,
        WindowFlags::COLL_SYMMETRIC
    );
}

#[test]
fn registrations_windows_and_pooled_buffers_describe_themselves() {
    on_one_rank(1, |_, OneRank { ctx, comm, .. }| {
        let b = comm.alloc_nccl::<f32>(1024).unwrap();
        let reg = comm.register(&b.slice(0..16).unwrap()).unwrap();
        assert_eq!(
            format!("{reg:?}"),
            format!(
                "Registration {{ ptr: {:#x}, bytes: 64, rank: 0 }}",
                b.as_raw()
            )
        );
        let win = comm.register_window(&b, WindowFlags::DEFAULT).unwrap();
        assert_eq!(
            format!("{win:?}"),
            format!(
                "Window {{ ptr: {:#x}, bytes: 4096, active: true }}",
                b.as_raw()
            )
        );
        let p = pooled(&comm).buffer::<u8>(4).unwrap();
        assert_eq!(
            format!("{p:?}"),
            format!(
                "PooledBuffer {{ buffer: Some(DeviceBuffer {{ device: 0, ptr: {:#x}, len: 4 }}), \
                 registered: false }}",
                p.as_raw()
            )
        );
        drop((reg, win, p, b));
        drop(comm);
        drop(ctx);
    });
}

#[test]
fn a_failed_window_release_is_reported_by_deregister() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let b = comm.alloc_nccl::<f32>(1024).unwrap();
        let win = comm.register_window(&b, WindowFlags::DEFAULT).unwrap();
        // A failure that aborts the communicator (which releases the window with it).
        rig.fail_next(
            "ncclCommWindowDeregister",
            nccl_sys::ncclResult_t::ncclSystemError,
        );
        match win.deregister() {
            Err(Error::Nccl { call, code, .. }) => {
                assert_eq!(call, "ncclCommWindowDeregister");
                assert_eq!(code, nccl_sys::ncclResult_t::ncclSystemError);
            }
            other => panic!("expected the deregistration's error, got {other:?}"),
        }
        assert!(comm.is_aborted());
        drop(b);
        drop(comm);
        drop(ctx);
    });
}

#[test]
fn the_pool_keeps_at_most_eight_buffers_of_one_shape() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let bufs: Vec<_> = (0..9)
            .map(|_| pooled(&comm).buffer::<u8>(16).unwrap())
            .collect();
        assert_eq!(rig.world.calls("ncclMemAlloc"), 9);
        drop(bufs);
        assert_eq!(comm.pooled_buffers(), 8);
        assert_eq!(rig.world.calls("ncclMemFree"), 1, "the ninth is freed");
        comm.trim_pool().unwrap();
        assert_eq!(rig.world.calls("ncclMemFree"), 9);
        drop(comm);
        drop(ctx);
    });
}

#[test]
fn a_pooled_buffer_can_be_registered_by_hand() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let p = pooled(&comm).buffer::<f32>(16).unwrap();
        let reg = comm.register(&p).unwrap();
        assert_eq!((reg.device_ptr(), reg.size_bytes()), (p.as_raw(), 64));
        assert_eq!(rig.world.calls("ncclCommRegister"), 1);
        drop(reg);
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        drop(p);
        drop(comm);
        drop(ctx);
    });
}

#[test]
fn registering_one_pooled_buffer_leaves_the_others_registrable() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut a = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let mut b = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let mut c = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        comm.all_gather_in_place(&mut b, &s).unwrap();
        assert_eq!(
            (a.is_registered(), b.is_registered(), c.is_registered()),
            (false, true, false)
        );
        comm.all_gather_in_place(&mut a, &s).unwrap();
        comm.all_gather_in_place(&mut c, &s).unwrap();
        assert_eq!(
            (a.is_registered(), b.is_registered(), c.is_registered()),
            (true, true, true)
        );
        assert_eq!(rig.world.calls("ncclCommRegister"), 3);
        s.synchronize().unwrap();
        drop((a, b, c));
        comm.trim_pool().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 3);
        drop(comm);
        drop(s);
    });
}

#[test]
fn a_registered_pooled_buffer_of_an_aborted_communicator_is_not_pooled() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut p = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        comm.all_gather_in_place(&mut p, &s).unwrap();
        assert!(p.is_registered());
        s.synchronize().unwrap();
        // A deregistration that fails aborts the communicator (NCCL released everything).
        let other = comm.alloc_nccl::<f32>(16).unwrap();
        let reg = comm.register(&other).unwrap();
        rig.fail_next(
            "ncclCommDeregister",
            nccl_sys::ncclResult_t::ncclSystemError,
        );
        assert!(matches!(
            reg.deregister(),
            Err(Error::Nccl {
                call: "ncclCommDeregister",
                ..
            })
        ));
        assert!(comm.is_aborted());
        drop(p);
        assert_eq!(
            comm.pooled_buffers(),
            0,
            "its registration is gone with NCCL"
        );
        drop(other);
        drop(comm);
        assert_eq!(rig.world.calls("ncclMemFree"), 2);
        drop(s);
    });
}

#[test]
fn a_registration_keeps_only_its_own_memory() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let a = comm.alloc_nccl::<f32>(16).unwrap();
        let b = comm.alloc_nccl::<f32>(16).unwrap();
        let reg_a = comm.register(&a).unwrap();
        let reg_b = comm.register(&b).unwrap();
        let w = comm.alloc_nccl::<f32>(1024).unwrap();
        let win = comm.register_window(&w, WindowFlags::DEFAULT).unwrap();
        drop((reg_a, a));
        // Neither the later registration nor the window holds the first one's memory.
        assert_eq!(rig.world.calls("ncclMemFree"), 1);
        drop((reg_b, b));
        assert_eq!(rig.world.calls("ncclMemFree"), 2);
        drop((win, w));
        assert_eq!(rig.world.calls("ncclMemFree"), 3);
        drop(comm);
        drop(ctx);
    });
}

#[test]
fn an_empty_collective_does_not_resolve_a_registration() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let reg = comm.register(&b).unwrap();
        let graph = capture(&s, || {
            comm.all_reduce_in_place(&mut b.slice_mut(4..4).unwrap(), ReduceOp::Sum, &s)
                .unwrap();
        });
        drop(reg);
        // The graph touches no byte of it: the registration goes at once.
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        graph.launch(&s).unwrap();
        s.synchronize().unwrap();
        drop((graph, b));
        drop(comm);
        drop(s);
    });
}

/// The registry rounds a registration out to 64 KiB pages: work that ends exactly where
/// those pages begin, or begins exactly where they end, does not resolve it.
#[test]
fn work_just_outside_a_registrations_pages_does_not_hold_it() {
    const PAGE: u64 = 64 << 10;
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    let mut b = comm.alloc_nccl::<f32>(4 * PAGE as usize / 4).unwrap();
    let base = b.as_raw();
    // The first 64 KiB boundary after the start: a page with memory on both sides.
    let start = (base + 1).next_multiple_of(PAGE);
    let at = ((start - base) / 4) as usize;
    let reg = comm.register(&b.slice(at..at + 1).unwrap()).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let before = at - 4..at;
    let after = at + PAGE as usize / 4..at + PAGE as usize / 4 + 4;
    for r in [before, after] {
        comm.all_reduce_in_place(&mut b.slice_mut(r).unwrap(), ReduceOp::Sum, &s)
            .unwrap();
    }
    let graph = s.end_capture().unwrap().instantiate().unwrap();
    drop(reg);
    assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
    graph.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop((graph, b));
    drop(comm);
    drop(s);
    drop(ctx);
    rig.assert_clean();
}

/// A synchronous copy from a pooled buffer into which s-ordered memory was swapped
/// waits for that memory's allocation first.
#[test]
fn a_synchronous_copy_from_a_pooled_buffer_waits_for_its_memory() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let pool = Stream::non_blocking(&ctx).unwrap();
        let mut p = pooled(&comm).buffer::<u32>(4).unwrap();
        let ordered = DeviceBuffer::<u32>::alloc_on(&pool, 4).unwrap();
        let mine = std::mem::replace(&mut *p, ordered);
        let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
        let syncs = rig.gpus.calls("cuStreamSynchronize");
        dst.copy_from(&p).unwrap();
        assert_eq!(
            rig.gpus.calls("cuStreamSynchronize") - syncs,
            2,
            "the allocation s, then the legacy one"
        );
        drop((p, dst, mine));
        pool.synchronize().unwrap();
        drop(comm);
        drop(pool);
    });
}

/// NCCL without windows (`NCCL_WIN_ENABLE=0`) succeeds with no window: the `Window` is
/// inactive, collectives run as without it, and its drop releases nothing through NCCL.
#[test]
fn a_window_nccl_declines_is_inactive_and_released_without_nccl() {
    let rig = Rig::with_nccl(1, |nccl| nccl.windows(false));
    rig.check_on_one_rank(|rig, OneRank { comm, s, .. }| {
        let mut b = comm.alloc_nccl::<f32>(1024).unwrap();
        b.fill(2.0).unwrap();
        let win = comm
            .register_window(&b, WindowFlags::COLL_SYMMETRIC)
            .unwrap();
        assert!(!win.is_active());
        assert_eq!(
            format!("{win:?}"),
            format!(
                "Window {{ ptr: {:#x}, bytes: 4096, active: false }}",
                b.as_raw()
            )
        );
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
        win.deregister().unwrap();
        assert_eq!(rig.world.calls("ncclCommWindowRegister"), 1);
        assert_eq!(rig.world.calls("ncclCommWindowDeregister"), 0);
        assert_eq!(b.to_vec().unwrap(), vec![2.0f32; 1024]);
        drop(b);
        assert_eq!(rig.world.calls("ncclMemFree"), 1);
    });
}

/// NCCL without local registration (`NCCL_LOCAL_REGISTER=0`) succeeds with no handle:
/// such registrations are not one shared registration, each holds only its own memory,
/// and their release calls nothing.
#[test]
fn registrations_nccl_declines_hold_only_their_own_memory() {
    let rig = Rig::with_nccl(1, |nccl| nccl.local_registration(false));
    rig.check_on_one_rank(|rig, OneRank { comm, s, .. }| {
        let mut a = comm.alloc_nccl::<f32>(16).unwrap();
        let b = comm.alloc_nccl::<f32>(16).unwrap();
        a.fill(1.5).unwrap();
        let reg_a = comm.register(&a).unwrap();
        let reg_b = comm.register(&b).unwrap();
        comm.all_reduce_in_place(&mut a, ReduceOp::Sum, &s).unwrap();
        assert_eq!(a.to_vec().unwrap(), vec![1.5f32; 16]);
        drop((reg_a, a));
        assert_eq!(
            rig.world.calls("ncclMemFree"),
            1,
            "b's registration holds only b"
        );
        drop((reg_b, b));
        assert_eq!(rig.world.calls("ncclMemFree"), 2);
        assert_eq!(rig.world.calls("ncclCommRegister"), 2);
        assert_eq!(
            rig.world.calls("ncclCommDeregister"),
            0,
            "nothing to release"
        );
    });
}
