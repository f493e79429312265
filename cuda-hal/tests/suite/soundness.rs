//! The memory model on the simulated driver, whose sanitizer checks every device address
//! when work executes and every stream-ordered free against the streams that used the
//! memory. Each test is a way safe code could once make the (simulated) GPU touch freed
//! memory; the sanitizer reports it as a violation naming the call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{assert_clean, rig};

use cuda_hal::{CaptureMode, DeviceBuffer, Error, Event, Stream};

/// A graph captured over two buffers is launched after both were dropped: the graph owns
/// the memory, so the replay copies real data and the sanitizer sees no freed address.
#[test]
fn a_graph_keeps_the_memory_it_captured() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[7u32, 8, 9]).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 3).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 3).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    dst.copy_from_async(&src, &s).unwrap();
    out.copy_from_async(&dst, &s).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 4, "two copies, two buffers each");
    let exec = graph.instantiate().unwrap();
    drop(graph);
    drop((src, dst));
    assert_eq!(world.live().device_allocations, 3, "held by the graph");
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [7, 8, 9]);
    drop(exec);
    s.synchronize().unwrap();
    assert_eq!(
        world.live().device_allocations,
        1,
        "released with the graph"
    );
    drop((out, s, ctx, cuda));
    assert_clean(&world);
}

/// Stream-ordered memory freed on its own stream while work on another stream that used
/// it may still run: the free is ordered after that work.
#[test]
fn a_stream_ordered_free_waits_for_other_streams() {
    let (cuda, world, ctx) = rig();
    let (a, b) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[1u8; 64]).unwrap();
    let mut pooled = DeviceBuffer::<u8>::alloc_on(&a, 64).unwrap();
    pooled.copy_from_async(&src, &b).unwrap();
    drop(pooled);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    drop((src, a, b, ctx, cuda));
    assert_clean(&world);
}

/// A global capture forbids host waits in its own driver only: a test (or a program)
/// with another simulated machine waits, allocates and frees there as usual, and its
/// memory never goes to the other machine's graph. Before, a global capture anywhere in
/// the process refused every simulated machine's waits, so tests running beside one failed
/// at random.
#[test]
fn a_global_capture_forbids_nothing_on_another_driver() {
    let (cuda, world, ctx) = rig();
    let (other_cuda, other_world, other_ctx) = rig();
    let captured = Stream::non_blocking(&ctx).unwrap();
    let (here, there) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&other_ctx).unwrap(),
    );
    let mut theirs = DeviceBuffer::<u32>::zeroed(&other_ctx, 16).unwrap();
    let mut homed = DeviceBuffer::<u32>::alloc_on(&there, 16).unwrap();
    captured.begin_capture(CaptureMode::Global).unwrap();
    assert!(here.host_waits_forbidden());
    assert!(!there.host_waits_forbidden());
    theirs.fill_async(3, &there).unwrap();
    homed.fill_async(4, &there).unwrap();
    there.synchronize().unwrap();
    other_ctx.synchronize().unwrap();
    assert_eq!(theirs.to_vec().unwrap(), [3; 16]);
    let before = other_world.live().device_allocations;
    drop((theirs, homed));
    assert_eq!(
        other_world.live().device_allocations,
        before - 2,
        "freed at once, not given to the capture's graph"
    );
    assert_eq!(
        here.synchronize(),
        Err(Error::Capturing {
            what: "Stream::synchronize"
        })
    );
    drop(captured.end_capture().unwrap());
    assert!(!here.host_waits_forbidden());
    drop((here, there, captured, ctx, other_ctx, cuda, other_cuda));
    assert_clean(&world);
    assert_clean(&other_world);
}

/// The same with a plain allocation used on two streams: its free waits for both.
#[test]
fn a_plain_free_waits_for_every_stream_that_used_it() {
    let (cuda, world, ctx) = rig();
    let streams: Vec<Stream> = (0..3)
        .map(|_| Stream::non_blocking(&ctx).unwrap())
        .collect();
    let src = DeviceBuffer::from_slice(&ctx, &[3u16; 32]).unwrap();
    let mut dst = DeviceBuffer::<u16>::alloc(&ctx, 32).unwrap();
    for s in &streams {
        dst.copy_from_async(&src, s).unwrap();
    }
    let syncs = world.calls("cuStreamSynchronize");
    drop(dst);
    assert_eq!(
        world.calls("cuStreamSynchronize") - syncs,
        3,
        "one wait per stream that used the buffer"
    );
    drop((src, streams, ctx, cuda));
    assert_clean(&world);
}

/// A stream that joins a capture through an event records into the same graph, so what
/// its work uses is held by that graph too.
#[test]
fn a_stream_joined_to_a_capture_is_held_by_the_graph() {
    let (cuda, world, ctx) = rig();
    let (a, b) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let fork = Event::without_timing(&ctx).unwrap();
    let join = Event::without_timing(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[5i64; 4]).unwrap();
    let mut dst = DeviceBuffer::<i64>::zeroed(&ctx, 4).unwrap();
    a.begin_capture(CaptureMode::ThreadLocal).unwrap();
    a.record(&fork).unwrap();
    b.wait_event(&fork).unwrap();
    dst.copy_from_async(&src, &b).unwrap();
    b.record(&join).unwrap();
    a.wait_event(&join).unwrap();
    let graph = a.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 2, "b's copy is held by a's graph");
    drop(src);
    let exec = graph.instantiate().unwrap();
    exec.launch(&a).unwrap();
    a.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [5; 4]);
    drop((exec, graph, dst, fork, join, a, b, ctx, cuda));
    assert_clean(&world);
}

/// Memory a graph still uses cannot be handed out as raw memory.
#[test]
fn into_raw_refuses_memory_a_graph_still_uses() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[1u8, 2]).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 2).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    dst.copy_from_async(&src, &s).unwrap();
    let graph = s.end_capture().unwrap();
    let src = src.into_raw().expect_err("the graph still reads it");
    drop(graph);
    let (ptr, len) = src.into_raw().unwrap();
    assert_eq!(len, 2);
    // SAFETY: handed over just above, 2 bytes of this context, nothing else owns it.
    drop(unsafe { DeviceBuffer::<u8>::from_raw(&ctx, ptr, len) });
    drop((dst, s, ctx, cuda));
    assert_clean(&world);
}

