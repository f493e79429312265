//! Inits in one process that cannot complete fail at once instead of waiting for their
//! deadline (real NCCL hangs there).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use nccl_sys::ncclResult_t;

use crate::common::Rig;
use crate::common::procs::{Coll, ProcsRig, id_from};

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

/// The simulated NCCL's stderr lines in the child that ran test `name` of this module
/// (with `NCCL_CHANNEL_WAIT_NOTICE_SECS=1`); the child must pass.
fn notices_of_child(name: &str) -> Vec<String> {
    let name = test_support::test_name(module_path!(), name);
    let mut cmd = test_support::env::scrubbed(std::env::current_exe().unwrap());
    cmd.env(NOTICE_CHILD, &name)
        .env("NCCL_CHANNEL_WAIT_NOTICE_SECS", "1");
    let (_, stderr) = test_support::env::run_test_in_child(cmd, &name);
    stderr
        .lines()
        .filter(|l| l.starts_with("simulated NCCL:"))
        .map(String::from)
        .collect()
}

/// Set in the child that runs a notice test's body: the test's name.
const NOTICE_CHILD: &str = "NCCL_MOCK_NOTICE_CHILD";

fn is_notice_child(name: &str) -> bool {
    let name = test_support::test_name(module_path!(), name);
    std::env::var(NOTICE_CHILD).is_ok_and(|c| c == name)
}

/// The notice's text after "still waiting after 1 s for ".
fn notice(what: &str) -> String {
    format!(
        "simulated NCCL: still waiting after 1 s for {what}; it fails at the simulator's \
         deadline of 2.5s (MockNccl::timeout). Likely causes: a second rank driven from this \
         thread outside a group (group the ranks' calls, or use one thread per rank); ranks \
         disagreeing on the world size or the unique id; a peer that died or never started."
    )
}

/// One thread driving two ranks outside a group waits for a peer that can never come:
/// the blocking init, and a blocking all-reduce of a communicator made by
/// `ncclCommInitAll`, each say so once on stderr after the threshold, then fail at the
/// deadline. (An error at once is not sound: see `src/notice.rs`.)
#[test]
fn one_thread_driving_two_ranks_outside_a_group_is_noticed() {
    const NAME: &str = "one_thread_driving_two_ranks_outside_a_group_is_noticed";
    if !is_notice_child(NAME) {
        assert_eq!(
            notices_of_child(NAME),
            [
                notice("the init of rank 0 of 2 on device 0"),
                notice("ncclAllReduce of rank 0 of 2"),
            ]
        );
        return;
    }
    let rig = Rig::with_timeout(2, Duration::from_millis(2500));
    let id = rig.unique_id();
    let started = Instant::now();
    let (rc, _) = rig.init_rank(0, id, 2, 0);
    assert_eq!(rc, ncclResult_t::ncclSystemError);
    assert_eq!(
        rig.last_error(),
        "rank 0: not every rank of 2 joined within 2.5s"
    );
    assert!(started.elapsed() >= Duration::from_millis(2500));
    // A quick wait says nothing.
    let comms = rig.comms(2);
    let s = rig.stream(0);
    let buf = rig.upload(0, &[1f32]);
    let started = Instant::now();
    let rc = rig.coll::<f32>(
        Coll::AllReduce(nccl_sys::ncclRedOp_t::ncclSum),
        buf,
        buf,
        1,
        comms[0],
        s,
    );
    assert_ne!(rc, ncclResult_t::ncclSuccess);
    assert!(started.elapsed() >= Duration::from_millis(2500));
    for c in comms {
        rig.abort(c);
    }
    rig.free(buf);
}
