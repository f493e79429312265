//! `NCCL_COMM_ID`-derived ids with the real libnccl of the pinned wheel (no GPU needed):
//! every call gives the same id, so independent processes agree. Its own test process,
//! because it sets NCCL_COMM_ID for the whole process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::wheel::{self, load_trusted};

fn libnccl() -> std::path::PathBuf {
    wheel::libnccl("2.32.3", "NCCL_SYS_TEST_LIBNCCL")
}

#[test]
fn comm_id_gives_identical_ids_and_bad_values_are_refused() {
    let nccl = load_trusted(libnccl()).unwrap();
    // SAFETY: this test process has no other thread reading the environment now.
    unsafe { std::env::remove_var("NCCL_COMM_ID") };
    let e = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap_err();
    assert!(e.to_string().contains("NCCL_COMM_ID"), "{e}");
    // SAFETY: as above.
    unsafe { std::env::set_var("NCCL_COMM_ID", "127.0.0.1") };
    let e = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap_err();
    assert!(e.to_string().contains("host:port"), "{e}");
    // SAFETY: as above.
    unsafe { std::env::set_var("NCCL_COMM_ID", " 127.0.0.1:8123") };
    let e = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap_err();
    assert_eq!(
        e.to_string(),
        "environment variable NCCL_COMM_ID=\" 127.0.0.1:8123\": expected host:port without \
         surrounding spaces (NCCL reads it as it is)"
    );
    // SAFETY: as above.
    unsafe { std::env::set_var("NCCL_COMM_ID", "127.0.0.1:8123") };
    let a = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap();
    let b = nccl_channel::UniqueId::from_comm_id(&nccl).unwrap();
    assert_eq!(a, b);
    println!(
        "NCCL {}: NCCL_COMM_ID ids identical; id starts {}",
        nccl.version(),
        &a.to_string()[..32]
    );
}
