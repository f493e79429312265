//! Data-parallel training: linear regression by full-batch gradient descent on N GPUs, one
//! rank per GPU.
//!
//! Each rank holds a shard of the data (`--samples` rows of `--features` features) and the
//! same weights. A step computes the residuals and the gradient of the mean squared error
//! of its shard with its own kernels (`kernels.cu`, compiled to `kernels.ptx`), averages
//! the gradients over the ranks with in-place all-reduces on views of one flat gradient
//! buffer (`--bucket` elements per all-reduce, as data-parallel trainers do), and updates
//! its weights. With `--overlap` the gradient is computed a bucket at a time, and each
//! finished bucket's all-reduce runs on a second stream while the next bucket's gradient
//! is computed (as torch DDP overlaps its buckets' all-reduces with the backward pass).
//! The gradient lives in symmetric memory ([`Communicator::symmetric`]: NCCL memory every
//! rank registers as a window at the same place, whose all-reduces take NCCL's symmetric
//! kernels, which use fewer SMs and less latency); `--plain-memory` keeps it in plain
//! device memory for the side-by-side. Every `--log-every` steps the loss over all shards is printed. At the end
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
//! # Each bucket's all-reduce overlapped with the next bucket's gradient
//! data_parallel --nprocs 2 --overlap
//! # The gradient in plain device memory instead of symmetric memory
//! data_parallel --nprocs 2 --plain-memory
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
use nccl_channel::{Channel, Communicator, Error, ReduceOp, SymmetricBuffer, World};

mod data;
mod elastic;
mod reference;
mod twins;

use data::{print_shard, shard};
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
    /// Gradient-descent steps (at most 1000000: each keeps three timing events, four with
    /// --overlap).
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
    /// Compute the gradient a bucket at a time, and all-reduce each finished bucket on a
    /// second stream while the next one is computed.
    #[arg(long, conflicts_with = "elastic")]
    overlap: bool,
    /// Keep the gradient in plain device memory, not in symmetric memory (NCCL memory
    /// registered as a symmetric window on every rank): the side-by-side comparison.
    #[arg(long)]
    plain_memory: bool,
    /// Print a few values of this rank's shard (of --samples and --features) and exit: what
    /// the Python port of the data generator (bench/ddp_data.py) is checked against.
    #[arg(long, conflicts_with = "nprocs")]
    print_shard: Option<u32>,
    /// Skip the host reference (it costs about as much as the training on one CPU core).
    #[arg(long)]
    no_reference: bool,
    /// Seconds the launcher lets the ranks run, and a rank waits for the others.
    #[arg(long, default_value_t = 300.0, value_parser = positive_seconds)]
    timeout: f64,
    #[command(flatten)]
    elastic: elastic::ElasticOpts,
}

/// The most `--steps`: each step keeps three timing events (four with `--overlap`) until
/// the end.
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
        if self.overlap {
            a.push("--overlap".into());
        }
        if self.plain_memory {
            a.push("--plain-memory".into());
        }
        a.extend(self.elastic.rank_args());
        a
    }
}

