//! Attacks on the newer API found in review (each failed before its fix), on the
//! simulated driver and NCCL: a suspend that missed a graph's launch, puts bounded by
//! this rank's window instead of the smallest one, a nested group's simulated end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{Rig, capture, streams};
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, Group, ReduceOp, Signal, SuspendFlags, WindowFlags};

/// A graph of the communicator's all-reduce, launched on a stream the communicator never
/// used itself and dropped at once: the suspend must see that launch's stream (it waits
/// for nothing else), or NCCL would release memory the replay still uses. The simulated
/// NCCL reports a suspend the host did not wait for the communicator's work before.
#[test]
fn a_suspend_sees_the_stream_a_dropped_graph_was_launched_on() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let capture_on = Stream::non_blocking(&ctx).unwrap();
    let launch_on = Stream::new(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[3u32; 16]).unwrap();
    let graph = capture(&capture_on, || {
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &capture_on)
            .unwrap();
    });
    graph.launch(&launch_on).unwrap();
    drop(graph);
    // The simulated stream is done already: the suspend may go on, having asked it.
    comm.suspend(SuspendFlags::MEM).unwrap();
    assert_eq!(rig.gpus.take_violations(), Vec::<String>::new());
    comm.resume().unwrap();
}

/// Work enqueued directly and not waited for: the suspend asks its stream first (on a
/// GPU, `Error::InFlight` while it runs; see newer_api_gpu), never leaving it unasked.
#[test]
fn a_suspend_asks_the_streams_the_communicator_used() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[3u32; 16]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
        .unwrap();
    comm.suspend(SuspendFlags::MEM).unwrap();
    assert_eq!(rig.gpus.take_violations(), Vec::<String>::new());
}

/// NCCL lets ranks register windows of different sizes and does not check that a put
/// fits the peer's: puts are bounded by the smallest window of the place, agreed at
/// registration. (Before, by this rank's own: rank 0's 4 KiB put landed past the end of
/// rank 1's 64-byte window, which the simulated NCCL reports.)
#[test]
fn puts_are_bounded_by_the_smallest_window_of_their_place() {
    let rig = Rig::new(2);
    let (ctxs, comms) = rig.all_ranks(2);
    let s0 = Stream::new(&ctxs[0]).unwrap();
    let big = 1024; // u32s: 4 KiB on rank 0
    let mut src = comms[0].alloc_nccl::<u32>(big).unwrap();
    src.fill(5).unwrap();
    let src1 = comms[1].alloc_nccl::<u32>(big).unwrap();
    let dst0 = comms[0].alloc_nccl::<u32>(big).unwrap();
    let dst1 = comms[1].alloc_nccl::<u32>(16).unwrap(); // 64 bytes on rank 1
    let sym = WindowFlags::COLL_SYMMETRIC;
    let _src_w =
        Communicator::register_windows(&[(&comms[0], &src), (&comms[1], &src1)], sym).unwrap();
    let dst_w =
        Communicator::register_windows(&[(&comms[0], &dst0), (&comms[1], &dst1)], sym).unwrap();
    assert_eq!(
        dst_w[0].put_signal(&src.slice(..32).unwrap(), 1, 0, Signal::DEFAULT, &s0),
        Err(Error::OutOfWindow {
            what: "Window::put_signal",
            offset: 0,
            bytes: 128,
            window: 64
        })
    );
    dst_w[0]
        .put_signal(&src.slice(..16).unwrap(), 1, 0, Signal::DEFAULT, &s0)
        .unwrap();
    s0.synchronize().unwrap();
    assert_eq!(dst1.to_vec().unwrap(), [5; 16]);
    assert_eq!(rig.gpus.take_violations(), Vec::<String>::new());
}

/// A nested group's simulated end: NCCL would close only that level, and the outermost
/// end would run the calls. Refused (the group ended as `end` ends it), the calls run at
/// the outer end, as documented.
#[test]
fn a_nested_groups_simulated_end_is_refused() {
    let rig = Rig::new(2);
    let (ctxs, comms) = rig.all_ranks(2);
    let streams = streams(&ctxs);
    let mut bufs = [
        DeviceBuffer::from_slice(&ctxs[0], &[1u32; 4]).unwrap(),
        DeviceBuffer::from_slice(&ctxs[1], &[2u32; 4]).unwrap(),
    ];
    let outer = Group::start(&rig.nccl).unwrap();
    let inner = Group::start(&rig.nccl).unwrap();
    for r in 0..2 {
        comms[r]
            .all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])
            .unwrap();
    }
    let refused = inner.simulate_end();
    assert!(
        matches!(&refused, Err(Error::InvalidArgument { what: "Group::simulate_end", problem })
            if problem.contains("nested")),
        "{refused:?}"
    );
    outer.end().unwrap();
    for s in &streams {
        s.synchronize().unwrap();
    }
    assert_eq!(bufs[0].to_vec().unwrap(), [3; 4]);
    // A group alone again: simulated, nothing runs.
    let g = Group::start(&rig.nccl).unwrap();
    for r in 0..2 {
        comms[r]
            .all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])
            .unwrap();
    }
    assert!(g.simulate_end().unwrap() > std::time::Duration::ZERO);
    assert_eq!(bufs[0].to_vec().unwrap(), [3; 4], "simulated, not run");
}