/// Calls that wait for their stream, and so would put borrowed host memory into a graph,
/// are refused while the stream is captured; a capture not begun here cannot be ended
/// here.
#[test]
fn waiting_calls_are_refused_while_capturing_and_foreign_captures_stay_foreign() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 2).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    assert_eq!(
        buf.copy_from_host_on(&[1, 2], &s).unwrap_err(),
        Error::Capturing {
            what: "copy_from_host_on"
        }
    );
    assert_eq!(
        buf.copy_to_host_on(&mut [0, 0], &s).unwrap_err(),
        Error::Capturing {
            what: "copy_to_host_on"
        }
    );
    assert_eq!(
        s.begin_capture(CaptureMode::ThreadLocal).unwrap_err(),
        Error::Capturing {
            what: "begin_capture"
        }
    );
    drop(s.end_capture().unwrap());
    let t = Stream::non_blocking(&ctx).unwrap();
    // SAFETY: a valid stream and mode; the capture is ended through the raw table below.
    unsafe {
        (cuda.fns().cuStreamBeginCapture)(
            t.as_raw(),
            cuda_hal::cuda_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    };
    assert_eq!(
        t.end_capture().unwrap_err(),
        Error::ForeignCapture {
            what: "end_capture"
        }
    );
    let mut raw = std::ptr::null_mut();
    // SAFETY: ends the raw capture begun above.
    unsafe { (cuda.fns().cuStreamEndCapture)(t.as_raw(), &mut raw) };
    // SAFETY: the graph made just above, destroyed once.
    unsafe { (cuda.fns().cuGraphDestroy)(raw) };
    drop((buf, s, t, ctx, cuda));
    assert_clean(&world);
}

/// A guard that made a context current pops it again; it never names the context that
/// was current before, which it does not own.
#[test]
fn a_guard_never_restores_a_context_it_does_not_own() {
    let (cuda, world, ctx) = rig();
    let other = cuda.device(1).unwrap().primary_context().unwrap();
    let current = || {
        let mut c = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { (cuda.fns().cuCtxGetCurrent)(&mut c) };
        c
    };
    {
        let _outer = other.bind().unwrap();
        assert_eq!(current(), other.as_raw());
        {
            let _inner = ctx.bind().unwrap();
            assert_eq!(current(), ctx.as_raw());
            let _again = ctx.bind().unwrap();
        }
        assert_eq!(current(), other.as_raw());
    }
    assert!(current().is_null());
    assert_eq!(world.calls("cuCtxSetCurrent"), 0, "only pushes and pops");
    drop((other, ctx, cuda));
    assert_clean(&world);
}

/// A buffer whose stream (or whose own allocation stream) is being captured when it is
/// dropped: freeing now would put a wait, an event or the free itself into the user's
/// graph (a free node frees again at every launch). The graph owns the memory instead.
#[test]
fn a_buffer_dropped_while_its_streams_are_captured_goes_with_the_graph() {
    let (cuda, world, ctx) = rig();
    let (s, pool) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[1u8; 8]).unwrap();
    let mut plain = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    plain.copy_from_async(&src, &s).unwrap();
    let mut pooled = DeviceBuffer::<u8>::alloc_on(&pool, 8).unwrap();
    pooled.copy_from_async(&src, &s).unwrap();
    let own = DeviceBuffer::<u8>::alloc_on(&pool, 8).unwrap();
    s.synchronize().unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    pool.begin_capture(CaptureMode::ThreadLocal).unwrap();
    drop((plain, pooled, own));
    let (gs, gp) = (s.end_capture().unwrap(), pool.end_capture().unwrap());
    assert_eq!(gs.dependencies(), 2, "the two buffers s used");
    assert_eq!(gp.dependencies(), 1, "the buffer only pool knew");
    let (es, ep) = (gs.instantiate().unwrap(), gp.instantiate().unwrap());
    for _ in 0..2 {
        es.launch(&s).unwrap();
        ep.launch(&pool).unwrap();
    }
    assert_eq!(world.live().device_allocations, 4, "held by the graphs");
    drop((es, ep, gs, gp));
    pool.synchronize().unwrap();
    assert_eq!(world.live().device_allocations, 1, "freed with them");
    drop((src, s, pool, ctx, cuda));
    assert_clean(&world);
}

/// Stream-ordered memory first used on another stream makes that stream wait for the
/// allocation stream once; synchronous calls wait for the allocation stream once.
#[test]
fn stream_ordered_memory_is_ordered_before_its_first_use_elsewhere() {
    let (cuda, world, ctx) = rig();
    let (pool, other) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[9u16; 4]).unwrap();
    let mut p = DeviceBuffer::<u16>::alloc_on(&pool, 4).unwrap();
    let waits = world.calls("cuStreamWaitEvent");
    p.copy_from_async(&src, &other).unwrap();
    p.copy_from_async(&src, &other).unwrap();
    assert_eq!(
        world.calls("cuStreamWaitEvent") - waits,
        1,
        "once per stream"
    );
    p.copy_from_async(&src, &pool).unwrap();
    assert_eq!(
        world.calls("cuStreamWaitEvent") - waits,
        1,
        "not on its own stream"
    );
    let mut q = DeviceBuffer::<u16>::alloc_on(&pool, 4).unwrap();
    let syncs = world.calls("cuStreamSynchronize");
    q.copy_from_host(&[1, 2, 3, 4]).unwrap();
    let first = world.calls("cuStreamSynchronize") - syncs;
    q.copy_from_host(&[5, 6, 7, 8]).unwrap();
    let second = world.calls("cuStreamSynchronize") - syncs - first;
    assert_eq!(
        (first, second),
        (2, 1),
        "the pool stream once, then the legacy one each time"
    );
    assert_eq!(q.to_vec().unwrap(), [5, 6, 7, 8]);
    drop((p, q, src));
    pool.synchronize().unwrap();
    drop((pool, other, ctx, cuda));
    assert_clean(&world);
}

