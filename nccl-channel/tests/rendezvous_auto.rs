//! `IdSource::Auto` with several ranks and no `NCCL_COMM_ID` goes through the rendezvous the
//! environment names. Its own test process, because it sets variables for the whole process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Rig;
use cuda_hal::DeviceBuffer;
use nccl_channel::{ChannelBuilder, World};

#[test]
fn auto_uses_nccl_channel_rendezvous_when_nccl_comm_id_is_unset() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // SAFETY: no other thread of this test process reads the environment yet.
    unsafe {
        std::env::remove_var("NCCL_COMM_ID");
        std::env::set_var("NCCL_CHANNEL_RENDEZVOUS", format!("127.0.0.1:{port}"));
        std::env::set_var("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20");
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
