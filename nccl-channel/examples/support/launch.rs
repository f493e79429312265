//! The examples' launcher: one process per GPU (each configured by the environment, as a
//! user would start it by hand), or, with no CUDA driver, one thread per rank on simulated
//! devices. Shared by the `allgather` and `data_parallel` examples.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_hal::mock::MockDriver;
use cuda_hal::{Cuda, cuda_sys};
use nccl_channel::{Channel, ChannelBuilder, IdSource, UniqueId, World};
use nccl_sys::mock::MockNccl;

/// Where the ranks run.
pub(crate) enum Machine {
    /// A CUDA driver with at least the ranks' number of GPUs.
    Gpus,
    /// No CUDA driver: why, for the first line of output.
    Simulated(String),
}

/// Picks real GPUs when a driver loads (and refuses too few of them), else simulated ones.
pub(crate) fn machine(n: usize) -> Result<Machine, String> {
    match Cuda::load() {
        Ok(cuda) => {
            let gpus = cuda.device_count().map_err(|e| e.to_string())?;
            if gpus < n {
                return Err(format!(
                    "--nprocs {n} needs {n} GPUs; this machine has {gpus}"
                ));
            }
            Ok(Machine::Gpus)
        }
        Err(e) => Ok(Machine::Simulated(match &e {
            cuda_hal::Error::Load(cuda_sys::LoadError::NotFound { attempts, .. }) => {
                let first = attempts
                    .0
                    .first()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                format!("{} places tried, first {first}", attempts.0.len())
            }
            other => other.to_string(),
        })),
    }
}

/// One rank configured by the environment (and `--device`), announced with its GPU and
/// the NCCL it loaded.
pub(crate) fn rank_channel(world: World, device: Option<&str>) -> Result<Channel, String> {
    let mut b = ChannelBuilder::new().world(world);
    if let Some(d) = device {
        b = b.device(d.to_string());
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
    Ok(ch)
}

/// Starts this executable `n` times with `args`, rank `r` configured by
/// `NCCL_CHANNEL_NPROCS/PROCID/LOCAL_PROCID` and a shared `NCCL_COMM_ID`; prefixes their
/// output with the rank; stops every rank when one fails or `timeout` passes.
pub(crate) fn processes(n: usize, args: &[String], timeout: Duration) -> Result<(), String> {
    let t = Instant::now();
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
        cmd.args(args)
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
    let deadline = t + timeout;
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
            failed.push(format!("ranks still running after {timeout:?}; stopped"));
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

/// Runs `rank(r, channel)` for `n` ranks, one thread each, on a simulated machine of `n`
/// devices built from `driver` (with the mock NCCL); rank `r` on device `r`.
pub(crate) fn simulated(
    n: usize,
    driver: MockDriver,
    timeout: Duration,
    rank: impl Fn(usize, Channel) -> Result<(), String> + Sync,
) -> Result<(), String> {
    let t = Instant::now();
    let (cuda, gpus) = Cuda::mock(driver).map_err(|e| e.to_string())?;
    let (nccl, _world) = MockNccl::new(&gpus)
        .timeout(timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let nccl = Arc::new(nccl);
    let id = UniqueId::generate(&nccl).map_err(|e| e.to_string())?;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (cuda, nccl, rank) = (cuda.clone(), nccl.clone(), &rank);
                s.spawn(move || -> Result<(), String> {
                    let ch = ChannelBuilder::new()
                        .world(World::new(n, r).map_err(|e| e.to_string())?)
                        .device(format!("cuda://{r}"))
                        .unique_id(IdSource::Given(id))
                        .cuda(cuda)
                        .nccl(nccl)
                        .build()
                        .map_err(|e| e.to_string())?
                        .ok_or("no world")?;
                    rank(r, ch)
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
    let violations = gpus.violations();
    if !violations.is_empty() {
        return Err(format!(
            "the simulated driver's sanitizer reported:\n{}",
            violations.join("\n")
        ));
    }
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
