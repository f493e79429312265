//! A run without a launcher: `--nprocs N` starts the ranks; otherwise one process drives
//! the GPUs, or without a CUDA driver two simulated devices (a smoke test, not a figure).

use std::sync::Arc;
use std::time::Instant;

use cuda_hal::Cuda;
use cuda_mock::MockDriver;
use nccl_channel::Result;
use nccl_launch::Machine;
use nccl_mock::MockNccl;

use crate::invalid;
use crate::launched::launch;
use crate::options::Opts;
use crate::setup::{command_line, print_setup};
use crate::threads::run_threads;

/// Runs the benchmark as `--nprocs` or `--threads` (the default) say.
pub(crate) fn run(o: &Opts) -> Result<()> {
    if let Some(n) = o.nprocs {
        let machine = nccl_launch::machine(n).map_err(invalid("bench launcher"))?;
        if let Machine::Simulated(why) = machine {
            println!("# no CUDA driver ({why}): {n} processes on simulated devices");
        }
        return launch(n, o);
    }
    let t = Instant::now();
    let driver = Cuda::load();
    let driver_ms = t.elapsed().as_secs_f64() * 1e3;
    match driver {
        Ok(cuda) => on_gpus(&cuda, driver_ms, o),
        Err(e) => on_simulated(&e, o),
    }
}

/// One thread per GPU (`--threads`, else every GPU); the header says how long the driver
/// (`driver_ms`) and NCCL took to load.
fn on_gpus(cuda: &Cuda, driver_ms: f64, o: &Opts) -> Result<()> {
    let t = Instant::now();
    let nccl = nccl_channel::nccl()?;
    let nccl_ms = t.elapsed().as_secs_f64() * 1e3;
    let gpus = cuda.device_count()?;
    println!(
        "# nccl-channel bench: CUDA driver {} ({}), loaded in {driver_ms:.2} ms",
        cuda.version(),
        cuda.driver().origin()
    );
    println!(
        "# NCCL {} ({}), loaded and resolved in {nccl_ms:.2} ms; {gpus} GPUs",
        nccl.version(),
        nccl.origin()
    );
    println!("# {}", command_line());
    print_setup(o);
    run_threads(cuda, &nccl, o.threads.unwrap_or(gpus), o)
}

/// No CUDA driver (`e` says why): one thread per simulated device (`--threads`, else 2).
fn on_simulated(e: &cuda_hal::Error, o: &Opts) -> Result<()> {
    println!(
        "# no CUDA driver ({}): running on simulated devices; a smoke test, not a figure",
        e.to_string().lines().next().unwrap_or_default()
    );
    print_setup(o);
    let n = o.threads.unwrap_or(2);
    let (cuda, gpus) = MockDriver::with_devices(n).build_with(Cuda::from_driver)?;
    let mut sim = MockNccl::new(&gpus);
    if let Some(v) = o.sim_nccl {
        sim = sim.version(v);
    }
    let (nccl, _w) = sim.build()?;
    println!("# simulated NCCL {}", nccl.version());
    run_threads(&cuda, &Arc::new(nccl), n, o)
}
