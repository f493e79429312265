//! The all-gather demo on two GPUs (`#[ignore]`d; GPU machine): the launcher, and two
//! hand-started ranks configured by the environment, by index and by UUID, with this
//! crate's and IREE's variables. Every rank's printed result is checked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Instant;

use common::demo::{demo_exe, run_demo};

const RESULT: &str = "2x2xi32=[101 102][101 102]";

#[test]
#[ignore = "needs 2 GPUs"]
fn launcher_runs_one_rank_per_gpu() {
    let t = Instant::now();
    let (ok, out, err) = run_demo(&["--nprocs", "2"], &[]);
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|r| {
            let mut c = std::process::Command::new(demo_exe());
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
    two_hand_started("NCCL_CHANNEL_* by index", &ours, &|r| format!("cuda://{r}"));
    two_hand_started("IREE_CUDA_NCCL_* by index", &iree, &|r| {
        format!("cuda://{r}")
    });
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_ranks_by_uuid() {
    let cuda = cuda_hal::Cuda::load().unwrap();
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
