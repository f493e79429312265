//! A process that never asks for a channel never opens libnccl. The check runs in a child
//! of this test binary, a process of its own where nothing loads NCCL first, with no
//! launcher or NCCL variable of the caller's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn libnccl_mapped() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .any(|l| l.contains("libnccl"))
}

#[test]
fn no_world_no_nccl() {
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    for family in nccl_channel::ENV_FAMILIES {
        assert!(
            std::env::var_os(family.size).is_none(),
            "{} is set in this test's environment",
            family.size
        );
    }
    // The default channel with no world configured: no channel, and NCCL untouched.
    assert!(nccl_channel::Channel::from_env().unwrap().is_none());
    assert!(!nccl_channel::nccl_opened());
    assert!(!libnccl_mapped());
    // Asking for NCCL opens it (or fails to find it), and only then.
    let _ = nccl_channel::nccl();
    assert!(nccl_channel::nccl_opened());
}
