//! Separately started ranks of the demo on a machine without a CUDA driver: every process
//! runs on a simulated device and the simulated NCCL moves the data between them over
//! loopback. The ranks are configured as each launcher configures them (the scenario's two
//! command lines verbatim, torchrun, Slurm, Open MPI, PMI) and find each other with no
//! variable of ours.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::demo::{bench_exe, demo_exe, example_exe, free_port};
use crate::common::tcpstore::TestStore;
use test_support::env::scrubbed;

const RESULT: &str = "2x2xi32=[101 102][101 102]";

/// The demo as a new process with `env` (on top of a scrubbed environment, see
/// `crate::common::env`, and no CUDA driver) and `args`.
fn demo(env: &[(String, String)], args: &[String]) -> Command {
    example(demo_exe(), env, args)
}

/// As [`demo`], for any example.
fn example(exe: std::path::PathBuf, env: &[(String, String)], args: &[String]) -> Command {
    let mut c = scrubbed(exe);
    c.args(args)
        .env("CUDA_SYS_LIBRARY", "/nonexistent/libcuda.so.1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// One process to start: its environment and its arguments.
type RankStart = (Vec<(String, String)>, Vec<String>);

/// Starts one process per entry of `ranks` (its environment and arguments) at once and
/// waits for all; a process still running after a minute is killed (a hang fails).
fn run_all(ranks: Vec<RankStart>) -> Vec<Output> {
    let children: Vec<_> = ranks
        .iter()
        .map(|(env, args)| demo(env, args).spawn().unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            c.wait_with_output().unwrap()
        })
        .collect()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Checks that every rank succeeded, says on its first line that it is simulated, and
/// printed `want` as its result.
fn assert_ranks(label: &str, outs: &[Output], want: &str) {
    let n = outs.len();
    for (r, o) in outs.iter().enumerate() {
        let (out, err) = text(o);
        assert!(o.status.success(), "{label}, rank {r}: {out}\n{err}");
        let first = out.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("rank {r}/{n} on simulated GPU "))
                && first.contains("across processes"),
            "{label}, rank {r}: {first}"
        );
        assert_eq!(out.lines().nth(1), Some(want), "{label}, rank {r}: {out}");
    }
}

fn vars(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// The scenario's two command lines, verbatim but for the port, on a machine without a
/// GPU: each process on its own simulated device, by index and by UUID.
#[test]
fn the_two_command_lines_verbatim_on_simulated_devices() {
    let port = free_port();
    let line = |r: usize, device: String| {
        (
            vars(&[
                ("IREE_CUDA_NCCL_NPROCS", "2".into()),
                ("NCCL_COMM_ID", format!("127.0.0.1:{port}")),
                ("IREE_CUDA_NCCL_PROCID", r.to_string()),
            ]),
            vec![format!("--device={device}")],
        )
    };
    let outs = run_all(vec![line(0, "cuda://0".into()), line(1, "cuda://1".into())]);
    assert_ranks("by index", &outs, RESULT);
    for (r, o) in outs.iter().enumerate() {
        let (out, _) = text(o);
        assert!(
            out.starts_with(&format!("rank {r}/2 on simulated GPU {r} (GPU-")),
            "{out}"
        );
    }
    // The simulated machine's UUIDs, as the ranks printed them; swapped, in upper case.
    let uuid = |o: &Output| {
        let (out, _) = text(o);
        let first = out.lines().next().unwrap().to_string();
        let start = first.find("(GPU-").unwrap() + 1;
        let end = first[start..].find(')').unwrap() + start;
        first[start..end].to_string()
    };
    let uuids = [uuid(&outs[0]), uuid(&outs[1])];
    assert_ne!(uuids[0], uuids[1]);
    let port = free_port();
    let line = |r: usize, device: String| {
        (
            vars(&[
                ("IREE_CUDA_NCCL_NPROCS", "2".into()),
                ("NCCL_COMM_ID", format!("127.0.0.1:{port}")),
                ("IREE_CUDA_NCCL_PROCID", r.to_string()),
            ]),
            vec![format!("--device=cuda://{device}")],
        )
    };
    let outs = run_all(vec![
        line(0, uuids[1].to_uppercase()),
        line(1, uuids[0].to_uppercase()),
    ]);
    assert_ranks("by UUID", &outs, RESULT);
    for (r, o) in outs.iter().enumerate() {
        let (out, _) = text(o);
        assert!(
            out.starts_with(&format!("rank {r}/2 on simulated GPU {} (", 1 - r)),
            "{out}"
        );
    }
}

/// Three ranks per launcher, each configured only by that launcher's own variables; each
/// says its id came through `origin`.
fn three_ranks(label: &str, origin: &str, env: impl Fn(usize) -> Vec<(String, String)>) {
    let args = vec!["--collective=all_reduce".to_string(), "--count=3".into()];
    let outs = run_all((0..3).map(|r| (env(r), args.clone())).collect());
    assert_ranks(label, &outs, "3xi32=[303 306 309]");
    for o in &outs {
        let (out, _) = text(o);
        let first = out.lines().next().unwrap_or_default();
        assert!(
            first.contains(&format!("unique id: {origin}")),
            "{label}: {first}"
        );
    }
}

/// A job id that no other test run shares (it picks the derived port).
fn job_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (u64::from(std::process::id()) * 1000 + u64::from(t.subsec_millis())).to_string()
}

