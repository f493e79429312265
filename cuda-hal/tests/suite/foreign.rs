//! Other crates' memory, streams and contexts: adopted with an owner, given back without
//! ever handing out a freed address, and leaked (with a word on stderr) rather than
//! released when their work cannot be proven done.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuda_hal::{CaptureMode, Context, DeferScope, DeviceBuffer, Error, Event, Stream};

use crate::common::rig;

/// Runs test `name` of this binary in a child and returns its stderr (it must pass).
fn child_stderr(name: &str) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("CUDA_HAL_FOREIGN_CHILD", name);
    test_support::env::run_test_in_child(cmd, name).1
}

fn is_child(name: &str) -> bool {
    std::env::var("CUDA_HAL_FOREIGN_CHILD").is_ok_and(|c| c == name)
}

/// A stream another library destroys behind this crate's back (`from_raw`, not owned).
fn doomed_stream(ctx: &Context) -> (Stream, impl FnOnce()) {
    let cuda = ctx.cuda().clone();
    let mut raw = std::ptr::null_mut();
    {
        let _g = ctx.bind().unwrap();
        // SAFETY: a valid out-pointer, with `ctx` current.
        cuda.check(
            unsafe { (cuda.fns().cuStreamCreate)(&mut raw, 1) },
            "cuStreamCreate",
        )
        .unwrap();
    }
    // SAFETY: a stream of `ctx`; the test breaks the "stays valid" promise on purpose, to
    // see the crate leak rather than free.
    let stream = unsafe { Stream::from_raw(ctx, raw, false) };
    let raw_addr = raw as usize;
    let destroy = move || {
        // SAFETY: the stream made above, destroyed once, by "its owner".
        let rc = unsafe { (cuda.fns().cuStreamDestroy)(raw_addr as cuda_hal::cuda_sys::CUstream) };
        cuda.check(rc, "cuStreamDestroy").unwrap();
    };
    (stream, destroy)
}

/// Regression: a buffer used on a borrowed stream that its owner destroyed first was
/// leaked without a word (16 of 16 bytes kept, nothing said).
#[test]
fn memory_used_on_a_stream_destroyed_behind_our_back_is_leaked_and_said() {
    const ME: &str =
        "foreign::memory_used_on_a_stream_destroyed_behind_our_back_is_leaked_and_said";
    if !is_child(ME) {
        let err = child_stderr(ME);
        assert!(
            err.contains("cuda-hal: leaking 16 bytes of device memory at 0x")
                && err.contains(
                    "on device 0: waiting for the work of the streams that used it failed: \
                     cuStreamSynchronize failed: CUDA_ERROR_INVALID_HANDLE"
                ),
            "{err}"
        );
        return;
    }
    let (_cuda, world, ctx) = rig();
    let (stream, destroy) = doomed_stream(&ctx);
    let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    buf.fill_async(1, &stream).unwrap();
    destroy();
    drop(buf);
    assert_eq!(world.used_memory(0), 16, "leaked, not freed");
    world.take_violations();
}

