//! Soundness under any control flow: the crate's own groups, thread-local
//! teardown, panics while a group settles, deferred releases, window slots on a failed
//! poll. Each test is a way safe code once reached freed memory on the simulated driver
//! and NCCL, whose sanitizer checks every address when the work executes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{OneRank, Rig, on_one_rank};
use cuda_hal::{DeferScope, Dependency, DeviceBuffer, KeepAlive, Stream};
use nccl_channel::{
    CommConfig, Communicator, Error, Group, ReduceOp, UniqueId, WindowFlags, group,
};
use nccl_sys::{NcclVersion, ncclResult_t};

/// The last release without native all_to_all/gather/scatter: the crate falls back to
/// send/recv in a group of its own.
const BEFORE_NATIVE: NcclVersion = NcclVersion(22703);

/// On NCCL < 2.28.3 all_to_all, gather and scatter are send/recv in a group the crate
/// opens itself. With non-blocking communicators that group's end answers "in progress"
/// and the work is enqueued later: the buffers the caller drops right after the call
/// must live until then (the group held nothing, and NCCL read and wrote freed memory).
#[test]
fn the_fallbacks_own_group_holds_its_buffers_until_the_work_is_enqueued() {
    Rig::with_version(2, BEFORE_NATIVE).check(|rig| {
        let got = rig.non_blocking_ranks(Duration::from_secs(10), |rank, ctx, comm| {
            let s = Stream::non_blocking(ctx).unwrap();
            let r = rank as i32;
            let mut out = DeviceBuffer::<i32>::zeroed(ctx, 4).unwrap();
            {
                let send = DeviceBuffer::from_slice(ctx, &[10 * r, 10 * r + 1]).unwrap();
                let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 2).unwrap();
                comm.all_to_all(&send, &mut recv, &s).unwrap();
                // Both dropped before NCCL enqueued the sends and receives.
                out.slice_mut(..2)
                    .unwrap()
                    .copy_from_async(&recv, &s)
                    .unwrap();
            }
            {
                let send = DeviceBuffer::from_slice(ctx, &[100 + r]).unwrap();
                let mut all = (rank == 0).then(|| DeviceBuffer::<i32>::zeroed(ctx, 2).unwrap());
                comm.gather(&send, all.as_mut().map(|a| a.as_view_mut()), 0, &s)
                    .unwrap();
                if let Some(all) = &all {
                    out.slice_mut(2..)
                        .unwrap()
                        .copy_from_async(all, &s)
                        .unwrap();
                }
            }
            {
                let src = (rank == 1).then(|| DeviceBuffer::from_slice(ctx, &[7, 8]).unwrap());
                let mut one = DeviceBuffer::<i32>::zeroed(ctx, 1).unwrap();
                comm.scatter(src.as_ref().map(|b| b.as_view()), &mut one, 1, &s)
                    .unwrap();
            }
            comm.wait(&s).unwrap();
            s.synchronize().unwrap();
            out.to_vec().unwrap()
        });
        rig.assert_no_gpu_violations();
        assert_eq!(got[0], [0, 10, 100, 101]);
        assert_eq!(got[1][..2], [1, 11]);
    });
}

/// A call that fails inside the fallback's group (its receive) must not abort the
/// communicator while the group still holds its recorded send: the abort waits for the
/// group's end, as in the user's groups, and happens there (the group ended in an error:
/// its send may stay queued in NCCL) before the group lets go of the buffers.
#[test]
fn an_error_inside_the_fallbacks_group_aborts_only_after_the_group() {
    Rig::with_version(1, BEFORE_NATIVE).check(|rig| {
        let (ctx, comm) = rig.one_rank(0);
        let s = Stream::non_blocking(&ctx).unwrap();
        let send = DeviceBuffer::from_slice(&ctx, &[1i32]).unwrap();
        let mut recv = DeviceBuffer::<i32>::zeroed(&ctx, 1).unwrap();
        rig.fail_next("ncclRecv", ncclResult_t::ncclSystemError);
        let e = comm.all_to_all(&send, &mut recv, &s).unwrap_err();
        assert!(
            matches!(&e, Error::Nccl { call: "ncclRecv", code, .. } if *code == ncclResult_t::ncclSystemError),
            "{e:?}"
        );
        rig.assert_no_gpu_violations();
        assert!(comm.is_aborted(), "performed at the group's end");
        assert_eq!(comm.async_error(), Err(Error::Aborted));
    });
}

