//! `control_flow`'s paths on one real GPU and the real NCCL (`#[ignore]`d; run with
//! `--include-ignored` on the GPU machine, best under `compute-sanitizer --tool memcheck`):
//! single-rank communicators, so that one GPU is enough. Each case drops what grouped,
//! captured or queued work uses, scribbles over the freed space, and checks the results.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::{graph_holding_a_registration, scribble};
use cuda_hal::{CaptureMode, Context, Cuda, DeviceBuffer, Error as CudaError, Stream};
use nccl_channel::{CommConfig, Communicator, Error, ReduceOp, UniqueId, group};
use nccl_sys::Nccl;

const N: usize = 1 << 20; // 4 MiB of f32 per buffer

fn one_gpu() -> (Cuda, Arc<Nccl>, Context) {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let nccl = nccl_channel::nccl()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no NCCL");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    (cuda, nccl, ctx)
}

fn non_blocking(nccl: &Arc<Nccl>, ctx: &Context) -> Communicator {
    let id = UniqueId::generate(nccl).unwrap();
    let config = CommConfig::non_blocking(Duration::from_secs(60));
    Communicator::init_rank_with(nccl, ctx, &id, 1, 0, &config).unwrap()
}

/// A non-blocking communicator's group with its buffers dropped inside (NCCL may enqueue
/// the work after `ncclGroupEnd` returned): the result is right and nothing freed early.
#[test]
#[ignore = "needs a GPU"]
fn a_non_blocking_group_with_buffers_dropped_inside() {
    let (_cuda, nccl, ctx) = one_gpu();
    let comm = non_blocking(&nccl, &ctx);
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<f32>::zeroed(&ctx, N).unwrap();
    for round in 1..4 {
        group(&nccl, || {
            let mut send = DeviceBuffer::<f32>::alloc(&ctx, N)?;
            send.fill(round as f32)?;
            comm.all_reduce(&send, &mut out, ReduceOp::Sum, &s)
        })
        .unwrap();
        let junk = scribble(&ctx, N);
        comm.wait(&s).unwrap();
        s.synchronize().unwrap();
        assert!(out.to_vec().unwrap().iter().all(|&v| v == round as f32));
        drop(junk);
    }
}

/// all_to_all, gather and scatter (native on this NCCL) with their buffers dropped right
/// after the call, on a non-blocking communicator.
#[test]
#[ignore = "needs a GPU"]
fn all_to_all_gather_scatter_with_buffers_dropped_at_once() {
    let (_cuda, nccl, ctx) = one_gpu();
    let comm = non_blocking(&nccl, &ctx);
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<f32>::zeroed(&ctx, 3 * N).unwrap();
    {
        let mut send = DeviceBuffer::<f32>::alloc(&ctx, N).unwrap();
        send.fill(7.0).unwrap();
        let mut recv = DeviceBuffer::<f32>::zeroed(&ctx, N).unwrap();
        comm.all_to_all(&send, &mut recv, &s).unwrap();
        out.slice_mut(..N)
            .unwrap()
            .copy_from_async(&recv, &s)
            .unwrap();
        let mut all = DeviceBuffer::<f32>::zeroed(&ctx, N).unwrap();
        comm.gather(&send, Some(all.as_view_mut()), 0, &s).unwrap();
        out.slice_mut(N..2 * N)
            .unwrap()
            .copy_from_async(&all, &s)
            .unwrap();
        let mut one = DeviceBuffer::<f32>::zeroed(&ctx, N).unwrap();
        comm.scatter(Some(send.as_view()), &mut one, 0, &s).unwrap();
        out.slice_mut(2 * N..)
            .unwrap()
            .copy_from_async(&one, &s)
            .unwrap();
    }
    let junk = scribble(&ctx, N);
    comm.wait(&s).unwrap();
    s.synchronize().unwrap();
    assert!(out.to_vec().unwrap().iter().all(|&v| v == 7.0));
    drop(junk);
}

