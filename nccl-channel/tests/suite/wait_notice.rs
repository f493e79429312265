//! A wait that lasts says so once on stderr (`NCCL_CHANNEL_WAIT_NOTICE_SECS`, here 1 s):
//! what it waits for, for how long, its deadline and the likely causes; then it still
//! ends at its deadline. Each test runs its body in a child process of this binary and
//! reads the child's stderr.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::assert_nccl_error;
#[cfg(feature = "rendezvous")]
use crate::common::loopback_port;
use cuda_hal::Cuda;
use cuda_mock::MockDriver;
use nccl_channel::{CommConfig, Communicator, Error, UniqueId};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::ncclResult_t;
use test_support::this_test;

/// Set in the child that runs a test's body: the test's name.
const CHILD: &str = "NCCL_CHANNEL_WAIT_NOTICE_CHILD";

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|c| c == name)
}

/// Runs test `name` (its full name in this binary) in a child with `NCCL_CHANNEL_WAIT_NOTICE_SECS=1` and
/// returns its stderr lines that begin with `prefix`; the child must pass.
fn child_lines(name: &str, prefix: &str) -> Vec<String> {
    child_lines_with(name, prefix, &[])
}

/// As [`child_lines`], with `env` added to the child's environment.
fn child_lines_with(name: &str, prefix: &str, env: &[(&str, &str)]) -> Vec<String> {
    let out = test_support::env::scrubbed(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .env(CHILD, name)
        .env("NCCL_CHANNEL_WAIT_NOTICE_SECS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "no test named {name}: {stdout}"
    );
    stderr
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(String::from)
        .collect()
}

const CAUSES: &str = "Likely causes: a second rank driven from this thread outside a group \
                      (group the ranks' calls, or use one thread per rank); ranks disagreeing \
                      on the world size or the unique id; a peer that died or never started.";

/// Two simulated devices and their NCCL, whose peers wait at most `timeout`.
fn machine(timeout: Duration) -> (Cuda, Arc<nccl_sys::Nccl>, MockNcclWorld) {
    let (cuda, gpus) = MockDriver::with_devices(2)
        .build_with(Cuda::from_driver)
        .unwrap();
    let (nccl, world) = MockNccl::new(&gpus).timeout(timeout).build().unwrap();
    (cuda, Arc::new(nccl), world)
}

/// Rank 0 of 2 alone, non-blocking with a deadline of 2.5 s: one notice after 1 s naming
/// the init, its deadline and the causes, then `Error::Timeout` at the deadline.
#[test]
fn a_non_blocking_init_waiting_for_a_peer_says_so_once_then_times_out() {
    let name = this_test!();
    if !is_child(&name) {
        assert_eq!(
            child_lines(&name, "nccl-channel:"),
            [format!(
                "nccl-channel: still waiting after 1 s for init of rank 0 of 2 on device 0 \
                 (ncclCommInitRankConfig); it fails at its deadline of 2.5s \
                 (CommConfig::timeout). {CAUSES}"
            )]
        );
        return;
    }
    let (cuda, nccl, _world) = machine(Duration::from_secs(20));
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let id = UniqueId::generate(&nccl).unwrap();
    let deadline = Duration::from_millis(2500);
    let config = CommConfig::non_blocking(deadline);
    let started = Instant::now();
    let e = Communicator::init_rank_with(&nccl, &ctx, &id, 2, 0, &config).unwrap_err();
    let took = started.elapsed();
    assert_eq!(
        e,
        Error::Timeout {
            what: "ncclCommInitRankConfig".into(),
            after: deadline
        }
    );
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(1),
        "{took:?}"
    );
}

