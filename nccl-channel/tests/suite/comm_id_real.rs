//! `NCCL_COMM_ID`-derived ids with the real libnccl of the pinned wheel (no GPU needed):
//! every call gives the same id, so independent processes agree. Each test runs in a child
//! of this test binary whose environment has exactly the `NCCL_COMM_ID` it checks (and no
//! launcher or NCCL variable of the caller's).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;

use crate::common::wheel::{self, load_trusted};
use test_support::this_test;

/// Names the library these tests use (or, in their child, the one the parent found).
const LIBNCCL: &str = "NCCL_SYS_TEST_LIBNCCL";

fn libnccl() -> std::path::PathBuf {
    wheel::libnccl("2.32.3", LIBNCCL)
}

/// Runs test `name` (its full name: `this_test!()`) in a child with `NCCL_COMM_ID=comm_id` (unset
/// for `None`); in the child, returns the library.
fn in_child(name: &str, comm_id: Option<&str>) -> Option<nccl_sys::Nccl> {
    let lib = libnccl();
    let mut env = vec![(LIBNCCL, lib.as_os_str())];
    if let Some(v) = comm_id {
        env.push(("NCCL_COMM_ID", OsStr::new(v)));
    }
    test_support::env::in_scrubbed_child(name, &env).then(|| load_trusted(lib).unwrap())
}

#[test]
fn an_unset_comm_id_is_refused() {
    let Some(nccl) = in_child(&this_test!(), None) else {
        return;
    };
    let e = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap_err();
    assert!(e.to_string().contains("NCCL_COMM_ID"), "{e}");
}

#[test]
fn a_comm_id_without_a_port_is_refused() {
    let Some(nccl) = in_child(&this_test!(), Some("127.0.0.1")) else {
        return;
    };
    let e = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap_err();
    assert!(e.to_string().contains("host:port"), "{e}");
}

#[test]
fn a_comm_id_with_spaces_is_refused() {
    let Some(nccl) = in_child(&this_test!(), Some(" 127.0.0.1:8123")) else {
        return;
    };
    let e = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap_err();
    assert_eq!(
        e.to_string(),
        "environment variable NCCL_COMM_ID=\" 127.0.0.1:8123\": expected host:port without \
         surrounding spaces (NCCL reads it as it is)"
    );
}

#[test]
fn comm_id_gives_identical_ids() {
    let Some(nccl) = in_child(&this_test!(), Some("127.0.0.1:8123")) else {
        return;
    };
    let a = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap();
    let b = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap();
    assert_eq!(a, b);
    println!(
        "NCCL {}: NCCL_COMM_ID ids identical; id starts {}",
        nccl.version(),
        &a.to_hex()[..32]
    );
}
