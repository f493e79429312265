//! cudarc's contexts, streams and memory used by the safe crates (their `cudarc` feature),
//! cudarc and they both on the drop-in, as on a real driver: the sanitizer checks every
//! free and every cross-stream order, and its verdict is the child's exit status.

use std::sync::Arc;

use cuda_hal::cudarc::{Borrowed, BorrowedMut};
use cuda_hal::{CaptureMode, Context, Cuda, DeviceBuffer, DeviceViewMut, Error, Stream};
use cudarc::driver::{CudaContext, CudaSlice};
use nccl_channel::{Communicator, group};

use super::{child, dropin_dir, is_child, stderr};

/// Runs the test `me` in a child on two simulated GPUs, with cudarc finding the drop-in
/// through the library path, and returns its stderr (it must have succeeded: the sanitizer
/// fails the process at exit on any invalid access or unordered free).
fn on_the_dropin(me: &str) -> String {
    let dir = dropin_dir();
    let o = child(
        me,
        &[
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
            ("CUDA_MOCK_DEVICES", "2"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    stderr(&o)
}

/// The driver and NCCL as a program that uses both crates loads them: the same libraries
/// cudarc opened.
fn libraries() -> (Cuda, Arc<nccl_sys::Nccl>) {
    let cuda = Cuda::load().unwrap();
    let nccl = Arc::new(nccl_sys::Nccl::load().unwrap());
    (cuda, nccl)
}

#[test]
fn cudarc_memory_moved_in_all_gathers_in_a_group_and_comes_back() {
    const ME: &str = "cudarc_interop::cudarc_memory_moved_in_all_gathers_in_a_group_and_comes_back";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    // No `unsafe` from here on: everything crosses through the adapters.
    let (cuda, nccl) = libraries();
    let theirs = [0, 1].map(|d| CudaContext::new(d).unwrap());
    let ctxs = theirs
        .each_ref()
        .map(|c| Context::from_cudarc(&cuda, c).unwrap());
    assert_eq!(ctxs[1], cuda.device(1).unwrap().primary_context().unwrap());
    let their_streams = theirs.each_ref().map(|c| c.new_stream().unwrap());
    let streams: Vec<Stream> = (0..2)
        // SAFETY: cudarc never captures these streams here.
        .map(|r| unsafe { Stream::from_cudarc(&ctxs[r], &their_streams[r]) }.unwrap())
        .collect();
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    // Allocated by cudarc on its streams, moved in without a copy.
    let sends: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|r| {
            let s = their_streams[r].clone_htod(&[101 + r as i32]).unwrap();
            DeviceBuffer::from_cudarc(&ctxs[r], s).unwrap()
        })
        .collect();
    let mut recvs: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|r| {
            let s = their_streams[r].alloc_zeros::<i32>(2).unwrap();
            DeviceBuffer::from_cudarc(&ctxs[r], s).unwrap()
        })
        .collect();
    // Our own streams for the collective: the home streams must wait for them.
    let ours = ctxs.each_ref().map(|c| Stream::non_blocking(c).unwrap());
    group(&nccl, || {
        for (r, recv) in recvs.iter_mut().enumerate() {
            comms[r].all_gather(&sends[r], recv, &ours[r])?;
        }
        Ok(())
    })
    .unwrap();
    // Freed by cudarc on its streams, after the collective (the sanitizer checks).
    drop(sends);
    for (r, recv) in recvs.into_iter().enumerate() {
        let back: CudaSlice<i32> = recv.into_cudarc().unwrap();
        assert_eq!(their_streams[r].clone_dtoh(&back).unwrap(), [101, 102]);
    }
    assert_eq!(streams.len(), 2);
}

#[test]
fn borrowed_cudarc_memory_is_ordered_both_ways_and_refused_where_work_outlives_it() {
    const ME: &str = "cudarc_interop::borrowed_cudarc_memory_is_ordered_both_ways_and_refused_where_work_outlives_it";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    let (cuda, nccl) = libraries();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    // This crate's work on a stream of its own.
    let ours = Stream::non_blocking(&ctx).unwrap();
    // cudarc in its single-stream mode first (its default stream; no events kept), then
    // with a stream of its own (it keeps read and write events per slice): either way,
    // its free and its next use come after this crate's copy.
    for managing in [false, true] {
        // (The first stream of its own switches cudarc to keeping events.)
        let home = match managing {
            false => theirs.default_stream(),
            true => theirs.new_stream().unwrap(),
        };
        assert_eq!(theirs.is_managing_stream_synchronization(), managing);
        let src = home.clone_htod(&[1u32, 2, 3, 4]).unwrap();
        let mut dst = home.alloc_zeros::<u32>(4).unwrap();
        {
            let from = Borrowed::new(&ctx, &src).unwrap();
            let mut to = BorrowedMut::new(&ctx, &mut dst).unwrap();
            DeviceViewMut::new(&mut to)
                .copy_from_async(&from, &ours)
                .unwrap();
        }
        // cudarc frees the source on its stream at once, and reads the destination there:
        // both ordered after the copy on `ours` (the sanitizer fails the process otherwise).
        drop(src);
        assert_eq!(home.clone_dtoh(&dst).unwrap(), [1, 2, 3, 4]);
    }
    let home = theirs.new_stream().unwrap();
    let mut dst = home.clone_htod(&[1u32, 2, 3, 4]).unwrap();

    // Work that outlives the borrow is refused: an open group, a capture.
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx)).unwrap();
    let refused = group(&nccl, || {
        let mut to = BorrowedMut::new(&ctx, &mut dst).unwrap();
        comm[0].all_reduce_in_place(&mut to, nccl_channel::ReduceOp::Sum, &ours)
    });
    assert!(
        matches!(
            refused,
            Err(nccl_channel::Error::Cuda(Error::Deferred { why, .. })) if why.contains("group")
        ),
        "{refused:?}"
    );
    // (Allocated first: a synchronous zeroing inside a thread-local capture fails.)
    let mut scratch = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    ours.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let captured = {
        let to = BorrowedMut::new(&ctx, &mut dst).unwrap();
        DeviceViewMut::new(&mut scratch).copy_from_async(&to, &ours)
    };
    ours.end_capture().unwrap();
    assert!(
        matches!(&captured, Err(Error::Deferred { why, .. }) if why.contains("captured")),
        "{captured:?}"
    );
    // Outside both, the same all-reduce runs (one rank: the sum is the value).
    let mut to = BorrowedMut::new(&ctx, &mut dst).unwrap();
    comm[0]
        .all_reduce_in_place(&mut to, nccl_channel::ReduceOp::Sum, &ours)
        .unwrap();
    drop(to);
    assert_eq!(home.clone_dtoh(&dst).unwrap(), [1, 2, 3, 4]);
}

