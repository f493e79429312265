//! The memory model on the simulated driver, whose sanitizer checks every device address
//! when work executes and every stream-ordered free against the streams that used the
//! memory. Each test is a way safe code could once make the (simulated) GPU touch freed
//! memory; the sanitizer reports it as a violation naming the call.
#![cfg(feature = "mock")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_hal::mock::{MockDriver, MockWorld};
use cuda_hal::{CaptureMode, Context, Cuda, DeviceBuffer, Error, Event, Stream};

fn rig() -> (Cuda, MockWorld, Context) {
    let (cuda, world) = Cuda::mock(MockDriver::with_devices(2)).unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    (cuda, world, ctx)
}

/// No violation was seen, and nothing is left once everything is dropped.
fn assert_clean(world: &MockWorld) {
    let v = world.violations();
    assert!(v.is_empty(), "sanitizer:\n{}", v.join("\n"));
    assert!(world.live().is_empty(), "leaked: {:?}", world.live());
}

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
