//! Data-parallel training: linear regression by full-batch gradient descent on N GPUs, one
//! rank per GPU.
//!
//! Each rank holds a shard of the data (`--samples` rows of `--features` features) and the
//! same weights. A step computes the residuals and the gradient of the mean squared error
//! of its shard with its own kernels (`kernels.cu`, compiled to `kernels.ptx`), averages
//! the gradients over the ranks with in-place all-reduces on views of one flat gradient
//! buffer (`--bucket` elements per all-reduce, as data-parallel trainers do), and updates
//! its weights. Every `--log-every` steps the loss over all shards is printed. At the end
//! every rank checks that its weights equal every other rank's (an all-reduce of the max
//! and of the min), rank 0 compares the losses with the same training done on the host in
//! f64, and reports the step time and the share of it spent in all-reduce.
//!
//! ```text
//! # One rank per GPU (on a machine without a CUDA driver, on simulated devices, whose
//! # kernels are the Rust twins below)
//! data_parallel --nprocs 2
//! # One rank, configured by the environment, as the allgather demo
//! NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=0 NCCL_COMM_ID=127.0.0.1:8000 data_parallel --device cuda://0 &
//! NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=1 NCCL_COMM_ID=127.0.0.1:8000 data_parallel --device cuda://1
//! # Elastic: rank 1 of 3 dies at step 10, the survivors shrink, its replacement is grown
//! # back in (see elastic.rs)
//! data_parallel --nprocs 3 --elastic --kill-rank 1 --kill-at 10
//! ```
//!
//! Modules: `data` (the shards), `twins` (the kernels' host twins), `reference` (the host's
//! f64 training), `elastic` (`--elastic`).

use nccl_launch as launch;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cuda_hal::{DeviceBuffer, Event, LaunchConfig, Module, Stream};
use nccl_channel::{Channel, Communicator, ReduceOp, World};

mod data;
mod elastic;
mod reference;
mod twins;

use data::shard;
use reference::check_reference;
use twins::with_kernels;

/// The kernels, compiled from `kernels.cu` (see there).
const KERNELS: &str = include_str!("kernels.ptx");

/// Threads per block of every kernel (the reductions' shared arrays have this size).
const BLOCK: u32 = 256;

/// Linear regression trained data-parallel over NCCL.
#[derive(Parser, Debug, Clone)]
#[command(name = "data_parallel")]
struct Opts {
    /// Ranks to launch, one process each: on its own GPU, or on a simulated device without a
    /// CUDA driver.
    /// Without it, this process is one rank configured by the environment.
    #[arg(long)]
    nprocs: Option<usize>,
    /// This rank's GPU (`cuda://<index>` or `cuda://GPU-<uuid>`); default: the local rank's.
    #[arg(long)]
    device: Option<String>,
    /// Features per sample.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    features: u32,
    /// Samples per rank.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..=1 << 24))]
    samples: u32,
    /// Gradient-descent steps (at most 1000000: each keeps three timing events).
    #[arg(long, default_value_t = 100, value_parser = steps_arg)]
    steps: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.5)]
    lr: f32,
    /// Elements per all-reduce bucket.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    bucket: u32,
    /// Print the loss every this many steps.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    log_every: u32,
    /// Skip the host reference (it costs about as much as the training on one CPU core).
    #[arg(long)]
    no_reference: bool,
    /// Seconds the launcher lets the ranks run, and a rank waits for the others.
    #[arg(long, default_value_t = 300.0, value_parser = positive_seconds)]
    timeout: f64,
    #[command(flatten)]
    elastic: elastic::ElasticOpts,
}

/// The most `--steps`: each step keeps three timing events until the end.
const MAX_STEPS: usize = 1_000_000;

