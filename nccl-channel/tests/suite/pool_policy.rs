//! The pool follows its table ([`PoolPolicy`]): the measured default, one set on the
//! communicator, or the file `NCCL_CHANNEL_POOL_POLICY` names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;

use cuda_hal::Stream;
use nccl_channel::{Communicator, Error, PoolMemory, PoolPolicy, ReduceOp};

use crate::common::Rig;

/// The smallest power-of-two size (bytes) at which `table` registers `coll`.
fn first_registered(table: &PoolPolicy, coll: &str) -> Option<usize> {
    (2..=32)
        .map(|k| 1usize << k)
        .find(|&b| table.memory(coll, b) == PoolMemory::Registered)
}

/// Whether the pooled buffer of `bytes` bytes that `comm`'s `coll` uses ends up registered.
fn registers(comm: &Communicator, stream: &Stream, coll: &str, bytes: usize) -> bool {
    let mut b = comm.buffer::<f32>(bytes / 4).unwrap();
    match coll {
        "all_gather" => comm.all_gather_in_place(&mut b, stream).unwrap(),
        "all_reduce" => comm
            .all_reduce_in_place(&mut b, ReduceOp::Sum, stream)
            .unwrap(),
        "broadcast" => comm.broadcast_in_place(&mut b, 0, stream).unwrap(),
        "reduce" => comm
            .reduce_in_place(&mut b, ReduceOp::Sum, 0, stream)
            .unwrap(),
        other => panic!("{other}"),
    }
    stream.synchronize().unwrap();
    let r = b.is_registered();
    drop(b);
    comm.trim_pool().unwrap();
    r
}

#[test]
fn without_a_table_of_its_own_the_pool_follows_the_measured_one() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    let measured = PoolPolicy::measured();
    let from = first_registered(measured, "all_gather").expect("the table registers all_gather");
    assert!(registers(&comm, &s, "all_gather", from));
    assert!(!registers(&comm, &s, "all_gather", from - 4));
    // Measured slower registered (BENCHMARKS.md): broadcast never registers.
    assert_eq!(first_registered(measured, "broadcast"), None);
    assert!(!registers(&comm, &s, "broadcast", from));
    drop((s, comm, ctx));
    rig.assert_clean();
}

#[test]
fn a_table_set_on_the_communicator_rules_from_then_on() {
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    comm.set_pool_policy(
        PoolPolicy::parse("all_reduce 4K registered\nall_reduce 8K plain").unwrap(),
    );
    assert!(!registers(&comm, &s, "all_reduce", 4092));
    assert!(registers(&comm, &s, "all_reduce", 4096));
    assert!(registers(&comm, &s, "all_reduce", 8188));
    assert!(!registers(&comm, &s, "all_reduce", 8192));
    assert!(!registers(&comm, &s, "all_gather", 4096));
    // A registered buffer stays so in the pool when the table changes.
    let mut kept = comm.buffer::<f32>(1024).unwrap();
    comm.all_reduce_in_place(&mut kept, ReduceOp::Sum, &s)
        .unwrap();
    assert!(kept.is_registered());
    drop(kept);
    comm.set_pool_policy(PoolPolicy::plain());
    let again = comm.buffer::<f32>(1024).unwrap();
    assert!(again.is_registered());
    drop(again);
    assert!(!registers(&comm, &s, "all_reduce", 4096 + 4));
    comm.trim_pool().unwrap();
    drop((s, comm, ctx));
    rig.assert_clean();
}

/// The variable's table replaces the measured one; one it cannot read is the first
/// `buffer` call's error, naming the variable.
#[test]
fn the_environment_names_the_process_default() {
    let dir = std::env::temp_dir().join(format!("pool-policy-{}", std::process::id()));
    let file = dir.join("policy.tsv");
    if !test_support::in_scrubbed_child!(
        "the_environment_names_the_process_default",
        &[("NCCL_CHANNEL_POOL_POLICY", file.as_os_str())]
    ) {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // The parent's path (its process id).
    let file = std::path::PathBuf::from(std::env::var_os(nccl_channel::POOL_POLICY_ENV).unwrap());
    let dir = file.parent().unwrap().to_path_buf();
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    let env_error = |comm: &Communicator| match comm.buffer::<f32>(4) {
        Err(Error::Env {
            variable,
            value,
            problem,
        }) => {
            assert_eq!(variable, nccl_channel::POOL_POLICY_ENV);
            assert_eq!(OsStr::new(&value), file.as_os_str());
            problem
        }
        other => panic!("{other:?}"),
    };
    // Not there yet: an error, not the measured table.
    let problem = env_error(&comm);
    assert!(problem.starts_with("reading the pool policy "), "{problem}");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&file, "reduce 16 registred\n").unwrap();
    let problem = env_error(&comm);
    assert!(
        problem.contains("line 1: unknown memory \"registred\""),
        "{problem}"
    );
    std::fs::write(&file, "reduce 16 registered\n").unwrap();
    assert!(registers(&comm, &s, "reduce", 16));
    assert!(!registers(&comm, &s, "all_gather", 64 << 20));
    // A communicator's own table needs no variable.
    std::fs::remove_file(&file).unwrap();
    let (ctx2, other) = rig.one_rank(0);
    other.set_pool_policy(PoolPolicy::plain());
    assert!(!registers(&other, &s, "reduce", 16));
    std::fs::remove_dir_all(&dir).unwrap();
    drop((s, comm, other, ctx, ctx2));
    rig.assert_clean();
}
