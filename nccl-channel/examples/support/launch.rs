//! The examples' launcher, shared by `allgather`, `bench` and `data_parallel`.
//!
//! * [`rank_channel`]: one rank configured by its launcher's environment (ours, IREE's,
//!   torchrun, Slurm, Open MPI, PMI): the GPU it was given, or with no CUDA driver a
//!   simulated device whose NCCL reaches the other processes over loopback.
//! * [`processes`]: `--nprocs N`, the one-machine shortcut: starts this executable `N`
//!   times, one rank per GPU (or simulated device), as torchrun would.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_hal::{Cuda, cuda_sys};
use cuda_mock::{MockDriver, MockWorld};
use nccl_channel::{Channel, ChannelBuilder, CommConfig, IdSource, Rendezvous, World};
use nccl_mock::MockNccl;
use nccl_sys::NcclVersion;

/// An error and its sources, as one line (`outer: cause: root cause`): a library error
/// names what failed and keeps why (e.g. the operating system's error) as its source.
pub(crate) fn report(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(&format!(": {cause}"));
        next = cause.source();
    }
    text
}

/// `text` as a `T` when it is one or more ASCII decimal digits and nothing else: the
/// integer `FromStr` of Rust also takes a leading `+`, which the examples refuse (as the
/// library refuses it in the launcher's variables).
pub(crate) fn parse_decimal<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Where the ranks run.
pub(crate) enum Machine {
    /// A CUDA driver with at least the ranks' number of GPUs.
    Gpus,
    /// No CUDA driver: why, for the first line of output.
    Simulated(String),
}

/// Why the CUDA driver did not load, in one line.
fn no_driver_reason(e: &cuda_hal::Error) -> String {
    match e {
        cuda_hal::Error::Load(cuda_sys::LoadError::NotFound { attempts, .. }) => {
            match attempts.0.first() {
                Some(first) => format!("{} places tried, first {first}", attempts.0.len()),
                None => "no place to look for libcuda".to_string(),
            }
        }
        other => other.to_string(),
    }
}

/// The first 100 characters of `text`, with `…` if cut.
fn short(text: &str) -> String {
    match text.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Picks real GPUs when a driver loads (and refuses too few of them), else simulated ones.
pub(crate) fn machine(n: usize) -> Result<Machine, String> {
    match Cuda::load() {
        Ok(cuda) => {
            let gpus = cuda.device_count().map_err(|e| report(&e))?;
            if gpus < n {
                return Err(format!(
                    "--nprocs {n} needs {n} GPUs; this machine has {gpus}"
                ));
            }
            Ok(Machine::Gpus)
        }
        Err(e) => Ok(Machine::Simulated(no_driver_reason(&e))),
    }
}

/// The most simulated devices a rank's machine gets for a `--device` ordinal beyond its
/// world (a real node has a handful; the simulated ones are cheap, but not free).
const MAX_SIMULATED: usize = 64;

/// The refusal of `--nprocs` in a process its launcher already made a rank of a world.
pub(crate) fn nprocs_in_a_world(world: &World) -> String {
    format!(
        "--nprocs starts ranks itself, but this process is already rank {} of {} ({} \
         variables): leave --nprocs out, or unset the launcher's variables",
        world.rank, world.size, world.source
    )
}

/// How a rank configured by the environment is set up.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankSetup {
    /// `--device`: the GPU (else the local rank's).
    pub(crate) device: Option<String>,
    /// The communicator's configuration.
    pub(crate) config: Option<CommConfig>,
    /// How long a rank waits for the others: for the unique id from a launcher's
    /// rendezvous (unless `NCCL_CHANNEL_RENDEZVOUS_TIMEOUT` says), and without a driver in
    /// the simulated NCCL.
    pub(crate) timeout: Option<Duration>,
    /// Without a driver: the version the simulated NCCL reports.
    pub(crate) sim_version: Option<NcclVersion>,
    /// Without a driver: what the simulated driver gets besides its devices (kernels).
    pub(crate) sim_driver: Option<fn(MockDriver) -> MockDriver>,
}

/// One rank's channel and what it runs on.
pub(crate) struct RankChannel {
    pub(crate) channel: Channel,
    /// `rank R/N on GPU I (uuid), NCCL V`, or the simulated equivalent.
    pub(crate) line: String,
    /// The simulated driver (with no CUDA driver): its sanitizer's reports are checked
    /// by [`RankChannel::close`].
    sim: Option<MockWorld>,
}

impl RankChannel {
    /// Whether the rank runs on a simulated device.
    pub(crate) fn simulated(&self) -> bool {
        self.sim.is_some()
    }