/// Regression: `from_raw_with` then `into_raw` dropped the release closure: when the
/// closure owned the memory, `into_raw` handed out a freed address.
#[test]
fn into_raw_never_hands_out_memory_that_a_closure_or_owner_releases() {
    let (_cuda, world, ctx) = rig();
    let theirs = DeviceBuffer::<u8>::zeroed(&ctx, 32).unwrap();
    let ptr = theirs.as_raw();
    // SAFETY: 32 bytes of `ctx`, allocated while the closure (which owns them) lives.
    let buf = unsafe { DeviceBuffer::<u8>::from_raw_with(&ctx, ptr, 32, move |_| drop(theirs)) };
    let buf = buf.into_raw().expect_err("the closure owns the memory");
    assert_eq!(world.used_memory(0), 32, "still allocated");
    assert_eq!(buf.to_vec().unwrap(), [0; 32]);
    // The same with an owner: into_raw refuses, into_owner gives the owner back.
    let theirs = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    let p = theirs.as_raw();
    // SAFETY: 8 bytes of `ctx`, allocated while `theirs` lives.
    let owned = unsafe { DeviceBuffer::<u8>::from_owner(&ctx, p, 8, theirs) };
    let owned = owned.into_raw().expect_err("the owner keeps the memory");
    let owned = owned
        .into_owner::<String>()
        .expect_err("not a String: given back unchanged");
    let theirs: DeviceBuffer<u8> = owned.into_owner().unwrap();
    assert_eq!(theirs.as_raw(), p);
    drop((buf, theirs));
    assert_eq!(world.used_memory(0), 0);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// Regression: when the memory could not be proven idle, the release closure was dropped
/// (not called): a closure owning the memory freed it under work that still used it.
#[test]
fn a_release_that_owns_the_memory_is_leaked_with_it() {
    const ME: &str = "foreign::a_release_that_owns_the_memory_is_leaked_with_it";
    if !is_child(ME) {
        let err = child_stderr(ME);
        assert!(err.contains("cuda-hal: leaking 64 bytes"), "{err}");
        return;
    }
    let (_cuda, world, ctx) = rig();
    let (stream, destroy) = doomed_stream(&ctx);
    let theirs = DeviceBuffer::<u8>::zeroed(&ctx, 64).unwrap();
    let ptr = theirs.as_raw();
    // SAFETY: 64 bytes of `ctx`, allocated while the closure (which owns them) lives.
    let mut buf =
        unsafe { DeviceBuffer::<u8>::from_raw_with(&ctx, ptr, 64, move |_| drop(theirs)) };
    buf.fill_async(9, &stream).unwrap();
    destroy();
    drop(buf);
    assert_eq!(
        world.used_memory(0),
        64,
        "the closure and its memory are leaked"
    );
    world.take_violations();
}

/// Counts drops of the value it is cloned from.
#[derive(Clone, Default, Debug)]
struct Dropped(Arc<AtomicUsize>);
impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn an_owner_goes_only_after_the_work_and_the_holders_of_its_memory() {
    let (_cuda, world, ctx) = rig();
    let drops = Dropped::default();
    let count = drops.0.clone();
    let theirs = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    let p = theirs.as_raw();
    // SAFETY: 16 bytes of `ctx`, allocated while the owner (holding `theirs`) lives.
    let mut buf = unsafe { DeviceBuffer::<u32>::from_owner(&ctx, p, 4, (theirs, drops)) };
    let stream = Stream::non_blocking(&ctx).unwrap();
    stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    buf.fill_async(3, &stream).unwrap();
    let exec = stream.end_capture().unwrap().instantiate().unwrap();
    // The graph holds the memory: not the buffer's alone to give back.
    let buf = buf
        .into_owner::<(DeviceBuffer<u32>, Dropped)>()
        .expect_err("a graph holds it");
    drop(buf);
    assert_eq!(count.load(Ordering::SeqCst), 0, "the graph still holds it");
    exec.launch(&stream).unwrap();
    drop(exec);
    stream.synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1, "dropped with the graph");
    assert_eq!(world.used_memory(0), 0);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn a_home_stream_waits_on_the_device_for_every_stream_that_used_the_memory() {
    let (_cuda, world, ctx) = rig();
    let home = Stream::non_blocking(&ctx).unwrap();
    let other = Stream::non_blocking(&ctx).unwrap();
    let mut theirs = DeviceBuffer::<u8>::alloc_on(&home, 64).unwrap();
    theirs.fill_async(1, &home).unwrap();
    let p = theirs.as_raw();
    // SAFETY: 64 bytes of `ctx`, freed in order on `home` by `theirs`.
    let mut buf = unsafe { DeviceBuffer::<u8>::from_owner_on(&home, p, 64, theirs) };
    buf.slice_mut(32..).unwrap().fill_async(2, &other).unwrap();
    // Back out: `home` now waits for `other`; the owner's next work there is ordered.
    let (waits, syncs) = (
        world.calls("cuStreamWaitEvent"),
        world.calls("cuStreamSynchronize"),
    );
    let mut theirs: DeviceBuffer<u8> = buf.into_owner().unwrap();
    assert!(
        world.calls("cuStreamWaitEvent") > waits,
        "ordered on the device"
    );
    assert_eq!(world.calls("cuStreamSynchronize"), syncs, "no host wait");
    theirs.fill_async(3, &home).unwrap();
    drop(theirs); // cuMemFreeAsync on `home`, after `other`'s fill (the sanitizer checks)
    home.synchronize().unwrap();
    assert_eq!(world.used_memory(0), 0);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// Another library's home stream (a cudarc slice's) may be captured by that library on
/// another thread at any moment: a wait enqueued there for the other streams' work could
/// be recorded instead of run, and the owner's free on it would not wait. The release
/// and the way back out wait on the host for those streams, and enqueue nothing there.
#[test]
fn another_librarys_home_stream_gets_no_wait_the_free_depends_on() {
    let (_cuda, world, ctx) = rig();
    let theirs_stream = Arc::new(Stream::non_blocking(&ctx).unwrap());
    // SAFETY: `theirs_stream` keeps its stream, of `ctx`, alive.
    let home = unsafe { Stream::from_owner(&ctx, theirs_stream.as_raw(), theirs_stream.clone()) };
    let other = Stream::non_blocking(&ctx).unwrap();
    for back_out in [false, true] {
        let mut theirs = DeviceBuffer::<u8>::alloc_on(&home, 64).unwrap();
        theirs.fill_async(1, &home).unwrap();
        let p = theirs.as_raw();
        // SAFETY: 64 bytes of `ctx`, freed in order on `home` by `theirs`.
        let mut buf = unsafe { DeviceBuffer::<u8>::from_owner_on(&home, p, 64, theirs) };
        buf.slice_mut(32..).unwrap().fill_async(2, &other).unwrap();
        let (waits, syncs) = (
            world.calls("cuStreamWaitEvent"),
            world.calls("cuStreamSynchronize"),
        );
        if back_out {
            let theirs: DeviceBuffer<u8> = buf.into_owner().unwrap();
            drop(theirs);
        } else {
            drop(buf);
        }
        assert_eq!(
            world.calls("cuStreamWaitEvent"),
            waits,
            "a wait enqueued on their stream"
        );
        assert!(
            world.calls("cuStreamSynchronize") > syncs,
            "the host waited for `other`"
        );
        home.synchronize().unwrap();
    }
    assert_eq!(world.used_memory(0), 0);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn an_adopted_context_outlives_what_was_made_in_it_and_then_drops_its_owner() {
    let (cuda, world, ctx) = rig();
    let drops = Dropped::default();
    let count = drops.0.clone();
    // SAFETY: the primary context's handle, kept alive by the clone of `ctx` in the owner.
    let adopted = unsafe { Context::from_raw(ctx.device(), ctx.as_raw(), (ctx.clone(), drops)) };
    assert_eq!(adopted, ctx);
    let buf = DeviceBuffer::from_slice(&adopted, &[1u8, 2, 3]).unwrap();
    drop(adopted);
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "the buffer holds the context"
    );
    assert_eq!(buf.to_vec().unwrap(), [1, 2, 3]);
    drop(buf);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // Nothing current, then the primary context current: `current` tells.
    assert_eq!(Context::current(&cuda).unwrap(), None);
    let _g = ctx.bind().unwrap();
    assert_eq!(Context::current(&cuda).unwrap().as_ref(), Some(&ctx));
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn after_enqueue_runs_at_the_locks_release_or_the_groups_end_and_not_in_a_capture() {
    let (_cuda, _world, ctx) = rig();
    let stream = Stream::non_blocking(&ctx).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let note = |what: &'static str| {
        let l = log.clone();
        move || l.lock().unwrap().push(what)
    };
    // Inside a group: after the group's end, not at the lock's release.
    {
        let _group = DeferScope::open();
        {
            let _order = stream.enqueue_lock();
            stream.after_enqueue(note("grouped")).unwrap();
        }
        log.lock().unwrap().push("lock released");
    }
    log.lock().unwrap().push("group ended");
    // Another stream's lock does not run this stream's hooks.
    let other = Stream::non_blocking(&ctx).unwrap();
    {
        let _order = stream.enqueue_lock();
        stream.after_enqueue(note("mine")).unwrap();
        drop(other.enqueue_lock());
        log.lock().unwrap().push("other's lock released");
        assert!(
            matches!(
                other.after_enqueue(note("never")),
                Err(Error::InvalidArgument {
                    what: "Stream::after_enqueue",
                    ..
                })
            ),
            "not under other's lock"
        );
    }
    assert_eq!(
        *log.lock().unwrap(),
        [
            "lock released",
            "grouped",
            "group ended",
            "other's lock released",
            "mine"
        ]
    );
    // A capture: refused (the work runs at each launch).
    stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    {
        let _order = stream.enqueue_lock();
        assert!(matches!(
            stream.after_enqueue(note("never")),
            Err(Error::Deferred {
                why: "the stream is being captured",
                ..
            })
        ));
    }
    stream.end_capture().unwrap();
    assert_eq!(log.lock().unwrap().len(), 5);
}

/// Enqueue locks released in another order than taken: each guard gives up its own lock
/// only, so `after_enqueue` is accepted exactly under a lock still held, and each hook
/// runs at its own stream's release.
#[test]
fn after_enqueue_knows_which_locks_are_held_when_they_are_released_out_of_order() {
    let (_cuda, _world, ctx) = rig();
    let (a, b) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let note = |what: &'static str| {
        let l = log.clone();
        move || l.lock().unwrap().push(what)
    };
    let refused = |r: Result<(), Error>| {
        matches!(
            r,
            Err(Error::InvalidArgument {
                what: "Stream::after_enqueue",
                ..
            })
        )
    };
    let lock_a = a.enqueue_lock();
    let lock_b = b.enqueue_lock();
    a.after_enqueue(note("a")).unwrap();
    drop(lock_a);
    log.lock().unwrap().push("a released");
    assert!(
        refused(a.after_enqueue(note("never"))),
        "a is no longer held"
    );
    b.after_enqueue(note("b")).unwrap();
    drop(lock_b);
    assert!(refused(a.after_enqueue(note("never"))), "nothing is held");
    assert!(refused(b.after_enqueue(note("never"))), "nothing is held");
    assert_eq!(*log.lock().unwrap(), ["a", "a released", "b"]);
}

/// Another library's stream, adopted with `Stream::from_owner` (`ours`), which that
/// library captures through the driver's table, behind this crate's back.
struct Theirs {
    cuda: cuda_hal::Cuda,
    raw: Arc<Stream>,
    ours: Stream,
}

impl Theirs {
    fn new(cuda: &cuda_hal::Cuda, ctx: &Context) -> Theirs {
        let raw = Arc::new(Stream::non_blocking(ctx).unwrap());
        // SAFETY: `raw` keeps its stream alive; nothing captures it on another thread.
        let ours = unsafe { Stream::from_owner(ctx, raw.as_raw(), raw.clone()) };
        Theirs {
            cuda: cuda.clone(),
            raw,
            ours,
        }
    }

    /// Their relaxed capture begins.
    fn begin_capture(&self) {
        let mode = cuda_hal::cuda_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a live stream and a documented mode.
        let rc = unsafe { (self.cuda.fns().cuStreamBeginCapture)(self.raw.as_raw(), mode) };
        self.cuda.check(rc, "cuStreamBeginCapture").unwrap();
    }

    /// Their capture ends: the graph, theirs to destroy.
    fn end_capture(&self) -> cuda_hal::cuda_sys::CUgraph {
        let mut graph = std::ptr::null_mut();
        // SAFETY: a live stream being captured; a valid out-pointer.
        let rc = unsafe { (self.cuda.fns().cuStreamEndCapture)(self.raw.as_raw(), &mut graph) };
        self.cuda.check(rc, "cuStreamEndCapture").unwrap();
        graph
    }
}

/// A stream captured by another library (begun through the raw driver, not
/// `begin_capture`): work enqueued on it through this crate keeps its memory for as long
/// as that library's graph, or an executable graph made from it, lives; both destroyed,
/// the memory is released at the crate's next release (the destructor of the graph's
/// user object may not call CUDA), and the replays in between read live memory.
#[test]
fn work_on_a_foreign_stream_captured_behind_our_back_keeps_its_memory_for_the_graphs_life() {
    // Alone in a process: another test's global-mode capture would take memory released
    // meanwhile into its graph, and the release queue is the process's.
    if !test_support::in_scrubbed_child!(
        "work_on_a_foreign_stream_captured_behind_our_back_keeps_its_memory_for_the_graphs_life",
        &[]
    ) {
        return;
    }
    let (cuda, world, ctx) = rig();
    let theirs = Theirs::new(&cuda, &ctx);
    let f = cuda.fns();
    theirs.begin_capture();
    assert!(matches!(
        theirs.ours.expect_immediate("my op"),
        Err(Error::Deferred {
            why: "the stream is being captured",
            ..
        })
    ));
    let mut buf = DeviceBuffer::<u8>::zeroed(&ctx, 48).unwrap();
    buf.fill_async(5, &theirs.ours).unwrap();
    let graph = theirs.end_capture();
    let mut exec = std::ptr::null_mut();
    // SAFETY: the graph just made; a valid out-pointer.
    let rc = unsafe { (f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0) };
    cuda.check(rc, "cuGraphInstantiateWithFlags").unwrap();
    drop(buf);
    let other = DeviceBuffer::<u8>::zeroed(&ctx, 16).unwrap();
    assert_eq!(
        world.used_memory(0),
        64,
        "kept for the graph another library holds"
    );
    // SAFETY: the graph is destroyed once; its executable graph still holds the memory.
    cuda.check(unsafe { (f.cuGraphDestroy)(graph) }, "cuGraphDestroy")
        .unwrap();
    drop(DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap());
    assert_eq!(world.used_memory(0), 64, "kept for the executable graph");
    // SAFETY: a live executable graph and stream.
    let rc = unsafe { (f.cuGraphLaunch)(exec, theirs.raw.as_raw()) };
    cuda.check(rc, "cuGraphLaunch").unwrap();
    theirs.raw.synchronize().unwrap();
    // SAFETY: destroyed once, after its launch completed.
    cuda.check(
        unsafe { (f.cuGraphExecDestroy)(exec) },
        "cuGraphExecDestroy",
    )
    .unwrap();
    // Handed to the crate; released at its next release.
    drop(other);
    assert_eq!(world.used_memory(0), 0);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
    drop((theirs, ctx, cuda));
    assert!(world.live().is_empty(), "{:?}", world.live());
}

/// Waits for `s`, also while another test's global-mode capture forbids host waits in the
/// whole process for a moment (as CUDA's global mode does).
fn synchronized(s: &Stream) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match s.synchronize() {
            Ok(()) => return,
            Err(Error::Capturing { .. }) if std::time::Instant::now() < until => {
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A release that fails to take its stream's lock while a capture holds it, and queues
/// itself just after that capture let the lock go and looked at the queue, is not left
/// waiting for an unrelated call: it sees the lock was let go and retries itself.
#[test]
fn a_release_queued_just_after_its_lock_was_let_go_is_not_stranded() {
    // Alone in a process: another test's global-mode capture (process-wide, as in CUDA)
    // would take the memory into its graph, and another test's release would retry the
    // queue for this one.
    if !test_support::in_scrubbed_child!(
        "a_release_queued_just_after_its_lock_was_let_go_is_not_stranded",
        &[]
    ) {
        return;
    }
    let (_cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let ev = Event::without_timing(&ctx).unwrap();
    Stream::non_blocking(&ctx).unwrap().record(&ev).unwrap();
    for trial in 0..5_000 {
        let buf = DeviceBuffer::<u8>::alloc_on(&s, 64).unwrap();
        synchronized(&s);
        let both = std::sync::Barrier::new(2);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                both.wait();
                // Takes the stream's lock exclusively for a moment (a capture joined).
                s.wait_event(&ev).unwrap();
            });
            both.wait();
            for _ in 0..(trial % 64) {
                std::hint::spin_loop();
            }
            drop(buf);
        });
        synchronized(&s);
        assert_eq!(world.used_memory(0), 0, "trial {trial}: left in the queue");
    }
}