/// A blocking init (the default config) blocks inside NCCL: the watchdog says so once
/// for the init that waits, and never for one that returned before the threshold.
#[test]
fn a_blocking_init_waiting_for_a_peer_is_noticed_by_the_watchdog() {
    let name = this_test!();
    if !is_child(&name) {
        assert_eq!(
            child_lines(&name, "nccl-channel:"),
            [format!(
                "nccl-channel: still waiting after 1 s for init of rank 1 of 2 on device 1 \
                 (ncclCommInitRank); it has no deadline: a blocking communicator waits inside \
                 NCCL (CommConfig::non_blocking(timeout) bounds the wait). {CAUSES}"
            )]
        );
        return;
    }
    // The simulated NCCL gives up after 2.5 s (real NCCL would wait for ever).
    let (cuda, nccl, _world) = machine(Duration::from_millis(2500));
    let ctxs = [
        cuda.device(0).unwrap().primary_context().unwrap(),
        cuda.device(1).unwrap().primary_context().unwrap(),
    ];
    // Two ranks that meet at once: nothing is said, now or after the threshold.
    let id = UniqueId::generate(&nccl).unwrap();
    let comms = std::thread::scope(|s| {
        let peer = s.spawn(|| Communicator::init_rank(&nccl, &ctxs[0], &id, 2, 0));
        let me = Communicator::init_rank(&nccl, &ctxs[1], &id, 2, 1);
        (peer.join().unwrap().unwrap(), me.unwrap())
    });
    drop(comms);
    std::thread::sleep(Duration::from_millis(1500));
    // Rank 1 alone.
    let id = UniqueId::generate(&nccl).unwrap();
    let started = Instant::now();
    let e = Communicator::init_rank(&nccl, &ctxs[1], &id, 2, 1).unwrap_err();
    assert_nccl_error(&e, "ncclCommInitRank", ncclResult_t::ncclSystemError);
    assert!(started.elapsed() >= Duration::from_millis(2500));
    // The watchdog said nothing after the call returned.
    std::thread::sleep(Duration::from_millis(1500));
}

/// Rank 1 of 2 waits at a rendezvous nobody serves: one notice naming the address, then
/// the rendezvous's error at its deadline.
#[cfg(feature = "rendezvous")]
#[test]
fn a_rendezvous_nobody_serves_says_so_once_then_fails() {
    let name = this_test!();
    const PORT: &str = "NCCL_CHANNEL_WAIT_NOTICE_PORT";
    if !is_child(&name) {
        let port = loopback_port().to_string();
        assert_eq!(
            child_lines_with(&name, "nccl-channel:", &[(PORT, &port)]),
            [format!(
                "nccl-channel: still waiting after 1 s for the rendezvous at 127.0.0.1:{port} \
                 (rank 1 of 2); it fails at its deadline of 2.5s (the rendezvous timeout). \
                 {CAUSES}"
            )]
        );
        return;
    }
    let port = std::env::var(PORT).unwrap();
    let rdv = nccl_channel::Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_millis(2500));
    let started = Instant::now();
    let e = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert!(matches!(e, Error::Rendezvous { .. }), "{e}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// Ranks holding different secrets: rank 1's notice says that rank 0 answered but could
/// not prove the secret, not the generic causes, and rank 1 still ends at its deadline.
#[cfg(feature = "rendezvous")]
#[test]
fn a_rank_whose_rank_0_cannot_prove_the_secret_is_told_so() {
    let name = this_test!();
    const PORT: &str = "NCCL_CHANNEL_WAIT_NOTICE_PORT";
    if !is_child(&name) {
        let port = loopback_port().to_string();
        let lines = child_lines_with(&name, "nccl-channel:", &[(PORT, &port)]);
        let ours: Vec<_> = lines
            .iter()
            .filter(|l| l.contains("(rank 1 of 2)"))
            .collect();
        assert_eq!(ours.len(), 1, "{lines:?}");
        assert!(
            ours[0].contains("answered, but what answered could not prove it knows the secret"),
            "{}",
            ours[0]
        );
        assert!(!ours[0].contains(CAUSES), "{}", ours[0]);
        return;
    }
    let port = std::env::var(PORT).unwrap();
    let rdv = |b: u8| {
        nccl_channel::Rendezvous::tcp(&format!("127.0.0.1:{port}"))
            .unwrap()
            .timeout(Duration::from_millis(2500))
            .secret(nccl_channel::RendezvousSecret::new([b; 16]).unwrap())
    };
    let (zero, one) = std::thread::scope(|s| {
        let zero = s.spawn(|| rdv(1).exchange_with(0, 2, || Ok(UniqueId([1; 128]))));
        let one = rdv(2).exchange_with(1, 2, || unreachable!());
        (zero.join().unwrap(), one)
    });
    assert!(
        matches!(one, Err(Error::RendezvousRefused { .. })),
        "{one:?}"
    );
    assert!(zero.is_err());
}
