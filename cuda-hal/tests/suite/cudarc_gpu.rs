//! The `cudarc` feature on a real driver (`#[ignore]`d; the GPU machine runs them): cudarc's
//! primary and non-primary contexts, its streams and events, and memory handed both ways,
//! also through a captured graph. (On simulated devices the same paths run in the drop-in's
//! tests; the non-primary context only here: the simulator has no `cuCtxCreate`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use cuda_hal::cudarc::{Borrowed, BorrowedMut};
use cuda_hal::{CaptureMode, Context, Cuda, DeviceBuffer, DeviceViewMut, Error, Stream};
use cudarc::driver::{CudaContext, CudaSlice};

fn cuda() -> Cuda {
    Cuda::load().expect("a GPU test (run with --include-ignored on the GPU machine)")
}

#[test]
#[ignore = "needs a GPU"]
fn cudarc_primary_and_non_primary_contexts_are_adopted() {
    let cuda = cuda();
    let primary = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &primary).unwrap();
    assert_eq!(ctx, cuda.device(0).unwrap().primary_context().unwrap());

    // A context of its own (cuCtxCreate): held by the adopted value and what it made.
    let own = CudaContext::new_non_primary(0, 0).unwrap();
    assert!(!own.is_primary());
    let ctx2 = Context::from_cudarc(&cuda, &own).unwrap();
    assert_ne!(ctx2, ctx, "another context on the same device");
    let weak = Arc::downgrade(&own);
    drop(own);
    let mut buf = DeviceBuffer::<u32>::zeroed(&ctx2, 1024).unwrap();
    let s = Stream::non_blocking(&ctx2).unwrap();
    buf.fill_async(7, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(buf.to_vec().unwrap(), vec![7; 1024]);
    assert!(
        weak.upgrade().is_some(),
        "the adopted context keeps cudarc's alive"
    );
    // Current on this thread now (cudarc binds it), and not primary: not held from the
    // handle alone.
    weak.upgrade().unwrap().bind_to_thread().unwrap();
    assert_eq!(
        Context::current(&cuda).unwrap_err(),
        Error::ForeignContext {
            what: "Context::current",
            device: 0
        }
    );
    drop((buf, s, ctx2));
    assert!(
        weak.upgrade().is_none(),
        "released with the last of its users"
    );
    println!("cudarc: primary and non-primary contexts adopted on GPU 0");
}

#[test]
#[ignore = "needs a GPU"]
fn cudarc_memory_moves_in_runs_in_a_captured_graph_and_comes_back() {
    let cuda = cuda();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let n = 1 << 20;
    let slice: CudaSlice<f32> = home.alloc_zeros(n).unwrap();
    let mut buf = DeviceBuffer::from_cudarc(&ctx, slice).unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    // First use on our stream inside a strict capture: ordering it after cudarc's pending
    // allocation would need a host wait the capture forbids; refused, capture intact.
    ours.begin_capture(CaptureMode::ThreadLocal).unwrap();
    assert!(matches!(
        buf.fill_async(1.0, &ours),
        Err(Error::PendingInCapture { .. })
    ));
    ours.end_capture().unwrap();
    buf.fill_async(0.0, &ours).unwrap(); // once outside: ordered with events
    ours.begin_capture(CaptureMode::ThreadLocal).unwrap();
    buf.fill_async(2.5, &ours).unwrap();
    let exec = ours.end_capture().unwrap().instantiate().unwrap();
    let buf = buf.into_cudarc().expect_err("the graph holds the memory");
    for _ in 0..3 {
        exec.launch(&ours).unwrap();
    }
    drop(exec);
    let back = buf.into_cudarc().unwrap();
    // cudarc's own read on its stream: ordered after our graph's launches.
    let host = home.clone_dtoh(&back).unwrap();
    assert!(host.iter().all(|&v| v == 2.5));
    println!("cudarc: {n} floats moved in, filled by 3 graph launches, given back");
}

#[test]
#[ignore = "needs a GPU"]
fn borrowed_cudarc_memory_across_streams_and_a_capture_cudarc_makes_for_its_graphs_life() {
    let cuda = cuda();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let n = 1 << 22;
    let src = home.clone_htod(&vec![3u32; n]).unwrap();
    let mut dst: CudaSlice<u32> = home.alloc_zeros(n).unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    DeviceViewMut::new(&mut BorrowedMut::new(&ctx, &mut dst).unwrap())
        .copy_from_async(&Borrowed::new(&ctx, &src).unwrap(), &ours)
        .unwrap();
    drop(src); // cudarc frees it on `home`, after our copy
    assert!(home.clone_dtoh(&dst).unwrap().iter().all(|&v| v == 3));

    // cudarc captures a stream we adopted: our work there keeps its memory.
    // SAFETY: cudarc captures `home` on this thread only, never while work is being
    // enqueued on it from another.
    let adopted = unsafe { Stream::from_cudarc(&ctx, &home) }.unwrap();
    home.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let mut tmp = DeviceBuffer::<u32>::alloc(&ctx, n).unwrap();
    tmp.fill_async(9, &adopted).unwrap();
    assert!(matches!(
        adopted.expect_immediate("a borrowed use"),
        Err(Error::Deferred {
            why: "the stream is being captured",
            ..
        })
    ));
    let graph = home
        .end_capture(
            cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        )
        .unwrap()
        .unwrap();
    let before = ctx.memory_info().unwrap().free;
    drop(tmp);
    assert_eq!(
        ctx.memory_info().unwrap().free,
        before,
        "kept for cudarc's graph"
    );
    graph.launch().unwrap();
    home.synchronize().unwrap();
    // The graph and its instance gone, CUDA runs the user object's destructor (on its own
    // thread, soon after), which hands the memory back: released at our next release.
    drop(graph);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let freed = loop {
        drop(DeviceBuffer::<u8>::alloc(&ctx, 1).unwrap());
        let free = ctx.memory_info().unwrap().free;
        if free >= before + 4 * n {
            break free - before;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not released: {free} <= {before}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    println!(
        "cudarc: borrowed across streams; a cudarc capture kept our memory, and gave {freed} \
         bytes back once its graph was dropped"
    );
}
