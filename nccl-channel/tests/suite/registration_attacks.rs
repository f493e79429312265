//! Attacks on registrations, windows and the pool from safe code, on the simulated driver
//! and NCCL: each test is a way a release could come before the work that uses it, a
//! release from the wrong thread, a leak, or a pool handing out the wrong memory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{
    MIB_F32, OneRank, Rig, assert_nccl_error, capture, graph_holding_a_registration, on_one_rank,
    pooled,
};
use cuda_hal::{DeviceBuffer, DeviceSlice, Stream};
use nccl_channel::{CommConfig, Communicator, Error, ReduceOp, UniqueId, WindowFlags, group};
use nccl_sys::ncclResult_t;

fn one_non_blocking(rig: &Rig, device: usize) -> (cuda_hal::Context, Communicator) {
    let ctx = rig.context(device);
    let config = CommConfig::non_blocking(Duration::from_secs(5));
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
    (ctx, comm)
}

/// A registration dropped while a graph holds it is still registered in NCCL, so an
/// eager collective on its memory afterwards resolves it: its release must wait for that
/// collective too (it waited only for the graph's streams).
#[test]
fn a_registration_a_graph_holds_still_notes_later_work() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s: s1 }| {
        let s2 = Stream::new(&ctx).unwrap();
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let graph = graph_holding_a_registration(&comm, &mut b, ReduceOp::Sum, &s1);
        // NCCL still has the registration: this all-reduce on s2 uses it.
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
            .unwrap();
        drop(graph);
        // The owner's next call releases it: after the all-reduce on s2.
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        s2.synchronize().unwrap();
    });
}

/// The same inside a group: a registration dropped between two grouped collectives on
/// its memory (another stream each) is resolved by both at the group's end.
#[test]
fn a_registration_dropped_inside_a_group_waits_for_every_grouped_use() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s: s1 }| {
        let s2 = Stream::new(&ctx).unwrap();
        let mut b = comm.alloc_nccl::<i32>(8).unwrap();
        group(&rig.nccl, || {
            let reg = comm.register(&b)?;
            comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s1)?;
            drop(reg);
            comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
        })
        .unwrap();
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
    });
}

/// `trim_pool` on a communicator moved to another thread while this thread's group
/// holds it: refused like every other call (NCCL allows one thread at a time), never a
/// deregistration from that thread.
#[test]
fn trim_pool_is_refused_while_another_thread_groups_the_communicator() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s }| {
        // A pooled buffer registered by an all-gather (the pool registers for those).
        let mut b = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        comm.all_gather_in_place(&mut b, &s).unwrap();
        assert!(b.is_registered());
        s.synchronize().unwrap();
        drop(b);
        assert_eq!(comm.pooled_buffers(), 1);
        // The middle of 1 MiB: no page of it is near the pooled memory, so the group's
        // work does not hold the pooled registration.
        let mut a = DeviceBuffer::<i32>::zeroed(&ctx, 1 << 18).unwrap();
        let world = &rig.world;
        let (r, deregs) = group(&rig.nccl, || {
            let mut mid = a.slice_mut(1 << 17..(1 << 17) + 2)?;
            comm.all_reduce_in_place(&mut mid, ReduceOp::Sum, &s)?;
            let out = std::thread::scope(|sc| {
                sc.spawn(move || {
                    let r = comm.trim_pool();
                    (r, world.calls("ncclCommDeregister"))
                })
                .join()
                .unwrap()
            });
            Ok(out)
        })
        .unwrap();
        assert_eq!(
            deregs, 0,
            "ncclCommDeregister from another thread inside the group"
        );
        assert!(
            matches!(
                r,
                Err(Error::GroupedElsewhere {
                    what: "Communicator"
                })
            ),
            "{r:?}"
        );
        s.synchronize().unwrap();
    });
}

