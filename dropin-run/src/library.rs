//! Where the drop-in library lives, how it is built there, and how a program is pointed
//! at it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// This runner's version: the drop-in of the same version is built.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The names the drop-in stands in for: what the loaders of the CUDA and NCCL crates,
/// cudarc and C programs open.
const NAMES: [&str; 4] = ["libcuda.so.1", "libcuda.so", "libnccl.so.2", "libnccl.so"];

/// The library cargo builds (crate `mock-dropin`, library `simgpu`).
const BUILT: &str = "libsimgpu.so";

/// The folder of this version's build and library: `$MOCK_DROPIN_HOME/<version>`, by
/// default under `$XDG_CACHE_HOME/mock-dropin` or `~/.cache/mock-dropin`.
pub(crate) fn home() -> PathBuf {
    let base = std::env::var_os("MOCK_DROPIN_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("mock-dropin"))
        })
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mock-dropin")))
        .unwrap_or_else(|| std::env::temp_dir().join("mock-dropin"));
    base.join(VERSION)
}

/// The manifest of the project whose build makes the library: it depends on exactly this
/// version of `mock-dropin`, and cargo builds that dependency's library (a `cdylib`) when
/// asked for it by name.
fn manifest() -> String {
    format!(
        "[package]\nname = \"mock-dropin-build\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[dependencies]\nmock-dropin = \"={VERSION}\"\n\n[workspace]\n"
    )
}

/// The folder that holds the drop-in under its four names, built first if it is not there
/// (or incomplete). Concurrent first runs are safe: cargo locks its build folder, and each
/// file is put in place by a rename.
pub(crate) fn ensure(home: &Path) -> Result<PathBuf, String> {
    let lib = home.join("lib");
    if NAMES.iter().all(|n| lib.join(n).is_file()) {
        return Ok(lib);
    }
    let build = home.join("build");
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir_all(build.join("src")).map_err(|e| io("creating", &build, e))?;
    for (name, text) in [("Cargo.toml", manifest()), ("src/lib.rs", String::new())] {
        // Written only when it differs (another first run's cargo may be reading it), and
        // then whole, by a rename.
        let path = build.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
            continue;
        }
        let tmp = build.join(format!(
            ".{}.{}",
            name.replace('/', "-"),
            std::process::id()
        ));
        std::fs::write(&tmp, text).map_err(|e| io("writing", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("placing", &path, e))?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    eprintln!(
        "mock-dropin-run: building mock-dropin {VERSION} in {} (once)",
        build.display()
    );
    // The target folder is named, so that a CARGO_TARGET_DIR or build.target-dir of the
    // caller's does not move the library elsewhere.
    let target = build.join("target");
    let status = Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--lib",
            "-p",
            "mock-dropin",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&build)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !status.success() {
        return Err(format!(
            "building mock-dropin {VERSION} failed ({status}); cargo's output is above"
        ));
    }
    let built = target.join("release").join(BUILT);
    std::fs::create_dir_all(&lib).map_err(|e| io("creating", &lib, e))?;
    let tmp = lib.join(format!(".{BUILT}.{}", std::process::id()));
    std::fs::copy(&built, &tmp).map_err(|e| io("copying", &built, e))?;
    std::fs::rename(&tmp, lib.join(BUILT)).map_err(|e| io("placing", &tmp, e))?;
    for name in NAMES {
        // Links to one file: the dynamic loader opens it once, so the driver and NCCL are
        // one simulated machine.
        let tmp = lib.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(BUILT, &tmp).map_err(|e| io("linking", &tmp, e))?;
        std::fs::rename(&tmp, lib.join(name)).map_err(|e| io("placing", &tmp, e))?;
    }
    Ok(lib)
}

/// `LD_LIBRARY_PATH` with `dir` first, then what the caller had.
pub(crate) fn search_path(dir: &Path) -> OsString {
    let mut path = dir.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_depends_on_exactly_this_version() {
        assert!(manifest().contains(&format!("mock-dropin = \"={VERSION}\"")));
    }
}
