//! Finds the examples' binaries for tests: `$NCCL_CHANNEL_DEMO` (allgather) or
//! `$NCCL_CHANNEL_DATA_PARALLEL`, else beside this test binary (the GPU machine's staged
//! layout), else cargo's `examples/` folder (built on demand).
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::PathBuf;

pub fn demo_exe() -> PathBuf {
    example_exe("allgather", "NCCL_CHANNEL_DEMO")
}

/// The example `name`: `$var`, beside this test binary, or in cargo's `examples/`.
pub fn example_exe(name: &str, var: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let me = std::env::current_exe().unwrap();
    let dir = me.parent().unwrap();
    for candidate in [dir.join(name), dir.join("../examples").join(name)] {
        if candidate.exists() {
            return candidate;
        }
    }
    // Under `cargo test` with a target filter the example may not be built yet: build it.
    if let (Some(cargo), Some(profile_dir)) = (std::env::var_os("CARGO"), dir.parent()) {
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = std::process::Command::new(cargo);
        cmd.args([
            "build",
            "-q",
            "-p",
            "nccl-channel",
            "--example",
            name,
            "--features",
            "mock half",
        ]);
        if release {
            cmd.arg("--release");
        }
        if cmd.status().is_ok_and(|s| s.success()) {
            let built = profile_dir.join("examples").join(name);
            if built.exists() {
                return built;
            }
        }
    }
    panic!(
        "the {name} example was not found beside {} or in ../examples; build it \
         (cargo build --examples --features mock) or set {var}",
        me.display()
    );
}

/// Runs the demo with `args` and `env`; returns (success, stdout, stderr).
pub fn run_demo(args: &[&str], env: &[(&str, String)]) -> (bool, String, String) {
    run_example(demo_exe(), args, env)
}

/// Runs `exe` with `args` and `env`; returns (success, stdout, stderr).
pub fn run_example(exe: PathBuf, args: &[&str], env: &[(&str, String)]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
