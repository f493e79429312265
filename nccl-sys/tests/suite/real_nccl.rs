//! nccl-sys against the real `libnccl.so.2` of the pinned PyPI wheel (no GPU needed).
//!
//! The library comes from `$NCCL_SYS_TEST_LIBNCCL` when set, else from
//! `scripts/wheel nvidia-nccl-cu12 <pinned>`, which downloads the wheel once (checked
//! against its sha256) and caches it outside the repository. If neither works, the tests
//! fail: they never skip silently.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use nccl_sys::{Nccl, ncclResult_t, ncclUniqueId};

/// Opens a library this test chose (the pinned NCCL wheel, checked by sha256).
fn load_trusted(path: impl AsRef<std::path::Path>) -> Result<Nccl, nccl_sys::LoadError> {
    // SAFETY: the pinned NCCL wheel, checked by sha256; a library that is not the real thing is what the test checks is refused.
    unsafe { Nccl::load_from(path) }
}

const WHEEL: &str = "nvidia-nccl-cu12";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The wheel version pinned in scripts/wheels.lock.
fn pinned_version() -> String {
    let lock = std::fs::read_to_string(root().join("scripts/wheels.lock")).unwrap();
    lock.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(WHEEL)).then(|| w.next().unwrap().to_string())
        })
        .next()
        .expect("nvidia-nccl-cu12 is pinned")
}

fn libnccl() -> PathBuf {
    if let Some(p) = std::env::var_os("NCCL_SYS_TEST_LIBNCCL") {
        return PathBuf::from(p);
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/wheel"))
        .args([WHEEL, &pinned_version()])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "fetching the NCCL wheel failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    dir.join("nvidia/nccl/lib/libnccl.so.2")
}

fn load() -> Nccl {
    load_trusted(libnccl()).unwrap()
}

/// For a test that calls `ncclGetUniqueId`, which reads `NCCL_COMM_ID`: runs test `name` in
/// a child of this binary without the caller's launcher and NCCL variables, handing it the
/// library; `true` in that child.
fn in_child(name: &str) -> bool {
    let lib = libnccl();
    test_support::in_scrubbed_child!(name, &[("NCCL_SYS_TEST_LIBNCCL", lib.as_os_str())])
}

#[test]
fn the_table_resolves_and_the_version_matches_the_wheel() {
    let n = load();
    if std::env::var_os("NCCL_SYS_TEST_LIBNCCL").is_none() {
        assert_eq!(n.version().to_string(), pinned_version());
        // The pinned wheel is the header's release: every optional function is present.
        let missing: Vec<_> = n
            .fns()
            .optional_present()
            .into_iter()
            .filter(|(_, p)| !p)
            .collect();
        assert!(missing.is_empty(), "{missing:?}");
    }
}

#[test]
fn unique_ids_are_128_bytes_and_fresh() {
    if !in_child("unique_ids_are_128_bytes_and_fresh") {
        return;
    }
    let n = load();
    let mut a = ncclUniqueId::default();
    let mut b = ncclUniqueId::default();
    // SAFETY: valid out-pointers.
    let (ra, rb) = unsafe {
        (
            (n.fns().ncclGetUniqueId)(&mut a),
            (n.fns().ncclGetUniqueId)(&mut b),
        )
    };
    assert_eq!(ra, ncclResult_t::ncclSuccess, "{}", n.error_string(ra));
    assert_eq!(rb, ncclResult_t::ncclSuccess);
    assert_eq!(std::mem::size_of_val(&a.internal), 128);
    assert!(a.internal.iter().any(|&c| c != 0), "id is all zeros");
    assert_ne!(
        a.internal, b.internal,
        "two ids without NCCL_COMM_ID must differ"
    );
}

#[test]
fn error_strings_come_from_the_library() {
    let n = load();
    let s = n.error_string(ncclResult_t::ncclInvalidArgument);
    assert!(s.to_lowercase().contains("invalid argument"), "{s}");
    assert_eq!(n.error_string(ncclResult_t::ncclSuccess), "no error");
}

/// Whether this machine has a usable GPU, asked of the real driver if there is one.
fn gpu_present() -> bool {
    let Ok(d) = cuda_sys::Driver::load() else {
        return false;
    };
    let mut n = 0;
    // SAFETY: plain driver calls with a valid out-pointer.
    unsafe {
        (d.fns().cuInit)(0) == cuda_sys::CUresult::CUDA_SUCCESS
            && (d.fns().cuDeviceGetCount)(&mut n) == cuda_sys::CUresult::CUDA_SUCCESS
            && n > 0
    }
}

#[test]
fn init_without_a_gpu_returns_an_error_instead_of_crashing() {
    if !in_child("init_without_a_gpu_returns_an_error_instead_of_crashing") {
        return;
    }
    let n = load();
    let mut id = ncclUniqueId::default();
    // SAFETY: valid out-pointer.
    let rc = unsafe { (n.fns().ncclGetUniqueId)(&mut id) };
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let mut comm: nccl_sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: a one-rank world with a fresh id; `comm` is a valid out-pointer.
    let rc = unsafe { (n.fns().ncclCommInitRank)(&mut comm, 1, id, 0) };
    println!(
        "ncclCommInitRank, one rank: {} ({})",
        rc.name().unwrap_or("?"),
        n.error_string(rc)
    );
    if gpu_present() {
        // On the GPU machine the same call must succeed; clean up.
        assert_eq!(rc, ncclResult_t::ncclSuccess);
        // SAFETY: `comm` was just created and is destroyed once.
        let rc = unsafe { (n.fns().ncclCommDestroy)(comm) };
        assert_eq!(rc, ncclResult_t::ncclSuccess);
    } else {
        assert_ne!(rc, ncclResult_t::ncclSuccess, "no GPU here, init must fail");
    }
}

#[test]
fn dropping_a_loaded_nccl_while_its_threads_run_is_safe() {
    if !in_child("dropping_a_loaded_nccl_while_its_threads_run_is_safe") {
        return;
    }
    // ncclGetUniqueId starts NCCL's bootstrap root thread. Unmapping the library under it
    // crashed the process before libraries were opened with RTLD_NODELETE.
    for _ in 0..3 {
        let n = load();
        let mut id = ncclUniqueId::default();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (n.fns().ncclGetUniqueId)(&mut id) };
        assert_eq!(rc, ncclResult_t::ncclSuccess);
        drop(n);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
