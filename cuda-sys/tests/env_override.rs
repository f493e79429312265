//! `$CUDA_SYS_LIBRARY` is the one library `Driver::load` tries. Its own test binary with one
//! test: it sets the variable for the whole process, which no other test may race.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_sys::dylib::Reason;
use cuda_sys::{DRIVER_PATH_ENV, Driver, LoadError};

#[test]
fn the_environment_override_is_the_only_path_tried() {
    assert_eq!(DRIVER_PATH_ENV, "CUDA_SYS_LIBRARY");
    let path = "/nonexistent/cuda-sys-env-override/libcuda.so.1";
    // SAFETY: the only test of this binary, and no thread of it reads the environment.
    unsafe { std::env::set_var(DRIVER_PATH_ENV, path) };
    let e = Driver::load().unwrap_err();
    match &e {
        LoadError::Unusable {
            library,
            origin,
            reason,
        } => {
            assert_eq!(*library, "CUDA driver");
            assert_eq!(origin, &format!("{path} ($CUDA_SYS_LIBRARY)"));
            assert_eq!(reason, &Reason::NoSuchFile);
        }
        other => panic!("expected the override to be refused alone, got {other:?}"),
    }
    assert_eq!(e.attempts(), Vec::new(), "nothing else searched");
}
