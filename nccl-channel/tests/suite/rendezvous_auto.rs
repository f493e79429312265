//! `IdSource::Auto` with several ranks and no `NCCL_COMM_ID` goes through the rendezvous the
//! environment names. Run in a child of this test binary whose environment has exactly
//! those variables (of the launcher and NCCL families).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;

use crate::common::Rig;
use cuda_hal::DeviceBuffer;
use nccl_channel::{ChannelBuilder, World};

#[test]
fn auto_uses_nccl_channel_rendezvous_when_nccl_comm_id_is_unset() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Chosen by the test's process and passed on; the child reads the variable.
    let address = format!("127.0.0.1:{port}");
    if !test_support::in_scrubbed_child!(
        "auto_uses_nccl_channel_rendezvous_when_nccl_comm_id_is_unset",
        &[
            ("NCCL_CHANNEL_RENDEZVOUS", OsStr::new(&address)),
            ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", OsStr::new("20")),
        ],
    ) {
        return;
    }
    let rig = Rig::new(2);
    let out: Vec<Vec<i32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (cuda, nccl) = (rig.cuda.clone(), rig.nccl.clone());
                s.spawn(move || {
                    let ch = ChannelBuilder::new()
                        .world(World::new(2, r).unwrap())
                        .cuda(cuda)
                        .nccl(nccl)
                        .build()
                        .unwrap()
                        .unwrap();
                    let ctx = ch.comm().context();
                    let send = DeviceBuffer::from_slice(ctx, &[10 + r as i32]).unwrap();
                    let mut recv = DeviceBuffer::<i32>::alloc(ctx, 2).unwrap();
                    ch.comm().all_gather(&send, &mut recv, ch.stream()).unwrap();
                    ch.stream().synchronize().unwrap();
                    let v = recv.to_vec().unwrap();
                    drop((send, recv));
                    ch.close().unwrap();
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(out, vec![vec![10, 11]; 2]);
    rig.assert_clean();
}
