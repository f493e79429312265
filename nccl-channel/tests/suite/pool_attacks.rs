//! Attacks on the pool's lazy registration (`Communicator::buffer`, registered by the first
//! collective that gains from it), on the simulated driver and NCCL: registration inside
//! groups and captures, views, other communicators, aborts, non-blocking communicators,
//! and user code that runs in the middle of a registration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::common::{MIB_F32, OneRank, Rig, capture, on_one_rank, pooled};
use cuda_hal::{Context, Dependency, DeviceBuffer, DeviceSlice, DeviceSliceMut, KeepAlive, Stream};
use cuda_sys::CUdeviceptr;
use nccl_channel::{CommConfig, Communicator, PooledBuffer, ReduceOp, UniqueId, group};
use nccl_sys::ncclResult_t;

/// The `DeviceSlice` items that forward to the `buf: DeviceBuffer<f32>` field unchanged.
macro_rules! forward_to_buf {
    () => {
        type Elem = f32;
        fn device_ptr(&self) -> CUdeviceptr {
            self.buf.as_raw()
        }
        fn len(&self) -> usize {
            self.buf.len()
        }
        fn context(&self) -> &Context {
            self.buf.context()
        }
    };
}

/// Memory whose first use on a stream runs `on_use` (user code inside a collective's
/// checks), otherwise a `DeviceBuffer`.
struct OnUse {
    buf: DeviceBuffer<f32>,
    on_use: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

// SAFETY: forwards to the `DeviceBuffer`, which keeps the promises; `on_use` does not
// touch the memory.
unsafe impl DeviceSlice for OnUse {
    forward_to_buf!();
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        let f = self.on_use.lock().unwrap().take();
        if let Some(f) = f {
            f();
        }
        self.buf.used_on(stream)
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(self.buf.keep_alive())
    }
}

// SAFETY: as above; `&mut OnUse` is the only writer of its buffer.
unsafe impl DeviceSliceMut for OnUse {}

/// A shared owner of memory that runs `on_drop` when the last one goes.
struct Hook {
    _memory: KeepAlive,
    on_drop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Dependency for Hook {}

impl Drop for Hook {
    fn drop(&mut self) {
        let f = self.on_drop.lock().unwrap().take();
        if let Some(f) = f {
            f();
        }
    }
}

/// Memory whose `keep_alive` is a [`Hook`].
struct Hooked {
    buf: DeviceBuffer<f32>,
    hook: Arc<Hook>,
}

// SAFETY: forwards to the `DeviceBuffer`; the hook holds the buffer's memory.
unsafe impl DeviceSlice for Hooked {
    forward_to_buf!();
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        self.buf.used_on(stream)
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(KeepAlive::new(self.hook.clone()))
    }
}

/// A registration's release can run user code (the last drop of a `KeepAlive` it held)
/// in the middle of the pool's lazy registration, and a pooled buffer may drop on
/// another thread meanwhile (its memory was swapped out and is what the collective
/// uses). The pool must neither hold its slot's lock across that code (the other
/// thread's drop waits for it: a deadlock once the user code waits for that thread) nor
/// let the new registration go before the collective's use of it is noted (its release
/// would not wait for the collective).
#[test]
fn a_pooled_buffer_dropped_during_its_lazy_registration() {
    on_one_rank(1, |_, OneRank { ctx, comm, s }| {
        let s2 = Stream::new(&ctx).unwrap();

        // A registration whose memory owner is a hook, held by a graph: released later, at
        // the owner's first call after the graph goes.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (ack_tx, ack_rx) = mpsc::channel::<()>();
        static STALLED: AtomicBool = AtomicBool::new(false);
        let x = DeviceBuffer::<f32>::zeroed(&ctx, 16).unwrap();
        let hook = Arc::new(Hook {
            _memory: x.keep_alive(),
            on_drop: Mutex::new(Some(Box::new(move || {
                go_tx.send(()).unwrap();
                if ack_rx.recv_timeout(Duration::from_secs(3)).is_err() {
                    STALLED.store(true, Ordering::SeqCst);
                }
            }))),
        });
        let hooked = Hooked { buf: x, hook };
        let reg = comm.register(&hooked).unwrap();
        let mut out = DeviceBuffer::<f32>::zeroed(&ctx, 16).unwrap();
        let graph = capture(&s2, || {
            comm.all_reduce(&hooked, &mut out, ReduceOp::Sum, &s2)
                .unwrap();
        });
        drop(reg);
        drop(hooked);

        // A pooled buffer whose memory is swapped out; the pooled buffer itself goes to
        // another thread, which drops it when the hook runs.
        let mut p = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let inner = std::mem::replace(&mut *p, DeviceBuffer::zeroed(&ctx, MIB_F32).unwrap());
        let mut recv = DeviceBuffer::<f32>::zeroed(&ctx, MIB_F32).unwrap();
        std::thread::scope(|sc| {
            sc.spawn(move || {
                go_rx.recv().unwrap();
                drop(p);
                let _ = ack_tx.send(());
            });
            // Its first use drops the graph (the hooked registration waits for the owner);
            // the pool's registration then releases it, which runs the hook.
            let send = OnUse {
                buf: inner,
                on_use: Mutex::new(Some(Box::new(move || drop(graph)))),
            };
            comm.all_gather(&send, &mut recv, &s).unwrap();
            // The owner's next call releases what is left: after the all-gather.
            comm.async_error().unwrap();
            s.synchronize().unwrap();
            drop(send);
        });
        assert!(
            !STALLED.load(Ordering::SeqCst),
            "the pooled buffer's drop waited for the registration that waited for it"
        );
        s2.synchronize().unwrap();
    });
}

