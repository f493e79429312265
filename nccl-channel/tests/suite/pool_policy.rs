//! The pool follows its table ([`PoolPolicy`]): the measured default, one set on the
//! communicator, or the file `NCCL_CHANNEL_POOL_POLICY` names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;

use cuda_hal::Stream;
use nccl_channel::{Collective, Communicator, Error, PoolMemory, PoolPolicy, ReduceOp};

use crate::common::{OneRank, Rig, on_one_rank};

/// The smallest power-of-two size (bytes) at which `table` registers `coll`.
fn first_registered(table: &PoolPolicy, coll: &str) -> Option<usize> {
    (2..=32)
        .map(|k| 1usize << k)
        .find(|&b| table.memory(coll.parse().unwrap(), b) == PoolMemory::Registered)
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
    // Not where the caller's environment names a table.
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    on_one_rank(1, |_, OneRank { comm, s, .. }| {
        let measured = PoolPolicy::measured();
        let from =
            first_registered(measured, "all_gather").expect("the table registers all_gather");
        assert!(registers(&comm, &s, "all_gather", from));
        assert!(!registers(&comm, &s, "all_gather", from - 4));
        // Measured slower registered (BENCHMARKS.md): broadcast never registers.
        assert_eq!(first_registered(measured, "broadcast"), None);
        assert!(!registers(&comm, &s, "broadcast", from));
    });
}

#[test]
fn a_table_set_on_the_communicator_rules_from_then_on() {
    on_one_rank(1, |_, OneRank { comm, s, .. }| {
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
    });
}

/// The variable's table replaces the measured one; one it cannot read is the first
/// `buffer` call's error, naming the variable.
#[test]
fn the_environment_names_the_process_default() {
    let dir = std::env::temp_dir().join(format!("pool-policy-{}", std::process::id()));
    let file = dir.join("policy.tsv");
    if !test_support::this_test_in_scrubbed_child!(&[(
        "NCCL_CHANNEL_POOL_POLICY",
        file.as_os_str()
    )]) {
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
    assert_eq!(
        problem,
        format!(
            "reading the pool policy {} failed: No such file or directory (os error 2)",
            file.display()
        )
    );
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

/// The table's sizes are the benchmark's (nccl-tests') sizes: for an all-gather, the
/// bytes of the whole receive buffer, with both buffers registered (`-R 1` registers the
/// send and the receive buffer). `pool-policy` wrote "all_gather 8 MiB registered" from
/// the 8 MiB row, so an 8 MiB all-gather on two ranks (4 MiB sent by each) should register
/// both of its pooled buffers; the pool looks the send buffer up by its own 4 MiB instead
/// and left it unregistered (found in review; on 8 ranks the send buffer of a 64 MiB
/// all-gather, 8 MiB of it, was the first that registered).
#[test]
fn an_all_gather_follows_the_row_of_its_benchmark_size() {
    let measured = PoolPolicy::measured();
    assert_eq!(
        measured.memory(Collective::AllGather, 8 << 20),
        PoolMemory::Registered
    );
    assert_eq!(
        measured.memory(Collective::AllGather, 4 << 20),
        PoolMemory::Plain
    );
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

/// The other collective whose buffers differ in size: a reduce-scatter's receive buffer
/// is looked up by the scattered buffer's size; and a share never by more than its
/// collective.
#[test]
fn shares_are_looked_up_by_their_collectives_size() {
    let rig = Rig::new(2);
    let n = (2 << 20) / 4; // 2 MiB of f32
    let out = rig.run(2, |c, s| {
        c.set_pool_policy(
            PoolPolicy::parse("reduce_scatter 4M registered\nall_gather 8M registered").unwrap(),
        );
        // A 4 MiB reduce-scatter: 4 MiB sent, 2 MiB received by each rank.
        let send = c.buffer::<f32>(2 * n).unwrap();
        let mut recv = c.buffer::<f32>(n).unwrap();
        c.reduce_scatter(&*send, &mut *recv, ReduceOp::Sum, s)
            .unwrap();
        // A 4 MiB all-gather: below its rule, neither buffer registers.
        let mut gathered = c.buffer::<f32>(2 * n).unwrap();
        let share = c.buffer::<f32>(n).unwrap();
        c.all_gather(&*share, &mut *gathered, s).unwrap();
        s.synchronize().unwrap();
        [
            send.is_registered(),
            recv.is_registered(),
            share.is_registered(),
            gathered.is_registered(),
        ]
    });
    assert_eq!(out, vec![[true, true, false, false]; 2]);
}

/// A table file must be a regular file of at most 1 MiB: a device or a pipe would block
/// or never end.
#[test]
fn a_table_file_is_a_regular_file_of_at_most_a_mebibyte() {
    for path in ["/dev/zero", "/"] {
        match PoolPolicy::from_file(path) {
            Err(Error::InvalidArgument { what, problem }) => {
                assert_eq!(what, "PoolPolicy::from_file");
                assert_eq!(
                    problem,
                    format!("{path} is not a regular file of at most 1048576 bytes")
                );
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    let dir = std::env::temp_dir().join(format!("pool-policy-size-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.tsv");
    let line = "# padding\n".repeat((1 << 20) / 10 + 1);
    std::fs::write(&big, &line).unwrap();
    assert!(matches!(
        PoolPolicy::from_file(&big),
        Err(Error::InvalidArgument { .. })
    ));
    std::fs::write(&big, &line[..1 << 20]).unwrap();
    assert_eq!(PoolPolicy::from_file(&big).unwrap(), PoolPolicy::plain());
    match PoolPolicy::from_file(dir.join("missing.tsv")) {
        Err(Error::Io { what, source, .. }) => {
            assert_eq!(what, "reading the pool policy");
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An empty `NCCL_CHANNEL_POOL_POLICY` is unset, as every other path variable of this
/// workspace (`NCCL_SYS_LIBRARY`, `CUDA_SYS_LIBRARY`, `CUDA_HOME`: cuda-sys's `env_path`).
/// Found in review: the pool read it as the file "" and failed every `buffer` call.
#[test]
fn an_empty_pool_policy_variable_is_unset() {
    if !test_support::this_test_in_scrubbed_child!(&[(
        "NCCL_CHANNEL_POOL_POLICY",
        std::ffi::OsStr::new("")
    )]) {
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
