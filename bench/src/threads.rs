//! `--threads N` (and the default without a launcher): one process drives every GPU, one
//! thread and communicator each, the ranks agreeing on times through shared memory.

use std::sync::{Arc, Barrier, Mutex};

use cuda_hal::{Cuda, Stream};
use nccl_channel::{Communicator, Result, UniqueId};

use crate::options::Opts;
use crate::rank::Rank;
use crate::setup::comm_config;
use crate::sweep::run_rank;

/// Runs the sweep on devices `0..n` of `cuda`, one thread each, with NCCL `nccl`.
pub(crate) fn run_threads(
    cuda: &Cuda,
    nccl: &Arc<nccl_sys::Nccl>,
    n: usize,
    o: &Opts,
) -> Result<()> {
    let config = &comm_config(o);
    let id = UniqueId::generate(nccl)?;
    let barrier = Barrier::new(n);
    let slots = Mutex::new(vec![0f64; n]);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let (barrier, slots) = (&barrier, &slots);
                s.spawn(move || -> Result<()> {
                    let ctx = cuda.device(rank)?.primary_context()?;
                    let comm = match config {
                        Some(c) => Communicator::init_rank_with(nccl, &ctx, &id, n, rank, c)?,
                        None => Communicator::init_rank(nccl, &ctx, &id, n, rank)?,
                    };
                    let stream = Stream::non_blocking(&ctx)?;
                    let max_time = |v: f64| max_over_threads(slots, barrier, rank, v);
                    let r = Rank {
                        comm: &comm,
                        stream: &stream,
                        max_time: &max_time,
                    };
                    run_rank(&r, o)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(nccl_channel::Error::Aborted)))
            .collect()
    });
    results.into_iter().collect()
}

/// The largest of every thread's `v`: each writes its slot, all wait, all read, all wait
/// (so that no thread writes its next value before every thread has read this one).
fn max_over_threads(
    slots: &Mutex<Vec<f64>>,
    barrier: &Barrier,
    rank: usize,
    v: f64,
) -> Result<f64> {
    slots.lock().unwrap_or_else(|e| e.into_inner())[rank] = v;
    barrier.wait();
    let m = slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .fold(f64::MIN, f64::max);
    barrier.wait();
    Ok(m)
}