/// Lazy registration inside an open group, the pooled buffer dropped before the group
/// ends: NCCL resolves the registration at the group's end, so neither it nor the
/// memory may go before the grouped work.
#[test]
fn lazy_registration_inside_a_group_and_a_drop_before_its_end() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        group(&rig.nccl, || {
            let mut p = pooled(&comm).buffer::<f32>(MIB_F32)?;
            comm.all_gather_in_place(&mut p, &s)?;
            assert!(p.is_registered());
            drop(p);
            // Held by the group: not back in the pool.
            assert_eq!(comm.pooled_buffers(), 0);
            Ok(())
        })
        .unwrap();
        comm.async_error().unwrap();
        s.synchronize().unwrap();
        assert_eq!(rig.world.calls("ncclCommRegister"), 1);
    });
}

/// Lazy registration during a capture, through a view of the pooled buffer; the buffer
/// dropped before the graph launches, a capture of another stream of the same
/// communicator after: the graph holds registration and memory.
#[test]
fn lazy_registration_of_a_view_during_a_capture() {
    on_one_rank(1, |_, OneRank { ctx, comm, s }| {
        let s2 = Stream::new(&ctx).unwrap();
        let p = pooled(&comm).buffer::<f32>(2 * MIB_F32).unwrap();
        let mut recv = DeviceBuffer::<f32>::zeroed(&ctx, MIB_F32).unwrap();
        let graph = capture(&s, || {
            let view = p.slice(MIB_F32..).unwrap();
            comm.all_gather(&view, &mut recv, &s).unwrap();
        });
        assert!(
            p.is_registered(),
            "a view of at least the test table's 1 MiB registers"
        );
        drop(p);
        assert_eq!(comm.pooled_buffers(), 0, "the graph holds it");
        let graph2 = capture(&s2, || {
            comm.all_reduce_in_place(&mut recv, ReduceOp::Sum, &s2)
                .unwrap();
        });
        comm.trim_pool().unwrap();
        graph.launch(&s).unwrap();
        graph2.launch(&s2).unwrap();
        drop(graph);
        comm.async_error().unwrap();
        s.synchronize().unwrap();
        s2.synchronize().unwrap();
    });
}

/// A pooled buffer used by another communicator's collectives: that communicator's
/// registry does not know it, so it is never registered there, and the pool takes it
/// back as usual.
#[test]
fn another_communicators_collective_does_not_register_a_pooled_buffer() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (_, other) = rig.one_rank(0);
        let s = Stream::new(&ctx).unwrap();
        let mut p = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        other.all_gather_in_place(&mut p, &s).unwrap();
        assert!(!p.is_registered());
        assert_eq!(rig.world.calls("ncclCommRegister"), 0);
        s.synchronize().unwrap();
        drop(p);
        assert_eq!(comm.pooled_buffers(), 1);
    });
}

/// A non-blocking communicator registers lazily too, inside a group; `trim_pool` while a
/// buffer is out releases only the free ones; an abort afterwards releases the rest.
#[test]
fn non_blocking_lazy_registration_trim_and_abort() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let config = CommConfig::non_blocking(Duration::from_secs(5));
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
        let s = Stream::new(&ctx).unwrap();
        let mut a = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let mut b = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        group(&rig.nccl, || {
            comm.all_gather_in_place(&mut a, &s)?;
            comm.all_gather_in_place(&mut b, &s)
        })
        .unwrap();
        assert!(a.is_registered() && b.is_registered());
        drop(a);
        assert_eq!(comm.pooled_buffers(), 1);
        comm.trim_pool().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        comm.all_gather_in_place(&mut b, &s).unwrap();
        drop(b);
        assert_eq!(comm.pooled_buffers(), 1);
        comm.abort().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
    });
}