#[test]
fn a_stream_cudarc_captures_keeps_what_our_work_uses_for_its_graphs_life() {
    const ME: &str =
        "cudarc_interop::a_stream_cudarc_captures_keeps_what_our_work_uses_for_its_graphs_life";
    if !is_child(ME) {
        let err = on_the_dropin(ME);
        assert!(
            !err.contains("which another library is capturing into a graph"),
            "{err}"
        );
        return;
    }
    let (cuda, _nccl) = libraries();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let their_stream = theirs.new_stream().unwrap();
    // SAFETY: cudarc captures this stream below on this thread only, never while work is
    // being enqueued on it from another.
    let stream = unsafe { Stream::from_cudarc(&ctx, &their_stream) }.unwrap();
    let mut buf = DeviceBuffer::<u8>::zeroed(&ctx, 64).unwrap();
    // cudarc captures its stream; this crate cannot see that capture begin.
    their_stream
        .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    buf.fill_async(7, &stream).unwrap();
    let graph = their_stream
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a graph");
    // Dropped: its memory must outlive every launch of cudarc's graph.
    drop(buf);
    let held = ctx.memory_info().unwrap().free;
    graph.launch().unwrap();
    their_stream.synchronize().unwrap();
    // cudarc's graph gone, the memory comes back at this crate's next release.
    drop(graph);
    drop(DeviceBuffer::<u8>::zeroed(&ctx, 1).unwrap());
    assert_eq!(ctx.memory_info().unwrap().free, held + 64);
}

#[test]
fn a_driver_cudarc_does_not_share_is_refused() {
    const ME: &str = "cudarc_interop::a_driver_cudarc_does_not_share_is_refused";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    // An in-process simulated driver beside the drop-in cudarc opened: two machines.
    let (mine, _world) = cuda_mock::MockDriver::with_devices(2)
        .build_with(Cuda::from_driver)
        .unwrap();
    let theirs = CudaContext::new(0).unwrap();
    assert_eq!(
        Context::from_cudarc(&mine, &theirs).unwrap_err(),
        Error::ForeignDriver {
            what: "Context::from_cudarc"
        }
    );
    // A context of another device than the memory's.
    let (cuda, _nccl) = libraries();
    let other = CudaContext::new(1).unwrap();
    let ctx1 = Context::from_cudarc(&cuda, &other).unwrap();
    let slice = theirs.default_stream().alloc_zeros::<f32>(2).unwrap();
    assert_eq!(
        DeviceBuffer::from_cudarc(&ctx1, slice).unwrap_err(),
        Error::WrongDevice {
            what: "DeviceBuffer::from_cudarc",
            object: "cudarc memory or stream",
            expected: 1,
            found: 0
        }
    );
}
