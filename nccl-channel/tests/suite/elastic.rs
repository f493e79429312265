//! Elastic training (`data_parallel --elastic`), run as a user would, on simulated devices
//! without a CUDA driver: three ranks train; rank 1 kills itself (SIGKILL) as step 10
//! starts; the survivors' all-reduce fails within their deadline, they shrink to two and
//! train on; the launcher starts a replacement, which the survivors grow back in at step
//! 15 (it gets the weights and the step by broadcast); the final loss matches the
//! uninterrupted run's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use crate::common::demo::{example_exe, run_example};

/// Three ranks, elastic, training the example's small problem.
const SIZES: &str = "--nprocs 3 --elastic --features 24 --samples 96 --steps 40 --log-every 5 --deadline 5 \
     --timeout 60";

/// Runs the example with [`SIZES`] and the arguments of `extra`; (whether it succeeded,
/// its output, its errors), which it prints.
fn data_parallel(extra: &str) -> (bool, String, String) {
    let exe = example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let args: Vec<&str> = SIZES
        .split_whitespace()
        .chain(extra.split_whitespace())
        .collect();
    let (ok, out, err) = run_example(exe, &args, &[]);
    println!("{out}{err}");
    (ok, out, err)
}

/// The number after `before` on the line of `out` that contains `marker`.
fn figure(out: &str, marker: &str, before: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?}:\n{out}"));
    let tail = line
        .split(before)
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    let num: String = tail
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | '-' | '+'))
        .collect();
    num.parse()
        .unwrap_or_else(|e| panic!("{num:?} in {line:?}: {e}"))
}

/// (final loss, host reference's, relative difference) of a run.
fn final_loss(out: &str) -> (f64, f64, f64) {
    let marker = "[rank 0] final loss ";
    (
        figure(out, marker, "final loss"),
        figure(out, marker, "same data and steps)"),
        figure(out, marker, "relative difference"),
    )
}

