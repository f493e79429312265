//! The NCCL loader's search list from the environment (`$VIRTUAL_ENV`'s NCCL wheels,
//! `$CUDA_HOME`), checked in a child process that gets exactly the environment the test
//! gives it; and what a loaded library says of itself.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use test_support::stubcc;

use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_sys::dylib::Step;
use nccl_sys::{Nccl, NcclFns};

const SCENARIO: &str = "NCCL_SYS_LOADER_ENV_SCENARIO";

/// Runs `child` in a child with a cleared environment plus `env`.
fn run_child(env: &[(&str, &Path)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env_clear().env(SCENARIO, "search-list");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = test_support::test_name(module_path!(), "child");
    test_support::env::run_test_in_child(cmd, &child);
}

/// The child: compares the search list with `$WANT` (paths and steps, `;`-separated).
#[test]
fn child() {
    if std::env::var_os(SCENARIO).is_none() {
        return;
    }
    let want: Vec<String> = std::env::var("WANT")
        .unwrap()
        .split(';')
        .map(str::to_string)
        .collect();
    let got: Vec<String> = Nccl::search_list()
        .iter()
        // Wheels in the system's own Python folders depend on the machine: left out; so is
        // the already-loaded step, which reads no environment (the `resident` module).
        .filter(|c| c.step != Step::PythonPackage || !c.path.starts_with("/usr/"))
        .filter(|c| c.step != Step::AlreadyLoaded)
        .map(|c| format!("{} ({})", c.path.display(), c.step))
        .collect();
    assert_eq!(got, want);
}

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nccl-loader-env-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn expected(wheels: &[&Path], cuda_home: Option<&str>) -> String {
    let arch = std::env::consts::ARCH;
    let mut want = vec![
        "libnccl.so.2 (dynamic loader)".to_string(),
        "libnccl.so (dynamic loader)".to_string(),
    ];
    want.extend(
        wheels
            .iter()
            .map(|w| format!("{} (pip package)", w.display())),
    );
    let mut dirs = vec![format!("/usr/lib/{arch}-linux-gnu"), "/usr/lib64".into()];
    dirs.extend(cuda_home.map(|h| format!("{h}/lib64")));
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/nccl/lib",
            "/opt/nccl/lib",
        ]
        .map(String::from),
    );
    want.extend(
        dirs.iter()
            .map(|d| format!("{d}/libnccl.so.2 (system dir)")),
    );
    want.join(";")
}

#[test]
fn wheels_of_the_active_venv_then_cuda_home_join_the_search() {
    let venv = tmp("venv");
    let site = venv.join("lib/python3.12/site-packages");
    let cu12 = site.join("nvidia/nccl/lib/libnccl.so.2");
    let cu13 = site.join("nvidia/cu13/lib/libnccl.so.2");
    for f in [&cu12, &cu13] {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"").unwrap();
    }
    let want = expected(&[&cu12, &cu13], Some("/opt/cuda-x"));
    run_child(&[
        ("VIRTUAL_ENV", &venv),
        ("CUDA_HOME", Path::new("/opt/cuda-x")),
        ("WANT", Path::new(&want)),
    ]);
    // An empty $CUDA_HOME counts as unset; a venv without NCCL wheels adds nothing.
    let bare = tmp("bare");
    std::fs::create_dir_all(bare.join("lib/python3.12/site-packages")).unwrap();
    let want = expected(&[], None);
    run_child(&[
        ("VIRTUAL_ENV", &bare),
        ("CUDA_HOME", Path::new("")),
        ("WANT", Path::new(&want)),
    ]);
}

#[test]
fn a_loaded_library_names_where_it_came_from() {
    let mut c = String::from("int ncclGetVersion(int *v) { *v = 22803; return 0; }\n");
    let optional = NcclFns::OPTIONAL.iter().map(|(n, _)| *n);
    for n in NcclFns::REQUIRED.iter().copied().chain(optional) {
        if n != "ncclGetVersion" {
            c += &format!("int {n}(void) {{ return 3; }}\n");
        }
    }
    let path = stubcc::shared_library(env!("CARGO_TARGET_TMPDIR"), "nccl_origin", &c);
    // SAFETY: a stub compiled by this test.
    let nccl = unsafe { Nccl::load_from(&path) }.unwrap();
    assert_eq!(nccl.origin(), format!("{} (explicit path)", path.display()));
    assert_eq!(nccl.library().unwrap().path(), path);
    assert_eq!(nccl.version().to_string(), "2.28.3");
    let debug = format!("{nccl:?}");
    assert!(
        debug.starts_with(&format!(
            "Nccl {{ version: {:?}, origin: {:?}, fns: ",
            nccl.version(),
            nccl.origin()
        )),
        "{debug}"
    );
}
