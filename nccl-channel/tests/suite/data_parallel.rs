//! The `data_parallel` example, run as a user would: two ranks train a linear regression
//! (on simulated devices without a CUDA driver, where its kernels run as host twins; on
//! two GPUs otherwise). The output is checked: the loss falls, the weights are equal on
//! every rank, and the losses match the host's f64 reference.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::demo::{example_exe, run_example};

fn data_parallel(args: &[&str]) -> String {
    let exe = example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let (ok, out, err) = run_example(exe, args, &[]);
    println!("{out}{err}");
    assert!(ok, "data_parallel failed:\n{out}{err}");
    out
}

/// The numbers a run printed: (first logged loss, final loss, largest relative difference
/// from the host reference).
fn figures(out: &str) -> (f64, f64, f64) {
    let line = out
        .lines()
        .find(|l| l.contains("weights equal on all 2 ranks; loss "))
        .unwrap_or_else(|| panic!("no summary line:\n{out}"));
    let tail = line.split("; loss ").nth(1).unwrap();
    let mut it = tail.split(" -> ");
    let first: f64 = it.next().unwrap().parse().unwrap();
    let last: f64 = it
        .next()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let reference = out
        .lines()
        .find(|l| l.contains("host reference (f64)"))
        .unwrap_or_else(|| panic!("no reference line:\n{out}"));
    let worst: f64 = reference.rsplit(' ').next().unwrap().parse().unwrap();
    (first, last, worst)
}

#[test]
fn two_ranks_train_and_agree() {
    let out = data_parallel(&[
        "--nprocs",
        "2",
        "--features",
        "24",
        "--samples",
        "96",
        "--steps",
        "40",
        "--bucket",
        "10",
        "--log-every",
        "5",
    ]);
    let (first, last, worst) = figures(&out);
    assert!(last < first * 1e-2, "{first} -> {last}");
    assert!(worst < 2e-2, "{worst}");
    // Losses every 5 steps of 40, on rank 0 only.
    let logged = out
        .lines()
        .filter(|l| l.contains("step ") && l.contains("  loss "))
        .count();
    assert_eq!(logged, 8, "{out}");
    assert!(
        out.contains("in 3 buckets of <= 10 floats (25 floats of gradient)"),
        "{out}"
    );
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_train_and_agree() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let out = data_parallel(&["--nprocs", "2"]);
    let (first, last, worst) = figures(&out);
    assert!(last < first * 1e-2, "{first} -> {last}");
    assert!(worst < 2e-2, "{worst}");
    assert!(out.contains("step time "), "{out}");
}
