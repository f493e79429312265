//! Review findings on the pool's table (issue 30): each test fails on the reviewed commit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use nccl_channel::{PoolMemory, PoolPolicy};

use crate::common::Rig;

/// The table's sizes are the benchmark's (nccl-tests') sizes: for an all-gather, the
/// bytes of the whole receive buffer, with both buffers registered (`-R 1` registers the
/// send and the receive buffer). `pool-policy` wrote "all_gather 8 MiB registered" from
/// the 8 MiB row, so an 8 MiB all-gather on two ranks (4 MiB sent by each) should register
/// both of its pooled buffers; the pool looks the send buffer up by its own 4 MiB instead
/// and leaves it unregistered (on 8 ranks the send buffer of a 64 MiB all-gather, 8 MiB of
/// it, is the first that registers).
#[test]
fn an_all_gather_follows_the_row_of_its_benchmark_size() {
    let measured = PoolPolicy::measured();
    assert_eq!(
        measured.memory("all_gather", 8 << 20),
        PoolMemory::Registered
    );
    assert_eq!(measured.memory("all_gather", 4 << 20), PoolMemory::Plain);
    let rig = Rig::new(2);
    let n = (4 << 20) / 4; // 4 MiB of f32 per rank: an 8 MiB all-gather on two ranks
    let out = rig.run(2, |c, s| {
        c.set_pool_policy(PoolPolicy::measured().clone());
        let send = c.buffer::<f32>(n).unwrap();
        let mut recv = c.buffer::<f32>(2 * n).unwrap();
        c.all_gather(&*send, &mut *recv, s).unwrap();
        s.synchronize().unwrap();
        (send.is_registered(), recv.is_registered())
    });
    assert_eq!(
        out,
        vec![(true, true), (true, true)],
        "(send, recv) registered per rank"
    );
}

/// An empty `NCCL_CHANNEL_POOL_POLICY` is unset, as every other path variable of this
/// workspace (`NCCL_SYS_LIBRARY`, `CUDA_SYS_LIBRARY`, `CUDA_HOME`: cuda-sys's `env_path`);
/// the pool reads it as the file "" and fails every `buffer` call.
#[test]
fn an_empty_pool_policy_variable_is_unset() {
    if !test_support::in_scrubbed_child!(
        "an_empty_pool_policy_variable_is_unset",
        &[("NCCL_CHANNEL_POOL_POLICY", std::ffi::OsStr::new(""))]
    ) {
        return;
    }
    assert_eq!(
        std::env::var_os(nccl_channel::POOL_POLICY_ENV).as_deref(),
        Some(std::ffi::OsStr::new(""))
    );
    let rig = Rig::new(1);
    let (_ctx, comm) = rig.one_rank(0);
    let b = comm.buffer::<f32>(4);
    assert!(b.is_ok(), "{b:?}");
}