/// A registration queued for release (its graph dropped on another thread) while a
/// grouped all-reduce on its memory follows: released after that work, on real NCCL.
#[test]
#[ignore = "needs a GPU"]
fn a_queued_registration_and_a_grouped_collective_on_its_memory() {
    let (_cuda, nccl, ctx) = one_gpu();
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut b = comm.alloc_nccl::<f32>(N).unwrap();
    b.fill(2.0).unwrap();
    let graph = graph_holding_a_registration(&comm, &mut b, ReduceOp::Sum, &s1);
    std::thread::spawn(move || drop(graph)).join().unwrap();
    group(&nccl, || {
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s2)
    })
    .unwrap();
    comm.barrier(&s2).unwrap(); // the owner's next call releases it, after s2's work
    s2.synchronize().unwrap();
    assert!(b.to_vec().unwrap().iter().all(|&v| v == 2.0));
}

/// A capture begun inside an open group is refused on the real driver too.
#[test]
#[ignore = "needs a GPU"]
fn a_capture_inside_an_open_group_is_refused() {
    let (_cuda, nccl, ctx) = one_gpu();
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut b = DeviceBuffer::<f32>::zeroed(&ctx, N).unwrap();
    let r = group(&nccl, || {
        comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s)?;
        s.begin_capture(CaptureMode::ThreadLocal)?;
        Ok(())
    });
    assert!(
        matches!(
            &r,
            Err(Error::Cuda(CudaError::InvalidArgument {
                what: "begin_capture",
                ..
            }))
        ),
        "{r:?}"
    );
    assert!(!s.is_capturing().unwrap());
    s.synchronize().unwrap();
}

/// Pinned memory of a type aligned to 8 KiB: refused, or handed out aligned (the real
/// driver may give more than a page); never misaligned.
#[test]
#[ignore = "needs a GPU"]
fn pinned_memory_is_never_misaligned() {
    #[derive(Clone, Copy)]
    #[repr(C, align(8192))]
    struct Page2([u8; 8192]);
    // SAFETY: Copy, no padding, no pointers, every bit pattern valid.
    unsafe impl cuda_hal::DeviceRepr for Page2 {}
    let (_cuda, _nccl, ctx) = one_gpu();
    for _ in 0..16 {
        match cuda_hal::PinnedBuffer::<Page2>::zeroed(&ctx, 1) {
            Ok(b) => assert_eq!(b.as_ptr().addr() % 8192, 0),
            Err(e) => assert!(
                matches!(
                    &e,
                    CudaError::InvalidArgument {
                        what: "PinnedBuffer::zeroed",
                        ..
                    }
                ),
                "{e:?}"
            ),
        }
    }
}

/// Another thread begins a capture on the stream while this thread's group has an
/// all-reduce recorded on it: the group's end launches the all-reduce into the capture,
/// and the graph holds the communicator and buffers, so it replays after both were
/// dropped (under compute-sanitizer: no access to freed memory).
#[test]
#[ignore = "needs a GPU"]
fn a_capture_begun_elsewhere_during_a_group_replays_after_the_drops() {
    let (_cuda, nccl, ctx) = one_gpu();
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<f32>::zeroed(&ctx, N).unwrap();
    let graph = {
        let g = nccl_channel::Group::start(&nccl).unwrap();
        let mut send = DeviceBuffer::<f32>::alloc(&ctx, N).unwrap();
        send.fill(3.0).unwrap();
        comm.all_reduce(&send, &mut out, ReduceOp::Sum, &s).unwrap();
        drop(send);
        let other = s.clone();
        std::thread::spawn(move || other.begin_capture(CaptureMode::Relaxed))
            .join()
            .unwrap()
            .unwrap();
        g.end().unwrap(); // launched into the capture
        s.end_capture().unwrap().instantiate().unwrap()
    };
    drop(comm);
    let junk = scribble(&ctx, N);
    s.synchronize().unwrap();
    let before = out.to_vec().unwrap()[0];
    // NCCL decides whether grouped work joins a capture another thread began: either it
    // ran at the group's end (3 already) or the graph replays it (reading `send`, which
    // the graph must keep: freed, it would read the scribbled -1).
    eprintln!(
        "the group's all-reduce {} (out = {before} before the launch)",
        if before == 3.0 {
            "ran at the group's end"
        } else {
            "was captured"
        }
    );
    graph.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert!(out.to_vec().unwrap().iter().all(|&v| v == 3.0));
    drop((graph, junk));
}