thread_local! {
    /// A user's thread-local that keeps an open group.
    static KEPT: RefCell<Option<Group<'static>>> = const { RefCell::new(None) };
    /// A user's thread-local whose destructor starts a group.
    static LATE: RefCell<Option<LateGroup>> = const { RefCell::new(None) };
}

/// A group kept in a thread-local is dropped (and ended) after the crate's own per-thread
/// state, which held what the group's calls use: that state must leak it, never free it
/// before the group's end.
#[test]
fn a_group_kept_in_a_thread_local_never_frees_what_it_holds_before_its_end() {
    let rig = Rig::new(1);
    let nccl: &'static Arc<nccl_sys::Nccl> = Box::leak(Box::new(rig.nccl.clone()));
    let ctx = rig.context(0);
    let comm = Communicator::init_all(nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    let before = rig.gpus.live().device_allocations;
    std::thread::spawn(move || {
        // Registered before the crate's state: destroyed after it.
        KEPT.with(|_| ());
        let s = Stream::non_blocking(&ctx).unwrap();
        let g = Group::start(nccl).unwrap();
        let send = DeviceBuffer::from_slice(&ctx, &[5u32]).unwrap();
        let mut recv = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &s)
            .unwrap();
        drop((send, recv, s, comm));
        KEPT.with(|k| *k.borrow_mut() = Some(g));
    })
    .join()
    .unwrap();
    rig.assert_no_gpu_violations();
    assert_eq!(
        rig.world.calls("ncclGroupEnd"),
        2,
        "ended by the thread-local"
    );
    assert_eq!(
        rig.gpus.live().device_allocations,
        before + 2,
        "the group's buffers are leaked, not freed"
    );
}

struct LateGroup {
    nccl: &'static Arc<nccl_sys::Nccl>,
    seen: Arc<Mutex<Option<Result<(), Error>>>>,
}

impl Drop for LateGroup {
    fn drop(&mut self) {
        let r = Group::start(self.nccl).map(drop);
        *self.seen.lock().unwrap() = Some(r);
    }
}

/// A group started from a thread-local's destructor after the crate's per-thread state
/// is gone could hold nothing: refused with a typed error.
#[test]
fn a_group_started_after_the_threads_state_is_gone_is_refused() {
    let rig = Rig::new(1);
    let nccl: &'static Arc<nccl_sys::Nccl> = Box::leak(Box::new(rig.nccl.clone()));
    let seen = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        // Registered before the crate's state (which the group below creates): its
        // destructor runs after the crate's state is gone.
        LATE.with(|l| *l.borrow_mut() = Some(LateGroup { nccl, seen: seen2 }));
        drop(Group::start(nccl).unwrap());
    })
    .join()
    .unwrap();
    let r = seen.lock().unwrap().take().expect("the destructor ran");
    assert!(
        matches!(&r, Err(Error::InvalidArgument { what: "Group::start", problem }) if problem.contains("destructor")),
        "{r:?}"
    );
    assert_eq!(
        rig.world.calls("ncclGroupStart"),
        1,
        "the refused one never started"
    );
}

/// A dependency whose `settle` panics.
struct PanicsWhenSettled;

impl Dependency for PanicsWhenSettled {
    fn settle(&self) -> bool {
        panic!("a user's settle panicked")
    }
}