fn steps_arg(s: &str) -> Result<usize, String> {
    match launch::parse_decimal::<usize>(s) {
        Some(v) if v <= MAX_STEPS => Ok(v),
        Some(v) => Err(format!(
            "{v} steps are more than the {MAX_STEPS} this example keeps timing events for"
        )),
        None => Err(format!("{s:?} is not a number of steps")),
    }
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

impl Opts {
    /// The arguments a launched rank gets (everything but the launcher's own).
    fn rank_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--features={}", self.features),
            format!("--samples={}", self.samples),
            format!("--steps={}", self.steps),
            format!("--lr={}", self.lr),
            format!("--bucket={}", self.bucket),
            format!("--log-every={}", self.log_every),
        ];
        if self.no_reference {
            a.push("--no-reference".into());
        }
        a.extend(self.elastic.rank_args());
        a
    }
}

fn main() -> ExitCode {
    let o = Opts::parse();
    launch::dispatch(
        "data_parallel",
        o.nprocs,
        |world| rank_from_env(world, &o),
        |n| launch(n, &o),
    )
}

/// One process per rank, each on its own GPU or, without a CUDA driver, on a simulated
/// device whose kernels are their host twins.
fn launch(n: usize, o: &Opts) -> Result<(), String> {
    let timeout = Duration::from_secs_f64(o.timeout);
    // The ranks check it too; refused here before any starts.
    o.elastic.check(n, o.steps).map_err(|e| e.to_string())?;
    if let launch::Machine::Simulated(why) = launch::machine(n)? {
        println!(
            "no CUDA driver ({why}): {n} rank{} on simulated devices, one process each, kernels \
             run by their host twins",
            if n == 1 { "" } else { "s" }
        );
    }
    let mut args = o.rank_args();
    args.push(format!("--timeout={}", o.timeout));
    match o.elastic.kill_rank {
        Some(r) if o.elastic.elastic => {
            let mut join = args.clone();
            join.push("--join".into());
            let replacement = launch::Replacement {
                rank: r as usize,
                as_rank: n - 1,
                args: join,
            };
            launch::processes_replacing(n, &args, timeout, launch::Output::Prefixed, &replacement)
        }
        _ => launch::processes(n, &args, timeout, launch::Output::Prefixed),
    }
}

fn rank_from_env(world: World, o: &Opts) -> Result<(), String> {
    if o.elastic.elastic {
        return elastic::run(world, o);
    }
    let setup = launch::RankSetup {
        device: o.device.clone(),
        timeout: Some(Duration::from_secs_f64(o.timeout)),
        sim_driver: Some(with_kernels),
        ..Default::default()
    };
    let rank = launch::rank_channel(world, &setup)?;
    println!("{}", rank.line);
    train(&rank.channel, o)?;
    rank.close()
}

/// The device memory a rank needs for `--samples` `n` and `--features` `d`, checked
/// against its device's before anything is allocated: `x` (n * d floats), `y` and the
/// residuals (n each), the weights, the gradient and the two comparison buffers (d + 1
/// each) and the loss.
fn fits_on_device(comm: &Communicator, n: usize, d: usize) -> nccl_channel::Result<()> {
    let (n, d) = (n as u128, d as u128);
    let need = 4 * (n * d + 2 * n + 4 * (d + 1) + 1);
    let device = comm.context().device();
    let total = device.total_memory()?;
    if need <= total as u128 {
        return Ok(());
    }
    Err(nccl_channel::Error::InvalidArgument {
        what: "--samples and --features",
        problem: format!(
            "{n} samples of {d} features need {need} bytes of device memory per rank, more \
             than the {total} bytes of device {}",
            device.ordinal()
        ),
    })
}

// ---------------------------------------------------------------------------------------
// Training on the devices

/// What rank 0 reports.
struct Losses {
    /// (step, loss over all shards) every `--log-every` steps, and after the last step.
    logged: Vec<(usize, f32)>,
}

fn train(ch: &Channel, o: &Opts) -> Result<(), String> {
    train_inner(ch.comm(), ch.stream(), o).map_err(|e| launch::report(e.as_ref()))
}

