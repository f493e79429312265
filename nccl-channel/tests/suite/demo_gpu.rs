//! The all-gather demo on two GPUs (`#[ignore]`d; GPU machine): the launcher, and two
//! hand-started ranks configured by the environment, by index and by UUID, with this
//! crate's and IREE's variables. Every rank's printed result is checked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use crate::common::demo::{demo_exe, free_port, run_demo_on_gpus};
use test_support::env::scrubbed_for_gpu;

const RESULT: &str = "2x2xi32=[101 102][101 102]";

#[test]
#[ignore = "needs 2 GPUs"]
fn launcher_runs_one_rank_per_gpu() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let t = Instant::now();
    let (ok, out, err) = run_demo_on_gpus(&["--nprocs", "2"], &[]);
    println!(
        "{out}{err}(launcher, {:.2?} from start to result)",
        t.elapsed()
    );
    assert!(ok);
    assert!(out.starts_with("launching 2 ranks"), "{out}");
    for r in 0..2 {
        assert!(out.contains(&format!("[rank {r}] {RESULT}")), "{out}");
    }
}

/// Starts two ranks by hand with `vars(rank)` and `--device=device(rank)` (the form of
/// the scenario we reproduce); checks both.
fn two_hand_started(
    label: &str,
    vars: &dyn Fn(usize) -> Vec<(String, String)>,
    device: &dyn Fn(usize) -> String,
) {
    let port = free_port();
    let t = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|r| {
            let mut c = scrubbed_for_gpu(demo_exe());
            c.arg(format!("--device={}", device(r)))
                .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
                .env("NCCL_NVLS_ENABLE", "0")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            for (k, v) in vars(r) {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let took = t.elapsed();
    for (r, o) in outs.iter().enumerate() {
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        println!("{label}, rank {r} (--device={}):\n{out}{err}", device(r));
        assert!(o.status.success(), "rank {r} failed");
        assert!(out.lines().any(|l| l == RESULT), "rank {r}: {out}");
    }
    println!("{label}: {took:.2?} from start to result");
}

fn ours(r: usize) -> Vec<(String, String)> {
    vec![
        ("NCCL_CHANNEL_NPROCS".into(), "2".into()),
        ("NCCL_CHANNEL_PROCID".into(), r.to_string()),
    ]
}

fn iree(r: usize) -> Vec<(String, String)> {
    vec![
        ("IREE_CUDA_NCCL_NPROCS".into(), "2".into()),
        ("IREE_CUDA_NCCL_PROCID".into(), r.to_string()),
    ]
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_ranks_by_index_with_our_and_irees_variables() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    two_hand_started("NCCL_CHANNEL_* by index", &ours, &|r| format!("cuda://{r}"));
    two_hand_started("IREE_CUDA_NCCL_* by index", &iree, &|r| {
        format!("cuda://{r}")
    });
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_ranks_by_uuid() {
    let cuda = cuda_hal::Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    if !test_support::enough_gpus(cuda.device_count().unwrap(), 2) {
        return;
    }
    let uuids: Vec<String> = cuda
        .devices()
        .unwrap()
        .iter()
        .map(|d| d.uuid().unwrap().to_string())
        .collect();
    // Rank r on GPU 1 - r, named by UUID (upper case, as some tools print it).
    two_hand_started("IREE_CUDA_NCCL_* by UUID, swapped", &iree, &|r| {
        format!("cuda://{}", uuids[1 - r].to_uppercase())
    });
    two_hand_started("NCCL_CHANNEL_* by UUID", &ours, &|r| {
        format!("cuda://{}", uuids[r])
    });
}

/// `python3 -m torch.distributed.run` (torchrun) from `$NCCL_CHANNEL_TORCH_PYTHON`, else
/// torch's venv on the GPU machine, else `python3`.
fn torchrun() -> std::process::Command {
    let python = std::env::var_os("NCCL_CHANNEL_TORCH_PYTHON")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let venv = std::path::PathBuf::from("/opt/torch/.venv/bin/python3");
            venv.exists().then_some(venv)
        })
        .unwrap_or_else(|| "python3".into());
    let mut c = scrubbed_for_gpu(python);
    c.args(["-m", "torch.distributed.run"])
        .env("NCCL_NVLS_ENABLE", "0");
    c
}

/// Runs `cmd`, prints what it printed under `label`, and returns (success, stdout).
fn run_printed(label: &str, mut cmd: std::process::Command) -> (bool, String) {
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    println!("=== {label} ({:.2?}):\n{so}{se}", t.elapsed(),);
    (out.status.success(), so)
}

/// torchrun starts the demo as any binary (`--no-python`), with static and c10d
/// rendezvous: the ranks agree on the unique id through torchrun's store, with no variable
/// of ours.
#[test]
#[ignore = "needs 2 GPUs and torch"]
fn torchrun_runs_the_demo() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let port = free_port().to_string();
    let forms: [(&str, Vec<&str>); 2] = [
        (
            "torchrun static rendezvous",
            vec![
                "--nnodes",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
            ],
        ),
        (
            "torchrun --standalone (c10d rendezvous)",
            vec!["--standalone"],
        ),
    ];
    for (label, args) in forms {
        let mut c = torchrun();
        c.args(args)
            .args(["--nproc-per-node", "2", "--no-python"])
            .arg(demo_exe());
        let (ok, out) = run_printed(label, c);
        assert!(ok, "{label} failed");
        assert_eq!(
            out.lines().filter(|l| l.ends_with(RESULT)).count(),
            2,
            "{label}: {out}"
        );
        for r in 0..2 {
            assert!(
                out.contains(&format!("rank {r}/2 on GPU {r} (GPU-")),
                "{label}: {out}"
            );
        }
    }
}