/// A pooled buffer of 1 MiB of f32, registered by its first all-gather, whose
/// registration NCCL will refuse with `code`.
fn pooled_whose_registration_fails<'c>(
    rig: &Rig,
    comm: &'c Communicator,
    code: ncclResult_t,
) -> PooledBuffer<'c, f32> {
    let p = pooled(comm).buffer::<f32>(MIB_F32).unwrap();
    rig.fail_next("ncclCommRegister", code);
    p
}

/// A lazy registration that fails so that the communicator is aborted (NCCL's system
/// error): the collective that triggered it must not then be issued on the freed
/// communicator.
#[test]
fn a_lazy_registration_that_aborts_stops_its_collective() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut p = pooled_whose_registration_fails(rig, &comm, ncclResult_t::ncclSystemError);
        let r = comm.all_gather_in_place(&mut p, &s);
        assert!(comm.is_aborted());
        assert!(
            matches!(&r, Err(nccl_channel::Error::Nccl { call: "ncclCommRegister", code, .. })
                if *code == ncclResult_t::ncclSystemError),
            "issued on an aborted communicator: {r:?}"
        );
        assert_eq!(rig.world.calls("ncclAllGather"), 0);
        assert!(!p.is_registered());
        drop(p);
    });
}

/// A lazy registration that fails on a communicator that stays live (an invalid-usage
/// answer does not abort): the collective goes on with the plain buffer, and the buffer is
/// not offered for registration again.
#[test]
fn a_lazy_registration_that_fails_falls_back_to_plain_memory() {
    on_one_rank(1, |rig, OneRank { comm, s, .. }| {
        let mut p = pooled_whose_registration_fails(rig, &comm, ncclResult_t::ncclInvalidUsage);
        comm.all_gather_in_place(&mut p, &s).unwrap();
        assert!(!comm.is_aborted());
        assert!(!p.is_registered());
        comm.all_gather_in_place(&mut p, &s).unwrap();
        assert_eq!(rig.world.calls("ncclCommRegister"), 1);
        assert_eq!(rig.world.calls("ncclAllGather"), 2);
        assert!(!p.is_registered());
        s.synchronize().unwrap();
        drop(p);
    });
}

/// An abort asked for (from another thread, here from inside the collective's checks)
/// after the collective's first state check: the lazy registration performs it, and the
/// collective must not then use the freed communicator.
#[test]
fn an_abort_asked_for_during_a_collective_that_registers_stops_it() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s }| {
        let handle = comm.abort_handle();
        let send = OnUse {
            buf: DeviceBuffer::zeroed(&ctx, MIB_F32).unwrap(),
            on_use: Mutex::new(Some(Box::new(move || handle.abort()))),
        };
        let mut recv = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let r = comm.all_gather(&send, &mut *recv, &s);
        assert_eq!(
            r,
            Err(nccl_channel::Error::Aborted),
            "issued on an aborted communicator"
        );
        assert!(comm.is_aborted());
        assert_eq!(rig.world.calls("ncclAllGather"), 0);
        s.synchronize().unwrap();
        drop((recv, send));
    });
}

/// A registration of yours on a pooled buffer shares NCCL's handle with the pool's: the
/// buffer is not pooled while it lives, and each release waits for the work.
#[test]
fn a_registration_of_yours_shared_with_the_pools() {
    on_one_rank(1, |_, OneRank { comm, s, .. }| {
        // The pool's first, then yours.
        let mut p = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        comm.all_gather_in_place(&mut p, &s).unwrap();
        let mine = comm.register(&*p).unwrap();
        comm.all_gather_in_place(&mut p, &s).unwrap();
        drop(p);
        assert_eq!(comm.pooled_buffers(), 0, "your registration holds it");
        drop(mine);
        comm.async_error().unwrap();
        // Yours first, then the pool's.
        let mut q = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let mine = comm.register(&*q).unwrap();
        comm.all_gather_in_place(&mut q, &s).unwrap();
        assert!(q.is_registered());
        drop(mine);
        comm.all_gather_in_place(&mut q, &s).unwrap();
        drop(q);
        // The pool's registration also holds the memory yours was made for (NCCL keeps it
        // registered for both): not pooled again, released after its work.
        assert_eq!(comm.pooled_buffers(), 0);
        comm.async_error().unwrap();
        s.synchronize().unwrap();
    });
}