/// A panic while a group settles unwinds through the group's release: what the group's
/// work uses (here a send buffer NCCL reads in the background, 20 ms later) must be
/// leaked, never freed.
#[test]
fn a_panic_while_a_group_settles_leaks_what_the_work_uses() {
    let rig = Rig::new(1);
    let ctx = rig.context(0);
    let config = CommConfig::non_blocking(Duration::from_secs(10));
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    let before = rig.gpus.live().device_allocations;
    let r = catch_unwind(AssertUnwindSafe(|| {
        group(&rig.nccl, || {
            s.hold(|| KeepAlive::new(Arc::new(PanicsWhenSettled)));
            let send = DeviceBuffer::from_slice(&ctx, &[9u32])?;
            comm.all_reduce(&send, &mut out, ReduceOp::Sum, &s)
        })
    }));
    assert!(r.is_err(), "the panic comes out");
    assert!(!DeferScope::is_open());
    std::thread::sleep(Duration::from_millis(200)); // the background work ran
    rig.assert_no_gpu_violations();
    assert_eq!(
        rig.gpus.live().device_allocations,
        before + 1,
        "the send buffer is leaked"
    );
    assert_eq!(out.to_vec().unwrap(), [9]);
}

/// A timeout the clock cannot add to `now` is refused where it enters (the init), and
/// the longest accepted one works: no deadline arithmetic panics later.
#[test]
fn an_absurd_timeout_is_refused_at_init_and_the_longest_accepted_works() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        for blocking in [false, true] {
            let config = CommConfig::non_blocking(Duration::MAX).blocking(blocking);
            let id = UniqueId::generate(&rig.nccl).unwrap();
            let e = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap_err();
            assert!(
                matches!(
                    &e,
                    Error::InvalidArgument {
                        what: "CommConfig::timeout",
                        ..
                    }
                ),
                "{e:?}"
            );
            let just_over = CommConfig::MAX_TIMEOUT + Duration::from_nanos(1);
            let e = Communicator::init_rank_with(
                &rig.nccl,
                &ctx,
                &id,
                1,
                0,
                &config.clone().timeout(just_over),
            )
            .unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument { .. }), "{e:?}");
        }
        assert_eq!(
            CommConfig::MAX_TIMEOUT,
            Duration::from_secs(365 * 24 * 3600)
        );
        let config = CommConfig::non_blocking(CommConfig::MAX_TIMEOUT);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let mut b = DeviceBuffer::from_slice(&ctx, &[3u8]).unwrap();
        group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s)
        })
        .unwrap();
        comm.wait(&s).unwrap();
        assert_eq!(b.to_vec().unwrap(), [3]);
    });
}

/// A registration whose poll fails (an abort handle) while another thread's open group
/// holds the communicator (so the abort cannot happen yet): NCCL may still write the
/// handle and map the memory; both are kept, never freed. `register` is a window
/// registration (`ncclCommWindowRegister`) or a local one (`ncclCommRegister`).
fn a_registration_whose_poll_fails_keeps_its_memory(
    call: &str,
    register: impl FnOnce(&Communicator, &DeviceBuffer<u8>) -> Result<(), Error>,
) {
    let rig = Rig::new(1);
    let ctx = rig.context(0);
    let config = CommConfig::non_blocking(Duration::from_secs(10));
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
    let buf = comm.alloc_nccl::<u8>(4096).unwrap();
    let held = comm.keep_alive();
    let abort = comm.abort_handle();
    let s = Stream::non_blocking(&ctx).unwrap();
    rig.world.slow_registrations(u64::MAX);
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let world = rig.world.clone();
    let call = call.to_string();
    let other = std::thread::spawn(move || {
        while world.calls(&call) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // This thread's group holds the communicator while the registration polls.
        let scope = DeferScope::open();
        s.hold(|| held);
        abort.abort();
        hold_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        drop(scope);
    });
    let r = register(&comm, &buf);
    hold_rx.recv().unwrap();
    assert_eq!(r.unwrap_err(), Error::Aborted);
    drop(buf);
    assert_eq!(rig.world.calls("ncclMemFree"), 0, "the memory is kept");
    done_tx.send(()).unwrap();
    other.join().unwrap();
    drop(comm);
    assert_eq!(
        rig.world.calls("ncclMemFree"),
        0,
        "never freed, also after the communicator is gone (the documented leak)"
    );
    rig.assert_no_gpu_violations();
}

#[test]
fn a_window_whose_poll_fails_while_another_group_holds_the_communicator_keeps_its_memory() {
    a_registration_whose_poll_fails_keeps_its_memory("ncclCommWindowRegister", |c, b| {
        c.register_window(b, WindowFlags::DEFAULT).map(drop)
    });
}

