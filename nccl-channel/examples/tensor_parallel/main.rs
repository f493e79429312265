//! Tensor parallelism on cudarc's memory: Megatron's pair of linear layers, `Z = (X W) V`,
//! on N GPUs, one rank per GPU, every buffer allocated and read back by cudarc.
//!
//! * **Row-parallel** `Y = X W`: rank r holds the r-th block of X's columns (the input
//!   features, as a previous column-parallel layer leaves them) and the r-th block of W's
//!   rows; its kernel computes the partial product, and an in-place **all-reduce** (sum)
//!   gives every rank the whole `Y`.
//! * **Column-parallel** `Z = Y V`: rank r holds the r-th block of V's columns; its kernel
//!   computes its block of Z's columns, and an **all-gather** gives every rank all blocks.
//!
//! cudarc owns the inputs, the weights and its stream; cuda-hal launches the kernel on
//! that stream and nccl-channel runs the collectives on a stream of its own, through
//! `cuda_hal::cudarc`'s adapters (no copy, and no `unsafe` but the kernel launch's). The
//! activations the collectives move (Y, Z and the gathered Z) live in symmetric memory
//! ([`Communicator::symmetric`](nccl_channel::Communicator::symmetric): NCCL's symmetric
//! kernels, the latency of small all-reduces); `--cudarc-activations` allocates them with
//! cudarc too, for the side-by-side.
//! Every rank checks `Z` against the same product computed on the host in f64.
//!
//! ```text
//! # One rank per GPU
//! cargo run --release -p nccl-channel --features cudarc --example tensor_parallel -- --nprocs 2
//! # Without a GPU, on the drop-in simulator (cudarc opens libcuda itself, so it needs
//! # one on the library path; the kernel runs as its host twin below)
//! LD_LIBRARY_PATH=$(cargo xtask dropin) cargo run -p nccl-channel --features cudarc \
//!     --example tensor_parallel -- --nprocs 2
//! ```

use nccl_launch as launch;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cuda_hal::cudarc::{Borrowed, BorrowedMut};
use cuda_hal::{Context, DeviceSlice, DeviceSliceMut, LaunchConfig, Module, Stream};
use cudarc::driver::{CudaContext, CudaSlice};
use nccl_channel::{Channel, Error, ReduceOp, World};

/// The kernel, compiled from `kernels.cu` (see there).
const KERNELS: &str = include_str!("kernels.ptx");

/// Threads per block along each axis of the matmul kernel's 2-D blocks.
const TILE: u32 = 16;

/// The largest size along any axis: keeps the host reference and the buffers small.
const MAX_DIM: u32 = 1 << 14;

/// Two linear layers, row-parallel then column-parallel, on cudarc's memory.
#[derive(Parser, Debug, Clone)]
#[command(name = "tensor_parallel")]
struct Opts {
    /// Ranks to launch, one process each, one GPU each.
    /// Without it, this process is one rank configured by the environment.
    #[arg(long)]
    nprocs: Option<usize>,
    /// This rank's GPU (`cuda://<index>` or `cuda://GPU-<uuid>`); default: the local rank's.
    #[arg(long)]
    device: Option<String>,
    /// Rows of X (tokens).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=MAX_DIM as i64))]
    batch: u32,
    /// Columns of X, rows of W (a multiple of the ranks).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=MAX_DIM as i64))]
    features: u32,
    /// Columns of W, rows of V.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=MAX_DIM as i64))]
    hidden: u32,
    /// Columns of V (a multiple of the ranks).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=MAX_DIM as i64))]
    out: u32,
    /// Seconds the launcher lets the ranks run, and a rank waits for the others.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Allocate the activations with cudarc, not in symmetric memory.
    #[arg(long)]
    cudarc_activations: bool,
}

impl Opts {
    /// The arguments a launched rank gets (everything but the launcher's own).
    fn rank_args(&self) -> Vec<String> {
        vec![
            format!("--batch={}", self.batch),
            format!("--features={}", self.features),
            format!("--hidden={}", self.hidden),
            format!("--out={}", self.out),
            format!("--timeout={}", self.timeout),
        ]
        .into_iter()
        .chain(
            self.cudarc_activations
                .then(|| "--cudarc-activations".to_string()),
        )
        .collect()
    }
}

fn main() -> ExitCode {
    let o = Opts::parse();
    launch::dispatch(
        "tensor_parallel",
        o.nprocs,
        |world| rank_from_env(world, &o),
        |n| start(n, &o),
    )
}

/// One process per rank, each on its own GPU (real, or of the drop-in simulator).
fn start(n: usize, o: &Opts) -> Result<(), String> {
    match launch::machine(n)? {
        launch::Machine::Simulated(why) => {
            return Err(format!(
                "no CUDA driver ({why}); cudarc opens libcuda itself, so without a GPU run \
                 this on the drop-in simulator: LD_LIBRARY_PATH=$(cargo xtask dropin)"
            ));
        }
        launch::Machine::Gpus if launch::dropin::is_dropin() => println!(
            "the driver is the drop-in simulator: {n} rank{} on simulated GPUs, the kernel run \
             by its host twin",
            if n == 1 { "" } else { "s" }
        ),
        launch::Machine::Gpus => {}
    }
    let timeout = Duration::from_secs(o.timeout);
    launch::processes(n, &o.rank_args(), timeout, launch::Output::Prefixed)
}