fn main() -> ExitCode {
    let o = Opts::parse();
    if let Some(rank) = o.print_shard {
        return match print_shard(rank as usize, o.samples as usize, o.features as usize) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("data_parallel: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
    let (residual, gradient, gradient_cols, sgd, mse) = (
        module.function("residual")?,
        module.function("gradient")?,
        module.function("gradient_cols")?,
        module.function("sgd")?,
        module.function("mse")?,
    );

    let (hx, hy) = shard(rank, n, d)?;
    let x = DeviceBuffer::from_slice(ctx, &hx)?;
    let y = DeviceBuffer::from_slice(ctx, &hy)?;
    let mut w = DeviceBuffer::<f32>::zeroed(ctx, d + 1)?;
    let mut gradient_memory = Gradient::new(comm, d + 1, o.plain_memory)?;
    if rank == 0 {
        println!("gradient in {}", gradient_memory.describe());
    }
    let g: &mut DeviceBuffer<f32> = &mut gradient_memory;
    let mut r = DeviceBuffer::<f32>::zeroed(ctx, n)?;
    let mut loss = DeviceBuffer::<f32>::zeroed(ctx, 1)?;

    let (ni, di) = (n as i32, d as i32);
    let rows = LaunchConfig::linear(n as u32, BLOCK);
    // The gradient's grid: a thread per column, the rows split over `row_blocks`.
    let row_blocks = (n as u32).div_ceil(128).min(64);
    let cols_cfg = |cols: usize| {
        LaunchConfig::new(
            [(cols as u32).div_ceil(BLOCK), row_blocks, 1],
            [BLOCK, 1, 1],
        )
    };
    let grad_cfg = cols_cfg(d + 1);
    let scale = 2.0 / n as f32;
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
    // With --overlap: the stream the all-reduces run on, and the event a bucket's gradient
    // records for that stream to wait on (one event recorded again for every bucket: a
    // wait is for the record made before it).
    let overlap = match o.overlap {
        true => Some((Stream::non_blocking(ctx)?, Event::without_timing(ctx)?)),
        false => None,
    };
    let bucket = o.bucket as usize;
    let mut marks: Vec<Marks> = Vec::with_capacity(o.steps);
    let mut logged = Vec::new();
    for step in 0..o.steps {
        let m = Marks {
            start: timed()?,
            ar_start: timed()?,
            ar_end: timed()?,
            grad_end: overlap.as_ref().map(|_| timed()).transpose()?,
        };
        m.start.record(s)?;
        // SAFETY: as in `enqueue_loss`; `g` holds d + 1 floats, zeroed first since the
        // gradient kernels add their row blocks' partial sums.
        unsafe {
            residual.launch(s, rows, (&x, &w, &y, &mut r, ni, di))?;
            g.fill_async(0.0, s)?;
        }
        match (&overlap, &m.grad_end) {
            (Some((cs, ready)), Some(grad_end)) => {
                for k in 0..buckets {
                    let (j0, cols) = (k * bucket, bucket.min(d + 1 - k * bucket));
                    // SAFETY: as `gradient`, for columns j0 .. j0 + cols of the d + 1 (the
                    // grid covers them; the kernel checks the bound). It writes only
                    // those of `g`, which no all-reduce in flight on `cs` touches (those
                    // are of the buckets before); the zeroing above is ordered before
                    // them on `s`, and after the last step's all-reduces (`s` waited).
                    unsafe {
                        gradient_cols.launch(
                            s,
                            cols_cfg(cols),
                            (&x, &r, &mut *g, ni, di, scale, j0 as i32, cols as i32),
                        )?;
                    }
                    let done = if k + 1 == buckets { grad_end } else { ready };
                    done.record(s)?;
                    cs.wait_event(done)?;
                    if k == 0 {
                        m.ar_start.record(cs)?;
                    }
                    let mut view = g.slice_mut(j0..j0 + cols)?;
                    comm.all_reduce_in_place(&mut view, ReduceOp::Avg, cs)?;
                }
                m.ar_end.record(cs)?;
                s.wait_event(&m.ar_end)?;
            }
            _ => {
                // SAFETY: as in `enqueue_loss`; `g` holds d + 1 floats, the grid covers them.
                unsafe { gradient.launch(s, grad_cfg, (&x, &r, &mut *g, ni, di, scale))? };
                m.ar_start.record(s)?;
                for mut part in g.chunks_mut(bucket)? {
                    comm.all_reduce_in_place(&mut part, ReduceOp::Avg, s)?;
                }
                m.ar_end.record(s)?;
            }
        }
        // SAFETY: `w` and `g` hold d + 1 floats; the grid covers d + 1 threads.
        unsafe { sgd.launch(s, weights, (&mut w, &*g, o.lr, di + 1))? };
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
    // logged (they waited for the host) and the first two (warm-up) are left out. With
    // --overlap the all-reduce time is the second stream's, from the first bucket's
    // all-reduce start to the last one's end (waits for later buckets included), and
    // `exposed` the part of it after the last bucket's gradient: what overlap did not hide.
    s.synchronize()?;
    let (mut step_ms, mut ar_ms, mut exposed_ms, mut timed_steps) = (0.0f64, 0.0f64, 0.0f64, 0);
    for k in 2..marks.len().saturating_sub(1) {
        if k % o.log_every as usize == 0 {
            continue;
        }
        let m = &marks[k];
        step_ms += m.start.elapsed(&marks[k + 1].start)?.as_secs_f64() * 1e3;
        ar_ms += m.ar_start.elapsed(&m.ar_end)?.as_secs_f64() * 1e3;
        if let Some(grad_end) = &m.grad_end {
            exposed_ms += grad_end.elapsed(&m.ar_end)?.as_secs_f64() * 1e3;
        }
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
        // Their bits, in short: runs that must agree bit for bit compare this.
        println!("weights fnv1a {:016x}", fnv1a(&mine));
        if timed_steps > 0 {
            let t = timed_steps as f64;
            let (step, ar, exposed) = (step_ms / t, ar_ms / t, exposed_ms / t);
            // Simulated devices run kernels on the host when enqueued: their event times
            // measure the simulation, not a GPU.
            let clock = if ctx.cuda().driver().origin() == "mock driver" {
                " (simulated devices: host time of the simulation)"
            } else {
                ""
            };
            let overlapped = match o.overlap {
                true => format!(
                    " on a second stream, {:.1} us of it after the last gradient bucket,",
                    exposed * 1e3
                ),
                false => String::new(),
            };
            println!(
                "step time {:.1} us, all_reduce {:.1} us ({:.1} %){overlapped} in {buckets} \
                 buckets of <= {} floats ({} floats of gradient), over {timed_steps} \
                 steps{clock}",
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

/// The gradient's memory: symmetric unless `--plain-memory` (or where NCCL has no
/// windows: every rank learns that alike, and falls back alike).
enum Gradient<'c> {
    Symmetric(SymmetricBuffer<'c, f32>),
    Plain(DeviceBuffer<f32>, Option<String>),
}

impl<'c> Gradient<'c> {
    fn new(comm: &'c Communicator, len: usize, plain: bool) -> nccl_channel::Result<Self> {
        if plain {
            return Ok(Gradient::Plain(
                DeviceBuffer::zeroed(comm.context(), len)?,
                None,
            ));
        }
        match comm.symmetric::<f32>(len) {
            Ok(mut b) => {
                b.fill(0.0)?;
                Ok(Gradient::Symmetric(b))
            }
            Err(e @ Error::Unsupported { .. }) => Ok(Gradient::Plain(
                DeviceBuffer::zeroed(comm.context(), len)?,
                Some(e.to_string()),
            )),
            Err(e) => Err(e),
        }
    }

    fn describe(&self) -> String {
        match self {
            Gradient::Symmetric(_) => "symmetric memory (an NCCL window on every rank)".into(),
            Gradient::Plain(_, None) => "plain device memory (--plain-memory)".into(),
            Gradient::Plain(_, Some(why)) => format!("plain device memory ({why})"),
        }
    }
}

impl std::ops::Deref for Gradient<'_> {
    type Target = DeviceBuffer<f32>;
    fn deref(&self) -> &DeviceBuffer<f32> {
        match self {
            Gradient::Symmetric(b) => b,
            Gradient::Plain(b, _) => b,
        }
    }
}

impl std::ops::DerefMut for Gradient<'_> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<f32> {
        match self {
            Gradient::Symmetric(b) => b,
            Gradient::Plain(b, _) => b,
        }
    }
}

/// One step's timing events.
struct Marks {
    /// The step's start, on the compute stream.
    start: Event,
    /// Before the first all-reduce: on the compute stream after the gradient; with
    /// `--overlap` on the second stream, once the first bucket's gradient is done.
    ar_start: Event,
    /// After the last all-reduce, on the stream that ran them.
    ar_end: Event,
    /// With `--overlap`: after the last bucket's gradient, on the compute stream.
    grad_end: Option<Event>,
}

/// FNV-1a (64 bits) of the floats' bits.
fn fnv1a(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
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