/// No capture begins while another thread is between noting work and enqueueing it
/// (it holds the stream's order lock), so captured work is always held.
#[test]
fn a_capture_waits_for_work_being_enqueued_on_another_thread() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let order = s.enqueue_lock();
    let begun = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let h = scope.spawn(|| {
            s.begin_capture(CaptureMode::Relaxed).unwrap();
            begun.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !begun.load(std::sync::atomic::Ordering::SeqCst),
            "began under the lock"
        );
        drop(order);
        h.join().unwrap();
    });
    assert!(begun.into_inner());
    drop(s.end_capture().unwrap());
    drop((s, ctx, cuda));
    assert_clean(&world);
}

/// A graph launched inside another capture is held by the outer graph.
#[test]
fn a_graph_launched_inside_a_capture_is_held_by_the_outer_graph() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[3u8; 8]).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    dst.copy_from_async(&src, &s).unwrap();
    let inner = s.end_capture().unwrap().instantiate().unwrap();
    drop(src);
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    inner.launch(&s).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 1, "the inner graph");
    let outer = graph.instantiate().unwrap();
    drop((graph, inner));
    outer.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [3; 8]);
    drop((outer, dst, s, ctx, cuda));
    assert_clean(&world);
}

/// A stream that joined a capture leaves it when the capture ends: waiting calls work on
/// it again and it can begin a capture of its own.
#[test]
fn a_joined_stream_leaves_the_capture_when_it_ends() {
    let (cuda, world, ctx) = rig();
    let (a, b) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let (fork, join) = (
        Event::without_timing(&ctx).unwrap(),
        Event::without_timing(&ctx).unwrap(),
    );
    let mut buf = DeviceBuffer::<u8>::zeroed(&ctx, 2).unwrap();
    a.begin_capture(CaptureMode::ThreadLocal).unwrap();
    a.record(&fork).unwrap();
    b.wait_event(&fork).unwrap();
    assert_eq!(
        buf.copy_from_host_on(&[1, 2], &b).unwrap_err(),
        Error::Capturing {
            what: "copy_from_host_on"
        }
    );
    b.record(&join).unwrap();
    a.wait_event(&join).unwrap();
    drop(a.end_capture().unwrap());
    buf.copy_from_host_on(&[1, 2], &b).unwrap();
    b.begin_capture(CaptureMode::ThreadLocal).unwrap();
    drop(b.end_capture().unwrap());
    drop((buf, fork, join, a, b, ctx, cuda));
    assert_clean(&world);
}

/// An executable graph launches only on a stream of its own context.
#[test]
fn a_graph_launches_only_on_its_own_context() {
    let (cuda, world, ctx) = rig();
    let ctx1 = cuda.device(1).unwrap().primary_context().unwrap();
    let (s, s1) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx1).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[1u8; 8]).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    dst.copy_from_async(&src, &s).unwrap();
    let e = s.end_capture().unwrap().instantiate().unwrap();
    assert_eq!(
        e.launch(&s1).unwrap_err(),
        Error::WrongDevice {
            what: "GraphExec::launch",
            object: "stream",
            expected: 0,
            found: 1
        }
    );
    drop((e, src, dst, s, s1, ctx, ctx1, cuda));
    assert_clean(&world);
}

/// Deferral scopes nest like NCCL's group calls: what work noted inside holds (memory,
/// streams) is released when the outermost scope closes, not before.
#[test]
fn deferral_scopes_hold_until_the_outermost_closes() {
    use cuda_hal::DeferScope;
    let (cuda, world, ctx) = rig();
    let src = DeviceBuffer::from_slice(&ctx, &[4u8; 4]).unwrap();
    assert!(!DeferScope::is_open());
    let outer = DeferScope::open();
    assert!(DeferScope::is_open());
    {
        let inner = DeferScope::open();
        let s = Stream::non_blocking(&ctx).unwrap();
        let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 4).unwrap();
        dst.copy_from_async(&src, &s).unwrap();
        drop((dst, s));
        assert_eq!(world.live().device_allocations, 2, "dst held");
        assert_eq!(world.live().streams, 1, "its stream held");
        drop(inner);
        assert!(DeferScope::is_open());
        assert_eq!(
            world.live().device_allocations,
            2,
            "the outer scope is open"
        );
    }
    drop(outer);
    assert!(!DeferScope::is_open());
    assert_eq!(world.live().device_allocations, 1);
    drop(src);
    assert_eq!(
        world.live().streams,
        0,
        "src's use log held the stream until now"
    );
    drop((ctx, cuda));
    assert_clean(&world);
}

/// A graph launch notes its memory on the launch stream: a stream-ordered buffer the
/// graph wrote is freed on its own stream only after the launch (the sanitizer checks).
#[test]
fn a_graph_launch_orders_the_free_of_what_it_used() {
    let (cuda, world, ctx) = rig();
    let (pool, cap, launch) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[2u32; 4]).unwrap();
    let mut pooled = DeviceBuffer::<u32>::alloc_on(&pool, 4).unwrap();
    // Ready for any stream before the capture: a strict capture forbids the host wait
    // that a first use on another stream would need.
    cuda_hal::DeviceSlice::used_synchronously(&pooled).unwrap();
    cap.begin_capture(CaptureMode::ThreadLocal).unwrap();
    pooled.copy_from_async(&src, &cap).unwrap();
    let graph = cap.end_capture().unwrap();
    let exec = graph.instantiate().unwrap();
    drop((graph, pooled));
    exec.launch(&launch).unwrap();
    drop(exec);
    pool.synchronize().unwrap();
    drop((src, pool, cap, launch, ctx, cuda));
    assert_clean(&world);
}

