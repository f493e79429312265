//! The multi-process mode with `NCCL_COMM_ID`: the id names that address, and rank 0's
//! init starts the hub there. The test runs in a child of this test binary whose
//! environment sets `NCCL_COMM_ID` (and has no launcher or NCCL variable of the caller's).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::procs::{self, ProcsRig as _};

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use crate::common::NCCL_OK;
use nccl_mock::network_threads;
use nccl_sys::ncclResult_t;
use procs::{Coll, free_port, id_address, process};

/// Both ranks of the fixed address all-gather `[101, 102]`; rank 1 comes first (it
/// retries until rank 0's init has started the hub).
fn all_gather(id: [u8; 128]) {
    let threads: Vec<_> = [1, 0]
        .into_iter()
        .map(|r| {
            std::thread::spawn(move || {
                if r == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                let rig = process(Duration::from_secs(20));
                let (rc, comm) = rig.init_rank(0, id, 2, r);
                assert_eq!(rc, NCCL_OK, "{}", rig.last_error());
                let (rc, out) = rig.run(0, Coll::AllGather, &[101 + r], 1, 2, 0, comm);
                rig.destroy(comm);
                assert!(rig.world.live().is_empty());
                (rc, out)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), (NCCL_OK, vec![101, 102]));
    }
}

#[test]
fn nccl_comm_id_names_the_hub_rank_0_starts() {
    // Below the ephemeral range: nothing else takes the port once it is freed.
    let addr = free_port();
    if !test_support::in_scrubbed_child!(
        "nccl_comm_id_names_the_hub_rank_0_starts",
        &[("NCCL_COMM_ID", OsStr::new(&addr))],
    ) {
        return;
    }
    // The child's address is its parent's.
    let addr = std::env::var("NCCL_COMM_ID").unwrap();
    let busy = std::net::TcpListener::bind(&addr).unwrap();

    // Every call, in every process, gives the same id naming the address.
    let (a, b) = (
        process(Duration::from_secs(1)),
        process(Duration::from_secs(1)),
    );
    let id = a.unique_id();
    assert_eq!(b.unique_id(), id);
    assert_eq!(&id[..8], b"MOCKADDR");
    assert_eq!(id_address(&id), addr);

    // The port is taken: rank 0 cannot start the hub.
    let (rc, _) = a.init_rank(0, id, 2, 0);
    assert_eq!(rc, ncclResult_t::ncclSystemError);
    let msg = a.last_error();
    assert!(
        msg.contains(&format!("rank 0 cannot start the hub at {addr}")),
        "{msg}"
    );
    assert!(a.world.live().is_empty());
    drop(busy);

    all_gather(id);
    // The hub stopped listening once its ranks had come: the address serves the next
    // communicator.
    all_gather(id);

    let deadline = Instant::now() + Duration::from_secs(10);
    while network_threads() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(network_threads(), 0);
}
