//! One NCCL per process: `Nccl::load` takes an NCCL the process already loaded (under
//! `libnccl.so`, as cudarc loads it, or under `libnccl.so.2`, as torch does) before it
//! searches, even when the search would find another one. Each case runs in a child
//! process with exactly the environment it names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_sys::dylib::Step;
use libloading::os::unix::{Library as RawLibrary, RTLD_LOCAL, RTLD_NOW};
use nccl_sys::{Nccl, NcclFns, NcclVersion};
use test_support::stubcc;

/// Set in a child: the library it loads itself before `Nccl::load` (or empty: none).
const RESIDENT: &str = "NCCL_SYS_RESIDENT_TEST_LIBRARY";
/// Set in a child: what `Nccl::load` must give, `version|origin`.
const WANT: &str = "NCCL_SYS_RESIDENT_TEST_WANT";

/// A stub NCCL whose `ncclGetVersion` reports `version` (every other entry returns
/// ncclInternalError), compiled with `args` (its soname).
fn stub(name: &str, version: NcclVersion, args: &[&str]) -> PathBuf {
    let mut c = format!(
        "int ncclGetVersion(int *v) {{ *v = {}; return 0; }}\n",
        version.0
    );
    let optional = NcclFns::OPTIONAL.iter().map(|(n, _)| *n);
    for n in NcclFns::REQUIRED.iter().copied().chain(optional) {
        if n != "ncclGetVersion" {
            c += &format!("int {n}(void) {{ return 3; }}\n");
        }
    }
    stubcc::shared_library_with(env!("CARGO_TARGET_TMPDIR"), name, &c, args)
}

/// A fresh folder holding `lib` as `libnccl.so.2`: what the search finds through
/// `LD_LIBRARY_PATH`.
fn on_search_path(lib: &Path) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nccl-resident-path-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(lib, dir.join("libnccl.so.2")).unwrap();
    dir
}

/// Runs `child` with a cleared environment plus `LD_LIBRARY_PATH=path_dir`, the resident
/// library (if any) and what it must load.
fn run_child(path_dir: &Path, resident: Option<&Path>, version: &str, origin: &str) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env_clear()
        .env("LD_LIBRARY_PATH", path_dir)
        .env(RESIDENT, resident.unwrap_or(Path::new("")))
        .env(WANT, format!("{version}|{origin}"));
    let child = test_support::test_name(module_path!(), "child");
    test_support::env::run_test_in_child(cmd, &child);
}

/// The child: loads `$RESIDENT` by its path (as another crate would), then `Nccl::load`.
#[test]
fn child() {
    let (Some(resident), Ok(want)) = (std::env::var_os(RESIDENT), std::env::var(WANT)) else {
        return;
    };
    let (version, origin) = want.split_once('|').unwrap();
    // Another crate's NCCL, from a folder the search does not look in.
    let other = (!resident.is_empty()).then(|| {
        // SAFETY: a stub compiled by the parent test, with no initialiser.
        unsafe { RawLibrary::open(Some(&resident), RTLD_NOW | RTLD_LOCAL) }.unwrap()
    });
    let nccl = Nccl::load().unwrap();
    assert_eq!(nccl.version().to_string(), version);
    assert_eq!(nccl.origin(), origin);
    if let Some(other) = other {
        // The very same library: its functions are the ones in the table.
        // SAFETY: the address is read, never called.
        let theirs = unsafe { other.get::<*const std::ffi::c_void>(b"ncclGetVersion\0") };
        assert_eq!(nccl.fns().ncclGetVersion as *const _, *theirs.unwrap());
        assert_eq!(
            nccl.library().unwrap().path(),
            Path::new(&origin[..origin.find(" (").unwrap()])
        );
    }
}

#[test]
fn an_nccl_already_loaded_wins_over_the_search() {
    // What the search finds first: `libnccl.so.2` through the dynamic loader, 2.28.3.
    let found = stub("nccl_resident_found", NcclVersion::new(2, 28, 3), &[]);
    let path_dir = on_search_path(&found);
    run_child(&path_dir, None, "2.28.3", "libnccl.so.2 (dynamic loader)");

    // cudarc loads NCCL as `libnccl.so`: a library of that soname, loaded from a folder
    // the search never looks in, is taken instead, under the name it is loaded as.
    let cudarcs = stub(
        "nccl_resident_cudarc",
        NcclVersion::new(2, 99, 1),
        &["-Wl,-soname,libnccl.so"],
    );
    run_child(
        &path_dir,
        Some(&cudarcs),
        "2.99.1",
        "libnccl.so (already loaded)",
    );

    // torch loads its wheel's `libnccl.so.2` by path: the same.
    let torchs = stub(
        "nccl_resident_torch",
        NcclVersion::new(2, 98, 7),
        &["-Wl,-soname,libnccl.so.2"],
    );
    run_child(
        &path_dir,
        Some(&torchs),
        "2.98.7",
        "libnccl.so.2 (already loaded)",
    );
}

#[test]
fn the_already_loaded_step_comes_first_with_ours_and_cudarcs_names() {
    let list = Nccl::search_list();
    let resident: Vec<&str> = list
        .iter()
        .take_while(|c| c.step == Step::AlreadyLoaded)
        .map(|c| c.path.to_str().unwrap())
        .collect();
    assert_eq!(
        resident[..3],
        ["libnccl.so.2", "libnccl.so", "libnccl64.so"]
    );
    for cudarc in [
        "libnccl.so.12",
        "libnccl.so.13",
        "libnccl64_12.so",
        "libnccl.so.1",
    ] {
        assert!(resident.contains(&cudarc), "{cudarc}: {resident:?}");
    }
    let mut unique = resident.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), resident.len(), "each name once");
    // Then the search proper, which never asks with RTLD_NOLOAD again.
    let rest = &list[resident.len()..];
    assert_eq!(rest[0].path, Path::new("libnccl.so.2"));
    assert_eq!(rest[0].step, Step::DynamicLoader);
    assert!(rest.iter().all(|c| c.step != Step::AlreadyLoaded));
}