/// The same through `register_windows` (one NCCL group for every rank's window, the
/// handles read after its end): the rank whose wait failed unsettled keeps its slot and
/// memory.
#[test]
fn register_windows_whose_wait_fails_while_another_group_holds_the_communicator_keeps_its_memory() {
    a_registration_whose_poll_fails_keeps_its_memory("ncclCommWindowRegister", |c, b| {
        Communicator::register_windows(&[(c, b)], WindowFlags::DEFAULT).map(drop)
    });
}

/// The same for a local registration (found by the adversarial review: its handle was on
/// the stack and its memory dropped).
#[test]
fn a_registration_whose_poll_fails_while_another_group_holds_the_communicator_keeps_its_memory() {
    a_registration_whose_poll_fails_keeps_its_memory("ncclCommRegister", |c, b| {
        c.register(b).map(drop)
    });
}

/// A registration whose release is queued (its graph was dropped on another thread) is
/// still NCCL's until `ncclCommDeregister` returns: a grouped collective on its memory
/// meanwhile (the queue is not processed inside a group) uses it, so the release must
/// wait for that work too.
#[test]
fn a_queued_registration_notes_work_issued_inside_a_group() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let reg = comm.register(&b).unwrap();
        s1.begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s1)
            .unwrap();
        let graph = s1.end_capture().unwrap().instantiate().unwrap();
        drop(reg);
        std::thread::spawn(move || drop(graph)).join().unwrap();
        group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
        })
        .unwrap();
        assert_eq!(
            rig.world.calls("ncclCommDeregister"),
            0,
            "not inside the group"
        );
        comm.async_error().unwrap(); // the owner's next call releases it, after s2's work
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        rig.assert_no_gpu_violations();
    });
}

/// The same when the release was queued because a capture refused its wait: an eager
/// collective on another stream meanwhile is waited for before the deregistration.
#[test]
fn a_registration_queued_by_a_capture_notes_later_work() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let mut other = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
        let reg = comm.register(&b).unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s1)
            .unwrap();
        s1.begin_capture(cuda_hal::CaptureMode::Relaxed).unwrap();
        other.fill_async(1.0, &s1).unwrap();
        let e = reg.deregister().unwrap_err();
        assert!(
            matches!(&e, Error::Cuda(cuda_hal::Error::Capturing { .. })),
            "{e:?}"
        );
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
            .unwrap();
        drop(s1.end_capture().unwrap());
        comm.async_error().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        rig.assert_no_gpu_violations();
    });
}

