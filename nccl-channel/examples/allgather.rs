//! The all-gather demo: each rank holds `[101, 102]`, all-gathers it over the default
//! channel and prints `2x2xi32=[101 102][101 102]`.
//!
//! ```text
//! # Launcher: one rank per GPU (on a machine without a CUDA driver, on simulated devices)
//! allgather --nprocs 2
//! # One rank, configured by the environment (this crate's or IREE's variables)
//! NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=0 NCCL_COMM_ID=127.0.0.1:8000 allgather --device cuda://0 &
//! NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=1 NCCL_COMM_ID=127.0.0.1:8000 allgather --device cuda://1
//! ```
//! Options: `--count N` (elements per rank, default 2), `--dtype i32|f32|i8|ui8|ui32|i64|ui64|f64`,
//! `--collective all_gather|all_reduce|all_to_all|broadcast|reduce_scatter`,
//! `--timeout SECONDS` (launcher: how long ranks may take, default 120).

use std::fmt::Display;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_hal::{Cuda, DeviceBuffer, Stream, cuda_sys};
use nccl_channel::{ChannelBuilder, Communicator, NcclType, ReduceOp, UniqueId, World};

#[derive(Clone, Debug)]
struct Opts {
    nprocs: Option<usize>,
    device: Option<String>,
    count: usize,
    dtype: String,
    collective: String,
    timeout: Duration,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        nprocs: None,
        device: None,
        count: 2,
        dtype: "i32".into(),
        collective: "all_gather".into(),
        timeout: Duration::from_secs(120),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--nprocs" => {
                o.nprocs = Some(
                    value("--nprocs")?
                        .parse()
                        .map_err(|_| "--nprocs expects a number")?,
                )
            }
            "--device" => o.device = Some(value("--device")?),
            "--count" => {
                o.count = value("--count")?
                    .parse()
                    .map_err(|_| "--count expects a number")?
            }
            "--dtype" => o.dtype = value("--dtype")?,
            "--collective" => o.collective = value("--collective")?,
            "--timeout" => {
                let s: f64 = value("--timeout")?
                    .parse()
                    .map_err(|_| "--timeout expects seconds")?;
                o.timeout = Duration::from_secs_f64(s);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.nprocs == Some(0) {
        return Err("--nprocs must be at least 1".into());
    }
    if o.count == 0 {
        return Err("--count must be at least 1".into());
    }
    Ok(o)
}

