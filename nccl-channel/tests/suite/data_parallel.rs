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

/// Sizes from the command line that do not fit are errors naming the options, the bytes
/// and the limit, before anything is allocated (they were allocation failures that
/// aborted the rank, or a capacity overflow that panicked it).
#[test]
fn sizes_beyond_the_limits_are_errors_naming_them() {
    let exe = || example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let no_driver = [("CUDA_SYS_LIBRARY", "/nonexistent/libcuda.so.1".to_string())];
    let (ok, out, err) = run_example(
        exe(),
        &[
            "--nprocs",
            "1",
            "--samples",
            "16777216",
            "--features",
            "1048576",
        ],
        &no_driver,
    );
    assert!(!ok, "{out}\n{err}");
    let want = "[rank 0] data_parallel: --samples and --features: 16777216 samples of 1048576 \
                features need 70368895172628 bytes of device memory per rank, more than the \
                17179869184 bytes of device 0";
    assert!(err.lines().any(|l| l == want), "want {want:?} in\n{err}");
    let (ok, out, err) = run_example(
        exe(),
        &["--nprocs", "1", "--steps", "18446744073709551615"],
        &no_driver,
    );
    assert!(!ok, "{out}\n{err}");
    assert_eq!(
        err.lines().next(),
        Some(
            "error: invalid value '18446744073709551615' for '--steps <STEPS>': \
             18446744073709551615 steps are more than the 1000000 this example keeps timing \
             events for"
        ),
        "{err}"
    );
}