    /// Closes the channel; on simulated devices, fails if the sanitizer saw an invalid access.
    pub(crate) fn close(self) -> Result<(), String> {
        self.channel.close().map_err(|e| report(&e))?;
        match self.sim {
            Some(gpus) if !gpus.violations().is_empty() => Err(format!(
                "the simulated driver's sanitizer reported:\n{}",
                gpus.violations().join("\n")
            )),
            _ => Ok(()),
        }
    }
}

/// One rank configured by its launcher's environment: on the GPU `--device` names (else the
/// local rank's); with no CUDA driver, on a simulated device of a simulated machine with a
/// device per rank, whose NCCL moves data between the processes over loopback. The unique
/// id comes as [`IdSource::Auto`] says (`NCCL_COMM_ID`, or the launcher's rendezvous).
pub(crate) fn rank_channel(world: World, setup: &RankSetup) -> Result<RankChannel, String> {
    let mut b = ChannelBuilder::new().world(world);
    if let Some(d) = &setup.device {
        b = b.device(d.clone());
    }
    if let Some(c) = &setup.config {
        b = b.config(c.clone());
    }
    let (mut b, sim) = match Cuda::load() {
        Ok(cuda) => (b.cuda(cuda), None),
        Err(e) => {
            // Enough devices for every rank of a one-node job and for the ordinal `--device`
            // names, up to a machine's worth: a larger ordinal then matches no device and
            // the selector's error lists the ones there are.
            let wanted = setup
                .device
                .as_deref()
                .and_then(|d| d.strip_prefix("cuda://"))
                .and_then(parse_decimal::<usize>)
                .map_or(0, |d| d.saturating_add(1));
            let n = world.size.max(world.default_device().saturating_add(1));
            let n = if wanted <= MAX_SIMULATED.max(n) {
                n.max(wanted)
            } else {
                n
            };
            let driver = MockDriver::with_devices(n);
            let driver = match setup.sim_driver {
                Some(f) => f(driver),
                None => driver,
            };
            let (cuda, gpus) = driver
                .build_with(Cuda::from_driver)
                .map_err(|e| report(&e))?;
            let mut nccl = MockNccl::new(&gpus).multi_process(true);
            if let Some(t) = setup.timeout {
                nccl = nccl.timeout(t);
            }
            if let Some(v) = setup.sim_version {
                nccl = nccl.version(v);
            }
            let (nccl, _) = nccl.build().map_err(|e| report(&e))?;
            (
                b.cuda(cuda).nccl(Arc::new(nccl)),
                // The launcher's first line says why; a rank started alone says it briefly.
                Some((
                    gpus,
                    match std::env::var_os("NCCL_CHANNEL_PROCID") {
                        Some(_) => String::new(),
                        None => format!(": {}", short(&no_driver_reason(&e))),
                    },
                )),
            )
        }
    };
    // The launcher's rendezvous, if that is how the id comes, waits as long as the rank may.
    let comm_id_set = std::env::var("NCCL_COMM_ID").is_ok_and(|v| !v.trim().is_empty());
    let rendezvous = match comm_id_set {
        true => None,
        false => Rendezvous::from_env(&world).map_err(|e| report(&e))?,
    };
    let rendezvous = rendezvous.map(|rdv| {
        match (
            std::env::var_os("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT"),
            setup.timeout,
        ) {
            (None, Some(t)) => rdv.timeout(t),
            _ => rdv,
        }
    });
    // One note for both phases (the id, then NCCL's init), worded for the rank's role.
    let waiting_for = match (&rendezvous, comm_id_set) {
        (Some(rdv), _) if world.rank == 0 => {
            format!("the other ranks (to take the unique id from {rdv}, then to join NCCL)")
        }
        (Some(rdv), _) => {
            format!("the unique id from {rdv}, or, once it came, for the other ranks to join NCCL")
        }
        (None, true) => "the other ranks to join NCCL (NCCL_COMM_ID)".to_string(),
        (None, false) => "the other ranks to join NCCL".to_string(),
    };
    if let Some(rdv) = rendezvous {
        b = b.unique_id(IdSource::Rendezvous(rdv));
    }
    let built = watched(world, &waiting_for, || b.build());
    let channel = built.map_err(|e| report(&e))?.ok_or("no world")?;
    let (comm, dev) = (channel.comm(), channel.comm().context().device());
    let uuid = dev.uuid().map_err(|e| report(&e))?;
    let (line, sim) = match sim {
        None => (
            format!(
                "rank {}/{} on GPU {} ({uuid}), NCCL {}, unique id: {}",
                comm.rank(),
                comm.size(),
                dev.ordinal(),
                comm.nccl().version(),
                channel.id_origin()
            ),
            None,
        ),
        Some((gpus, why)) => (
            format!(
                "rank {}/{} on simulated GPU {} ({uuid}), simulated NCCL {} across processes, \
                 unique id: {} (no CUDA driver{why})",
                comm.rank(),
                comm.size(),
                dev.ordinal(),
                comm.nccl().version(),
                channel.id_origin()
            ),
            Some(gpus),
        ),
    };
    Ok(RankChannel { channel, line, sim })
}