/// NCCL (>= 2.28) writes a window's handle at the outermost `ncclGroupEnd`: inside an
/// open group `register_window` would read it before it is written (a window never
/// released) and NCCL would write it later into a dead stack slot. Refused.
#[test]
fn register_window_inside_an_open_group_is_refused() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let b = comm.alloc_nccl::<f32>(1024).unwrap();
        let r = group(&rig.nccl, || {
            comm.register_window(&b, WindowFlags::DEFAULT)
                .map(|w| w.is_active())
        });
        assert!(
            matches!(&r, Err(Error::InvalidArgument { what: "Communicator::register_window", problem })
                if problem == "called inside an open group: NCCL gives the window only when the \
                               group ends; register windows outside groups (register_windows makes \
                               its own)"),
            "{r:?}"
        );
        let r = group(&rig.nccl, || {
            Communicator::register_windows(&[(&comm, &b)], WindowFlags::DEFAULT).map(|w| w.len())
        });
        assert!(
            matches!(&r, Err(Error::InvalidArgument { what: "Communicator::register_windows", problem })
                if problem == "called inside an open group: NCCL gives the window only when the \
                               group ends; register windows outside groups (register_windows makes \
                               its own)"),
            "{r:?}"
        );
        assert_eq!(rig.world.calls("ncclCommWindowRegister"), 0);
        drop((b, comm, ctx));
    });
}

/// `register_windows` when the wait for one non-blocking rank fails: the windows the
/// other ranks made are released, not leaked with their memory's hold dropped.
#[test]
fn register_windows_releases_the_other_ranks_windows_when_a_wait_fails() {
    Rig::new(2).check(|rig| {
        let (ctx0, c0) = one_non_blocking(rig, 0);
        let (ctx1, c1) = one_non_blocking(rig, 1);
        let b0 = c0.alloc_nccl::<f32>(1024).unwrap();
        let b1 = c1.alloc_nccl::<f32>(1024).unwrap();
        rig.fail_next("ncclCommGetAsyncError", ncclResult_t::ncclSystemError);
        let r = Communicator::register_windows(&[(&c0, &b0), (&c1, &b1)], WindowFlags::DEFAULT);
        assert_nccl_error(
            r.as_ref().unwrap_err(),
            "ncclCommGetAsyncError",
            ncclResult_t::ncclSystemError,
        );
        drop(r);
        assert!(c0.is_aborted());
        // Rank 1's window was made: it must be released (its memory is freed below while
        // rank 1 lives on).
        assert_eq!(rig.world.calls("ncclCommWindowDeregister"), 1);
        drop((b0, b1));
        drop((c0, c1, ctx0, ctx1));
    });
}

/// `DerefMut` lets the caller swap another buffer into a pooled one: the pool must not
/// keep it and hand it out (here memory of another device) as its registered memory.
#[test]
fn a_buffer_swapped_into_a_pooled_one_is_not_pooled() {
    Rig::new(2).check(|rig| {
        let (ctx0, comm) = rig.one_rank(0);
        let ctx1 = rig.context(1);
        let mut p = pooled(&comm).buffer::<f32>(64).unwrap();
        let other = DeviceBuffer::<f32>::zeroed(&ctx1, 64).unwrap();
        // Another owner, as the pooled memory's registration is.
        let hold = other.keep_alive();
        let mine = std::mem::replace(&mut *p, other);
        drop(p);
        drop(hold);
        let q = pooled(&comm).buffer::<f32>(64).unwrap();
        assert!(
            q.context() == comm.context(),
            "the pool handed out memory of device {}",
            q.device().ordinal()
        );
        drop((q, mine));
        comm.trim_pool().unwrap();
        drop((comm, ctx0, ctx1));
    });
}

/// A registration a graph holds is released after the graph's last launch is done: the
/// launch stream is waited for, not only the stream it was captured on.
#[test]
fn the_release_waits_for_the_last_launch_of_the_graph_that_held_it() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s: s1 }| {
        let s2 = Stream::new(&ctx).unwrap();
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let graph = graph_holding_a_registration(&comm, &mut b, ReduceOp::Sum, &s1);
        graph.launch(&s2).unwrap();
        drop(graph);
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        s2.synchronize().unwrap();
    });
}

