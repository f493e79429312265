//! `IdSource::Auto` with several ranks and no `NCCL_COMM_ID` goes through the rendezvous the
//! environment names. Run in a child of this test binary whose environment has exactly
//! those variables (of the launcher and NCCL families).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;

use crate::common::{Rig, all_gather_and_close, loopback_port, on_threads};
use nccl_channel::World;

#[test]
fn auto_uses_nccl_channel_rendezvous_when_nccl_comm_id_is_unset() {
    let port = loopback_port();
    // Chosen by the test's process and passed on; the child reads the variable.
    let address = format!("127.0.0.1:{port}");
    if !test_support::this_test_in_scrubbed_child!(&[
        ("NCCL_CHANNEL_RENDEZVOUS", OsStr::new(&address)),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", OsStr::new("20")),
    ]) {
        return;
    }
    Rig::new(2).check(|rig| {
        let out = on_threads(2, |r| {
            let ch = rig
                .channel(World::new(2, r).unwrap())
                .build()
                .unwrap()
                .unwrap();
            all_gather_and_close(ch, &[10 + r as i32])
        });
        assert_eq!(out, vec![vec![10, 11]; 2]);
    });
}
