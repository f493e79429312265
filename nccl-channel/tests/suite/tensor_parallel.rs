//! The tensor_parallel example (cudarc's memory, this crate's collectives) on the drop-in
//! simulator: cudarc opens libcuda itself, so without a GPU it runs only there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use crate::common::demo::{example_exe, run_example};

fn exe() -> std::path::PathBuf {
    example_exe("tensor_parallel", "NCCL_CHANNEL_TENSOR_PARALLEL")
}

#[test]
fn tensor_parallel_on_cudarc_memory_matches_the_host_on_the_dropin() {
    let dir = test_support::dropin::dir(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let args = [
        "--nprocs",
        "2",
        "--batch",
        "16",
        "--features",
        "256",
        "--hidden",
        "64",
        "--out",
        "128",
    ];
    for (extra, memory) in [
        (None, "activations in symmetric memory"),
        (Some("--cudarc-activations"), ""),
    ] {
        let args: Vec<&str> = args.iter().copied().chain(extra).collect();
        let (ok, out, err) = run_example(
            exe(),
            &args,
            &[("LD_LIBRARY_PATH", dir.display().to_string())],
        );
        assert!(ok, "{out}\n{err}");
        assert!(
            out.starts_with(
                "the driver is the drop-in simulator: 2 ranks on simulated GPUs, the kernel run \
                 by its host twin\n"
            ),
            "{out}"
        );
        for r in 0..2 {
            let line = format!(
                "[rank {r}] rank {r}/2: Z = (X W) V, 16x128, matches the host reference \
                 (largest error "
            );
            assert!(out.contains(&line), "{out}");
            let said = out.contains(&format!("[rank {r}] rank {r}: {memory}\n"));
            assert_eq!(said, !memory.is_empty(), "{out}");
        }
    }
}

#[test]
fn without_a_driver_it_says_where_to_run_it() {
    let (ok, out, err) = run_example(exe(), &["--nprocs", "2"], &[]);
    assert!(!ok, "{out}");
    assert!(
        err.starts_with("tensor_parallel: no CUDA driver (")
            && err.contains(
                "; cudarc opens libcuda itself, so without a GPU run this on the drop-in \
                 simulator: LD_LIBRARY_PATH=$(cargo xtask dropin)"
            ),
        "{err}"
    );
}

#[test]
fn ranks_that_do_not_divide_the_features_are_refused() {
    let dir = test_support::dropin::dir(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let (ok, out, err) = run_example(
        exe(),
        &["--nprocs", "2", "--features", "255"],
        &[("LD_LIBRARY_PATH", dir.display().to_string())],
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains("--features 255 and --out 256 must both be multiples of the 2 ranks"),
        "{err}"
    );
}