const USAGE: &str = "usage: allgather [--nprocs N] [--device cuda://<index>|cuda://GPU-<uuid>] \
[--count N] [--dtype i32|f32|i8|ui8|ui32|i64|ui64|f64] \
[--collective all_gather|all_reduce|all_to_all|broadcast|reduce_scatter] [--timeout SECONDS]";

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("allgather: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let world = match World::from_env() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("allgather: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match (world, opts.nprocs) {
        (Some(world), _) => run_rank_from_env(world, &opts),
        (None, Some(n)) => launch(n, &opts),
        (None, None) => Err(
            "no world configured: pass --nprocs N, or set NCCL_CHANNEL_NPROCS/NCCL_CHANNEL_PROCID \
             (or IREE_CUDA_NCCL_NPROCS/IREE_CUDA_NCCL_PROCID) and NCCL_COMM_ID=host:port; \
             NCCL was not opened"
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

/// One rank, everything from the environment and `--device`.
fn run_rank_from_env(world: World, o: &Opts) -> Result<(), String> {
    let mut b = ChannelBuilder::new().world(world);
    if let Some(d) = &o.device {
        b = b.device(d.clone());
    }
    let ch = b.build().map_err(|e| e.to_string())?.ok_or("no world")?;
    let dev = ch.comm().context().device();
    println!(
        "rank {}/{} on GPU {} ({}), NCCL {}",
        ch.comm().rank(),
        ch.comm().size(),
        dev.ordinal(),
        dev.uuid().map_err(|e| e.to_string())?,
        ch.comm().nccl().version()
    );
    let line = run_collective(ch.comm(), ch.stream(), o)?;
    println!("{line}");
    ch.close().map_err(|e| e.to_string())
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
        other => return Err(format!("unknown --dtype {other:?}; {USAGE}")),
    };
    r.map_err(|e| e.to_string())
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
    let input: Vec<T> = (0..count).map(|i| T::from_i(101 + i as i64)).collect();
    let send = DeviceBuffer::from_slice(ctx, &input)?;
    let line = match o.collective.as_str() {
        "all_gather" => {
            let mut recv = DeviceBuffer::<T>::alloc(ctx, n * count)?;
            comm.all_gather(&send, &mut recv, s)?;
            s.synchronize()?;
            tensor(n, count, dtype, &recv.to_vec()?)
        }
        "all_reduce" => {
            let mut recv = DeviceBuffer::<T>::alloc(ctx, count)?;
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, s)?;
            s.synchronize()?;
            tensor(1, count, dtype, &recv.to_vec()?)
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
            tensor(1, count, dtype, &recv.to_vec()?)
        }
        "all_to_all" | "reduce_scatter" => {
            if count % n != 0 {
                return Err(nccl_channel::Error::InvalidArgument {
                    what: "allgather demo",
                    problem: format!(
                        "--count {count} must be a multiple of the {n} ranks for {}",
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
            let v = recv.to_vec()?;
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

/// The launcher: one process per GPU, or threads on simulated devices without a driver.
fn launch(n: usize, o: &Opts) -> Result<(), String> {
    let t = Instant::now();
    match Cuda::load() {
        Ok(cuda) => {
            let gpus = cuda.device_count().map_err(|e| e.to_string())?;
            if gpus < n {
                return Err(format!(
                    "--nprocs {n} needs {n} GPUs; this machine has {gpus}"
                ));
            }
            launch_processes(n, o, t)
        }
        Err(e) => {
            let why = match &e {
                cuda_hal::Error::Load(cuda_sys::LoadError::NotFound { attempts, .. }) => {
                    let first = attempts
                        .0
                        .first()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    format!("{} places tried, first {first}", attempts.0.len())
                }
                other => other.to_string(),
            };
            println!(
                "no CUDA driver ({why}): running {n} ranks on simulated devices (mock driver and NCCL, one thread per rank)"
            );
            launch_simulated(n, o, t)
        }
    }
}

fn launch_processes(n: usize, o: &Opts, t: Instant) -> Result<(), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for NCCL_COMM_ID: {e}"))?
        .port();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    println!("launching {n} ranks, one per GPU, NCCL_COMM_ID=127.0.0.1:{port}");
    let mut children: Vec<Child> = Vec::new();
    let mut printers = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--count",
            &o.count.to_string(),
            "--dtype",
            &o.dtype,
            "--collective",
            &o.collective,
        ])
        .env("NCCL_CHANNEL_NPROCS", n.to_string())
        .env("NCCL_CHANNEL_PROCID", r.to_string())
        .env("NCCL_CHANNEL_LOCAL_PROCID", r.to_string())
        .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("starting rank {r}: {e}"));
            }
        };
        if let Some(out) = child.stdout.take() {
            printers.push(std::thread::spawn(move || prefix(r, out, false)));
        }
        if let Some(err) = child.stderr.take() {
            printers.push(std::thread::spawn(move || prefix(r, err, true)));
        }
        children.push(child);
    }
    let deadline = t + o.timeout;
    let mut failed: Vec<String> = Vec::new();
    let mut done = vec![false; n];
    while done.iter().any(|d| !d) {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(st)) => {
                    done[r] = true;
                    if !st.success() {
                        failed.push(format!("rank {r} exited with {st}"));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[r] = true;
                    failed.push(format!("rank {r}: {e}"));
                }
            }
        }
        if !failed.is_empty() && done.iter().any(|d| !d) {
            // A failed rank leaves its peers waiting in NCCL: stop them.
            std::thread::sleep(Duration::from_millis(500));
            kill_all(&mut children);
            failed.push("the other ranks were stopped".into());
            break;
        }
        if Instant::now() > deadline {
            kill_all(&mut children);
            failed.push(format!(
                "ranks still running after {:?}; stopped",
                o.timeout
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in printers {
        let _ = p.join();
    }
    if failed.is_empty() {
        println!(
            "all {n} ranks succeeded in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn prefix(rank: usize, stream: impl std::io::Read, err: bool) {
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        if err {
            eprintln!("[rank {rank}] {line}");
        } else {
            println!("[rank {rank}] {line}");
        }
    }
}

/// No driver: the ranks run as threads on one simulated machine.
fn launch_simulated(n: usize, o: &Opts, t: Instant) -> Result<(), String> {
    use cuda_hal::mock::MockDriver;
    use nccl_sys::mock::MockNccl;
    let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(n)).map_err(|e| e.to_string())?;
    let (nccl, _world) = MockNccl::new(&gpus)
        .timeout(o.timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let nccl = Arc::new(nccl);
    let id = UniqueId::generate(&nccl).map_err(|e| e.to_string())?;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (cuda, nccl) = (cuda.clone(), nccl.clone());
                s.spawn(move || -> Result<(), String> {
                    let ch = ChannelBuilder::new()
                        .world(World::new(n, r).map_err(|e| e.to_string())?)
                        .device(format!("cuda://{r}"))
                        .unique_id(nccl_channel::IdSource::Given(id))
                        .cuda(cuda)
                        .nccl(nccl)
                        .build()
                        .map_err(|e| e.to_string())?
                        .ok_or("no world")?;
                    let dev = ch.comm().context().device();
                    let uuid = dev.uuid().map_err(|e| e.to_string())?;
                    let line = run_collective(ch.comm(), ch.stream(), o)?;
                    println!(
                        "[rank {r}] rank {r}/{n} on simulated GPU {} ({uuid})\n[rank {r}] {line}",
                        dev.ordinal()
                    );
                    ch.close().map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err("a rank panicked".into())))
            .collect()
    });
    let failed: Vec<String> = results
        .into_iter()
        .enumerate()
        .filter_map(|(r, x)| x.err().map(|e| format!("rank {r}: {e}")))
        .collect();
    if failed.is_empty() {
        println!(
            "all {n} ranks succeeded in {:.2} s (simulated)",
            t.elapsed().as_secs_f64()
        );
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}