/// Found by the adversarial review: between the moment a registration's last holder (a
/// graph, dropped on another thread) lets go and the moment its release is queued, the
/// registry's entry can no longer be upgraded and the queue does not have it yet. A
/// collective of the owner in that window was noted nowhere, NCCL still used the
/// registration, and the owner's next call deregistered it without waiting for that
/// work. Many other registrations make the window (the drop's scan of the list) wide;
/// the race is tried up to 1500 times and stops at the first report.
#[test]
fn a_registration_dropped_on_another_thread_is_never_out_of_view() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    const N: usize = 4000;
    let big = comm.alloc_nccl::<u8>(N * 4096).unwrap();
    let _spacer = comm.alloc_nccl::<u8>(256 << 10).unwrap();
    let mut target = comm.alloc_nccl::<f32>(1024).unwrap();
    let others: Vec<_> = (0..N)
        .map(|i| {
            comm.register(&big.slice(i * 4096..(i + 1) * 4096).unwrap())
                .unwrap()
        })
        .collect();
    let capture = Stream::new(&ctx).unwrap();
    let mut streams = Vec::new();
    for attempt in 0..1500 {
        let reg = comm.register(&target).unwrap();
        capture
            .begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        comm.all_reduce_in_place(&mut target, ReduceOp::Sum, &capture)
            .unwrap();
        let exec = capture.end_capture().unwrap().instantiate().unwrap();
        drop(reg); // the graph holds the registration's last strong reference
        let go = Arc::new(std::sync::Barrier::new(2));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (go2, done2) = (go.clone(), done.clone());
        let t = std::thread::spawn(move || {
            go2.wait();
            for _ in 0..(attempt * 37 % 200) {
                std::hint::spin_loop();
            }
            drop(exec);
            done2.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        go.wait();
        loop {
            let finished = done.load(std::sync::atomic::Ordering::SeqCst);
            let s = Stream::new(&ctx).unwrap();
            comm.all_reduce_in_place(&mut target, ReduceOp::Sum, &s)
                .unwrap();
            streams.push(s);
            if finished {
                break;
            }
        }
        t.join().unwrap();
        comm.async_error().unwrap(); // the owner's next call releases what is queued
        let v = rig.gpus.violations();
        assert!(
            v.is_empty(),
            "attempt {attempt}: the sanitizer saw:\n{}",
            v.join("\n")
        );
        if streams.len() > 2000 {
            for s in streams.drain(..) {
                s.synchronize().unwrap();
            }
        }
    }
    drop(others);
}

/// Found by the adversarial review (real CUDA, not the simulator, which runs grouped work
/// at once): another thread begins a capture on a stream while this thread's group has
/// work recorded on it; the group's end launches that work into the capture, so the graph
/// must hold what the group held (the communicator, the buffers), not the group alone.
#[test]
fn a_capture_begun_elsewhere_during_a_group_holds_what_the_group_held() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::non_blocking(&ctx).unwrap();
    let (to_b, b_rx) = std::sync::mpsc::channel::<()>();
    let (to_a, a_rx) = std::sync::mpsc::channel::<()>();
    let capturing = s.clone();
    let b = std::thread::spawn(move || {
        b_rx.recv().unwrap(); // the group has work on the stream
        capturing
            .begin_capture(cuda_hal::CaptureMode::Relaxed)
            .unwrap();
        to_a.send(()).unwrap();
        b_rx.recv().unwrap(); // the group ended
        capturing.end_capture().unwrap().instantiate().unwrap()
    });
    let before = rig.gpus.live().device_allocations;
    let g = Group::start(&rig.nccl).unwrap();
    let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
        .unwrap();
    to_b.send(()).unwrap();
    a_rx.recv().unwrap();
    g.end().unwrap();
    to_b.send(()).unwrap();
    let graph = b.join().unwrap();
    drop((buf, comm));
    assert_eq!(
        rig.world.live().comms,
        2,
        "the graph holds the communicator"
    );
    assert_eq!(
        rig.gpus.live().device_allocations,
        before + 1,
        "and the buffer"
    );
    drop(graph);
    assert_eq!(rig.world.live().comms, 0);
    assert_eq!(rig.gpus.live().device_allocations, before);
    rig.assert_no_gpu_violations();
}

/// Found by the second review: a group's end must not hold anything another rank needs.
/// Rank 1's thread begins a capture on rank 0's stream while rank 0 waits in
/// `ncclGroupEnd` for rank 1's part: both go through (the end held the streams' order
/// locks once, and rank 1 waited for them while rank 0 waited for rank 1).
#[test]
fn a_group_end_waiting_for_a_peer_lets_a_capture_begin_on_its_stream() {
    let rig = Rig::new(2);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Stream>();
    let (rig, id) = (&rig, &id);
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(move || {
            let ctx = rig.context(0);
            let comm = Communicator::init_rank(&rig.nccl, &ctx, id, 2, 0).unwrap();
            let s0 = Stream::non_blocking(&ctx).unwrap();
            tx.send(s0.clone()).unwrap();
            let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
            let g = Group::start(&rig.nccl).unwrap();
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s0)
                .unwrap();
            g.end()
        });
        let b = sc.spawn(move || {
            let ctx = rig.context(1);
            let comm = Communicator::init_rank(&rig.nccl, &ctx, id, 2, 1).unwrap();
            let s0 = rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(100)); // rank 0 is in its group end
            s0.begin_capture(cuda_hal::CaptureMode::Relaxed).unwrap();
            let s1 = Stream::non_blocking(&ctx).unwrap();
            let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
            let r = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s1);
            drop(s0.end_capture());
            r
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((a, b), (Ok(()), Ok(())));
}