/// What the new types print.
#[test]
fn debug_output_names_what_matters() {
    use cuda_hal::DeferScope;
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[1u8, 2, 3]).unwrap();
    assert_eq!(src.len(), 3);
    assert!(!src.is_empty());
    assert_eq!(format!("{:?}", s.enqueue_lock()), "EnqueueLock");
    assert!(
        format!("{s:?}").starts_with("Stream { device: 0, raw: 0x"),
        "{s:?}"
    );
    assert_eq!(format!("{ctx:?}"), "Context { device: 0 }");
    assert_eq!(
        format!("{:?}", Event::without_timing(&ctx).unwrap()),
        "Event { device: 0 }"
    );
    let text = format!("{src:?}");
    assert!(
        text.starts_with("DeviceBuffer { device: 0, ptr: 0x") && text.ends_with(", len: 3 }"),
        "{text}"
    );
    let empty = DeviceBuffer::<u8>::alloc_on(&s, 0).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.len(), 0);
    assert_eq!(
        format!("{:?}", src.keep_alive()),
        "KeepAlive { gated: false }"
    );
    let scope = DeferScope::open();
    assert_eq!(format!("{scope:?}"), "DeferScope { open: true }");
    drop(scope);
    let guard = ctx.bind().unwrap();
    assert_eq!(
        format!("{guard:?}"),
        "CurrentGuard { device: 0, pushed: true }"
    );
    drop(guard);
    let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 3).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    dst.copy_from_async(&src, &s).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(format!("{graph:?}"), "Graph { device: 0, holds: 2 }");
    let exec = graph.instantiate().unwrap();
    assert_eq!(format!("{exec:?}"), "GraphExec { device: 0, holds: 2 }");
    drop((exec, graph, src, dst, empty, s, ctx, cuda));
    assert_clean(&world);
}

/// A dependency of another crate (say a registration) held by a capture: gated ones are
/// asked before each launch and can refuse it; every dependency keeps its stream alive
/// while an open group holds it.
#[test]
fn user_dependencies_gate_launches_and_are_held_with_their_stream() {
    use cuda_hal::{DeferScope, Dependency, KeepAlive};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    struct Plain;
    impl Dependency for Plain {}
    /// Gated, but with the default `while_usable`: launches.
    struct Open;
    impl Dependency for Open {
        fn gated(&self) -> bool {
            true
        }
    }
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let gate = Arc::new(Gate(AtomicBool::new(true)));
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    s.hold(|| KeepAlive::new(gate.clone()));
    s.hold(|| KeepAlive::new(Arc::new(Plain)));
    s.hold(|| KeepAlive::new(Arc::new(Open)));
    let exec = s.end_capture().unwrap().instantiate().unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(world.calls("cuGraphLaunch"), 1);
    gate.0.store(false, Ordering::SeqCst);
    assert_eq!(
        exec.launch(&s).unwrap_err(),
        Error::Unusable {
            what: "the gate is shut".into()
        }
    );
    assert_eq!(world.calls("cuGraphLaunch"), 1, "refused before the driver");
    drop(exec);
    let scope = DeferScope::open();
    for _ in 0..2 {
        let t = Stream::non_blocking(&ctx).unwrap();
        t.hold(|| KeepAlive::new(Arc::new(Plain)));
    }
    assert_eq!(world.live().streams, 3, "both held by the open scope");
    drop(scope);
    assert_eq!(world.live().streams, 1);
    drop((s, ctx, cuda));
    assert_clean(&world);
}

/// Stream-ordered memory dropped while its own stream is captured, after use on another
/// stream: the graph takes it with its use log, and its eventual free is still ordered
/// after that use. Its first use on a captured stream waits on the host instead of
/// putting an outside event into the capture.
#[test]
fn a_deferred_free_keeps_its_use_log_and_captured_first_uses_wait_on_the_host() {
    let (cuda, world, ctx) = rig();
    let (pool, s) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[6u8; 16]).unwrap();
    let mut pooled = DeviceBuffer::<u8>::alloc_on(&pool, 16).unwrap();
    pool.synchronize().unwrap();
    pooled.copy_from_async(&src, &s).unwrap();
    pool.begin_capture(CaptureMode::ThreadLocal).unwrap();
    drop(pooled);
    drop(pool.end_capture().unwrap());
    pool.synchronize().unwrap();
    assert!(world.violations().is_empty(), "{:?}", world.violations());

    let mut fresh = DeviceBuffer::<u8>::alloc_on(&pool, 16).unwrap();
    // Relaxed: a strict capture forbids the host wait (PendingInCapture, see
    // foreign::home_stream_memory_first_used_in_a_strict_capture_is_a_typed_error).
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    let (syncs, waits) = (
        world.calls("cuStreamSynchronize"),
        world.calls("cuStreamWaitEvent"),
    );
    fresh.copy_from_async(&src, &s).unwrap();
    assert_eq!(
        world.calls("cuStreamSynchronize") - syncs,
        1,
        "the pool stream, on the host"
    );
    assert_eq!(
        world.calls("cuStreamWaitEvent"),
        waits,
        "no outside event in the capture"
    );
    drop(s.end_capture().unwrap());
    drop((fresh, src));
    pool.synchronize().unwrap();
    drop((pool, s, ctx, cuda));
    assert_clean(&world);
}

/// A graph launched inside a capture: launching the outer graph on another stream notes
/// the inner graph's memory there, so its stream-ordered free waits for that launch.
#[test]
fn an_outer_graph_launch_notes_the_inner_graphs_memory() {
    let (cuda, world, ctx) = rig();
    let (pool, cap, outer_s, launch) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[2u32; 4]).unwrap();
    let mut pooled = DeviceBuffer::<u32>::alloc_on(&pool, 4).unwrap();
    // Ready for any stream before the capture: a strict capture forbids the host wait
    // that a first use on another stream would need.
    cuda_hal::DeviceSlice::used_synchronously(&pooled).unwrap();
    cap.begin_capture(CaptureMode::ThreadLocal).unwrap();
    pooled.copy_from_async(&src, &cap).unwrap();
    let inner = cap.end_capture().unwrap().instantiate().unwrap();
    outer_s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    inner.launch(&outer_s).unwrap();
    let outer = outer_s.end_capture().unwrap().instantiate().unwrap();
    drop((inner, pooled));
    outer.launch(&launch).unwrap(); // replays the copy into `pooled` on `launch`
    drop(outer); // last owner: cuMemFreeAsync on `pool`, not ordered after `launch`
    pool.synchronize().unwrap();
    drop((src, pool, cap, outer_s, launch, ctx, cuda));
    assert_clean(&world);
}

