//! The environment of the processes a test starts: never the caller's launcher, NCCL or
//! library settings. A test run inside a Slurm job, under torchrun, or with `NCCL_COMM_ID`
//! or `NCCL_SYS_LIBRARY` exported must give the results it gives on a bare shell, so every
//! child starts from this process's environment less those variables (see [`scrubbed`]),
//! plus only what its test sets. Checks of the "nothing set" case that read the process's
//! own environment run in a child of this test binary ([`in_scrubbed_child`]): tests never
//! change their own environment (`set_var` races with other threads).
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::ffi::OsStr;
use std::process::Command;

/// Prefixes of the scrubbed variables: NCCL's own and this workspace's (`NCCL_COMM_ID`,
/// `NCCL_SYS_LIBRARY`, `NCCL_CHANNEL_*`, ...), the launchers' (Slurm, Open MPI, PMI, PMIx,
/// Hydra, torchrun, IREE) and the CUDA loader's (`CUDA_SYS_LIBRARY`, ...).
const PREFIXES: &[&str] = &[
    "NCCL_",
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_LOCAL",
    "TORCHELASTIC_",
    "IREE_CUDA_",
    "CUDA_SYS_",
    "CUDA_MOCK_",
];

/// Scrubbed variables without a prefix of their own (torchrun's).
const NAMES: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
];

/// Kept although `NCCL_`: the cache of `scripts/wheel` (`NCCL_RS_WHEEL_CACHE`), which only
/// the test tooling reads.
const KEPT_PREFIX: &str = "NCCL_RS_";

/// The libraries' overrides, passed through to GPU tests' children (the GPU machine may
/// name a different NCCL or driver on purpose).
const LIBRARIES: &[&str] = &["NCCL_SYS_LIBRARY", "CUDA_SYS_LIBRARY"];

/// Set in a child started by [`in_scrubbed_child`]: the name of the test it runs.
const CHILD: &str = "NCCL_SHARED_TEST_CHILD";

/// Whether a child of a test must not inherit `name` from the caller's environment.
pub fn is_scrubbed(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    NAMES.contains(&name)
        || (PREFIXES.iter().any(|p| name.starts_with(p)) && !name.starts_with(KEPT_PREFIX))
}

/// Removes every scrubbed variable of this process's environment from `cmd`'s.
pub fn scrub(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if is_scrubbed(&name) {
            cmd.env_remove(name);
        }
    }
    // Whatever the caller set: NVLink SHARP (multicast) stays off on shared GPU hosts.
    cmd.env("NCCL_NVLS_ENABLE", "0");
    cmd
}

/// As [`scrub`], but for a GPU test: `NCCL_SYS_LIBRARY` and `CUDA_SYS_LIBRARY` pass
/// through unchanged.
pub fn scrub_for_gpu(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if is_scrubbed(&name) && !LIBRARIES.iter().any(|l| name == *l) {
            cmd.env_remove(name);
        }
    }
    // Whatever the caller set: NVLink SHARP (multicast) stays off on shared GPU hosts.
    cmd.env("NCCL_NVLS_ENABLE", "0");
    cmd
}

/// `Command::new(program)` with a scrubbed environment.
pub fn scrubbed(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    scrub(&mut cmd);
    cmd
}

/// `Command::new(program)` with a scrubbed environment for a GPU test.
pub fn scrubbed_for_gpu(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    scrub_for_gpu(&mut cmd);
    cmd
}

/// Runs the test `name` (its full path in this test binary) of this binary in a child
/// made by `cmd` (the caller sets its environment; the program is this binary), and
/// checks that exactly that one test ran and passed: a name that matches no test (renamed,
/// ignored, filtered) would otherwise pass without checking anything. Returns its
/// standard output and error.
pub fn run_test_in_child(mut cmd: Command, name: &str) -> (String, String) {
    let out = cmd
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "test {name} failed in its child:\n{stdout}{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test named {name}:\n{stdout}"
    );
    (stdout, stderr)
}

/// For a test that needs its own process environment without the scrubbed variables:
/// `true` in the child that runs the test's body, `false` in the test's process, after it
/// has run test `name` (its full path in this binary) in that child with `env` added and
/// checked that it passed. The test starts with
/// `if !in_scrubbed_child("name", &[]) { return; }`.
pub fn in_scrubbed_child(name: &str, env: &[(&str, &OsStr)]) -> bool {
    if std::env::var_os(CHILD).is_some_and(|v| v == name) {
        return true;
    }
    let mut cmd = scrubbed(std::env::current_exe().unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .env(CHILD, name)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(out.status.success(), "test {name} failed in its child");
    // A name that matches no test would pass without running anything.
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test named {name}"
    );
    false
}