/// The benchmark under torchrun: rank 0 prints the table, every size checked.
#[test]
#[ignore = "needs 2 GPUs and torch"]
fn torchrun_runs_the_bench() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let bench = crate::common::demo::bench_exe();
    let mut c = torchrun();
    c.args(["--standalone", "--nproc-per-node", "2", "--no-python"])
        .arg(bench)
        .args([
            "-c",
            "all_reduce,all_gather",
            "-b",
            "8",
            "-e",
            "8M",
            "-f",
            "8",
        ]);
    let (ok, out) = run_printed("torchrun bench", c);
    assert!(ok, "torchrun bench failed");
    assert!(
        out.contains("# nccl-channel bench, 2 ranks from torchrun"),
        "{out}"
    );
    // One row per size and collective: 8 B .. 8 MiB by 8 is 7 sizes (8 B to 2 MiB), two
    // collectives.
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with('#') && l.split_whitespace().count() > 8)
        .collect();
    assert_eq!(rows.len(), 14, "{out}");
}

/// Two "nodes" on one host: one torchrun per node (`--nnodes 2 --node-rank 0|1`), one GPU
/// each, NCCL kept off NVLink and shared memory so it goes through sockets as between
/// machines.
#[test]
#[ignore = "needs 2 GPUs and torch"]
fn torchrun_on_two_nodes_over_sockets() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let port = free_port().to_string();
    // NCCL's INFO lines go to files: on stdout they would interleave with the demo's.
    let logs = std::env::temp_dir().join(format!("nccl-channel-two-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    let nodes: Vec<_> = (0..2)
        .map(|node| {
            let mut c = torchrun();
            c.args([
                "--nnodes",
                "2",
                "--node-rank",
                &node.to_string(),
                "--nproc-per-node",
                "1",
            ])
            .args([
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
                "--no-python",
            ])
            .arg(demo_exe())
            .env("CUDA_VISIBLE_DEVICES", node.to_string())
            .env("NCCL_P2P_DISABLE", "1")
            .env("NCCL_SHM_DISABLE", "1")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
            .env("NCCL_DEBUG_FILE", logs.join(format!("node{node}.%p.log")))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for (node, child) in nodes.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        println!("=== node {node}:\n{so}");
        assert!(out.status.success(), "node {node} failed:\n{so}\n{se}");
        assert!(so.lines().any(|l| l == RESULT), "node {node}: {so}");
        assert!(
            so.lines()
                .any(|l| l.starts_with(&format!("rank {node}/2 on GPU 0 ("))
                    && l.contains("unique id: torchrun's TCPStore at 127.0.0.1:")),
            "node {node}: {so}"
        );
    }
    // Each node's NCCL says it went through sockets.
    let mut transports = Vec::new();
    for e in std::fs::read_dir(&logs).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("via NET/Socket"))
            .map(str::to_string);
        transports.push(line.unwrap_or_else(|| panic!("no NET/Socket channel in:\n{text}")));
    }
    println!("{}", transports.join("\n"));
    assert_eq!(transports.len(), 2);
    let _ = std::fs::remove_dir_all(&logs);
}
