//! `scripts/wheel`, which the real-library tests call, run by several tests at once on an
//! empty cache: every caller gets the unpacked wheel, none a half-unpacked or missing one.
//! (Parallel callers used to unpack over each other: `File exists` errors, or a folder
//! marked good without the library in it.) The wheel file itself comes from the normal
//! cache, so nothing is downloaded twice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/wheel")
}

#[test]
fn parallel_callers_on_an_empty_cache_all_get_the_unpacked_wheel() {
    // Fetch (or find) the wheel in the normal cache once.
    let out = Command::new("bash")
        .arg(script())
        .args(["nvidia-nccl-cu12", "2.32.3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unpacked = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let cache = unpacked.parent().unwrap();
    let wheel = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("nvidia_nccl_cu12-2.32.3-"))
        })
        .unwrap();
    let fresh = std::env::temp_dir().join(format!("nccl-rs-wheel-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::create_dir_all(&fresh).unwrap();
    std::fs::copy(&wheel, fresh.join(wheel.file_name().unwrap())).unwrap();
    let callers: Vec<_> = (0..6)
        .map(|_| {
            Command::new("bash")
                .arg(script())
                .args(["nvidia-nccl-cu12", "2.32.3"])
                .env("NCCL_RS_WHEEL_CACHE", &fresh)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in callers {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            dir.join("nvidia/nccl/lib/libnccl.so.2").is_file(),
            "{}",
            dir.display()
        );
    }
    std::fs::remove_dir_all(&fresh).unwrap();
}