#[test]
fn a_killed_rank_is_shrunk_away_and_its_replacement_grown_back_in() {
    let (ok, reference, err) = data_parallel("");
    assert!(ok, "the uninterrupted run failed:\n{reference}{err}");
    let (uninterrupted, _, _) = final_loss(&reference);

    let t = Instant::now();
    let (ok, out, err) = data_parallel("--kill-rank 1 --kill-at 10 --rejoin-after 5");
    let took = t.elapsed();
    assert!(ok, "the elastic run failed:\n{out}{err}");
    let has = |line: &str| assert!(out.lines().any(|l| l == line), "want {line:?} in\n{out}");
    // The kill, and the launcher seeing it.
    has("[rank 1] rank 1: killing itself at step 10 (SIGKILL)");
    assert!(
        out.contains(
            "[launcher] rank 1 is gone (signal: 9 (SIGKILL)); starting its replacement, rank 2 \
             of 3 once it joins, on its device"
        ),
        "{out}"
    );
    // Both survivors detect it within their deadline (5 s), in step 10.
    for r in [0, 2] {
        let marker = format!("[rank {r}] rank {r}: lost a peer at step 10, ");
        let after = figure(&out, &marker, "at step 10,");
        assert!(after < 5.0, "rank {r} detected it after {after} s:\n{out}");
        assert!(out.contains(&format!("{marker}{after:.3} s into it (deadline 5 s): ")));
    }
    // The shrink from 3 to 2: old rank 2 is rank 1 now; the survivors train on at 2 ranks.
    assert!(
        out.lines()
            .any(|l| l.starts_with("[rank 0] shrunk from 3 to 2 ranks in ")
                && l.ends_with(
                    " s (rank 1 excluded); training goes on with the shards re-assigned"
                )),
        "{out}"
    );
    has("[rank 0] rank 0 is rank 0 of 2 now");
    has("[rank 2] rank 2 is rank 1 of 2 now");
    assert!(out.contains("[rank 0] step    10  loss "), "{out}");
    assert!(out.contains("(2 ranks)"), "{out}");
    // The grow back to 3, at step 15: the replacement joins as rank 2 with step 15.
    has(
        "[replacement] replacement: joined as rank 2 of 3; weights and step 15 received from rank 0",
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("[rank 0] grew from 2 to 3 ranks in ")
                && l.ends_with(
                    " s at step 15: the replacement joined as rank 2; weights and step broadcast \
                 from rank 0, shards re-assigned"
                )),
        "{out}"
    );
    let starts = |p: &str| {
        assert!(
            out.lines().any(|l| l.starts_with(p)),
            "want {p:?} in\n{out}"
        )
    };
    starts("[rank 0] weights equal on all 3 ranks; loss 3.1377e0 -> ");
    starts("all 3 ranks and the replacement succeeded in ");
    // The final loss: as the host's f64 run within the example's tolerance (1e-2), and as
    // the uninterrupted device run's within 1e-3. The step the replacement rejoins at
    // depends on timing, and with it the path (7e-6 to 1.5e-4 apart, measured): the final
    // loss of this convex problem cannot tell a lost shard (8e-5, found in review) from
    // that; the per-step check against a replayed reference is left to do.
    let (last, host, diff) = final_loss(&out);
    assert!(diff <= 1e-2, "{diff}");
    assert!((last - host).abs() / host <= 1e-2, "{last} vs {host}");
    let apart = (last - uninterrupted).abs() / uninterrupted;
    assert!(
        apart <= 1e-3,
        "final loss {last:e} vs the uninterrupted run's {uninterrupted:e}: {apart:e}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// A failure the run could not recover from is refused before any rank starts, naming
/// the options (the values clap cannot range-check alone).
#[test]
fn a_kill_that_cannot_be_recovered_from_is_refused_before_the_ranks_start() {
    let (ok, out, err) = data_parallel("--kill-rank 3 --kill-at 3");
    assert!(!ok, "{out}");
    assert_eq!(out, "");
    assert_eq!(
        err.trim_end(),
        "data_parallel: --kill-rank 3 is not a rank of 3 other than 0 (rank 0 serves the \
         rendezvous and coordinates the grows)"
    );
    let (ok, out, err) = data_parallel("--kill-rank 2 --kill-at 38");
    assert!(!ok, "{out}");
    assert_eq!(
        err.trim_end(),
        "data_parallel: --kill-at 38 plus --rejoin-after 3 must be below --steps 40, so that \
         the replacement joins before the end"
    );
    let (ok, _, err) = data_parallel("--kill-rank 0 --kill-at 3");
    assert!(!ok);
    assert_eq!(
        err.lines().next(),
        Some("error: invalid value '0' for '--kill-rank <KILL_RANK>': 0 is not in 1..=4294967295")
    );
}

/// The recovery needs shrink and grow (NCCL 2.29.2): with an older NCCL (the GPU machine's
/// system NCCL is 2.28.3) every rank refuses `--kill-rank` before training, so no rank is
/// killed and no replacement waits for a grow that cannot come (it used to: the kill and
/// the shrink ran, and the run failed at the grow). Without `--kill-rank` the same NCCL
/// trains: nothing to recover.
#[test]
fn an_nccl_without_grow_is_refused_before_a_rank_is_killed() {
    let exe = || example_exe("data_parallel", "NCCL_CHANNEL_DATA_PARALLEL");
    let args = |kill: bool| {
        let mut a: Vec<&str> =
            "--nprocs 2 --elastic --features 24 --samples 96 --steps 40 --timeout 60 \
             --sim-nccl 2.28.9"
                .split_whitespace()
                .collect();
        if kill {
            a.extend(["--kill-rank", "1", "--kill-at", "10"]);
        }
        a
    };
    let (ok, out, err) = run_example(exe(), &args(true), &[]);
    assert!(!ok, "{out}{err}");
    for r in [0, 1] {
        let line = format!(
            "[rank {r}] data_parallel: --kill-rank recovers with ncclCommShrink and \
             ncclCommGrow, which need NCCL 2.29.2 or newer; this is NCCL 2.28.9 \
             (set NCCL_SYS_LIBRARY to a newer libnccl.so.2)"
        );
        assert!(err.lines().any(|l| l == line), "want {line:?} in\n{err}");
    }
    for never in ["killing itself", "[replacement]", "step "] {
        assert!(!out.contains(never), "{never:?} in\n{out}");
    }
    let (ok, out, err) = run_example(exe(), &args(false), &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("[rank 0] weights equal on all 2 ranks; "),
        "{out}"
    );
}
