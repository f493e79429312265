//! The all-gather demo: each rank holds `[101, 102]`, all-gathers it over the default
//! channel and prints `2x2xi32=[101 102][101 102]`.
//!
//! ```text
//! # Launcher: one rank per GPU (on a machine without a CUDA driver, on simulated devices)
//! allgather --nprocs 2
//! # One rank, configured by the environment (this crate's or IREE's variables)
//! IREE_CUDA_NCCL_NPROCS=2 NCCL_COMM_ID=127.0.0.1:8000 IREE_CUDA_NCCL_PROCID=0 allgather --device=cuda://0 &
//! IREE_CUDA_NCCL_NPROCS=2 NCCL_COMM_ID=127.0.0.1:8000 IREE_CUDA_NCCL_PROCID=1 allgather --device=cuda://1
//! # Under a launcher: rank 0's unique id reaches the others through it (torchrun's store,
//! # or an address derived from Slurm's, Open MPI's or PMI's variables)
//! torchrun --no-python --nproc-per-node 2 allgather
//! srun -n 2 allgather
//! ```
//! Without a CUDA driver every form runs on simulated devices, the ranks' data moving
//! between the processes over loopback.
//! `allgather --help` lists the options (`--device` also takes `cuda://GPU-<uuid>`;
//! `--opt value` and `--opt=value` both work).

use nccl_launch as launch;

use std::fmt::Display;
use std::process::ExitCode;
use std::time::Duration;

use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Communicator, NcclType, ReduceOp, World};

/// The all-gather demo of nccl-channel: one rank per process, configured by the
/// environment, or `--nprocs N` to start N ranks here.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "allgather", version)]
struct Opts {
    /// Start N ranks, one process each: on its own GPU, or on a simulated device without a
    /// CUDA driver (for a world from the environment or a launcher, leave it out).
    #[arg(long, value_name = "N", value_parser = launch::positive)]
    nprocs: Option<usize>,
    /// The GPU of this rank, for a world from the environment: cuda://<index>,
    /// cuda://GPU-<uuid>, cuda://MIG-<uuid>, a PCI bus id cuda://0000:18:00.0, or cuda://
    /// (default: the rank's local index). With --nprocs each rank takes its own GPU.
    #[arg(
        long,
        value_name = "cuda://<index>|cuda://GPU-<uuid>",
        conflicts_with = "nprocs"
    )]
    device: Option<String>,
    /// Elements per rank.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = launch::positive)]
    count: usize,
    /// Element type.
    #[arg(long, default_value = "i32", value_parser = ["i32", "f32", "i8", "ui8", "ui32", "i64", "ui64", "f64"])]
    dtype: String,
    /// The collective to run.
    #[arg(long, default_value = "all_gather", value_parser = ["all_gather", "all_reduce", "all_to_all", "broadcast", "reduce_scatter"])]
    collective: String,
    /// How long a rank waits for the others (for the unique id from a launcher's rendezvous,
    /// and on simulated devices in NCCL), and how long the ranks of --nprocs may take.
    #[arg(long, value_name = "SECONDS", default_value = "120", value_parser = launch::seconds)]
    timeout: Duration,
}

