//! A rank of a launcher (`--nprocs`, torchrun, srun, mpirun): everything from the
//! environment, one process per GPU, the ranks agreeing on times through NCCL; and
//! `--nprocs` itself, which starts those processes.

use std::cell::RefCell;
use std::time::Duration;

use cuda_hal::DeviceBuffer;
use nccl_channel::{ReduceOp, Result, World};
use nccl_launch::{Output, RankSetup};

use crate::invalid;
use crate::options::Opts;
use crate::rank::Rank;
use crate::setup::{comm_config, command_line, print_setup};
use crate::sweep::run_rank;

/// The most a rank waits for the others: `--timeout`, but not the hour a sweep may take.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// This process as rank `world.rank`, on a GPU or (without a driver) a simulated device.
/// Rank 0 prints the header and the table.
pub(crate) fn run(world: World, o: &Opts) -> Result<()> {
    let setup = RankSetup {
        config: comm_config(o),
        sim_version: o.sim_nccl,
        timeout: Some(o.timeout.min(MAX_WAIT)),
        ..Default::default()
    };
    let rank = nccl_launch::rank_channel(world, &setup).map_err(invalid("bench rank"))?;
    let ch = &rank.channel;
    if ch.comm().rank() == 0 {
        let what = match rank.simulated() {
            true => "; simulated devices: a smoke test, not a figure",
            false => "",
        };
        let size = ch.comm().size();
        println!(
            "# nccl-channel bench, {size} ranks from {}{what}",
            world.source
        );
        println!("# {}", rank.line);
        println!("# {}", command_line());
        print_setup(o);
    }
    let scratch = RefCell::new(DeviceBuffer::<f64>::zeroed(ch.comm().context(), 1)?);
    let max_time = |v: f64| -> Result<f64> {
        let mut b = scratch.borrow_mut();
        b.copy_from_host(&[v])?;
        ch.comm()
            .all_reduce_in_place(&mut *b, ReduceOp::Max, ch.stream())?;
        ch.stream().synchronize()?;
        Ok(b.to_vec()?[0])
    };
    let r = Rank {
        comm: ch.comm(),
        stream: ch.stream(),
        max_time: &max_time,
    };
    run_rank(&r, o)?;
    drop(scratch);
    rank.close().map_err(invalid("bench rank"))
}

/// `--nprocs N`: one process per rank through the shared launcher; rank 0's output is
/// the table.
pub(crate) fn launch(n: usize, o: &Opts) -> Result<()> {
    // The ranks get every option but the launcher's own.
    let mut args: Vec<String> = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(a) = given.next() {
        match a.as_str() {
            "--nprocs" => drop(given.next()),
            _ if a.starts_with("--nprocs=") => {}
            _ => args.push(a),
        }
    }
    nccl_launch::processes(n, &args, o.timeout, Output::Rank0).map_err(invalid("bench launcher"))
}
