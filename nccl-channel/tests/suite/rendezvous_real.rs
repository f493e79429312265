//! The rendezvous with the real libnccl of NCCL 2.18.3 (the pinned wheel; no GPU needed):
//! the release where ids derived from `NCCL_COMM_ID` differ between calls, so the
//! environment alone cannot give ranks a shared id. Rank 0 makes one with the real
//! `ncclGetUniqueId` and three ranks (threads) agree on it through the rendezvous.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::time::Duration;

use crate::common::loopback_port;
use nccl_channel::{Error, Rendezvous, UniqueId, World};
use nccl_sys::NcclVersion;

use crate::common::wheel::{self, load_trusted};

/// Names the library its own tests use (or, in their child, the one the parent found).
const LIBNCCL_2_18: &str = "NCCL_CHANNEL_TEST_LIBNCCL_2_18";

fn libnccl_2_18() -> std::path::PathBuf {
    wheel::libnccl("2.18.3", LIBNCCL_2_18)
}

/// Runs test `name` in a child without the caller's launcher and NCCL variables (the real
/// `ncclGetUniqueId` reads `NCCL_COMM_ID`), giving it the library; `true` in the child.
fn in_child(name: &str) -> bool {
    let lib = libnccl_2_18();
    test_support::in_scrubbed_child!(name, &[(LIBNCCL_2_18, lib.as_os_str())])
}

#[test]
fn three_ranks_agree_on_a_real_nccl_2_18_id() {
    if !in_child("three_ranks_agree_on_a_real_nccl_2_18_id") {
        return;
    }
    let nccl = load_trusted(libnccl_2_18()).unwrap();
    assert_eq!(nccl.version(), NcclVersion::new(2, 18, 3));
    let port = loopback_port().to_string();
    let made = Mutex::new(Vec::new());
    let ids: Vec<UniqueId> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let (nccl, made, port) = (&nccl, &made, &port);
                s.spawn(move || {
                    let r = rank.to_string();
                    let vars = [
                        ("WORLD_SIZE", "3"),
                        ("RANK", r.as_str()),
                        ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", port.as_str()),
                        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "60"),
                    ];
                    let lookup = |name: &str| {
                        vars.iter()
                            .find(|(k, _)| *k == name)
                            .map(|(_, v)| v.to_string())
                    };
                    let world = World::from_lookup(lookup).unwrap().unwrap();
                    let rdv = Rendezvous::from_lookup(&world, lookup).unwrap().unwrap();
                    rdv.exchange_with(world.rank, world.size, || {
                        let id = UniqueId::generate(nccl)?;
                        made.lock().unwrap().push(id);
                        Ok::<_, Error>(id)
                    })
                    .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made = made.into_inner().unwrap();
    assert_eq!(made.len(), 1, "rank 0 made exactly one id");
    assert_eq!(ids, vec![made[0]; 3]);
    assert_ne!(
        made[0],
        UniqueId([0; 128]),
        "ncclGetUniqueId gave an all-zero id"
    );
    println!(
        "NCCL {}: 3 ranks share id {}…",
        nccl.version(),
        &made[0].to_hex()[..32]
    );
}

#[test]
fn the_same_through_exchange_with_nccl() {
    if !in_child("the_same_through_exchange_with_nccl") {
        return;
    }
    let nccl = load_trusted(libnccl_2_18()).unwrap();
    let port = loopback_port();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(60));
    let ids: Vec<UniqueId> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let (nccl, rdv) = (&nccl, &rdv);
                s.spawn(move || rdv.exchange(nccl, rank, 3).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ids, vec![ids[0]; 3]);
    assert_ne!(ids[0], UniqueId([0; 128]));
}