/// A dependency whose own drop panics.
struct Bomb;
impl cuda_hal::Dependency for Bomb {}
impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a dependency's drop panicked");
    }
}

/// A queued release whose drop panics (a user's dependency held for another library's
/// graph) does not unwind out of the unrelated call that finishes it, and later releases
/// on the same thread still finish.
#[test]
fn a_panicking_queued_release_stops_neither_its_caller_nor_later_releases() {
    // Alone in a process: another test's global-mode capture would take memory released
    // meanwhile into its graph, and the release queue is the process's.
    if !test_support::in_scrubbed_child!(
        "a_panicking_queued_release_stops_neither_its_caller_nor_later_releases",
        &[]
    ) {
        return;
    }
    let (cuda, world, ctx) = rig();
    let theirs = Theirs::new(&cuda, &ctx);
    // Another library captures its stream while `hold` is held for work enqueued there,
    // then destroys its graph: the graph's user object hands the hold to the release queue.
    let captured = |hold: cuda_hal::KeepAlive| {
        theirs.begin_capture();
        {
            let _order = theirs.ours.enqueue_lock();
            theirs.ours.hold(|| hold);
        }
        let graph = theirs.end_capture();
        // SAFETY: their graph, destroyed once.
        let rc = unsafe { (cuda.fns().cuGraphDestroy)(graph) };
        cuda.check(rc, "cuGraphDestroy").unwrap();
    };
    captured(cuda_hal::KeepAlive::new(Arc::new(Bomb)));
    let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(DeviceBuffer::<u8>::alloc(&ctx, 1).unwrap());
    }));
    assert!(released.is_ok(), "the panic unwound out of an allocation");
    let buf = DeviceBuffer::<u8>::zeroed(&ctx, 64).unwrap();
    captured(buf.keep_alive());
    drop(buf);
    drop(DeviceBuffer::<u8>::alloc(&ctx, 1).unwrap());
    assert_eq!(
        world.used_memory(0),
        0,
        "this thread's releases still finish"
    );
    drop((theirs, ctx, cuda));
    assert!(world.live().is_empty(), "{:?}", world.live());
}