/// `DeviceBuffer::from_raw_with` promises its release is never called for an empty
/// buffer, whose address may be anything: a release such as `ncclMemFree` must not see it.
#[test]
fn from_raw_with_never_releases_an_empty_buffer() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        // SAFETY: no element, so any address will do (the documented contract).
        let b = unsafe {
            DeviceBuffer::<f32>::from_raw_with(&ctx, 0xdead_b000, 0, move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            })
        };
        assert!(b.is_empty());
        drop(b);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "released an empty buffer");

        // A real one: released once, after its work; `into_raw` refuses to give it away.
        let stream = Stream::new(&ctx).unwrap();
        for give_up in [false, true] {
            calls.store(0, Ordering::SeqCst);
            let (ptr, len) = DeviceBuffer::<u32>::zeroed(&ctx, 16)
                .unwrap()
                .into_raw()
                .unwrap();
            let c = calls.clone();
            let owner = ctx.clone();
            let release = move |p| {
                c.fetch_add(1, Ordering::SeqCst);
                // SAFETY: the allocation handed over below, freed once through a buffer that
                // owns it again.
                drop(unsafe { DeviceBuffer::<u32>::from_raw(&owner, p, 16) });
            };
            // SAFETY: a cuMemAlloc allocation of 16 u32 of `ctx` that nobody else owns; the
            // release frees exactly it.
            let mut b = unsafe { DeviceBuffer::<u32>::from_raw_with(&ctx, ptr, len, release) };
            let src = DeviceBuffer::<u32>::zeroed(&ctx, 16).unwrap();
            b.copy_from_on(&src, &stream).unwrap();
            if give_up {
                // Memory a closure releases is not handed out as a bare address (the closure
                // may own it): the buffer comes back, and its drop releases it once.
                let b = b.into_raw().expect_err("a release closure owns the memory");
                assert_eq!(calls.load(Ordering::SeqCst), 0);
                drop(b);
                assert_eq!(calls.load(Ordering::SeqCst), 1);
            } else {
                drop(b);
                assert_eq!(calls.load(Ordering::SeqCst), 1);
            }
        }
    });
}

/// NCCL registers whole host pages (`ncclRegFind` rounds the buffer out to pages): a
/// collective on memory next to a registered view, in the same page, resolves the
/// registration too, so its release must wait for that collective.
#[test]
fn a_collective_in_the_same_page_as_a_registration_is_waited_for() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut b = comm.alloc_nccl::<f32>(64).unwrap();
        let reg = comm.register(&b.slice(32..64).unwrap()).unwrap();
        comm.all_reduce_in_place(&mut b.slice_mut(0..32).unwrap(), ReduceOp::Sum, &s)
            .unwrap();
        drop(reg);
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        s.synchronize().unwrap();
    });
}

/// NCCL hands out the same (reference-counted) registration when an existing one covers
/// the new range: that shared registration keeps the first one's range after the first
/// handle is released, and the last release must wait for work anywhere in it.
#[test]
fn a_registration_nccl_shares_covers_the_range_it_was_shared_from() {
    on_one_rank(1, |_, OneRank { comm, s, .. }| {
        let mut b = comm.alloc_nccl::<f32>(1 << 16).unwrap();
        let whole = comm.register(&b).unwrap();
        let head = comm.register(&b.slice(0..16).unwrap()).unwrap();
        drop(whole);
        // Far from `head`'s pages, inside the range NCCL still has registered.
        comm.all_reduce_in_place(&mut b.slice_mut(60_000..).unwrap(), ReduceOp::Sum, &s)
            .unwrap();
        drop(head);
        s.synchronize().unwrap();
    });
}

/// Two buffers in one page: NCCL hands the first one's registration out again for the
/// second. The memory of the first must stay allocated while that shared registration
/// lives on in the second (NCCL forbids freeing registered memory).
#[test]
fn a_shared_registration_keeps_the_memory_it_was_made_for() {
    on_one_rank(1, |_, OneRank { ctx, comm, .. }| {
        // The simulated device memory comes from the host's heap, which other tests of this
        // binary use at the same time: enough buffers that two surely share a page.
        let mut bufs: Vec<DeviceBuffer<u8>> = (0..1024)
            .map(|_| DeviceBuffer::zeroed(&ctx, 64).unwrap())
            .collect();
        let page = |b: &DeviceBuffer<u8>| (b.as_raw() / 4096, (b.as_raw() + 63) / 4096);
        let mut by_page = std::collections::HashMap::new();
        let (i, j) = (0..bufs.len())
            .filter(|&i| page(&bufs[i]).0 == page(&bufs[i]).1)
            .find_map(|j| by_page.insert(page(&bufs[j]), j).map(|i| (i, j)))
            .expect("two small buffers in one page");
        let y = bufs.swap_remove(i.max(j));
        let x = bufs.swap_remove(i.min(j));
        let reg_x = comm.register(&x).unwrap();
        let reg_y = comm.register(&y).unwrap();
        drop(reg_x);
        drop(x);
        drop(reg_y);
    });
}