#[test]
fn three_ranks_under_torchrun_without_an_agent_store() {
    let port = free_port();
    let origin =
        format!("rank 0's rendezvous at 127.0.0.1:{port} (derived from MASTER_ADDR, MASTER_PORT)");
    three_ranks("torchrun", &origin, |r| {
        vars(&[
            ("WORLD_SIZE", "3".into()),
            ("RANK", r.to_string()),
            ("LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("TORCHELASTIC_USE_AGENT_STORE", "False".into()),
            ("TORCHELASTIC_RUN_ID", "none".into()),
        ])
    });
}

/// torchrun's usual setup: its agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT (here a
/// test-side server speaking torch's protocol) and rank 0's id goes through it.
#[test]
fn three_ranks_under_torchrun_through_its_agent_store() {
    let store = TestStore::start();
    let port = store.port;
    let origin = format!(
        "torchrun's TCPStore at 127.0.0.1:{port} (derived from MASTER_ADDR, MASTER_PORT, \
         TORCHELASTIC_USE_AGENT_STORE), key torchrun-demo-attempt_0"
    );
    three_ranks("torchrun agent store", &origin, |r| {
        vars(&[
            ("WORLD_SIZE", "3".into()),
            ("RANK", r.to_string()),
            ("LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
            ("TORCHELASTIC_RUN_ID", "demo".into()),
            ("TORCHELASTIC_RESTART_COUNT", "0".into()),
        ])
    });
    // The id went through the store, and rank 0 removed it and the acks once every rank
    // took it (a later program under the same attempt must not read it).
    let key = "/nccl-channel/torchrun-demo-attempt_0#0";
    let log = store.log();
    assert!(log.contains(&format!("SET {key}")), "{log:?}");
    assert_eq!(
        log.iter().filter(|q| *q == &format!("GET {key}")).count(),
        2,
        "{log:?}"
    );
    assert!(log.contains(&format!("DELETE {key}/ack/2")), "{log:?}");
    assert_eq!(store.keys(), Vec::<String>::new());
}

#[test]
fn three_ranks_under_slurm() {
    let job = job_id();
    let origin = format!(
        "rank 0's rendezvous at localhost:{} (derived from SLURM_STEP_NODELIST, SLURM_JOB_ID, \
         SLURM_STEP_ID)",
        20000 + (16 * job.parse::<u64>().unwrap()) % 12000
    );
    three_ranks("Slurm", &origin, |r| {
        vars(&[
            ("SLURM_NTASKS", "3".into()),
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_JOB_ID", job.clone()),
            ("SLURM_STEP_ID", "0".into()),
            ("SLURM_JOB_NODELIST", "localhost".into()),
            ("SLURM_STEP_NODELIST", "localhost".into()),
        ])
    });
}

#[test]
fn three_ranks_under_open_mpi() {
    let job = job_id();
    let origin = format!(
        "rank 0's rendezvous at 127.0.0.1:{} (derived from",
        20000 + job.parse::<u64>().unwrap() % 12000
    );
    three_ranks("Open MPI", &origin, |r| {
        vars(&[
            ("OMPI_COMM_WORLD_SIZE", "3".into()),
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3".into()),
            ("OMPI_MCA_ess_base_jobid", job.clone()),
        ])
    });
}

/// Rank 0 never starts: the others give up at the deadline with an error that names the
/// address they tried and where it came from.
#[test]
fn rank_0_absent_times_out_naming_the_address() {
    let job = job_id();
    let t = Instant::now();
    let outs = run_all(
        (1..3)
            .map(|r| {
                (
                    vars(&[
                        ("SLURM_NTASKS", "3".into()),
                        ("SLURM_PROCID", r.to_string()),
                        ("SLURM_JOB_ID", job.clone()),
                        ("SLURM_STEP_ID", "0".into()),
                        ("SLURM_JOB_NODELIST", "localhost".into()),
                        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "2".into()),
                    ]),
                    vec![],
                )
            })
            .collect(),
    );
    let took = t.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}");
    for o in &outs {
        let (out, err) = text(o);
        assert!(!o.status.success(), "{out}");
        assert!(err.contains("localhost:"), "{err}");
        assert!(err.contains("SLURM_JOB_NODELIST"), "{err}");
    }
}