/// A dependency whose `settle` says it started and waits to be let go: holds a group in
/// its settling phase for as long as a test needs.
struct Gate {
    settling: Mutex<std::sync::mpsc::Sender<()>>,
    resume: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Dependency for Gate {
    fn settle(&self) -> bool {
        self.settling.lock().unwrap().send(()).unwrap();
        self.resume.lock().unwrap().recv().unwrap();
        true
    }
}

/// Found by the second review: a non-blocking communicator's group launches its work in
/// the background after `ncclGroupEnd` answered "in progress", while the group settles; a
/// capture another thread begins before that launch records it, so its graph must hold
/// the communicator too (the hand-off happened only around `ncclGroupEnd` itself). The
/// gate, held first, keeps the group settling (before the communicator's own wait)
/// while the capture begins.
#[test]
fn a_capture_begun_while_a_non_blocking_group_settles_holds_what_it_held() {
    let rig = Rig::new(1);
    let ctx = rig.context(0);
    let config = CommConfig::non_blocking(Duration::from_secs(10));
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let (settling_tx, settling) = std::sync::mpsc::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        settling: Mutex::new(settling_tx),
        resume: Mutex::new(resume_rx),
    });
    let capturing = s.clone();
    let b = std::thread::spawn(move || {
        settling.recv().unwrap(); // ncclGroupEnd answered; the group settles
        capturing
            .begin_capture(cuda_hal::CaptureMode::Relaxed)
            .unwrap();
        resume.send(()).unwrap();
        capturing
    });
    let g = Group::start(&rig.nccl).unwrap();
    s.hold(|| KeepAlive::new(gate));
    let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
        .unwrap();
    drop(buf);
    g.end().unwrap();
    let capturing = b.join().unwrap();
    drop(comm);
    let graph = capturing.end_capture().unwrap();
    assert_eq!(
        rig.world.live().comms,
        2,
        "the graph holds the communicator"
    );
    drop(graph);
    assert_eq!(rig.world.live().comms, 0);
    rig.assert_no_gpu_violations();
}

/// Found by the second review: a user's own `DeferScope` around a `Group` keeps the
/// group's holds past NCCL's launch (at `Group::end`); a capture another thread begins
/// on the stream before that launch still gets them.
#[test]
fn a_users_scope_around_a_group_still_hands_its_holds_to_a_capture() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::non_blocking(&ctx).unwrap();
    let before = rig.gpus.live().device_allocations;
    let user = DeferScope::open();
    let g = Group::start(&rig.nccl).unwrap();
    let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
        .unwrap();
    drop(buf);
    let other = s.clone();
    std::thread::spawn(move || other.begin_capture(cuda_hal::CaptureMode::Relaxed))
        .join()
        .unwrap()
        .unwrap();
    g.end().unwrap(); // NCCL's outermost end: the launch, into the capture
    drop(user);
    drop(comm);
    let graph = s.end_capture().unwrap();
    assert_eq!(
        rig.world.live().comms,
        2,
        "the graph holds the communicator"
    );
    assert_eq!(
        rig.gpus.live().device_allocations,
        before + 1,
        "and the buffer"
    );
    drop(graph);
    assert_eq!(rig.world.live().comms, 0);
}

/// A graph captured while a registration's release was queued holds the queued release;
/// each launch of that graph is work on the registration, so the release (once the graph
/// is gone) waits for the launch's stream too.
#[test]
fn a_launch_of_a_graph_holding_a_queued_registration_is_waited_for() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (s1, s2, s3) = (
            Stream::new(&ctx).unwrap(),
            Stream::new(&ctx).unwrap(),
            Stream::new(&ctx).unwrap(),
        );
        let mut b = comm.alloc_nccl::<f32>(16).unwrap();
        let reg = comm.register(&b).unwrap();
        s1.begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s1)
            .unwrap();
        let first = s1.end_capture().unwrap().instantiate().unwrap();
        drop(reg);
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
            .unwrap(); // noted on s2
        // Queued: its first graph goes on another thread.
        std::thread::spawn(move || drop(first)).join().unwrap();
        // A capture on s2: the release, which would wait for s2, is refused and stays
        // queued; the captured all-reduce holds it.
        s2.begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
            .unwrap();
        let second = s2.end_capture().unwrap().instantiate().unwrap();
        assert_eq!(rig.world.calls("ncclCommDeregister"), 0);
        second.launch(&s3).unwrap(); // work on the registration, on s3
        std::thread::spawn(move || drop(second)).join().unwrap();
        comm.async_error().unwrap(); // the owner's next call releases it: after s3's launch
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        rig.assert_no_gpu_violations();
    });
}