/// Frees and orderings of stream-ordered memory race with captures that another thread
/// begins and ends on the same stream: they take the stream's order lock, so nothing of
/// theirs lands in a graph (no free node freeing at every replay, no unordered free).
#[test]
fn stream_ordered_frees_race_safely_with_captures_on_another_thread() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (cuda, world, ctx) = rig();
    let (own, later) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[5u8; 8]).unwrap();
    let stop = AtomicBool::new(false);
    let execs = std::thread::scope(|sc| {
        let y = sc.spawn(|| {
            let mut execs = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if own.begin_capture(CaptureMode::Relaxed).is_ok() {
                    std::thread::yield_now();
                    if let Ok(e) = own.end_capture().and_then(|g| g.instantiate()) {
                        execs.push(e);
                    }
                }
            }
            execs
        });
        for _ in 0..3000 {
            if let Ok(mut pooled) = DeviceBuffer::<u8>::alloc_on(&own, 8) {
                let _ = pooled.copy_from_async(&src, &later);
                drop(pooled);
            }
        }
        stop.store(true, Ordering::Relaxed);
        y.join().unwrap()
    });
    let l = Stream::non_blocking(&ctx).unwrap();
    let mut fails = 0;
    for e in &execs {
        for _ in 0..2 {
            if e.launch(&l).is_err() {
                fails += 1;
            }
        }
    }
    let _ = l.synchronize();
    assert_eq!(fails, 0, "every captured graph replays cleanly");
    drop((execs, l, src, own, later, ctx, cuda));
    assert_clean(&world);
}

/// A wait that starts before another thread records its event into a capture, and
/// reaches the driver after: the capture it joins is the one the crate tracks, so the
/// work the joined stream records is held by the graph.
#[test]
fn a_wait_racing_a_record_into_a_capture_joins_it_knowingly() {
    let (cuda, world, ctx) = rig();
    let (s, t) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let (e, join) = (
        Event::without_timing(&ctx).unwrap(),
        Event::without_timing(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[5u8; 8]).unwrap();
    let mut victim = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    std::thread::scope(|sc| {
        let g = t.enqueue_lock();
        // A writer queues on t's lock, so readers now block behind it.
        let w = sc.spawn(|| {
            let _ = t.end_capture();
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        // wait_event reads e's capture (none yet), then blocks on t's order lock.
        let a = sc.spawn(|| t.wait_event(&e).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(100));
        s.begin_capture(CaptureMode::Relaxed).unwrap();
        e.record(&s).unwrap();
        drop(g);
        w.join().unwrap();
        a.join().unwrap();
    });
    // In the driver t has joined s's capture; the crate does not know.
    victim.copy_from_async(&src, &t).unwrap();
    t.record(&join).unwrap();
    s.wait_event(&join).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 2, "t's copy is held");
    let exec = graph.instantiate().unwrap();
    drop(graph);
    drop(victim);
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop((exec, src, e, join, s, t, ctx, cuda));
    assert_clean(&world);
}

/// A dependency's callbacks may look at the deferral scope (no re-entrant borrow), and a
/// dependency that cannot settle keeps what the group held alive instead of freeing it.
#[test]
fn dependencies_may_inspect_the_scope_and_unsettled_groups_keep_their_holds() {
    use cuda_hal::{DeferScope, Dependency, KeepAlive};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Unsettled(AtomicUsize);
    impl Dependency for Unsettled {
        fn deferred(&self) {
            assert!(DeferScope::is_open());
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn settle(&self) -> bool {
            false
        }
    }
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let dep = Arc::new(Unsettled(AtomicUsize::new(0)));
    let src = DeviceBuffer::from_slice(&ctx, &[1u8; 4]).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 4).unwrap();
    let scope = DeferScope::open();
    s.hold(|| KeepAlive::new(dep.clone()));
    dst.copy_from_async(&src, &s).unwrap();
    drop(dst);
    drop(scope);
    assert_eq!(dep.0.load(Ordering::SeqCst), 1);
    assert_eq!(
        world.live().device_allocations,
        2,
        "dst kept alive for good"
    );
    assert!(world.violations().is_empty());
    drop((src, s, ctx, cuda));
}

/// An event recorded into a capture and then again outside one no longer joins a stream
/// that waits for it to the capture; a stream with a capture of its own keeps it when it
/// waits for an event of another capture.
#[test]
fn waits_join_only_the_capture_of_the_last_record() {
    let (cuda, world, ctx) = rig();
    let (s, t, u) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let e = Event::without_timing(&ctx).unwrap();
    let mut buf = DeviceBuffer::<u8>::zeroed(&ctx, 2).unwrap();
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    e.record(&s).unwrap();
    e.record(&t).unwrap();
    u.wait_event(&e).unwrap();
    buf.copy_from_host_on(&[1, 2], &u).unwrap();
    t.begin_capture(CaptureMode::Relaxed).unwrap();
    let f = Event::without_timing(&ctx).unwrap();
    f.record(&s).unwrap();
    t.wait_event(&f).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[3u8, 4]).unwrap();
    buf.copy_from_async(&src, &t).unwrap();
    let gt = t.end_capture().unwrap();
    assert_eq!(gt.dependencies(), 2, "t kept its own capture");
    let gs = s.end_capture().unwrap();
    assert_eq!(gs.dependencies(), 0);
    drop((gs, gt, src, buf, e, f, s, t, u, ctx, cuda));
    assert_clean(&world);
}

/// A graph launched inside a capture carries its gates: the outer graph is refused when
/// a dependency of the inner one is.
#[test]
fn an_outer_graph_carries_the_inner_graphs_gates() {
    use cuda_hal::KeepAlive;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let gate = Arc::new(Gate(AtomicBool::new(true)));
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    s.hold(|| KeepAlive::new(gate.clone()));
    let inner = s.end_capture().unwrap().instantiate().unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    inner.launch(&s).unwrap();
    let outer = s.end_capture().unwrap().instantiate().unwrap();
    outer.launch(&s).unwrap();
    gate.0.store(false, Ordering::SeqCst);
    assert_eq!(
        outer.launch(&s).unwrap_err(),
        Error::Unusable {
            what: "the gate is shut".into()
        }
    );
    drop((outer, inner, s, ctx, cuda));
    assert_clean(&world);
}

/// A user dependency that refuses launches while shut.
struct Gate(std::sync::atomic::AtomicBool);

impl cuda_hal::Dependency for Gate {
    fn gated(&self) -> bool {
        true
    }

    fn while_usable(
        &self,
        launch: &mut dyn FnMut() -> cuda_hal::Result<()>,
    ) -> cuda_hal::Result<()> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            launch()
        } else {
            Err(Error::Unusable {
                what: "the gate is shut".into(),
            })
        }
    }
}