fn main() -> ExitCode {
    // `--help` and `--version` exit 0; a bad argument exits 2 with clap's message.
    let opts = <Opts as clap::Parser>::parse();
    let world = match World::from_env() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("allgather: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match (world, opts.nprocs) {
        (Some(world), Some(_)) => Err(launch::nprocs_in_a_world(&world)),
        (Some(world), None) => run_rank_from_env(world, &opts),
        (None, Some(n)) => launch(n, &opts),
        (None, None) => Err(
            "no world configured: pass --nprocs N, start the ranks with a launcher (torchrun \
             --no-python, srun, mpirun), or set NCCL_CHANNEL_NPROCS/NCCL_CHANNEL_PROCID (or \
             IREE_CUDA_NCCL_NPROCS/IREE_CUDA_NCCL_PROCID) and NCCL_COMM_ID=host:port; NCCL was \
             not opened"
                .to_string(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allgather: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One rank, everything from the environment and `--device`: its first line says where
/// it runs (a GPU, or a simulated device when there is no CUDA driver).
fn run_rank_from_env(world: World, o: &Opts) -> Result<(), String> {
    let setup = launch::RankSetup {
        device: o.device.clone(),
        timeout: Some(o.timeout),
        ..Default::default()
    };
    let rank = launch::rank_channel(world, &setup)?;
    println!("{}", rank.line);
    let ch = &rank.channel;
    let line = run_collective(ch.comm(), ch.stream(), o)?;
    println!("{line}");
    rank.close()
}

/// Dispatches on `--dtype`.
fn run_collective(comm: &Communicator, s: &Stream, o: &Opts) -> Result<String, String> {
    let r = match o.dtype.as_str() {
        "i32" => typed::<i32>(comm, s, o, "i32"),
        "f32" => typed::<f32>(comm, s, o, "f32"),
        "i8" => typed::<i8>(comm, s, o, "i8"),
        "ui8" => typed::<u8>(comm, s, o, "ui8"),
        "ui32" => typed::<u32>(comm, s, o, "ui32"),
        "i64" => typed::<i64>(comm, s, o, "i64"),
        "ui64" => typed::<u64>(comm, s, o, "ui64"),
        "f64" => typed::<f64>(comm, s, o, "f64"),
        other => return Err(format!("unknown --dtype {other:?}")),
    };
    r.map_err(|e| launch::report(&e))
}

trait DemoVal: NcclType + Display {
    fn from_i(v: i64) -> Self;
}
macro_rules! demo_val {
    ($($t:ty),*) => { $( impl DemoVal for $t { fn from_i(v: i64) -> Self { v as $t } } )* };
}
demo_val!(i8, u8, i32, u32, i64, u64, f32, f64);

/// Formats rows as IREE prints tensors: `2x2xi32=[101 102][101 102]`.
fn tensor<T: Display>(rows: usize, cols: usize, dtype: &str, v: &[T]) -> String {
    let mut s = if rows > 1 {
        format!("{rows}x{cols}x{dtype}=")
    } else {
        format!("{cols}x{dtype}=")
    };
    for row in v.chunks(cols.max(1)) {
        s.push('[');
        s.push_str(
            &row.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(" "),
        );
        s.push(']');
    }
    s
}

fn typed<T: DemoVal>(
    comm: &Communicator,
    s: &Stream,
    o: &Opts,
    dtype: &str,
) -> nccl_channel::Result<String> {
    let (n, count, ctx) = (comm.size(), o.count, comm.context());
    fits_on_device::<T>(comm, o, dtype)?;
    let mut input: Vec<T> = host_vec(count, dtype)?;
    input.extend((0..count).map(|i| T::from_i(101 + i as i64)));
    let send = DeviceBuffer::from_slice(ctx, &input)?;
    drop(input);
    let line = match o.collective.as_str() {
        "all_gather" => {
            let mut recv = DeviceBuffer::<T>::alloc(ctx, n * count)?;
            comm.all_gather(&send, &mut recv, s)?;
            s.synchronize()?;
            tensor(n, count, dtype, &download(&recv, dtype)?)
        }
        "all_reduce" => {
            let mut recv = DeviceBuffer::<T>::alloc(ctx, count)?;
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, s)?;
            s.synchronize()?;
            tensor(1, count, dtype, &download(&recv, dtype)?)
        }
        "broadcast" => {
            let mut recv = DeviceBuffer::<T>::alloc(ctx, count)?;
            comm.broadcast(
                (comm.rank() == 0).then_some(send.as_view()),
                &mut recv,
                0,
                s,
            )?;
            s.synchronize()?;
            tensor(1, count, dtype, &download(&recv, dtype)?)
        }
        "all_to_all" | "reduce_scatter" => {
            if count % n != 0 {
                return Err(nccl_channel::Error::InvalidArgument {
                    what: "--count",
                    problem: format!(
                        "{count} is not a multiple of the {n} ranks, which {} needs",
                        o.collective
                    ),
                });
            }
            let mut recv = DeviceBuffer::<T>::alloc(
                ctx,
                if o.collective == "all_to_all" {
                    count
                } else {
                    count / n
                },
            )?;
            if o.collective == "all_to_all" {
                comm.all_to_all(&send, &mut recv, s)?;
            } else {
                comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum, s)?;
            }
            s.synchronize()?;
            let v = download(&recv, dtype)?;
            let rows = if o.collective == "all_to_all" { n } else { 1 };
            tensor(rows, count / n, dtype, &v)
        }
        other => {
            return Err(nccl_channel::Error::InvalidArgument {
                what: "allgather demo",
                problem: format!("unknown --collective {other:?}"),
            });
        }
    };
    Ok(line)
}

/// `--count` checked against the rank's device before anything is allocated: the send
/// buffer and the receive buffer of `--collective` must fit in the device's memory (a
/// count that does not is an error naming the flag, the bytes it needs and the device's,
/// not an allocation that aborts the process).
fn fits_on_device<T>(comm: &Communicator, o: &Opts, dtype: &str) -> nccl_channel::Result<()> {
    let device = comm.context().device();
    let total = device.total_memory()?;
    match too_large(
        o,
        comm.size(),
        size_of::<T>(),
        dtype,
        total,
        device.ordinal(),
    ) {
        None => Ok(()),
        Some(problem) => Err(nccl_channel::Error::InvalidArgument {
            what: "--count",
            problem,
        }),
    }
}

/// Why `--count` elements of `dtype` (`size` bytes each) per rank do not fit on a device of
/// `total` bytes for `--collective` on `n` ranks (its send and receive buffers), or `None`
/// when they do.
fn too_large(
    o: &Opts,
    n: usize,
    size: usize,
    dtype: &str,
    total: usize,
    ordinal: impl Display,
) -> Option<String> {
    let (n, count) = (n as u128, o.count as u128);
    let recv = match o.collective.as_str() {
        "all_gather" => n * count,
        "reduce_scatter" => count / n.max(1),
        _ => count,
    };
    let need = (count + recv) * size as u128;
    (need > total as u128).then(|| {
        format!(
            "{count} elements of {dtype} per rank need {need} bytes of device memory for the \
             {} on {n} rank{} ({count} elements to send, {recv} to receive), more than the \
             {total} bytes of device {ordinal}",
            o.collective,
            if n == 1 { "" } else { "s" },
        )
    })
}

/// The bytes of one element of `--dtype`.
fn dtype_size(dtype: &str) -> usize {
    match dtype {
        "i8" | "ui8" => 1,
        "i32" | "ui32" | "f32" => 4,
        _ => 8,
    }
}

/// An empty host vector with room for `len` elements of `--count`, or an error naming the
/// flag and the bytes the host refused (instead of an abort).
fn host_vec<T>(len: usize, dtype: &str) -> nccl_channel::Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|e| nccl_channel::Error::InvalidArgument {
            what: "--count",
            problem: format!(
                "the host cannot hold {len} elements of {dtype} ({} bytes): {e}",
                len as u128 * size_of::<T>() as u128
            ),
        })?;
    Ok(v)
}

