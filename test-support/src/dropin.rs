//! The drop-in simulator (`mock-dropin`'s `libsimgpu.so`) for tests that run programs on
//! it. `cargo test` does not build a package's cdylib for another package's tests, so the
//! first caller builds it with cargo, into a target dir of its own under the tests'
//! scratch folder (no lock shared with the cargo running the tests; every package's tests
//! share the folder, so it is built once).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The built `libsimgpu.so` (`$DROPIN_LIBRARY` when set, as in the drop-in tests'
/// children). `tmp` is the calling test's `env!("CARGO_TARGET_TMPDIR")`.
pub fn library(tmp: &Path) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("DROPIN_LIBRARY") {
                return PathBuf::from(p);
            }
            let target = tmp.join("dropin-build");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "mock-dropin",
                    "--message-format=json-render-diagnostics",
                ])
                .arg("--target-dir")
                .arg(&target)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let json = String::from_utf8_lossy(&out.stdout);
            let lib = json
                .lines()
                .filter(|l| l.contains("\"compiler-artifact\"") && l.contains("mock-dropin"))
                .find_map(|l| {
                    let at = l.find("libsimgpu.so\"")?;
                    let start = l[..at].rfind('"')? + 1;
                    Some(PathBuf::from(&l[start..at + "libsimgpu.so".len()]))
                })
                .expect("cargo named the built libsimgpu.so");
            assert!(lib.exists(), "{} is not there", lib.display());
            lib
        })
        .clone()
}

/// A folder where `libcuda.so`, `libcuda.so.1`, `libnccl.so` and `libnccl.so.2` all name
/// the drop-in (as `cargo xtask dropin` lays it out), for a child's library path; made
/// once per process.
pub fn dir(tmp: &Path) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tmp.join(format!("dropin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["libcuda.so", "libcuda.so.1", "libnccl.so", "libnccl.so.2"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(library(tmp), &link).unwrap();
        }
        dir
    })
    .clone()
}