/// A queued release of a registration NCCL handed out again (for a part of a range
/// registered earlier) keeps the whole range NCCL still has registered in view: a
/// collective far from the part's own pages, while the release is queued, is waited for.
#[test]
fn a_queued_shared_registration_keeps_its_whole_range_in_view() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut b = comm.alloc_nccl::<f32>(1 << 16).unwrap();
        let whole = comm.register(&b).unwrap();
        let head = comm.register(&b.slice(0..16).unwrap()).unwrap();
        drop(whole);
        s1.begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        comm.all_reduce_in_place(&mut b.slice_mut(0..16).unwrap(), ReduceOp::Sum, &s1)
            .unwrap();
        let graph = s1.end_capture().unwrap().instantiate().unwrap();
        drop(head);
        std::thread::spawn(move || drop(graph)).join().unwrap(); // queued
        group(&rig.nccl, || {
            // Far from `head`'s pages, inside the range NCCL still has registered.
            comm.all_reduce_in_place(&mut b.slice_mut(60_000..).unwrap(), ReduceOp::Sum, &s2)
        })
        .unwrap();
        comm.async_error().unwrap(); // releases it, after s2's work
        assert_eq!(rig.world.calls("ncclCommDeregister"), 2);
        rig.assert_no_gpu_violations();
    });
}

/// A queued release is noted on (and held by) only the work that overlaps its range: a
/// captured collective on other memory, or on memory that ends right where the range
/// starts or starts right where it ends, does not delay the release while its graph
/// lives.
#[test]
fn a_queued_release_is_held_only_by_work_on_its_range() {
    on_one_rank(1, |rig, OneRank { ctx, comm, .. }| {
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        const PAGE: u64 = 64 << 10; // the registry's page
        let mut b = comm.alloc_nccl::<u8>(4 * PAGE as usize).unwrap();
        let mut other = comm.alloc_nccl::<u8>(4096).unwrap();
        // The registered part is one whole page: its range is exactly that page.
        let off = ((b.as_raw() / PAGE + 2) * PAGE - b.as_raw()) as usize;
        let page = off..off + PAGE as usize;
        let reg = comm.register(&b.slice(page.clone()).unwrap()).unwrap();
        s1.begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        comm.all_reduce_in_place(&mut b.slice_mut(page.clone()).unwrap(), ReduceOp::Max, &s1)
            .unwrap();
        let first = s1.end_capture().unwrap().instantiate().unwrap();
        drop(reg);
        std::thread::spawn(move || drop(first)).join().unwrap(); // queued
        // Captured inside a group, so the queue is not processed by these calls.
        s2.begin_capture(cuda_hal::CaptureMode::ThreadLocal)
            .unwrap();
        group(&rig.nccl, || {
            comm.all_reduce_in_place(&mut other, ReduceOp::Max, &s2)?;
            let before = page.start - 4096..page.start;
            let after = page.end..page.end + 4096;
            for r in [before, after] {
                comm.all_reduce_in_place(&mut b.slice_mut(r).unwrap(), ReduceOp::Max, &s2)?;
            }
            Ok(())
        })
        .unwrap();
        let second = s2.end_capture().unwrap().instantiate().unwrap();
        comm.async_error().unwrap(); // released now: the second graph does not hold it
        assert_eq!(rig.world.calls("ncclCommDeregister"), 1);
        drop(second);
        rig.assert_no_gpu_violations();
    });
}