/// `owners` counts the buffer and everything that holds its memory: a `KeepAlive` (an
/// NCCL registration) and a graph whose work uses it.
#[test]
fn owners_counts_the_buffer_and_each_holder_of_its_memory() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[3u8; 8]).unwrap();
    let mut b = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    assert_eq!(b.owners(), 1);
    let held = b.keep_alive();
    assert_eq!(b.owners(), 2);
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    b.copy_from_async(&src, &s).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(b.owners(), 3, "and the graph");
    drop(graph);
    assert_eq!(b.owners(), 2);
    drop(held);
    assert_eq!(b.owners(), 1);
    drop((b, src, s, ctx, cuda));
    assert_clean(&world);
}

/// `synchronize_uses` waits for each stream that used the memory, once, and for no other;
/// refused while one of them is captured.
#[test]
fn synchronize_uses_waits_for_exactly_the_streams_that_used_the_memory() {
    let (cuda, world, ctx) = rig();
    let (a, c, idle) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let src = DeviceBuffer::from_slice(&ctx, &[5u8; 8]).unwrap();
    let mut b = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
    let syncs = || world.calls("cuStreamSynchronize");
    let n = syncs();
    b.synchronize_uses().unwrap();
    assert_eq!(syncs() - n, 0, "never used on a stream");
    b.copy_from_async(&src, &a).unwrap();
    b.copy_from_async(&src, &c).unwrap();
    b.copy_from_async(&src, &a).unwrap();
    let n = syncs();
    b.synchronize_uses().unwrap();
    assert_eq!(syncs() - n, 2, "a and c");
    c.begin_capture(CaptureMode::ThreadLocal).unwrap();
    assert_eq!(
        b.synchronize_uses(),
        Err(Error::Capturing {
            what: "DeviceBuffer::synchronize_uses"
        })
    );
    drop(c.end_capture().unwrap());
    assert_eq!(b.to_vec().unwrap(), [5; 8]);
    drop((b, src, a, c, idle, ctx, cuda));
    assert_clean(&world);
}

/// A `StreamLog` keeps each stream noted once, in order, and waits for exactly those.
#[test]
fn a_stream_log_notes_each_stream_once_and_waits_for_them() {
    let (cuda, world, ctx) = rig();
    let (a, c) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    let log = cuda_hal::StreamLog::new();
    assert_eq!(format!("{log:?}"), "StreamLog { streams: 0 }");
    assert!(log.streams().is_empty());
    for s in [&c, &c, &a, &c] {
        log.note(s);
    }
    let raws: Vec<_> = log.streams().iter().map(Stream::as_raw).collect();
    assert_eq!(raws, [c.as_raw(), a.as_raw()]);
    assert_eq!(format!("{log:?}"), "StreamLog { streams: 2 }");
    let n = world.calls("cuStreamSynchronize");
    log.synchronize().unwrap();
    assert_eq!(world.calls("cuStreamSynchronize") - n, 2);
    a.begin_capture(CaptureMode::ThreadLocal).unwrap();
    assert_eq!(
        log.synchronize(),
        Err(Error::Capturing {
            what: "StreamLog::synchronize"
        })
    );
    drop(a.end_capture().unwrap());
    drop(log);
    drop((a, c, ctx, cuda));
    assert_clean(&world);
}

/// An element type aligned to more than the page the driver promises: the driver's
/// pinned memory (the simulated one is 4096- but never 8192-aligned) cannot hold it, and
/// the buffer is refused instead of handing out misaligned slices; nothing leaks.
#[test]
fn pinned_memory_of_an_over_aligned_type_is_refused() {
    #[derive(Clone, Copy)]
    #[repr(C, align(8192))]
    struct Page2([u8; 8192]);
    // SAFETY: Copy, no padding (one 8192-byte array in 8192 bytes), no pointers, every
    // bit pattern valid.
    unsafe impl cuda_hal::DeviceRepr for Page2 {}

    let (_cuda, world, ctx) = rig();
    let e = cuda_hal::PinnedBuffer::<Page2>::zeroed(&ctx, 2).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { what: "PinnedBuffer::zeroed", problem } if problem.contains("8192")),
        "{e:?}"
    );
    assert_eq!(world.live().host_allocations, 0, "freed at once");
    // A page-aligned type is fine, and its slice is aligned.
    #[derive(Clone, Copy)]
    #[repr(C, align(4096))]
    struct Page([u8; 4096]);
    // SAFETY: as above, at 4096 bytes.
    unsafe impl cuda_hal::DeviceRepr for Page {}
    let ok = cuda_hal::PinnedBuffer::<Page>::zeroed(&ctx, 2).unwrap();
    assert_eq!(ok.as_ptr().addr() % 4096, 0);
    assert_eq!(ok[1].0, [0; 4096]);
}

/// A capture begun inside an open group would record the work the group launches at its
/// end while the group alone holds what that work uses (the graph would hold nothing):
/// refused, and a capture begun before the group is fine.
#[test]
fn a_capture_begun_inside_an_open_group_is_refused() {
    let (_cuda, _world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    {
        let _group = cuda_hal::DeferScope::open();
        let e = s.begin_capture(CaptureMode::ThreadLocal).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what: "begin_capture", problem } if problem.contains("open group")),
            "{e:?}"
        );
        assert!(!s.is_capturing().unwrap());
    }
    // Allocated first: a synchronous zeroing inside a thread-local capture would fail on
    // a device (and the simulated driver refuses it likewise).
    let mut b = DeviceBuffer::<u8>::zeroed(&ctx, 4).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    {
        let _group = cuda_hal::DeferScope::open();
        b.fill_async(1, &s).unwrap();
        drop(b);
    }
    s.end_capture().unwrap();
}