/// The benchmark's `--nprocs` goes through the same launcher: one process per simulated
/// device, rank 0 prints the header and one checked row per size.
#[test]
fn the_bench_launches_processes_on_simulated_devices() {
    let bench = bench_exe();
    let args: Vec<String> = [
        "--nprocs",
        "2",
        "-c",
        "all_gather,all_reduce",
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "8",
        "-n",
        "1",
        "-w",
        "0",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let out = example(bench, &[], &args).output().unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    let lines: Vec<&str> = so.lines().collect();
    assert!(lines[0].starts_with("# no CUDA driver ("), "{so}");
    assert!(
        lines[0].ends_with("2 processes on simulated devices"),
        "{so}"
    );
    assert!(
        lines[1].starts_with("# nccl-channel bench, 2 ranks from nccl-channel; simulated devices"),
        "{so}"
    );
    assert!(
        lines[2].starts_with("# rank 0/2 on simulated GPU 0 (GPU-"),
        "{so}"
    );
    // 8 and 64 bytes, two collectives: four rows, none with a wrong element.
    let rows: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 4, "{so}");
    for row in rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        assert!(f[0] == "8" || f[0] == "64", "{row}");
        assert_eq!(f[8], "0", "wrong elements out of place: {row}");
        assert_eq!(f[12], "0", "wrong elements in place: {row}");
    }
    assert!(!so.contains("[rank 1]"), "only rank 0 prints: {so}");
}

/// `--timeout` bounds the wait for rank 0's rendezvous too, and a rank that waits says so
/// on stderr after a few seconds (it would otherwise be silent until its deadline).
#[test]
fn a_waiting_rank_says_what_it_waits_for_and_gives_up_at_its_timeout() {
    let port = free_port();
    let t = Instant::now();
    let outs = run_all(vec![(
        vars(&[
            ("WORLD_SIZE", "2".into()),
            ("RANK", "1".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ]),
        vec!["--timeout=6".into()],
    )]);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(20),
        "{took:?}"
    );
    let (out, err) = text(&outs[0]);
    assert!(!outs[0].status.success(), "{out}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "rank 1/2: still waiting for the unique id from rank 0's rendezvous at \
                 127.0.0.1:{port} (derived from MASTER_ADDR, MASTER_PORT), key nccl-channel, \
                 timeout 6s, or, once it came, for the other ranks to join NCCL"
            ),
            format!(
                "allgather: rank 0's rendezvous at 127.0.0.1:{port} (derived from MASTER_ADDR, \
                 MASTER_PORT) did not answer within 6s (last attempt: Connection refused (os \
                 error 111))"
            ),
        ],
        "{err}"
    );
}

