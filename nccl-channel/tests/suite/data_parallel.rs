//! The `data_parallel` example, run as a user would: two ranks train a linear regression
//! (on simulated devices without a CUDA driver, where its kernels run as host twins; on
//! two GPUs otherwise). The output is checked: the loss falls, the weights are equal on
//! every rank, and the losses match the host's f64 reference.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::demo::{example_exe, run_example};

/// Runs the example with the arguments of `command_line` and returns its output, which
/// it prints; asserts that it succeeded.
fn data_parallel(command_line: &str) -> String {
    let exe = example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let args: Vec<&str> = command_line.split_whitespace().collect();
    let (ok, out, err) = run_example(exe, &args, &[]);
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
    let out =
        data_parallel("--nprocs 2 --features 24 --samples 96 --steps 40 --bucket 10 --log-every 5");
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

/// Both ranks take the unique id from a rendezvous authenticated by the secret file the
/// launcher made for the launch.
#[test]
fn two_ranks_rendezvous_under_a_secret_of_the_launch() {
    let out = data_parallel("--nprocs 2 --features 24 --samples 96 --steps 40 --log-every 20");
    let ranks: Vec<&str> = out.lines().filter(|l| l.contains("unique id: ")).collect();
    assert_eq!(ranks.len(), 2, "{out}");
    for line in ranks {
        assert!(line.contains(", authenticated by a secret"), "{line}");
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_train_and_agree() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let out = data_parallel("--nprocs 2");
    let (first, last, worst) = figures(&out);
    assert!(last < first * 1e-2, "{first} -> {last}");
    assert!(worst < 2e-2, "{worst}");
    assert!(out.contains("step time "), "{out}");
}

/// The lines of a run that must agree bit for bit between runs of the same training:
/// the logged and final losses, and the weights' fingerprint.
fn outcome(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.contains("  loss ") || l.contains("weights fnv1a "))
        .collect()
}

/// `--overlap` computes the gradient a bucket at a time and all-reduces each bucket on a
/// second stream: the same values, so on the simulated devices (whose kernels are exact
/// host twins) the losses and the weights are the same bits as without it.
#[test]
fn overlap_trains_to_the_same_bits() {
    let args = "--nprocs 2 --features 24 --samples 96 --steps 30 --bucket 7 --log-every 5";
    let plain = data_parallel(args);
    let overlapped = data_parallel(&format!("{args} --overlap"));
    let (a, b) = (outcome(&plain), outcome(&overlapped));
    // 6 logged losses, the final one, the fingerprint.
    assert_eq!(a.len(), 8, "{plain}");
    assert_eq!(a, b, "without --overlap:\n{plain}\nwith it:\n{overlapped}");
    // 25 floats of gradient in buckets of 7, 7, 7 and 4, all-reduced on the second stream.
    let want = "on a second stream, ";
    assert!(overlapped.contains(want), "{overlapped}");
    assert!(!plain.contains(want), "{plain}");
    assert!(
        overlapped.contains("in 4 buckets of <= 7 floats (25 floats of gradient)"),
        "{overlapped}"
    );
    let (first, last, worst) = figures(&overlapped);
    assert!(last < first * 1e-2, "{first} -> {last}");
    assert!(worst < 2e-2, "{worst}");
}

/// The bucket size that the all-reduces' order depends on changes nothing either: one
/// bucket of everything, and one float a bucket, give the same bits with --overlap.
#[test]
fn overlap_with_one_bucket_and_with_one_float_buckets() {
    let run = |bucket: &str| {
        data_parallel(&format!(
            "--nprocs 2 --features 5 --samples 40 --steps 12 --bucket {bucket} --log-every 4 \
             --overlap"
        ))
    };
    let (whole, single) = (run("100"), run("1"));
    assert!(
        whole.contains("in 1 buckets of <= 100 floats (6 floats of gradient)"),
        "{whole}"
    );
    assert!(
        single.contains("in 6 buckets of <= 1 floats (6 floats of gradient)"),
        "{single}"
    );
    assert_eq!(outcome(&whole), outcome(&single));
    assert_eq!(outcome(&whole).len(), 5, "{whole}");
}

/// `--overlap` is of the plain training loop; the elastic one is refused with it.
#[test]
fn overlap_is_refused_with_elastic() {
    let exe = example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let (ok, out, err) = run_example(exe, &["--nprocs", "2", "--overlap", "--elastic"], &[]);
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.starts_with("error: the argument '--overlap' cannot be used with '--elastic'"),
        "{err}"
    );
}

/// The data generator (data.rs) prints what `bench/ddp_data_expected.txt` holds: the
/// values `bench/test_ddp_data.py` checks the Python port (used by `bench/ddp_bench.py`,
/// the torch DDP side of the comparison) against. A change of the generator fails here:
/// then regenerate that file and make the port agree.
#[test]
fn the_shard_generator_is_unchanged() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/ddp_data_expected.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blocks: Vec<&str> = text
        .split("\n\n")
        .filter(|b| b.starts_with("shard of rank "))
        .collect();
    assert_eq!(blocks.len(), 4, "{text}");
    for block in blocks {
        // "shard of rank R: N samples of D features"
        let head: Vec<&str> = block.lines().next().unwrap().split(' ').collect();
        let (rank, n, d) = (head[3].trim_end_matches(':'), head[4], head[7]);
        let exe = example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
        let args = ["--print-shard", rank, "--samples", n, "--features", d];
        let (ok, out, err) = run_example(exe, &args, &[]);
        assert!(ok, "{args:?}: {out}\n{err}");
        assert_eq!(out.trim_end(), block.trim_end(), "{args:?}");
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn two_gpus_train_with_overlap() {
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let out = data_parallel("--nprocs 2 --overlap");
    let (first, last, worst) = figures(&out);
    assert!(last < first * 1e-2, "{first} -> {last}");
    assert!(worst < 2e-2, "{worst}");
    assert!(out.contains("on a second stream, "), "{out}");
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

/// The gradient lives in symmetric memory unless `--plain-memory`: the same training,
/// the same bits, and each run says where its gradient is.
#[test]
fn symmetric_and_plain_gradients_train_to_the_same_bits() {
    let args =
        "--nprocs 2 --features 24 --samples 96 --steps 12 --bucket 7 --log-every 4 --overlap";
    let symmetric = data_parallel(args);
    let plain = data_parallel(&format!("{args} --plain-memory"));
    assert!(
        symmetric.contains("gradient in symmetric memory (an NCCL window on every rank)"),
        "{symmetric}"
    );
    assert!(
        plain.contains("gradient in plain device memory (--plain-memory)"),
        "{plain}"
    );
    assert_eq!(outcome(&symmetric), outcome(&plain));
    assert_eq!(outcome(&plain).len(), 5, "{plain}");
}

/// Four ranks, the gradient in symmetric memory: the weights agree on every rank.
#[test]
fn four_ranks_train_with_a_symmetric_gradient() {
    let out = data_parallel("--nprocs 4 --features 16 --samples 32 --steps 20 --log-every 10");
    assert!(
        out.contains("gradient in symmetric memory (an NCCL window on every rank)"),
        "{out}"
    );
    assert!(out.contains("weights equal on all 4 ranks; loss "), "{out}");
}
