//! `rendezvous-scale` a little: ranks as threads and as processes, with and without a
//! secret, each run succeeding with one id for all; the secret's directory is gone after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

/// The example, which `cargo test` builds beside this test's binary (`…/deps/..` holds
/// `examples/`).
fn program() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = dir.join("examples").join("rendezvous-scale");
    assert!(
        path.exists(),
        "{} is missing: run this test with `cargo test`, which builds the examples",
        path.display()
    );
    path
}

/// Runs the program; its standard output, after checking that every rank got the id.
fn run(args: &[&str], ranks: usize) -> String {
    let out = Command::new(program())
        .args(args)
        .args(["--timeout-s", "60"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stdout}{stderr}");
    assert!(
        stdout.contains(&format!("failures: 0 of {ranks}; 1 distinct id")),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("summary ")),
        "{stdout}"
    );
    stdout
}

#[test]
fn ranks_as_threads_agree() {
    run(&["--threads", "--ranks", "256"], 256);
    run(&["--threads", "--ranks", "256", "--secret"], 256);
}

#[test]
fn ranks_as_processes_agree_and_the_secret_goes() {
    run(&["--processes", "--ranks", "16"], 16);
    let out = run(&["--processes", "--ranks", "16", "--secret"], 16);
    let dir = out
        .lines()
        .find_map(|l| l.strip_prefix("# secret: a 0600 file in "))
        .and_then(|l| l.split(" (0700)").next())
        .unwrap();
    assert!(!std::path::Path::new(dir).exists(), "{dir} is left");
}

#[test]
fn a_late_rank_0_and_late_ranks_are_waited_for() {
    let out = run(
        &[
            "--processes",
            "--ranks",
            "8",
            "--late",
            "25%",
            "--late-ms",
            "200",
            "--rank0-late-ms",
            "100",
        ],
        8,
    );
    assert!(out.contains("25% (2) late by 200 ms"), "{out}");
}
