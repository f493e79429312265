//! The loader's inputs from the environment (`$CUDA_SYS_LIBRARY`, the Python prefixes) and
//! its fixed parts (the search list, the `dlopen` flags), each checked in a child process
//! that gets exactly the environment the test gives it: no test here reads the caller's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use test_support::stubcc;

use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_sys::dylib::{Candidate, OpenLibrary, Reason, Step, cudarc_names, python_site_dirs};
use cuda_sys::{DRIVER_PATH_ENV, Driver, LoadError};
use libloading::os::unix::{Library as RawLibrary, RTLD_LOCAL, RTLD_NOW};

/// Set in a child: the name of the scenario it runs (see `child`).
const SCENARIO: &str = "CUDA_SYS_LOADER_ENV_SCENARIO";

/// Runs scenario `name` of this binary in a child with a cleared environment plus `env`;
/// returns its stdout, failing the test if the child failed.
fn run_child(name: &str, env: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env_clear().env(SCENARIO, name);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = test_support::test_name(module_path!(), "child");
    test_support::env::run_test_in_child(cmd, &child).0
}

/// The child's side: does nothing unless started by `run_child`.
#[test]
fn child() {
    let Some(scenario) = std::env::var_os(SCENARIO) else {
        return;
    };
    match scenario.to_str().unwrap() {
        "override-missing" => {
            let e = Driver::load().unwrap_err();
            let LoadError::Unusable { origin, reason, .. } = &e else {
                panic!("expected Unusable from the override, got {e}");
            };
            assert_eq!(reason, &Reason::NoSuchFile);
            let want = std::env::var("WANT").unwrap();
            assert_eq!(origin, &format!("{want} (${DRIVER_PATH_ENV})"), "{e}");
            assert!(e.attempts().is_empty());
        }
        "override-incomplete" => {
            let e = Driver::load().unwrap_err();
            let want = std::env::var("WANT").unwrap();
            let LoadError::Unusable { origin, reason, .. } = &e else {
                panic!("expected Unusable from the override, got {e}");
            };
            assert_eq!(origin, &format!("{want} (${DRIVER_PATH_ENV})"), "{e}");
            assert_eq!(reason, &Reason::MissingSymbol("cuGetProcAddress_v2".into()));
        }
        "python-sites" => {
            let got: Vec<String> = python_site_dirs()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            let want: Vec<String> = std::env::var("WANT")
                .unwrap()
                .split(';')
                .map(str::to_string)
                .collect();
            assert_eq!(got[..want.len()], want[..], "{got:?}");
            // The rest are the system prefixes', none from the empty $CONDA_PREFIX.
            for p in &got[want.len()..] {
                assert!(p.starts_with("/usr/"), "{got:?}");
            }
        }
        "resident" => {
            // Another crate's driver, loaded by its path from a folder the search never
            // looks in: the loader takes it rather than searching.
            let path = std::env::var_os("RESIDENT").unwrap();
            // SAFETY: a stub driver compiled by the parent test, with no initialiser.
            let other = unsafe { RawLibrary::open(Some(&path), RTLD_NOW | RTLD_LOCAL) }.unwrap();
            let d = Driver::load().unwrap();
            assert_eq!(d.origin(), "libcuda.so.1 (already loaded)");
            assert_eq!(d.version().to_string(), "12.9");
            // SAFETY: the address is read, never called.
            let theirs = unsafe { other.get::<*const std::ffi::c_void>(b"cuGetProcAddress_v2\0") };
            let ours = d.library().unwrap().symbol(c"cuGetProcAddress_v2");
            assert_eq!(ours, *theirs.unwrap());
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("loader-env-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_override_is_the_only_path_tried() {
    let missing = Path::new("/nonexistent/override/libcuda.so.1");
    run_child(
        "override-missing",
        &[(DRIVER_PATH_ENV, missing), ("WANT", missing)],
    );
}

#[test]
fn the_override_opens_the_library_it_names() {
    // A library without the driver's entry point: refused, naming the override's path,
    // which proves that path was opened and nothing else was tried.
    let lib = stubcc::shared_library(
        env!("CARGO_TARGET_TMPDIR"),
        "cuda_override",
        "int not_a_driver(void) { return 0; }\n",
    );
    run_child(
        "override-incomplete",
        &[(DRIVER_PATH_ENV, &lib), ("WANT", &lib)],
    );
}

#[test]
fn an_empty_override_counts_as_unset() {
    // With `$CUDA_SYS_LIBRARY` empty the search runs: its error (or its success on a
    // machine with a driver) never names the empty override.
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env_clear()
        .env(DRIVER_PATH_ENV, "")
        .env(SCENARIO, "empty-override");
    let child = test_support::test_name(module_path!(), "empty_override_child");
    test_support::env::run_test_in_child(cmd, &child);
}

#[test]
fn empty_override_child() {
    if std::env::var_os(SCENARIO).is_none_or(|s| s != "empty-override") {
        return;
    }
    match Driver::load() {
        Ok(d) => assert!(!d.origin().contains(DRIVER_PATH_ENV), "{}", d.origin()),
        Err(e) => {
            let LoadError::NotFound { .. } = &e else {
                panic!("an empty override must not be opened: {e}");
            };
            let tried: Vec<Candidate> = e
                .attempts()
                .into_iter()
                .map(|a| Candidate::new(a.path, a.step))
                .collect();
            assert_eq!(tried, Driver::search_list(), "{e}");
        }
    }
}

#[test]
fn the_search_list_is_the_documented_one() {
    let arch = std::env::consts::ARCH;
    // First what is already loaded, under our names and then cudarc's, each once.
    let mut want: Vec<Candidate> = Vec::new();
    let ours = ["libcuda.so.1", "libcuda.so"].map(String::from);
    for name in ours.into_iter().chain(cudarc_names(&["cuda", "nvcuda"])) {
        let c = Candidate::new(name, Step::AlreadyLoaded);
        if !want.contains(&c) {
            want.push(c);
        }
    }
    // 69 names for each of cudarc's two stems; ours are among them.
    assert_eq!(want.len(), 2 * 69, "{want:?}");
    want.extend([
        Candidate::new("libcuda.so.1", Step::DynamicLoader),
        Candidate::new("libcuda.so", Step::DynamicLoader),
        Candidate::new(
            format!("/usr/lib/{arch}-linux-gnu/libcuda.so.1"),
            Step::SystemDir,
        ),
        Candidate::new("/usr/lib64/libcuda.so.1", Step::SystemDir),
        Candidate::new("/usr/local/nvidia/lib64/libcuda.so.1", Step::SystemDir),
        Candidate::new("/usr/lib/wsl/lib/libcuda.so.1", Step::SystemDir),
    ]);
    assert_eq!(Driver::search_list(), want);
}

#[test]
fn a_driver_already_loaded_is_the_one_used() {
    let lib = stubcc::shared_library_with(
        env!("CARGO_TARGET_TMPDIR"),
        "cuda_resident",
        &crate::stub_driver::stub_source(12090, &[], false),
        &["-Wl,-soname,libcuda.so.1"],
    );
    run_child("resident", &[("RESIDENT", &lib)]);
}

#[test]
fn python_sites_come_from_the_venv_then_home_newest_python_first() {
    let root = tmp("sites");
    let venv = root.join("venv");
    let home = root.join("home");
    let dirs = [
        venv.join("lib/python3.11/site-packages"),
        venv.join("lib/python3.12/site-packages"),
        venv.join("lib/python3.12/dist-packages"),
        home.join(".local/lib/python3.10/site-packages"),
    ];
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    // Not a Python folder, and a Python folder without a site dir: both ignored.
    std::fs::create_dir_all(venv.join("lib/perl5/site-packages")).unwrap();
    std::fs::create_dir_all(venv.join("lib/python3.9")).unwrap();
    let want = [&dirs[1], &dirs[2], &dirs[0], &dirs[3]]
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(";");
    run_child(
        "python-sites",
        &[
            ("VIRTUAL_ENV", &venv),
            ("CONDA_PREFIX", Path::new("")),
            ("HOME", &home),
            ("WANT", Path::new(&want)),
        ],
    );
}

#[test]
fn a_library_stays_mapped_after_its_handle_is_dropped() {
    // RTLD_NODELETE: libcuda and libnccl run threads and exit handlers of their own.
    let lib = stubcc::shared_library(
        env!("CARGO_TARGET_TMPDIR"),
        "nodelete",
        "int nodelete_marker(void) { return 7; }\n",
    );
    // SAFETY: a stub compiled by this test, with no initialiser.
    let opened = unsafe { OpenLibrary::open(&lib) }.unwrap();
    assert!(!opened.symbol(c"nodelete_marker").is_null());
    drop(opened);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        maps.contains(lib.to_str().unwrap()),
        "{} was unmapped when its handle was dropped",
        lib.display()
    );
}

#[test]
fn a_loader_error_carries_the_loaders_own_words() {
    let junk = tmp("junk").join("not-a-library.so");
    std::fs::write(&junk, b"hello").unwrap();
    // SAFETY: a text file, which the loader refuses before running anything.
    match unsafe { OpenLibrary::open(&junk) } {
        Err(Reason::Open(msg)) => {
            assert!(msg.contains(junk.to_str().unwrap()), "{msg}");
            assert!(
                msg.contains("file too short") || msg.contains("invalid ELF header"),
                "{msg}"
            );
        }
        Err(other) => panic!("expected an open error, got {other}"),
        Ok(_) => panic!("a text file opened as a library"),
    }
}

#[test]
fn a_drivers_debug_names_its_version_and_origin() {
    let (d, _world) = cuda_mock::MockDriver::new().build().unwrap();
    let text = format!("{d:?}");
    assert!(text.starts_with("Driver {"), "{text}");
    assert!(
        text.contains(&format!("version: {:?}", d.version())),
        "{text}"
    );
    assert!(
        text.contains(&format!("origin: {:?}", d.origin())),
        "{text}"
    );
}