/// `--device` beyond the simulated machine is refused with the list of its devices (it
/// once sized the machine after the ordinal: memory without bound), and `--nprocs` in a
/// process a launcher already made a rank is refused rather than ignored.
#[test]
fn a_device_beyond_the_machine_and_nprocs_inside_a_world_are_refused() {
    let one = vars(&[
        ("NCCL_CHANNEL_NPROCS", "1".into()),
        ("NCCL_CHANNEL_PROCID", "0".into()),
    ]);
    let outs = run_all(vec![(
        one.clone(),
        vec!["--device=cuda://2147483648".into()],
    )]);
    let (out, err) = text(&outs[0]);
    assert!(!outs[0].status.success(), "{out}");
    assert!(
        err.starts_with("allgather: no CUDA device matches cuda://2147483648; the devices are:\n  GPU 0: Mock GPU 0 (UUID: GPU-"),
        "{err}"
    );
    // Within a machine's worth of devices, an ordinal past the world is simulated.
    let outs = run_all(vec![(one.clone(), vec!["--device=cuda://7".into()])]);
    let (out, _) = text(&outs[0]);
    assert!(out.starts_with("rank 0/1 on simulated GPU 7 ("), "{out}");
    let outs = run_all(vec![(one, vec!["--nprocs=2".into()])]);
    let (_, err) = text(&outs[0]);
    assert!(!outs[0].status.success());
    assert_eq!(
        err.trim(),
        "allgather: --nprocs starts ranks itself, but this process is already rank 0 of 1 \
         (nccl-channel variables): leave --nprocs out, or unset the launcher's variables"
    );
}

/// One rank: nccl-tests' bus factor of all-reduce is 0 there; the algorithm bandwidth is
/// still bytes over time (it was busbw / 0 = NaN).
#[test]
fn the_bench_on_one_rank_prints_numbers() {
    let bench = bench_exe();
    let env = vars(&[
        ("NCCL_CHANNEL_NPROCS", "1".into()),
        ("NCCL_CHANNEL_PROCID", "0".into()),
    ]);
    let args: Vec<String> = ["-b", "8", "-e", "64", "-f", "8", "-n", "1", "-w", "0"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let out = example(bench, &env, &args).output().unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    let rows: Vec<&str> = so.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "{so}");
    for row in rows {
        assert!(!row.contains("NaN"), "{row}");
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((f[6], f[7]), ("0.00", "0.00"), "{row}");
    }
}

/// An `-e` beyond the device's memory is an error naming the flag, the bytes it needs and
/// the device's, before anything is allocated.
#[test]
fn the_bench_refuses_a_largest_size_beyond_the_device_memory() {
    let (ok, out, err) = crate::common::demo::run_example(
        bench_exe(),
        &["--threads", "1", "-b", "1000G", "-e", "1000G"],
        &[("CUDA_SYS_LIBRARY", "/nonexistent/libcuda.so.1".into())],
    );
    assert!(!ok, "{out}\n{err}");
    assert_eq!(
        err.trim(),
        "bench: -e: 1073741824000 bytes need 2147483648000 bytes of device memory per rank (1 \
         memory mode of -R, each 268435456000 elements of float to send and 268435456000 to \
         receive), more than the 17179869184 bytes of device 0"
    );
}

/// A program a test starts (found when the case runs), its arguments, what it must say.
type Refusal = (
    fn() -> std::path::PathBuf,
    &'static [&'static str],
    &'static str,
);

/// Bad numbers are refused by the command line (exit 2), not launched or panicked on.
#[test]
fn bench_and_data_parallel_refuse_bad_numbers() {
    let data_parallel = || example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let cases: [Refusal; 5] = [
        (
            bench_exe,
            &["--nprocs", "0"],
            "invalid value '0' for '--nprocs <NPROCS>': must be at least 1",
        ),
        // A sign is not a digit (Rust's integer parser alone takes `+2`).
        (
            bench_exe,
            &["--nprocs=+2"],
            "invalid value '+2' for '--nprocs <NPROCS>': expects a number, not \"+2\"",
        ),
        (
            bench_exe,
            &["-b", "+8"],
            "invalid value '+8' for '-b <MIN>': bad size \"+8\" (a positive number of bytes, \
             suffix K, M or G)",
        ),
        (
            data_parallel,
            &["--timeout=-1"],
            "invalid value '-1' for '--timeout <TIMEOUT>': \"-1\" is not a positive number of seconds",
        ),
        (
            data_parallel,
            &["--timeout=NaN"],
            "\"NaN\" is not a positive number of seconds",
        ),
    ];
    for (exe, args, want) in cases {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let exe = exe();
        let out = example(exe.clone(), &[], &args).output().unwrap();
        let (_, err) = text(&out);
        let name = exe.display();
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
        assert!(err.contains(want), "{name} {args:?}: {err}");
    }
}
