//! `private-channel`: what each communicator's private channel costs (BENCHMARKS.md), on
//! one rank of the first GPU a driver finds, else of a simulated device.
//!
//! ```text
//! private-channel [--inits 20] [--calls 2000]
//! ```
//!
//! - **init**: NCCL's own one-rank init (`ncclCommInitRank` through the raw table) against
//!   `Communicator::init_rank`, which adds the split of its private channel; min and
//!   median over `--inits` inits, and the device memory each took (the free memory before
//!   and after, the communicator alive; `ncclCommMemStats`'s total where NCCL has it).
//! - **exchange**: one exchange on the private channel, as the checked mode makes one
//!   before each call: an 8-byte all-reduce with and without the checked mode, `--calls`
//!   of each, the stream synchronised at the end; the difference per call.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use cuda_hal::{Context, Cuda, DeviceBuffer, Stream};
use nccl_channel::{CommConfig, Communicator, ReduceOp, UniqueId};
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

/// What each communicator's private channel costs.
#[derive(Parser, Debug)]
#[command(name = "private-channel")]
struct Opts {
    /// Inits of each kind.
    #[arg(long, default_value_t = 20)]
    inits: usize,
    /// Calls of each kind for the exchange's cost.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let opts = Opts::parse();
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("private-channel: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The driver and NCCL of this machine, or simulated ones (and what they are, in words).
fn machine() -> Res<(Cuda, Arc<Nccl>, String, Option<cuda_mock::MockWorld>)> {
    if let Ok(cuda) = Cuda::load() {
        let nccl = Arc::new(Nccl::load()?);
        let what = format!("{} with NCCL {}", cuda.device(0)?.name()?, nccl.version());
        return Ok((cuda, nccl, what, None));
    }
    let (cuda, gpus) = cuda_mock::MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    let nccl = Arc::new(nccl_mock::MockNccl::new(&gpus).build()?.0);
    let what = format!("a simulated device with simulated NCCL {}", nccl.version());
    Ok((cuda, nccl, what, Some(gpus)))
}

fn run(opts: &Opts) -> Res<()> {
    let (cuda, nccl, what, _world) = machine()?;
    let ctx = cuda.device(0)?.primary_context()?;
    println!("# private-channel: one rank on {what}");
    let free = || ctx.memory_info().map(|m| m.free);

    // NCCL's init alone.
    let mut raw_times = Vec::with_capacity(opts.inits);
    let mut raw_bytes = 0;
    let mut raw_stats = None;
    for i in 0..opts.inits {
        let id = UniqueId::generate(&nccl)?;
        let before = free()?;
        let t = Instant::now();
        let raw = raw_init(&nccl, &ctx, &id)?;
        raw_times.push(t.elapsed());
        if i == 0 {
            raw_bytes = before.saturating_sub(free()?);
            raw_stats = mem_total(&nccl, raw);
        }
        // SAFETY: made above, destroyed once.
        unsafe { (nccl.fns().ncclCommDestroy)(raw) };
    }

    // The crate's init: the same, and the private channel's split.
    let mut times = Vec::with_capacity(opts.inits);
    let mut bytes = 0;
    let mut stats = None;
    for i in 0..opts.inits {
        let id = UniqueId::generate(&nccl)?;
        let before = free()?;
        let t = Instant::now();
        let comm = Communicator::init_rank(&nccl, &ctx, &id, 1, 0)?;
        times.push(t.elapsed());
        if i == 0 {
            bytes = before.saturating_sub(free()?);
            stats = comm.mem_stats().ok().map(|s| s.total);
        }
        comm.close()?;
    }
    println!("| init | min | median | device memory taken | ncclCommMemStats total |");
    println!("|---|---|---|---|---|");
    let row = |name: &str, t: &mut Vec<Duration>, b: usize, s: Option<u64>| {
        t.sort();
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.1} MiB | {} |",
            ms(t[0]),
            ms(t[t.len() / 2]),
            b as f64 / (1 << 20) as f64,
            s.map_or("-".into(), |v| format!(
                "{:.1} MiB",
                v as f64 / (1 << 20) as f64
            ))
        );
    };
    row("ncclCommInitRank", &mut raw_times, raw_bytes, raw_stats);
    row("Communicator::init_rank", &mut times, bytes, stats);

    // One exchange: a checked call against an unchecked one.
    let per_call = |checked: bool| -> Res<Duration> {
        let id = UniqueId::generate(&nccl)?;
        let config = CommConfig::new().check_calls(checked);
        let comm = Communicator::init_rank_with(&nccl, &ctx, &id, 1, 0, &config)?;
        let stream = Stream::non_blocking(&ctx)?;
        let mut buf = DeviceBuffer::from_slice(&ctx, &[1.0f64])?;
        for _ in 0..opts.calls.min(100) {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
        }
        stream.synchronize()?;
        let t = Instant::now();
        for _ in 0..opts.calls {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
        }
        stream.synchronize()?;
        let d = t.elapsed() / opts.calls.max(1) as u32;
        comm.close()?;
        Ok(d)
    };
    let plain = per_call(false)?;
    let checked = per_call(true)?;
    println!();
    println!("| 8-byte all-reduce, {} calls | per call |", opts.calls);
    println!("|---|---|");
    println!("| unchecked | {:.2} µs |", us(plain));
    println!(
        "| checked (one exchange on the private channel first) | {:.2} µs |",
        us(checked)
    );
    println!(
        "| the exchange | {:.2} µs |",
        us(checked.saturating_sub(plain))
    );
    Ok(())
}

/// One rank's communicator made by NCCL alone, on `ctx`'s device.
fn raw_init(nccl: &Nccl, ctx: &Context, id: &UniqueId) -> Res<ncclComm_t> {
    let _bound = ctx.bind()?;
    let mut raw: ncclComm_t = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the device's context is current.
    let rc = unsafe { (nccl.fns().ncclCommInitRank)(&mut raw, 1, id.to_raw(), 0) };
    if rc != ncclResult_t::ncclSuccess {
        return Err(format!("ncclCommInitRank: {rc:?}").into());
    }
    Ok(raw)
}

/// `ncclCommMemStats`'s total for `raw`, where the NCCL has it.
fn mem_total(nccl: &Nccl, raw: ncclComm_t) -> Option<u64> {
    let f = nccl.fns().ncclCommMemStats?;
    let mut v = 0u64;
    // SAFETY: a live communicator and a valid out-pointer.
    let rc = unsafe {
        f(
            raw,
            nccl_sys::ncclCommMemStat_t::ncclStatGpuMemTotal,
            &mut v,
        )
    };
    (rc == ncclResult_t::ncclSuccess).then_some(v)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
