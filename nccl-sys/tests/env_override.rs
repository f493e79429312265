//! `$NCCL_SYS_LIBRARY` is the one library `Nccl::load` tries. Its own test binary with one
//! test: it sets the variable for the whole process, which no other test may race.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_sys::dylib::Reason;
use nccl_sys::{LoadError, NCCL_PATH_ENV, Nccl};

#[test]
fn the_environment_override_is_the_only_path_tried() {
    assert_eq!(NCCL_PATH_ENV, "NCCL_SYS_LIBRARY");
    let path = "/nonexistent/nccl-sys-env-override/libnccl.so.2";
    // SAFETY: the only test of this binary, and no thread of it reads the environment.
    unsafe { std::env::set_var(NCCL_PATH_ENV, path) };
    let e = Nccl::load().unwrap_err();
    match &e {
        LoadError::Unusable {
            library,
            origin,
            reason,
        } => {
            assert_eq!(*library, "NCCL");
            assert_eq!(origin, &format!("{path} ($NCCL_SYS_LIBRARY)"));
            assert_eq!(reason, &Reason::NoSuchFile);
        }
        other => panic!("expected the override to be refused alone, got {other:?}"),
    }
    assert_eq!(e.attempts(), Vec::new(), "nothing else searched");
}
