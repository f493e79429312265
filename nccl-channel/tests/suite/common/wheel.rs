//! The real libnccl of a pinned NCCL wheel (`scripts/wheel`: downloaded once, sha256
//! checked, cached), for tests that need the real library but no GPU.

use std::path::{Path, PathBuf};

/// `libnccl.so.2` of the pinned `nvidia-nccl-cu12` wheel `version`, or `$var` if set.
pub fn libnccl(version: &str, var: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/wheel"))
        .args(["nvidia-nccl-cu12", version])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("nvidia/nccl/lib/libnccl.so.2")
}

/// Opens a library this test chose (a pinned NCCL wheel, checked by sha256).
pub fn load_trusted(path: impl AsRef<Path>) -> Result<nccl_sys::Nccl, nccl_sys::LoadError> {
    // SAFETY: a pinned NCCL wheel's libnccl, checked by sha256 by scripts/wheel (or the
    // library the tester named); running its initialisers is what the test is for.
    unsafe { nccl_sys::Nccl::load_from(path) }
}