/// The buffer's contents, in a host vector from [`host_vec`].
fn download<T: DemoVal>(buf: &DeviceBuffer<T>, dtype: &str) -> nccl_channel::Result<Vec<T>> {
    let mut v = host_vec(buf.len(), dtype)?;
    v.resize(buf.len(), T::from_i(0));
    buf.copy_to_host(&mut v)?;
    Ok(v)
}

/// The launcher: one process per rank, each on its own GPU, or on a simulated device when
/// there is no CUDA driver (the simulated NCCL then moves data between the processes).
fn launch(n: usize, o: &Opts) -> Result<(), String> {
    if matches!(o.collective.as_str(), "all_to_all" | "reduce_scatter")
        && !o.count.is_multiple_of(n)
    {
        return Err(format!(
            "--count: {} is not a multiple of the {n} ranks, which {} needs",
            o.count, o.collective
        ));
    }
    let machine = launch::machine(n)?;
    // Every rank would refuse such a count on its own, but the first to fail stops the
    // others: refused here, it is one error, whichever rank would have been first.
    for (d, total) in launch::device_memory(n)?.into_iter().enumerate() {
        if let Some(problem) = too_large(o, n, dtype_size(&o.dtype), &o.dtype, total, d) {
            return Err(format!("--count: {problem}"));
        }
    }
    if let launch::Machine::Simulated(why) = machine {
        println!(
            "no CUDA driver ({why}): running {n} rank{} on simulated devices, one process each \
             (mock driver and NCCL, data moved between the processes over loopback)",
            if n == 1 { "" } else { "s" }
        );
    }
    let args: Vec<String> = [
        "--count",
        &o.count.to_string(),
        "--dtype",
        &o.dtype,
        "--collective",
        &o.collective,
        "--timeout",
        &o.timeout.as_secs_f64().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    launch::processes(n, &args, o.timeout, launch::Output::Prefixed)
}