/// A graph of another communicator's collective on a pooled buffer holds its memory but
/// not its registration (only its own communicator's collectives resolve it): the pool
/// must still not hand that memory out again.
#[test]
fn a_pooled_buffer_another_communicators_graph_uses_is_not_handed_out_again() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (_, other) = rig.one_rank(0);
        let s = Stream::new(&ctx).unwrap();
        let mut p = pooled(&comm).buffer::<f32>(64).unwrap();
        let first = p.as_raw();
        let graph = capture(&s, || {
            other
                .all_reduce_in_place(&mut p, ReduceOp::Sum, &s)
                .unwrap();
        });
        drop(p);
        let q = pooled(&comm).buffer::<f32>(64).unwrap();
        assert_ne!(q.as_raw(), first, "the graph still writes that memory");
        graph.launch(&s).unwrap();
        s.synchronize().unwrap();
        drop((q, graph));
    });
}

/// A deregistration that fails so badly that the communicator is aborted: the abort
/// released the registration, so its memory is freed rather than leaked.
#[test]
fn a_failed_deregistration_that_aborts_frees_the_memory() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let b = comm.alloc_nccl::<f32>(16).unwrap();
        let reg = comm.register(&b).unwrap();
        rig.fail_next("ncclCommDeregister", ncclResult_t::ncclSystemError);
        let e = reg.deregister().unwrap_err();
        assert_nccl_error(&e, "ncclCommDeregister", ncclResult_t::ncclSystemError);
        assert!(comm.is_aborted());
        drop((b, comm, ctx));
    });
}

/// `register_windows` when one rank's call fails: the other rank's window is released
/// once, the failed one never.
#[test]
fn register_windows_with_a_failing_rank_releases_the_others_once() {
    Rig::new(2).check(|rig| {
        let (_ctxs, comms) = rig.all_ranks(2);
        let bufs: Vec<DeviceBuffer<f32>> = comms
            .iter()
            .map(|c| c.alloc_nccl::<f32>(1024).unwrap())
            .collect();
        rig.world.fail_after(
            "ncclCommWindowRegister",
            1,
            ncclResult_t::ncclInvalidArgument,
        );
        let pairs: Vec<(&Communicator, &DeviceBuffer<f32>)> = comms.iter().zip(&bufs).collect();
        let r = Communicator::register_windows(&pairs, WindowFlags::DEFAULT);
        assert_nccl_error(
            r.as_ref().unwrap_err(),
            "ncclCommWindowRegister",
            ncclResult_t::ncclInvalidArgument,
        );
        drop(r);
        assert!(rig.world.calls("ncclCommWindowDeregister") <= 1);
        drop(pairs);
        drop(bufs);
    });
}

/// A pooled buffer dropped on another thread: back in the pool, no NCCL call there; one
/// a graph holds: released by the owner after the graph, never from that thread.
#[test]
fn pooled_buffers_dropped_on_other_threads() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        const N: usize = MIB_F32;
        let mut p = pooled(&comm).buffer::<f32>(N).unwrap();
        comm.all_gather_in_place(&mut p, &s).unwrap();
        assert!(p.is_registered());
        std::thread::scope(|sc| sc.spawn(move || drop(p)).join().unwrap());
        assert_eq!(comm.pooled_buffers(), 1);
        let mut p = pooled(&comm).buffer::<f32>(N).unwrap();
        let graph = capture(&s, || {
            comm.all_gather_in_place(&mut p, &s).unwrap();
        });
        std::thread::scope(|sc| sc.spawn(move || drop(p)).join().unwrap());
        assert_eq!(comm.pooled_buffers(), 0);
        graph.launch(&s).unwrap();
        std::thread::spawn(move || drop(graph)).join().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 0);
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
    });
}