fn rank_from_env(world: World, o: &Opts) -> Result<(), String> {
    let setup = launch::RankSetup {
        device: o.device.clone(),
        timeout: Some(Duration::from_secs(o.timeout)),
        ..Default::default()
    };
    let rank = launch::rank_channel(world, &setup)?;
    if rank.simulated() {
        return Err("cudarc needs a libcuda: run this on the drop-in simulator".into());
    }
    println!("{}", rank.line);
    launch::dropin::bind("matmul", &[8, 8, 8, 4, 4, 4], matmul_twin)?;
    layers(&rank.channel, o).map_err(|e| launch::report(e.as_ref()))?;
    rank.close()
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// SplitMix64, so every rank and the host reference make the same matrices.
fn uniform(seed: u64, i: usize) -> f32 {
    let mut z = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Rows `rows` and columns `cols` of the `seed` matrix with `width` columns, row-major.
fn block(
    seed: u64,
    width: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> Vec<f32> {
    rows.flat_map(|i| cols.clone().map(move |j| uniform(seed, i * width + j)))
        .collect()
}

const X: u64 = 1;
const W: u64 = 2;
const V: u64 = 3;

/// `c = a b` (`a`: n×k, `b`: k×m) on `stream`.
fn matmul<A, B, C>(
    module: &Module,
    stream: &Stream,
    (a, b, c): (&A, &B, &mut C),
    (n, k, m): (usize, usize, usize),
) -> Res<()>
where
    A: DeviceSlice<Elem = f32> + ?Sized,
    B: DeviceSlice<Elem = f32> + ?Sized,
    C: DeviceSliceMut<Elem = f32> + ?Sized,
{
    if a.len() != n * k || b.len() != k * m || c.len() != n * m {
        return Err(format!("matmul of {n}x{k} by {k}x{m}: the buffers' lengths differ").into());
    }
    let f = module.function("matmul")?;
    let cfg = LaunchConfig {
        grid: [(m as u32).div_ceil(TILE), (n as u32).div_ceil(TILE), 1],
        block: [TILE, TILE, 1],
        shared_mem_bytes: 0,
    };
    let dims = (n as i32, k as i32, m as i32);
    // SAFETY: `matmul` reads n*k floats at `a` and k*m at `b` and writes n*m at `c`, which
    // is what each holds (checked above), and only inside its grid's bounds.
    unsafe { f.launch(stream, cfg, (a, b, c, dims.0, dims.1, dims.2)) }?;
    Ok(())
}

/// The two layers on this rank's blocks (`x`, `w`, `v`), into the activations `y`
/// (n×h, all-reduced), `z` (this rank's n×ps block) and `gathered` (every rank's).
#[allow(clippy::too_many_arguments)] // the layers' operands, one for one
fn forward<Y, Z, G>(
    ch: &Channel,
    module: &Module,
    kernels_on: &Stream,
    (x, w, v): (&Borrowed<'_, f32>, &Borrowed<'_, f32>, &Borrowed<'_, f32>),
    (y, z, gathered): (&mut Y, &mut Z, &mut G),
    (n, ks, h, ps): (usize, usize, usize, usize),
) -> Res<()>
where
    Y: DeviceSliceMut<Elem = f32> + ?Sized,
    Z: DeviceSliceMut<Elem = f32> + ?Sized,
    G: DeviceSliceMut<Elem = f32> + ?Sized,
{
    let comm = ch.comm();
    // Row-parallel: partial Y on cudarc's stream, summed over the ranks on ours.
    matmul(module, kernels_on, (x, w, &mut *y), (n, ks, h))?;
    comm.all_reduce_in_place(&mut *y, ReduceOp::Sum, ch.stream())?;
    // Column-parallel: this rank's block of Z's columns, gathered from every rank.
    matmul(module, kernels_on, (&*y, v, &mut *z), (n, h, ps))?;
    comm.all_gather(&*z, gathered, ch.stream())?;
    Ok(())
}

fn layers(ch: &Channel, o: &Opts) -> Res<()> {
    let comm = ch.comm();
    let (r, size) = (comm.rank(), comm.size());
    let (n, k, h, p) = (
        o.batch as usize,
        o.features as usize,
        o.hidden as usize,
        o.out as usize,
    );
    if k % size != 0 || p % size != 0 {
        return Err(format!(
            "--features {k} and --out {p} must both be multiples of the {size} ranks"
        )
        .into());
    }
    let (ks, ps) = (k / size, p / size);

    // cudarc's context and stream of this rank's GPU, adopted (the same primary context
    // the channel's communicator lives in).
    let ordinal = comm.context().device().ordinal();
    let theirs = CudaContext::new(usize::try_from(ordinal)?)?;
    let ctx = Context::from_cudarc(comm.context().cuda(), &theirs)?;
    let their_stream = theirs.new_stream()?;
    // SAFETY: this program never captures `their_stream` through cudarc.
    let kernels_on = unsafe { Stream::from_cudarc(&ctx, &their_stream) }?;
    let module = Module::from_ptx(&ctx, KERNELS)?;

    // This rank's blocks, uploaded by cudarc.
    let x = their_stream.clone_htod(&block(X, k, 0..n, r * ks..(r + 1) * ks))?;
    let w = their_stream.clone_htod(&block(W, h, r * ks..(r + 1) * ks, 0..h))?;
    let v = their_stream.clone_htod(&block(V, p, 0..h, r * ps..(r + 1) * ps))?;
    let operands = (
        &Borrowed::new(&ctx, &x)?,
        &Borrowed::new(&ctx, &w)?,
        &Borrowed::new(&ctx, &v)?,
    );
    let dims = (n, ks, h, ps);
    let symmetric = match o.cudarc_activations {
        true => None,
        // Every rank asks the same sizes in the same order; where NCCL has no windows every
        // rank learns it alike and falls back alike.
        false => match (
            comm.symmetric::<f32>(n * h),
            comm.symmetric::<f32>(n * ps),
            comm.symmetric::<f32>(size * n * ps),
        ) {
            (Ok(y), Ok(z), Ok(g)) => Some((y, z, g)),
            (Err(e @ Error::Unsupported { .. }), ..) => {
                println!("rank {r}: activations allocated by cudarc ({e})");
                None
            }
            (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => return Err(e.into()),
        },
    };
    let blocks = match symmetric {
        Some((mut y, mut z, mut gathered)) => {
            println!("rank {r}: activations in symmetric memory");
            forward(
                ch,
                &module,
                &kernels_on,
                operands,
                (&mut y, &mut z, &mut gathered),
                dims,
            )?;
            // Waits for the all-gather, as any host copy of this crate's memory does.
            gathered.to_vec()?
        }
        None => {
            let mut y: CudaSlice<f32> = their_stream.alloc_zeros(n * h)?;
            let mut z: CudaSlice<f32> = their_stream.alloc_zeros(n * ps)?;
            let mut gathered: CudaSlice<f32> = their_stream.alloc_zeros(size * n * ps)?;
            forward(
                ch,
                &module,
                &kernels_on,
                operands,
                (
                    &mut BorrowedMut::new(&ctx, &mut y)?,
                    &mut BorrowedMut::new(&ctx, &mut z)?,
                    &mut BorrowedMut::new(&ctx, &mut gathered)?,
                ),
                dims,
            )?;
            // Back in cudarc: its read waits for the all-gather on our stream.
            their_stream.clone_dtoh(&gathered)?
        }
    };

    let worst = compare(&blocks, o, size)?;
    println!(
        "rank {r}/{size}: Z = (X W) V, {n}x{p}, matches the host reference (largest error \
         {worst:.1e} of its scale)"
    );
    Ok(())
}

/// Largest difference between the gathered blocks and `(X W) V` on the host (f64), as a
/// share of the result's largest magnitude; an error beyond 1e-4 of it.
fn compare(blocks: &[f32], o: &Opts, size: usize) -> Res<f64> {
    let (n, k, h, p) = (
        o.batch as usize,
        o.features as usize,
        o.hidden as usize,
        o.out as usize,
    );
    let ps = p / size;
    let (x, w, v) = (
        block(X, k, 0..n, 0..k),
        block(W, h, 0..k, 0..h),
        block(V, p, 0..h, 0..p),
    );
    let mut y = vec![0f64; n * h];
    for i in 0..n {
        for t in 0..k {
            let a = f64::from(x[i * k + t]);
            for j in 0..h {
                y[i * h + j] += a * f64::from(w[t * h + j]);
            }
        }
    }
    let (mut worst, mut scale) = (0f64, 0f64);
    for i in 0..n {
        for j in 0..p {
            let z: f64 = (0..h).map(|t| y[i * h + t] * f64::from(v[t * p + j])).sum();
            // Block j / ps, row i, column j % ps.
            let got = f64::from(blocks[(j / ps) * n * ps + i * ps + j % ps]);
            worst = worst.max((got - z).abs());
            scale = scale.max(z.abs());
        }
    }
    let rel = worst / scale.max(f64::MIN_POSITIVE);
    if rel > 1e-4 {
        return Err(format!("Z differs from the host reference by {rel:.2e} of its scale").into());
    }
    Ok(rel)
}

/// The kernel's host twin, for the drop-in simulator: what `kernels.cu` does on a GPU.
fn matmul_twin(l: &launch::dropin::Launch) {
    let p = |i| l.param::<u64>(i).unwrap_or(0);
    let d = |i| l.param::<i32>(i).unwrap_or(0).max(0) as usize;
    let (n, k, m) = (d(3), d(4), d(5));
    let (Some(a), Some(b)) = (l.read::<f32>(p(0), n * k), l.read::<f32>(p(1), k * m)) else {
        return;
    };
    let mut c = vec![0f32; n * m];
    for i in 0..n {
        for t in 0..k {
            let ai = a[i * k + t];
            for j in 0..m {
                c[i * m + j] += ai * b[t * m + j];
            }
        }
    }
    l.write(p(2), &c);
}