/// Runs `f`; if it takes more than a few seconds, says once on stderr what the rank waits
/// for (a rank whose peers or rank 0 never come would otherwise be silent until its deadline).
fn watched<T>(world: World, waiting_for: &str, f: impl FnOnce() -> T) -> T {
    let (done, rx) = std::sync::mpsc::channel::<()>();
    let note = format!(
        "rank {}/{}: still waiting for {waiting_for}",
        world.rank, world.size
    );
    let watcher = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(NOTE_AFTER) {
            eprintln!("{note}");
        }
    });
    let out = f();
    drop(done);
    let _ = watcher.join();
    out
}

/// When [`watched`] speaks up.
const NOTE_AFTER: Duration = Duration::from_secs(5);

/// How [`processes`] shows its ranks' output.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// Every line prefixed with `[rank R] `.
    Prefixed,
    /// Rank 0's lines as they are (a benchmark's table); the other ranks' standard output
    /// is dropped, their standard error shown prefixed with `[rank R] `.
    Rank0,
}

/// The one-machine launcher: starts this executable `n` times with `args`, rank `r`
/// configured by `NCCL_CHANNEL_NPROCS/PROCID/LOCAL_PROCID`, a rendezvous address
/// (`NCCL_CHANNEL_RENDEZVOUS`, where rank 0 serves the unique id) and a key of this launch
/// (`NCCL_CHANNEL_RENDEZVOUS_KEY`, so that ranks of another launch that find the same port
/// are told apart); stops every rank when one fails or `timeout` passes. The ranks take GPUs, or simulated devices without a
/// driver, as [`rank_channel`] says.
pub(crate) fn processes(
    n: usize,
    args: &[String],
    timeout: Duration,
    output: Output,
) -> Result<(), String> {
    let t = Instant::now();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for the rendezvous: {e}"))?
        .port();
    let exe = std::env::current_exe().map_err(|e| report(&e))?;
    let key = format!(
        "launch-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    if output == Output::Prefixed {
        let ranks = if n == 1 { "rank" } else { "ranks" };
        println!("launching {n} {ranks}, rendezvous at 127.0.0.1:{port}");
    }
    let mut children: Vec<Child> = Vec::new();
    let mut printers = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env("NCCL_CHANNEL_NPROCS", n.to_string())
            .env("NCCL_CHANNEL_PROCID", r.to_string())
            .env("NCCL_CHANNEL_LOCAL_PROCID", r.to_string())
            .env("NCCL_CHANNEL_RENDEZVOUS", format!("127.0.0.1:{port}"))
            .env("NCCL_CHANNEL_RENDEZVOUS_KEY", &key)
            .env_remove("NCCL_COMM_ID")
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
        let show = output == Output::Prefixed || r == 0;
        if let Some(out) = child.stdout.take() {
            printers.push(std::thread::spawn(move || {
                relay(r, out, false, show, output)
            }));
        }
        if let Some(err) = child.stderr.take() {
            printers.push(std::thread::spawn(move || {
                relay(r, err, true, true, output)
            }));
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
        if output == Output::Prefixed {
            let ranks = if n == 1 {
                "the rank"
            } else {
                &format!("all {n} ranks")
            };
            println!("{ranks} succeeded in {:.2} s", t.elapsed().as_secs_f64());
        }
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

/// Copies a rank's output to ours: prefixed with the rank, or (rank 0 only) as it is.
fn relay(rank: usize, stream: impl std::io::Read, err: bool, show: bool, output: Output) {
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        let line = match output {
            Output::Prefixed => format!("[rank {rank}] {line}"),
            Output::Rank0 if rank == 0 => line,
            Output::Rank0 => format!("[rank {rank}] {line}"),
        };
        match (err, show) {
            (true, _) => eprintln!("{line}"),
            (false, true) => println!("{line}"),
            (false, false) => {}
        }
    }
}
