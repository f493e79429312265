//! The memory model on real GPUs (`#[ignore]`d; run with `--include-ignored` on the GPU
//! machine, best under `compute-sanitizer --tool memcheck`): each case drops memory (or a
//! communicator) that enqueued, grouped or captured work still uses, then reuses the
//! freed space with other data, and checks the results are still right.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use crate::common::{capture, non_blocking_streams, scribble, zeroed_on_each};
use cuda_hal::{Context, Cuda, DeviceBuffer, Stream};
use nccl_channel::{Communicator, ReduceOp, UniqueId, group};
use nccl_sys::Nccl;

const N: usize = 4 << 20; // 16 MiB of f32 per buffer

/// The driver, NCCL and two GPUs' contexts, or `None` (said) on a machine with fewer.
fn two_gpus() -> Option<(Cuda, Arc<Nccl>, Vec<Context>)> {
    crate::common::backend::Machine::gpus(2).map(|m| (m.cuda, m.nccl, m.ctxs))
}

#[test]
#[ignore = "needs 2 GPUs"]
fn group_with_buffers_dropped_inside() {
    let Some((_cuda, nccl, ctxs)) = two_gpus() else {
        return;
    };
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams: Vec<Stream> = non_blocking_streams(&ctxs);
    let mut outs: Vec<DeviceBuffer<f32>> = zeroed_on_each(&ctxs, N);
    for round in 0..3 {
        group(&nccl, || {
            for ((c, s), out) in comms.iter().zip(&streams).zip(outs.iter_mut()) {
                let mut send = DeviceBuffer::<f32>::alloc(c.context(), N)?;
                send.fill((c.rank() + 1 + round) as f32)?;
                c.all_reduce(&send, out, ReduceOp::Sum, s)?;
            }
            Ok(())
        })
        .unwrap();
        let junk: Vec<_> = ctxs.iter().map(|c| scribble(c, N)).collect();
        for (s, out) in streams.iter().zip(&outs) {
            s.synchronize().unwrap();
            let v = out.to_vec().unwrap();
            let want = (3 + 2 * round) as f32;
            assert!(v.iter().all(|x| *x == want), "round {round}: {:?}", &v[..4]);
        }
        drop(junk);
    }
    println!(
        "group: 3 rounds of {} MiB all_reduce, send buffers dropped inside: ok",
        (N * 4) >> 20
    );
}

#[test]
#[ignore = "needs 2 GPUs"]
fn graph_outlives_its_buffers_and_communicator() {
    let Some((_cuda, nccl, ctxs)) = two_gpus() else {
        return;
    };
    let id = UniqueId::generate(&nccl).unwrap();
    std::thread::scope(|scope| {
        for (rank, ctx) in ctxs.iter().enumerate() {
            let (nccl, id) = (&nccl, &id);
            scope.spawn(move || {
                let comm = Communicator::init_rank(nccl, ctx, id, 2, rank).unwrap();
                let s = Stream::non_blocking(ctx).unwrap();
                let mut send = DeviceBuffer::<f32>::alloc(ctx, N).unwrap();
                send.fill(rank as f32 + 1.0).unwrap();
                let mut recv = DeviceBuffer::<f32>::alloc(ctx, N).unwrap();
                let mut out = DeviceBuffer::<f32>::zeroed(ctx, N).unwrap();
                // NCCL connects to its peers on the first collective, which cannot happen
                // during a capture: one plain all-reduce first.
                comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &s)
                    .unwrap();
                s.synchronize().unwrap();
                let exec = capture(&s, || {
                    comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &s)
                        .unwrap();
                    out.copy_from_async(&recv, &s).unwrap();
                });
                drop((send, recv, comm));
                let junk = scribble(ctx, N);
                for _ in 0..3 {
                    exec.launch(&s).unwrap();
                }
                s.synchronize().unwrap();
                let v = out.to_vec().unwrap();
                assert!(v.iter().all(|x| *x == 3.0), "rank {rank}: {:?}", &v[..4]);
                drop((exec, junk));
            });
        }
    });
    println!("graph: 3 launches after its buffers and communicator were dropped: ok");
}

#[test]
#[ignore = "needs 2 GPUs"]
fn pooled_buffer_freed_while_a_collective_on_another_stream_runs() {
    let Some((_cuda, nccl, ctxs)) = two_gpus() else {
        return;
    };
    let id = UniqueId::generate(&nccl).unwrap();
    std::thread::scope(|scope| {
        for (rank, ctx) in ctxs.iter().enumerate() {
            let (nccl, id) = (&nccl, &id);
            scope.spawn(move || {
                let comm = Communicator::init_rank(nccl, ctx, id, 2, rank).unwrap();
                let (pool, cs) = (
                    Stream::non_blocking(ctx).unwrap(),
                    Stream::non_blocking(ctx).unwrap(),
                );
                let mut out = DeviceBuffer::<f32>::zeroed(ctx, N).unwrap();
                for round in 0..5 {
                    let mut send = DeviceBuffer::<f32>::alloc_on(&pool, N).unwrap();
                    pool.synchronize().unwrap();
                    send.fill(round as f32).unwrap();
                    comm.all_reduce(&send, &mut out, ReduceOp::Sum, &cs)
                        .unwrap();
                    drop(send); // cuMemFreeAsync on `pool`, ordered after `cs`
                    let mut junk = DeviceBuffer::<f32>::alloc_on(&pool, N).unwrap();
                    pool.synchronize().unwrap();
                    junk.fill(-7.0).unwrap();
                    cs.synchronize().unwrap();
                    let v = out.to_vec().unwrap();
                    let want = 2.0 * round as f32;
                    assert!(
                        v.iter().all(|x| *x == want),
                        "rank {rank} round {round}: {:?}",
                        &v[..4]
                    );
                }
            });
        }
    });
    println!("stream-ordered: 5 pooled buffers freed under a running all_reduce: ok");
}