/// A blocking copy whose final wait fails must not end the host slice's borrow while a
/// copy into it might still run: it asks the stream until it is idle (or the context is
/// lost), then returns the wait's error.
#[test]
fn a_failed_wait_after_a_host_copy_still_waits_for_the_stream() {
    let (_cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let buf = DeviceBuffer::from_slice(&ctx, &[1u32, 2]).unwrap();
    let mut host = [0u32; 2];
    let queries = world.calls("cuStreamQuery");
    world.fail_next(
        "cuStreamSynchronize",
        cuda_sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    let e = buf.copy_to_host_on(&mut host, &s).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Driver {
                call: "cuStreamSynchronize",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(world.calls("cuStreamQuery") > queries, "asked until idle");
    let mut dev = DeviceBuffer::<u32>::zeroed(&ctx, 2).unwrap();
    world.fail_next(
        "cuStreamSynchronize",
        cuda_sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    let queries = world.calls("cuStreamQuery");
    dev.copy_from_host_on(&host, &s).unwrap_err();
    assert!(world.calls("cuStreamQuery") > queries, "asked until idle");
    // A query refused by a capture elsewhere is asked again; a lost context ends it.
    // Any other unexpected answer is asked again too.
    for (refusal, asked) in [
        (cuda_sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 2),
        (cuda_sys::CUresult::CUDA_ERROR_INVALID_VALUE, 2),
        (cuda_sys::CUresult::CUDA_ERROR_LAUNCH_FAILED, 1),
        (cuda_sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, 1),
    ] {
        world.fail_next(
            "cuStreamSynchronize",
            cuda_sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
        world.fail_next("cuStreamQuery", refusal);
        let queries = world.calls("cuStreamQuery");
        buf.copy_to_host_on(&mut host, &s).unwrap_err();
        assert_eq!(world.calls("cuStreamQuery") - queries, asked, "{refusal:?}");
    }
}

thread_local! {
    /// A user's thread-local that keeps a scope open (as a group kept there would).
    static KEPT_SCOPE: std::cell::RefCell<Option<cuda_hal::DeferScope>> =
        const { std::cell::RefCell::new(None) };
}

/// A scope kept open in a user's thread-local outlives the crate's per-thread state,
/// which is torn down first: what the scope holds is leaked, never freed (the group's work
/// is launched only when the scope's owner ends it, later).
#[test]
fn a_scope_kept_in_a_thread_local_leaks_what_it_holds() {
    let (_cuda, world, ctx) = rig();
    let before = world.live().device_allocations;
    std::thread::spawn(move || {
        // Registered before the crate's state: destroyed after it.
        KEPT_SCOPE.with(|_| ());
        let s = Stream::non_blocking(&ctx).unwrap();
        let scope = cuda_hal::DeferScope::open();
        let mut b = DeviceBuffer::<u8>::zeroed(&ctx, 8).unwrap();
        b.fill_async(1, &s).unwrap();
        drop(b);
        KEPT_SCOPE.with(|k| *k.borrow_mut() = Some(scope));
    })
    .join()
    .unwrap();
    assert_eq!(
        world.live().device_allocations,
        before + 1,
        "leaked, not freed"
    );
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// A stream whose last handle goes while a capture begun through it records (an early
/// return between `begin_capture` and `end_capture`): nothing can end that capture any
/// more, so its work never runs. Before, its record held the memory, whose use log held
/// the stream, which held the record: all of it (and the context) stayed for good, and
/// every later host wait of the thread was refused as if the capture still ran. In every
/// mode, dropped on the thread that began it.
#[test]
fn a_capture_whose_last_stream_handle_goes_is_abandoned_with_what_it_held() {
    for mode in [
        CaptureMode::ThreadLocal,
        CaptureMode::Global,
        CaptureMode::Relaxed,
    ] {
        let (cuda, world, ctx) = rig();
        {
            let s = Stream::non_blocking(&ctx).unwrap();
            let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 16).unwrap();
            let mut homed = DeviceBuffer::<u32>::alloc_on(&s, 16).unwrap();
            s.begin_capture(mode).unwrap();
            buf.fill_async(1, &s).unwrap();
            homed.fill_async(2, &s).unwrap();
            drop((buf, homed, s));
        }
        ctx.synchronize()
            .unwrap_or_else(|e| panic!("{mode:?}: the thread's host waits are refused: {e}"));
        drop((ctx, cuda));
        assert_clean(&world);
    }
}

/// A relaxed capture may end on any thread: its last handle going on another thread
/// abandons it at once. A strict one ends only on the thread that began it (CUDA's rule):
/// it is abandoned at that thread's next look at its captures (a host wait, a release),
/// and memory released meanwhile on that thread is not swallowed by it for good.
#[test]
fn a_capture_abandoned_on_another_thread_ends_there_or_at_its_threads_next_wait() {
    for mode in [
        CaptureMode::Relaxed,
        CaptureMode::ThreadLocal,
        CaptureMode::Global,
    ] {
        let (cuda, world, ctx) = rig();
        let s = Stream::non_blocking(&ctx).unwrap();
        let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 16).unwrap();
        s.begin_capture(mode).unwrap();
        buf.fill_async(1, &s).unwrap();
        drop(buf);
        std::thread::spawn(move || drop(s)).join().unwrap();
        let held = usize::from(mode != CaptureMode::Relaxed);
        assert_eq!(world.live().device_allocations, held, "{mode:?}");
        for _ in 0..5 {
            drop(DeviceBuffer::<u32>::alloc(&ctx, 16).unwrap());
        }
        assert_eq!(
            world.live().device_allocations,
            0,
            "{mode:?}: releases swallowed"
        );
        ctx.synchronize()
            .unwrap_or_else(|e| panic!("{mode:?}: the thread's host waits are refused: {e}"));
        drop((ctx, cuda));
        assert_clean(&world);
    }
}

/// An abandonment whose end fails at the driver (the capture still running) keeps what
/// the capture holds, whole; the beginning thread's next look at its captures tries
/// again, and then everything goes.
#[test]
fn an_abandonment_the_driver_refuses_keeps_the_holds_and_is_tried_again() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 16).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    buf.fill_async(1, &s).unwrap();
    drop(buf);
    world.fail_next(
        "cuStreamEndCapture",
        cuda_hal::cuda_sys::CUresult::CUDA_ERROR_UNKNOWN,
    );
    drop(s);
    assert_eq!(
        world.live().device_allocations,
        1,
        "released under a running capture"
    );
    assert_eq!(world.live().streams, 1);
    ctx.synchronize().unwrap();
    drop((ctx, cuda));
    assert_clean(&world);
}

/// Runs `f` on a thread and fails (rather than hangs) if it does not end in 20 s.
fn within_time(what: &str, f: impl FnOnce() + Send + 'static) {
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    assert!(
        ended
            .recv_timeout(std::time::Duration::from_secs(20))
            .is_ok(),
        "{what}: did not end (a deadlock)"
    );
}

/// A joined stream dropped after its capture failed to end (spoilt by a host wait): the
/// record's last reference went while a stream's capture slot was locked, and the memory
/// it held, released there, looked at that very slot: a deadlock. The failed capture's
/// holds now go when it fails, and records are dropped after their slot's lock.
#[test]
fn a_joined_stream_dropped_after_its_capture_failed_does_not_deadlock() {
    let (cuda, world, ctx) = rig();
    within_time("dropping the joined stream", move || {
        let (s1, s2) = (
            Stream::non_blocking(&ctx).unwrap(),
            Stream::non_blocking(&ctx).unwrap(),
        );
        let e = Event::without_timing(&ctx).unwrap();
        s1.begin_capture(CaptureMode::Relaxed).unwrap();
        s1.record(&e).unwrap();
        s2.wait_event(&e).unwrap();
        let mut b = DeviceBuffer::<u32>::zeroed(&ctx, 16).unwrap();
        b.fill_async(1, &s2).unwrap();
        drop(b);
        assert!(s1.synchronize().is_err(), "refused: it spoils the capture");
        assert!(s1.end_capture().is_err());
        drop(e);
        drop(s2);
        drop((s1, ctx, cuda));
    });
    assert_clean(&world);
}

/// `StreamLog::retain` asks its question without the log locked: the question may use
/// the log (it hung), and a stream noted while it runs is not forgotten.
#[test]
fn a_stream_log_can_be_used_while_it_retains() {
    let (_cuda, world, ctx) = rig();
    let log = std::sync::Arc::new(cuda_hal::StreamLog::new());
    let l = log.clone();
    let c = ctx.clone();
    within_time("retain", move || {
        let x = Stream::non_blocking(&c).unwrap();
        let y = Stream::non_blocking(&c).unwrap();
        l.note(&x);
        l.retain(|s| {
            assert_eq!(l.streams().len(), 1);
            l.note(&y);
            s.as_raw() != x.as_raw()
        });
        let left: Vec<_> = l.streams().iter().map(Stream::as_raw).collect();
        assert!(
            left.contains(&y.as_raw()),
            "a stream noted meanwhile was lost"
        );
        assert!(
            left.contains(&x.as_raw()),
            "forgotten although a note raced the question"
        );
        l.retain(|s| s.as_raw() == y.as_raw());
        let left: Vec<_> = l.streams().iter().map(Stream::as_raw).collect();
        assert_eq!(left, [y.as_raw()]);
    });
    drop((log, ctx));
    assert!(world.violations().is_empty());
}

/// Memory dropped on one thread while another begins a global capture (which forbids every
/// thread host waits): the release saw no capture, then its wait for the streams that used
/// the memory was refused. It leaked the memory for good (with its context); the capture's
/// graph now owns it, as when the capture is seen first.
#[test]
fn a_release_racing_a_global_capture_on_another_thread_is_not_leaked() {
    let (cuda, world, ctx) = rig();
    let (used, captured) = (
        Stream::non_blocking(&ctx).unwrap(),
        Stream::non_blocking(&ctx).unwrap(),
    );
    for _ in 0..300 {
        let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
        buf.fill_async(1, &used).unwrap();
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let g = go.clone();
        let dropper = std::thread::spawn(move || {
            g.wait();
            drop(buf);
        });
        go.wait();
        captured.begin_capture(CaptureMode::Global).unwrap();
        dropper.join().unwrap();
        // A wait that reached the driver just after the capture began spoilt it (CUDA's
        // rule for global captures): the end then fails, and the capture is over anyway.
        let _ = captured.end_capture();
        used.synchronize().unwrap();
    }
    drop((used, captured, ctx, cuda));
    assert_clean(&world);
}

/// A synchronous copy or memset while a strict capture forbids this thread host waits:
/// a typed error before the driver sees it, and the capture goes on (the driver would
/// refuse it and spoil the capture). A relaxed capture forbids nothing.
#[test]
fn synchronous_copies_inside_a_strict_capture_are_refused_and_the_capture_survives() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    for mode in [CaptureMode::ThreadLocal, CaptureMode::Global] {
        s.begin_capture(mode).unwrap();
        let refused = |r: cuda_hal::Result<()>| {
            assert!(matches!(r, Err(Error::Capturing { .. })), "{mode:?}: {r:?}");
        };
        refused(DeviceBuffer::from_slice(&ctx, &[1u32, 2]).map(drop));
        refused(DeviceBuffer::<u32>::zeroed(&ctx, 2).map(drop));
        refused(buf.copy_from_host(&[5, 6, 7, 8]));
        refused(buf.fill(3));
        refused(buf.to_vec().map(drop));
        buf.fill_async(9, &s).unwrap();
        drop(s.end_capture().unwrap());
    }
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    buf.copy_from_host(&[5, 6, 7, 8]).unwrap();
    drop(s.end_capture().unwrap());
    assert_eq!(buf.to_vec().unwrap(), [5, 6, 7, 8]);
    drop((buf, s, ctx, cuda));
    assert_clean(&world);
}