/// Counts the graph launches it hears of.
#[derive(Default)]
struct Launches(AtomicUsize);
impl cuda_hal::Dependency for Launches {
    fn launched(&self, _stream: &Stream) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn an_owner_hears_of_each_launch_of_a_graph_that_uses_it_once_enqueued() {
    let (_cuda, world, ctx) = rig();
    let owner = Arc::new(Launches::default());
    let stream = Stream::non_blocking(&ctx).unwrap();
    let mut buf = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    {
        let _order = stream.enqueue_lock();
        stream.hold(|| cuda_hal::KeepAlive::new(owner.clone()));
    }
    buf.fill_async(1, &stream).unwrap();
    let inner = stream.end_capture().unwrap().instantiate().unwrap();
    for _ in 0..3 {
        inner.launch(&stream).unwrap();
    }
    assert_eq!(owner.0.load(Ordering::SeqCst), 3);
    // Launched inside another capture: recorded, not run; the outer graph's launches tell.
    stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    inner.launch(&stream).unwrap();
    let outer = stream.end_capture().unwrap().instantiate().unwrap();
    assert_eq!(owner.0.load(Ordering::SeqCst), 3, "recorded only");
    outer.launch(&stream).unwrap();
    outer.launch(&stream).unwrap();
    assert_eq!(owner.0.load(Ordering::SeqCst), 5);
    stream.synchronize().unwrap();
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// Found on an H200: memory whose home stream has pending work (stream-ordered, or
/// adopted from cudarc) first used inside a thread-local capture on another stream made
/// the crate wait for the home stream on the host, which CUDA refuses there, spoiling the
/// capture (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`). Now a typed error, the capture
/// intact; a relaxed capture waits and records.
#[test]
fn home_stream_memory_first_used_in_a_strict_capture_is_a_typed_error() {
    let (_cuda, world, ctx) = rig();
    let home = Stream::non_blocking(&ctx).unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    for (mode, refused) in [
        (CaptureMode::ThreadLocal, true),
        (CaptureMode::Global, true),
        (CaptureMode::Relaxed, false),
    ] {
        let theirs = DeviceBuffer::<u32>::alloc_on(&home, 4).unwrap();
        let p = theirs.as_raw();
        // SAFETY: 16 bytes of `ctx`, freed in order on `home` by `theirs`.
        let mut buf = unsafe { DeviceBuffer::<u32>::from_owner_on(&home, p, 4, theirs) };
        ours.begin_capture(mode).unwrap();
        let r = buf.fill_async(6, &ours);
        let graph = ours.end_capture();
        if refused {
            assert!(
                matches!(r, Err(Error::PendingInCapture { .. })),
                "{mode:?}: {r:?}"
            );
            assert!(graph.is_ok(), "{mode:?}: the capture is intact");
        } else {
            r.unwrap();
            graph.unwrap().instantiate().unwrap().launch(&ours).unwrap();
            ours.synchronize().unwrap();
            assert_eq!(buf.to_vec().unwrap(), [6; 4]);
        }
        // Used once outside the capture, it can be captured in any mode.
        buf.fill_async(1, &ours).unwrap();
        ours.begin_capture(mode).unwrap();
        buf.fill_async(2, &ours).unwrap();
        ours.end_capture().unwrap();
    }
    home.synchronize().unwrap();
    ours.synchronize().unwrap();
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// Host waits a strict capture forbids this thread are refused before the driver is
/// called (the driver would refuse them and spoil the capture), and a free that needs one
/// is handed to the capture's graph, which frees the memory when it goes.
#[test]
fn host_waits_a_strict_capture_forbids_are_refused_and_frees_wait_for_its_graph() {
    let (_cuda, world, ctx) = rig();
    let (s, other) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let mut buf = DeviceBuffer::<u8>::zeroed(&ctx, 96).unwrap();
    buf.fill_async(1, &other).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    assert_eq!(
        other.synchronize(),
        Err(Error::Capturing {
            what: "Stream::synchronize"
        })
    );
    assert_eq!(
        ctx.synchronize(),
        Err(Error::Capturing {
            what: "Context::synchronize"
        })
    );
    assert_eq!(
        buf.synchronize_uses(),
        Err(Error::Capturing {
            what: "DeviceBuffer::synchronize_uses"
        })
    );
    drop(buf); // its free would wait for `other` on the host
    assert_eq!(world.used_memory(0), 96, "held by the capture");
    let graph = s.end_capture().unwrap();
    assert_eq!(world.used_memory(0), 96, "held by the graph");
    drop(graph);
    assert_eq!(world.used_memory(0), 0);
    // Relaxed: nothing is forbidden.
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    other.synchronize().unwrap();
    ctx.synchronize().unwrap();
    s.end_capture().unwrap();
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// Memory that counts what it hears: `used_on` before, `enqueued_on` after the driver call
/// (seen through the simulated driver's call counter), once each per use, while borrowed.
struct Probe<'a> {
    buf: &'a DeviceBuffer<u32>,
    world: &'a cuda_mock::MockWorld,
    heard: Mutex<Vec<(&'static str, u64)>>,
}
// SAFETY: forwards to the buffer, which keeps the promises.
unsafe impl cuda_hal::DeviceSlice for Probe<'_> {
    type Elem = u32;
    fn device_ptr(&self) -> cuda_hal::cuda_sys::CUdeviceptr {
        self.buf.as_raw()
    }
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn context(&self) -> &Context {
        self.buf.context()
    }
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        let n = self.world.calls("cuMemcpyDtoDAsync") + self.world.calls("cuMemsetD32Async");
        self.heard.lock().unwrap().push(("used_on", n));
        self.buf.used_on(stream)
    }
    fn enqueued_on(&self, _stream: &Stream) {
        let n = self.world.calls("cuMemcpyDtoDAsync") + self.world.calls("cuMemsetD32Async");
        self.heard.lock().unwrap().push(("enqueued_on", n));
    }
}

// SAFETY: the buffer's memory is writable, and `&mut Probe` is its only writer here.
unsafe impl cuda_hal::DeviceSliceMut for Probe<'_> {}

#[test]
fn memory_hears_of_each_enqueue_after_the_driver_call_while_borrowed() {
    let (_cuda, world, ctx) = rig();
    let stream = Stream::non_blocking(&ctx).unwrap();
    let (a, b) = (
        DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap(),
        DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap(),
    );
    let probe = |buf| Probe {
        buf,
        world: &world,
        heard: Mutex::new(Vec::new()),
    };
    let (src, mut dst) = (probe(&a), probe(&b));
    cuda_hal::DeviceViewMut::new(&mut dst)
        .copy_from_async(&src, &stream)
        .unwrap();
    assert_eq!(
        *src.heard.lock().unwrap(),
        [("used_on", 0), ("enqueued_on", 1)]
    );
    assert_eq!(
        *dst.heard.lock().unwrap(),
        [("used_on", 0), ("enqueued_on", 1)]
    );
    cuda_hal::DeviceViewMut::new(&mut dst)
        .fill_async(7, &stream)
        .unwrap();
    assert_eq!(
        dst.heard.lock().unwrap()[2..],
        [("used_on", 1), ("enqueued_on", 2)]
    );
    // A use that enqueues nothing is not heard of later (nothing to order).
    {
        let _order = stream.enqueue_lock();
        cuda_hal::DeviceSlice::used_on(&src, &stream).unwrap();
    }
    assert_eq!(
        src.heard.lock().unwrap().len(),
        3,
        "used_on alone: no later call"
    );
    stream.synchronize().unwrap();
    assert_eq!(b.to_vec().unwrap(), [7; 4]);
}

/// Two strict captures on one thread (and a global one): ending one leaves the other
/// forbidding host waits, until it ends too.
#[test]
fn every_running_strict_capture_forbids_host_waits_until_it_ends() {
    let (_cuda, world, ctx) = rig();
    let (a, b, c, other) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let refused = Err(Error::Capturing {
        what: "Stream::synchronize",
    });
    for second in [CaptureMode::ThreadLocal, CaptureMode::Global] {
        a.begin_capture(CaptureMode::ThreadLocal).unwrap();
        b.begin_capture(second).unwrap();
        c.begin_capture(second).unwrap();
        drop(c.end_capture().unwrap());
        assert_eq!(other.synchronize(), refused, "a and b still run");
        drop(b.end_capture().unwrap());
        assert_eq!(other.synchronize(), refused, "a still runs");
        drop(a.end_capture().unwrap());
        other.synchronize().unwrap();
    }
    let buf = DeviceBuffer::<u8>::zeroed(&ctx, 4).unwrap();
    let guard = cuda_hal::Enqueuing::new(&buf, &other);
    assert_eq!(format!("{guard:?}"), "Enqueuing { len: 4 }");
    drop(guard);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}