fn train_inner(
    comm: &Communicator,
    s: &Stream,
    o: &Opts,
) -> Result<(), Box<dyn std::error::Error>> {
    let (n, d) = (o.samples as usize, o.features as usize);
    let (rank, size) = (comm.rank(), comm.size());
    let ctx = comm.context();
    fits_on_device(comm, n, d)?;
    let module = Module::from_ptx(ctx, KERNELS)?;
    let (residual, gradient, sgd, mse) = (
        module.function("residual")?,
        module.function("gradient")?,
        module.function("sgd")?,
        module.function("mse")?,
    );

    let (hx, hy) = shard(rank, n, d)?;
    let x = DeviceBuffer::from_slice(ctx, &hx)?;
    let y = DeviceBuffer::from_slice(ctx, &hy)?;
    let mut w = DeviceBuffer::<f32>::zeroed(ctx, d + 1)?;
    let mut g = DeviceBuffer::<f32>::zeroed(ctx, d + 1)?;
    let mut r = DeviceBuffer::<f32>::zeroed(ctx, n)?;
    let mut loss = DeviceBuffer::<f32>::zeroed(ctx, 1)?;

    let (ni, di) = (n as i32, d as i32);
    let rows = LaunchConfig::linear(n as u32, BLOCK);
    let grad_cfg = LaunchConfig::new(
        [
            (d as u32 + 1).div_ceil(BLOCK),
            (n as u32).div_ceil(128).min(64),
            1,
        ],
        [BLOCK, 1, 1],
    );
    let weights = LaunchConfig::for_elements(d + 1, BLOCK);
    let one_block = LaunchConfig::linear(1, BLOCK);
    let buckets = (d + 1).div_ceil(o.bucket as usize);

    // Enqueues the loss of the current weights over all shards into `loss`.
    let enqueue_loss = |r: &mut DeviceBuffer<f32>,
                        loss: &mut DeviceBuffer<f32>,
                        w: &DeviceBuffer<f32>|
     -> Result<(), Box<dyn std::error::Error>> {
        // SAFETY: the kernels' parameters are as `kernels.cu` declares them: `x` holds
        // n * d floats, `w` d + 1, `y` and `r` n, `loss` 1; the grids cover those ranges.
        unsafe {
            residual.launch(s, rows, (&x, w, &y, &mut *r, ni, di))?;
            mse.launch(s, one_block, (&*r, &mut *loss, ni))?;
        }
        comm.all_reduce_in_place(loss, ReduceOp::Avg, s)?;
        Ok(())
    };

    let timed = || Event::new(ctx);
    let mut marks: Vec<[Event; 3]> = Vec::with_capacity(o.steps);
    let mut logged = Vec::new();
    for step in 0..o.steps {
        let m = [timed()?, timed()?, timed()?];
        m[0].record(s)?;
        // SAFETY: as in `enqueue_loss`; `g` holds d + 1 floats, zeroed first since the
        // gradient kernel adds its row blocks' partial sums.
        unsafe {
            residual.launch(s, rows, (&x, &w, &y, &mut r, ni, di))?;
            g.fill_async(0.0, s)?;
            gradient.launch(s, grad_cfg, (&x, &r, &mut g, ni, di, 2.0 / n as f32))?;
        }
        m[1].record(s)?;
        for mut bucket in g.chunks_mut(o.bucket as usize)? {
            comm.all_reduce_in_place(&mut bucket, ReduceOp::Avg, s)?;
        }
        m[2].record(s)?;
        // SAFETY: `w` and `g` hold d + 1 floats; the grid covers d + 1 threads.
        unsafe { sgd.launch(s, weights, (&mut w, &g, o.lr, di + 1))? };
        if step % o.log_every as usize == 0 {
            // The residuals of this step were of the weights before the update.
            // SAFETY: as in `enqueue_loss`.
            unsafe { mse.launch(s, one_block, (&r, &mut loss, ni))? };
            comm.all_reduce_in_place(&mut loss, ReduceOp::Avg, s)?;
            let l = loss.copy_to_host_vec_on(s)?;
            logged.push((step, l));
            if rank == 0 {
                println!("step {step:>5}  loss {l:.6e}");
            }
        }
        marks.push(m);
    }
    enqueue_loss(&mut r, &mut loss, &w)?;
    let final_loss = loss.copy_to_host_vec_on(s)?;
    logged.push((o.steps, final_loss));
    if rank == 0 {
        println!("final  {:>5}  loss {final_loss:.6e}", o.steps);
    }

    // Timing, from the events: a step is from one step's start to the next; steps that
    // logged (they waited for the host) and the first two (warm-up) are left out.
    s.synchronize()?;
    let (mut step_ms, mut ar_ms, mut timed_steps) = (0.0f64, 0.0f64, 0usize);
    for k in 2..marks.len().saturating_sub(1) {
        if k % o.log_every as usize == 0 {
            continue;
        }
        step_ms += marks[k][0].elapsed(&marks[k + 1][0])?.as_secs_f64() * 1e3;
        ar_ms += marks[k][1].elapsed(&marks[k][2])?.as_secs_f64() * 1e3;
        timed_steps += 1;
    }

    // Every rank's weights must be equal: the max and the min over the ranks are ours.
    let mine = w.to_vec()?;
    let mut hi = DeviceBuffer::<f32>::zeroed(ctx, d + 1)?;
    let mut lo = DeviceBuffer::<f32>::zeroed(ctx, d + 1)?;
    comm.all_reduce(&w, &mut hi, ReduceOp::Max, s)?;
    comm.all_reduce(&w, &mut lo, ReduceOp::Min, s)?;
    s.synchronize()?;
    let same = |v: Vec<f32>| v.iter().zip(&mine).all(|(a, b)| a.to_bits() == b.to_bits());
    if !(same(hi.to_vec()?) && same(lo.to_vec()?)) {
        return Err(format!("rank {rank}: the weights differ between ranks").into());
    }
    let first = logged.first().map_or(f32::NAN, |l| l.1);
    let fell = final_loss < first * 1e-2;
    if !fell {
        return Err(format!("rank {rank}: the loss did not fall: {first} -> {final_loss}").into());
    }
    if rank == 0 {
        println!(
            "weights equal on all {size} ranks; loss {first:.4e} -> {final_loss:.4e} in {} steps",
            o.steps
        );
        if timed_steps > 0 {
            let (step, ar) = (step_ms / timed_steps as f64, ar_ms / timed_steps as f64);
            // Simulated devices run kernels on the host when enqueued: their event times
            // measure the simulation, not a GPU.
            let clock = if ctx.cuda().driver().origin() == "mock driver" {
                " (simulated devices: host time of the simulation)"
            } else {
                ""
            };
            println!(
                "step time {:.1} us, all_reduce {:.1} us ({:.1} %) in {buckets} buckets of <= {} \
                 floats ({} floats of gradient), over {timed_steps} steps{clock}",
                step * 1e3,
                ar * 1e3,
                100.0 * ar / step,
                o.bucket,
                d + 1,
            );
        }
        if !o.no_reference {
            check_reference(&Losses { logged }, size, n, d, o)?;
        }
    }
    Ok(())
}

/// Downloads a one-element buffer in the order of `s`.
trait One {
    fn copy_to_host_vec_on(&self, s: &Stream) -> cuda_hal::Result<f32>;
}

impl One for DeviceBuffer<f32> {
    fn copy_to_host_vec_on(&self, s: &Stream) -> cuda_hal::Result<f32> {
        let mut v = [0.0f32];
        self.copy_to_host_on(&mut v, s)?;
        Ok(v[0])
    }
}
