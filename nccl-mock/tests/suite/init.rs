//! Inits in one process that cannot complete fail at once instead of waiting for their
//! deadline (real NCCL hangs there).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use nccl_sys::ncclResult_t;

use crate::common::Rig;
use crate::common::procs::{ProcsRig, id_from};

/// `ncclCommInitRank` of rank `r` of `n` on another thread, without a current context
/// (device 0): its status and last error.
fn init_on_a_thread(
    rig: &Rig,
    id: [u8; 128],
    n: i32,
    r: i32,
) -> std::thread::JoinHandle<(ncclResult_t, String)> {
    let (init, last) = (
        rig.nccl.fns().ncclCommInitRank,
        rig.nccl.fns().ncclGetLastError,
    );
    std::thread::spawn(move || {
        let mut comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and unique id.
        let rc = unsafe { init(&mut comm, n, id_from(id), r) };
        // SAFETY: the simulated NCCL returns a NUL-terminated string it owns.
        let msg = unsafe { std::ffi::CStr::from_ptr(last(std::ptr::null_mut())) };
        (rc, msg.to_string_lossy().into_owned())
    })
}

/// Two ranks of one unique id, one asking for 2 ranks and the other for 3: both fail at
/// once with `ncclInvalidArgument` and a last error naming both sizes, the rank that came
/// first and waits included.
#[test]
fn ranks_that_disagree_on_the_world_size_fail_at_once() {
    // Long enough that a rank left waiting for its deadline fails the timing check.
    let rig = Rig::with_timeout(2, Duration::from_secs(30));
    let id = rig.unique_id();
    let want = "the ranks of one unique id disagree on the world size: rank 1 asked for 3 \
                ranks, another rank for 2";
    let started = Instant::now();
    let first = init_on_a_thread(&rig, id, 2, 0);
    // Rank 0 waits in the init before rank 1 comes.
    std::thread::sleep(Duration::from_millis(200));
    let (rc, _) = rig.init_rank(1, id, 3, 1);
    let second = (rc, rig.last_error());
    let first = first.join().unwrap();
    assert_eq!(
        second,
        (ncclResult_t::ncclInvalidArgument, want.to_string())
    );
    assert_eq!(first, (ncclResult_t::ncclInvalidArgument, want.to_string()));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Ranks that agree still meet.
    let id = rig.unique_id();
    let h = init_on_a_thread(&rig, id, 2, 0);
    let rc1 = rig.init_rank(1, id, 2, 1).0;
    assert_eq!(
        (h.join().unwrap().0, rc1),
        (ncclResult_t::ncclSuccess, ncclResult_t::ncclSuccess)
    );
}
