//! The mixture-of-experts example (examples/moe_dispatch.rs) on a machine without a CUDA
//! driver: 2 and 4 ranks, one process each on simulated devices, each checking the tokens
//! it received and the combined results against the host's reference.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use crate::common::demo::{example_exe, run_example};

fn exe() -> PathBuf {
    example_exe("moe_dispatch", "NCCL_CHANNEL_MOE_DISPATCH")
}

/// Hides any real driver, so the example takes the simulated path on every machine.
fn no_driver() -> Vec<(&'static str, String)> {
    vec![("CUDA_SYS_LIBRARY", "/nonexistent/libcuda.so.1".into())]
}

/// The line of rank `rank` whose checks passed: its 6 tokens' experts, and the tokens it
/// sent to and received from each rank.
fn ok_line(rank: usize, experts: &str, sent: &str, received: &str) -> String {
    format!(
        "[rank {rank}] OK: 6 tokens to experts {experts}; sent {sent} and received {received} \
         tokens per rank; experts' results combined back match the host's"
    )
}

#[test]
fn dispatch_and_combine_on_2_and_4_simulated_ranks() {
    let oks = [
        vec![
            ok_line(0, "[0, 1, 0, 1, 0, 1]", "[6, 0]", "[6, 3]"),
            ok_line(1, "[0, 2, 2, 0, 0, 2]", "[3, 3]", "[0, 3]"),
        ],
        vec![
            ok_line(0, "[0, 1, 4, 1, 0, 1]", "[5, 0, 1, 0]", "[5, 1, 3, 2]"),
            ok_line(1, "[0, 6, 2, 4, 4, 2]", "[1, 2, 2, 1]", "[0, 2, 1, 0]"),
            ok_line(2, "[0, 7, 0, 3, 0, 7]", "[3, 1, 0, 2]", "[1, 2, 0, 2]"),
            ok_line(3, "[0, 4, 6, 6, 4, 0]", "[2, 0, 2, 2]", "[0, 1, 2, 2]"),
        ],
    ];
    for (n, want) in [2, 4].into_iter().zip(oks) {
        let (ok, out, err) = run_example(exe(), &["--nprocs", &n.to_string()], &no_driver());
        assert!(ok, "{n} ranks:\n{out}\n{err}");
        assert!(out.starts_with("no CUDA driver"), "{out}");
        for line in want {
            assert!(out.lines().any(|l| l == line), "want {line:?} in\n{out}");
        }
        assert_eq!(out.lines().filter(|l| l.contains("] OK: ")).count(), n);
    }
}

/// Other sizes: more tokens than ranks' experts, wider tokens, three experts a rank.
#[test]
fn other_sizes_check_out_too() {
    let args = [
        "--nprocs=3",
        "--tokens=40",
        "--hidden=5",
        "--experts-per-rank=3",
    ];
    let (ok, out, err) = run_example(exe(), &args, &no_driver());
    assert!(ok, "{out}\n{err}");
    for r in 0..3 {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("[rank {r}] OK: 40 tokens"))),
            "{out}"
        );
    }
}

#[test]
fn bad_sizes_and_no_world_fail_with_a_message() {
    for (args, needle) in [
        (
            &["--nprocs", "2", "--tokens", "0"][..],
            "invalid value '0' for '--tokens <N>'",
        ),
        (
            &["--nprocs", "2", "--tokens", "100000", "--hidden", "1000"][..],
            "--tokens 100000 × --hidden 1000 is more than the 16777216 elements a rank may \
             hold",
        ),
        (&[][..], "no world configured"),
    ] {
        let (ok, out, err) = run_example(exe(), args, &no_driver());
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
