//! `cargo xtask dropin [--release]`: builds `libsimgpu.so` (crate `mock-dropin`) and lays
//! it out as `libcuda.so.1`, `libcuda.so`, `libnccl.so.2` and `libnccl.so` in
//! `target/<profile>/dropin/`, which it prints. Links to one file: the dynamic loader
//! opens it once, so the simulated NCCL and driver are one machine.

use std::path::PathBuf;
use std::process::Command;

/// The names the drop-in stands in for: what the loaders of this workspace, cudarc and C
/// programs open.
const NAMES: [&str; 4] = ["libcuda.so.1", "libcuda.so", "libnccl.so.2", "libnccl.so"];

pub(crate) fn dropin(args: &[String]) -> Result<PathBuf, String> {
    let release = match args {
        [] => false,
        [r] if r == "--release" => true,
        _ => return Err("usage: cargo xtask dropin [--release]".into()),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "mock-dropin"]);
    if release {
        build.arg("--release");
    }
    let status = build
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p mock-dropin failed ({status})"));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| super::root().join("target"), PathBuf::from);
    let profile = target.join(if release { "release" } else { "debug" });
    let dir = profile.join("dropin");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for name in NAMES {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("../libsimgpu.so", &link)
            .map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(dir)
}
