//! An nccl-tests-style benchmark of every collective through nccl-channel.
//!
//! ```text
//! bench [-c COLLECTIVE[,COLLECTIVE...]|all]
//!       [-b 8] [-e 4G] [-f 2] [-n 20] [-w 5] [-d float|half|bfloat16|double|int32|int8|uint8]
//!       [-o sum|prod|max|min|avg] [-r ROOT] [-G] [--check 0|1] [--threads N | --nprocs N]
//!       [-R 0,nccl,1,2,pool] [--cta-policy default|efficiency|zero] [--min-ctas N] [--max-ctas N]
//!       [--nvls-ctas N]
//! ```
//! `COLLECTIVE` is one of nccl-channel's `Collective` names (all_reduce, all_gather,
//! reduce_scatter, broadcast, reduce, all_to_all, all_to_all_v, gather, scatter, sendrecv).
//! Sizes are bytes of the whole buffer as nccl-tests counts them (all_gather and gather:
//! the gathered buffer; reduce_scatter, scatter and the all-to-alls: a rank's send buffer).
//! `--threads N` (default: every local GPU): one process drives the GPUs, one thread each.
//! `--nprocs N`: one
//! process per GPU (this program starts them, as the examples' launcher does). Under
//! torchrun, srun or mpirun (`torchrun --no-python --nproc-per-node 2 bench -c all`) each
//! process is a rank configured by its launcher and rank 0 prints the table. `-G` captures
//! the `-n` iterations of each size into a CUDA graph and times its replay. `-R` picks the
//! memory the buffers live in (plain cuMemAlloc, NCCL memory registered locally or as a
//! symmetric window, or the communicator's pool); with several modes each size runs once
//! per mode and the table gets one row per mode with its busbw and time relative to mode
//! 0. Without a CUDA driver it runs on the simulated devices and says so: a smoke test,
//! not a figure.
//!
//! The modules follow one run: [`options`] (the command line), [`top`] (no launcher:
//! threads, or `--nprocs`) or [`launched`] (a rank of a launcher), [`rank`] (the element
//! type), [`sweep`] (collectives × sizes × memory modes), [`check`] and [`timing`] (one
//! measurement), [`table`] (what rank 0 prints).

mod check;
mod collective;
mod element;
mod launched;
mod memory;
mod mode;
mod options;
mod rank;
mod setup;
mod sizes;
mod sweep;
mod table;
mod threads;
mod timing;
mod top;

use std::process::ExitCode;

use nccl_channel::World;

fn main() -> ExitCode {
    let o = match options::parse() {
        Ok(o) => o,
        Err(e) => e.exit(),
    };
    let r = match World::from_env() {
        Ok(Some(world)) if o.nprocs.is_some() => {
            Err(invalid("--nprocs")(nccl_launch::nprocs_in_a_world(&world)))
        }
        Ok(Some(world)) => launched::run(world, &o),
        Ok(None) => top::run(&o),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The launcher's errors (text) as the library's, naming `what` failed: one error type
/// for every way a run ends.
fn invalid(what: &'static str) -> impl Fn(String) -> nccl_channel::Error {
    move |problem| nccl_channel::Error::InvalidArgument { what, problem }
}
