//! NCCL 2.22–2.32's newer API on the simulated NCCL: suspend/resume and memory
//! statistics, simulated group ends, typed parameters, socket encryption; each refused
//! with `Error::Unsupported` naming its release on an older NCCL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::streams;
use cuda_hal::{CaptureMode, Context, Cuda, DeviceBuffer, Stream};
use cuda_mock::MockDriver;
use nccl_channel::{
    CommConfig, Communicator, Encryption, Error, Group, MemStats, Param, ReduceOp, SuspendFlags,
    group, set_encryption,
};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::{Nccl, NcclVersion};

fn machine(devices: usize, version: Option<NcclVersion>) -> (Cuda, Arc<Nccl>, MockNcclWorld) {
    let (cuda, gpus) = MockDriver::with_devices(devices)
        .build_with(Cuda::from_driver)
        .unwrap();
    let mut m = MockNccl::new(&gpus);
    if let Some(v) = version {
        m = m.version(v);
    }
    let (nccl, world) = m.build().unwrap();
    (cuda, Arc::new(nccl), world)
}

fn one_rank(version: Option<NcclVersion>) -> (Context, Communicator, MockNcclWorld) {
    let (cuda, nccl, world) = machine(1, version);
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    (ctx, comm, world)
}

fn unsupported(feature: &'static str, needed: &str, found: &str) -> Error {
    Error::Unsupported {
        feature,
        needed: needed.into(),
        found: found.into(),
    }
}

#[test]
fn a_suspended_communicator_refuses_collectives_until_resumed() {
    let (ctx, comm, world) = one_rank(None);
    let stream = Stream::new(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2]).unwrap();
    comm.suspend(SuspendFlags::MEM).unwrap();
    assert!(comm.is_suspended());
    assert_eq!(
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream),
        Err(Error::Suspended {
            what: "all_reduce_in_place"
        })
    );
    assert_eq!(
        comm.barrier(&stream),
        Err(Error::Suspended { what: "barrier" })
    );
    assert_eq!(
        comm.suspend(SuspendFlags::MEM),
        Err(Error::Suspended {
            what: "Communicator::suspend"
        })
    );
    comm.resume().unwrap();
    assert!(!comm.is_suspended());
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(buf.to_vec().unwrap(), [1, 2]);
    let e = comm.resume().unwrap_err();
    assert_eq!(
        e,
        Error::InvalidArgument {
            what: "Communicator::resume",
            problem: "the communicator is not suspended".into()
        }
    );
    assert_eq!(world.calls("ncclCommSuspend"), 1);
    assert_eq!(world.calls("ncclCommResume"), 1);
    assert_eq!(world.take_violations(), Vec::<String>::new());
}

#[test]
fn a_suspend_without_the_memory_flag_suspends_nothing() {
    let (ctx, comm, world) = one_rank(None);
    comm.suspend(SuspendFlags::NONE).unwrap();
    assert!(!comm.is_suspended());
    assert!(!comm.mem_stats().unwrap().suspended);
    let stream = Stream::new(&ctx).unwrap();
    comm.barrier(&stream).unwrap();
    assert_eq!(world.calls("ncclCommSuspend"), 1);
}

#[test]
fn memory_statistics_say_suspended_and_keep_their_counts() {
    let (_ctx, comm, _world) = one_rank(None);
    let active = comm.mem_stats().unwrap();
    // The simulated NCCL's model for one rank: 1 MiB + 64 KiB kept, 2 MiB suspendable.
    let expected = MemStats {
        suspendable: 2 << 20,
        suspended: false,
        persistent: (1 << 20) + (64 << 10),
        total: (3 << 20) + (64 << 10),
    };
    assert_eq!(active, expected);
    comm.suspend(SuspendFlags::MEM).unwrap();
    assert_eq!(
        comm.mem_stats().unwrap(),
        MemStats {
            suspended: true,
            ..expected
        }
    );
    comm.resume().unwrap();
    assert_eq!(comm.mem_stats().unwrap(), expected);
}

#[test]
fn a_suspend_inside_an_open_group_is_refused() {
    let (ctx, comm, world) = one_rank(None);
    let nccl = comm.nccl().clone();
    let stream = Stream::new(&ctx).unwrap();
    let r = group(&nccl, || {
        comm.barrier(&stream)?;
        comm.suspend(SuspendFlags::MEM)
    });
    let Err(Error::InFlight { what, problem }) = r else {
        panic!("{r:?}")
    };
    assert_eq!(what, "Communicator::suspend");
    assert!(problem.starts_with("a group is open"), "{problem}");
    assert_eq!(world.calls("ncclCommSuspend"), 0);
    // After the group, nothing holds it.
    stream.synchronize().unwrap();
    comm.suspend(SuspendFlags::MEM).unwrap();
}

/// A graph that captured the communicator's work could launch it on released memory:
/// the suspend is refused while the graph lives.
#[test]
fn a_suspend_is_refused_while_a_graph_holds_the_communicators_work() {
    let (ctx, comm, world) = one_rank(None);
    let stream = Stream::non_blocking(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[3u32]).unwrap();
    stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
        .unwrap();
    let graph = stream.end_capture().unwrap();
    let e = comm.suspend(SuspendFlags::MEM).unwrap_err();
    let Error::InFlight { what, problem } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*what, "Communicator::suspend");
    assert!(problem.contains("captured graph"), "{problem}");
    drop(graph);
    comm.suspend(SuspendFlags::MEM).unwrap();
    assert_eq!(world.calls("ncclCommSuspend"), 1);
    assert_eq!(world.take_violations(), Vec::<String>::new());
}

#[test]
fn suspend_is_unsupported_before_2_29_7() {
    let (_ctx, comm, _world) = one_rank(Some(NcclVersion::new(2, 29, 3)));
    let e = unsupported("ncclCommSuspend", "2.29.7", "2.29.3");
    assert_eq!(comm.suspend(SuspendFlags::MEM), Err(e));
    assert_eq!(
        comm.mem_stats(),
        Err(unsupported("ncclCommMemStats", "2.29.7", "2.29.3"))
    );
    assert_eq!(
        comm.resume(),
        Err(unsupported("ncclCommResume", "2.29.7", "2.29.3"))
    );
}

fn two_ranks(version: Option<NcclVersion>) -> (Arc<Nccl>, [Context; 2], Vec<Communicator>) {
    let (cuda, nccl, _world) = machine(2, version);
    let ctxs = [
        cuda.device(0).unwrap().primary_context().unwrap(),
        cuda.device(1).unwrap().primary_context().unwrap(),
    ];
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    (nccl, ctxs, comms)
}

/// The simulated group predicts, launches nothing, and leaves the ranks in step: a real
/// group afterwards runs as usual.
#[test]
fn a_simulated_group_predicts_its_time_and_runs_nothing() {
    let (nccl, ctxs, comms) = two_ranks(None);
    let streams = streams(&ctxs);
    let mut bufs = [
        DeviceBuffer::from_slice(&ctxs[0], &[1u32; 50_000]).unwrap(),
        DeviceBuffer::from_slice(&ctxs[1], &[2u32; 50_000]).unwrap(),
    ];
    let g = Group::start(&nccl).unwrap();
    for r in 0..2 {
        comms[r]
            .all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])
            .unwrap();
        comms[r]
            .broadcast_in_place(&mut bufs[r], 0, &streams[r])
            .unwrap();
    }
    // 4 calls of 200 000 bytes: 4 × (10 µs + 2 µs).
    assert_eq!(g.simulate_end().unwrap(), Duration::from_micros(48));
    for s in &streams {
        s.synchronize().unwrap();
    }
    assert_eq!(bufs[0].to_vec().unwrap()[0], 1, "nothing ran");
    assert_eq!(bufs[1].to_vec().unwrap()[0], 2, "nothing ran");
    group(&nccl, || {
        for r in 0..2 {
            comms[r].all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])?;
        }
        Ok(())
    })
    .unwrap();
    for r in 0..2 {
        streams[r].synchronize().unwrap();
        assert_eq!(bufs[r].to_vec().unwrap()[7], 3);
    }
}

#[test]
fn an_empty_simulated_group_predicts_zero() {
    let (nccl, _ctxs, _comms) = two_ranks(None);
    let g = Group::start(&nccl).unwrap();
    assert_eq!(g.simulate_end(), Ok(Duration::ZERO));
}

#[test]
fn a_simulated_group_of_non_blocking_communicators_is_refused() {
    let (cuda, nccl, _world) = machine(1, None);
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let id = nccl_channel::UniqueId::generate(&nccl).unwrap();
    let config = CommConfig::non_blocking(Duration::from_secs(10));
    let comm = Communicator::init_rank_with(&nccl, &ctx, &id, 1, 0, &config).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[5u8]).unwrap();
    let g = Group::start(&nccl).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
        .unwrap();
    let e = g.simulate_end().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { what: "Group::simulate_end", problem } if problem.contains("non-blocking")),
        "{e:?}"
    );
    comm.wait(&stream).unwrap();
    assert_eq!(buf.to_vec().unwrap(), [5]);
}

#[test]
fn simulate_end_is_unsupported_before_2_22() {
    let (nccl, _ctxs, _comms) = two_ranks(Some(NcclVersion::new(2, 21, 5)));
    let g = Group::start(&nccl).unwrap();
    assert_eq!(
        g.simulate_end(),
        Err(unsupported("ncclGroupSimulateEnd", "2.22.3", "2.21.5"))
    );
    // The group was still ended (by its drop): a new one starts and ends.
    Group::start(&nccl).unwrap().end().unwrap();
}

#[test]
fn parameters_are_typed() {
    let (_cuda, nccl, _world) = machine(1, None);
    // Strings: NCCL_DEBUG_TIMESTAMP_FORMAT has a default ("[%F %T] ") unless set.
    let fmt = Param::<String>::bind(&nccl, "NCCL_DEBUG_TIMESTAMP_FORMAT").unwrap();
    let want = std::env::var("NCCL_DEBUG_TIMESTAMP_FORMAT").unwrap_or("[%F %T] ".into());
    assert_eq!(fmt.get().unwrap(), want);
    for e in [
        Param::<i8>::bind(&nccl, "NCCL_DEBUG_TIMESTAMP_FORMAT").unwrap_err(),
        Param::<i32>::bind(&nccl, "NCCL_DEBUG").unwrap_err(),
        Param::<u8>::bind(&nccl, "NCCL_SET_THREAD_NAME").unwrap_err(),
        Param::<String>::bind(&nccl, "NCCL_DEBUG_LEVELS").unwrap_err(),
    ] {
        assert!(matches!(e, Error::ParamType { .. }), "{e:?}");
    }
    assert_eq!(
        Param::<u64>::get_value(&nccl, "NCCL_DEBUG_TIMESTAMP_FORMAT"),
        Err(Error::ParamType {
            key: "NCCL_DEBUG_TIMESTAMP_FORMAT".into(),
            asked: "u64"
        })
    );
    assert_eq!(
        Param::value_string(&nccl, "NCCL_NOPE"),
        Err(Error::UnknownParam {
            key: "NCCL_NOPE".into()
        })
    );
    assert_eq!(
        Param::<u32>::bind(&nccl, "NUL\0INSIDE").unwrap_err(),
        Error::UnknownParam {
            key: "NUL\0INSIDE".into()
        }
    );
    let keys = Param::keys(&nccl).unwrap();
    for k in ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"] {
        assert!(keys.iter().any(|x| x == k), "{k} in {keys:?}");
    }
}

#[test]
fn parameters_are_unsupported_before_2_30_4() {
    let (_cuda, nccl, _world) = machine(1, Some(NcclVersion::new(2, 30, 3)));
    assert_eq!(
        Param::<u64>::get_value(&nccl, "NCCL_DEBUG_SUBSYS"),
        Err(unsupported("ncclParamBind", "2.30.4", "2.30.3"))
    );
    assert_eq!(
        Param::keys(&nccl),
        Err(unsupported(
            "ncclParamGetAllParameterKeys",
            "2.30.4",
            "2.30.3"
        ))
    );
    assert_eq!(
        Param::dump_all(&nccl),
        Err(unsupported("ncclParamDumpAll", "2.30.4", "2.30.3"))
    );
}

#[test]
fn encryption_keys_are_checked_before_nccl() {
    let (_cuda, nccl, world) = machine(1, None);
    assert_eq!(
        set_encryption(&nccl, &Encryption::Psk("k".repeat(31))),
        Err(Error::InvalidArgument {
            what: "set_encryption",
            problem: "the pre-shared key holds 31 bytes; NCCL needs at least 32".into()
        })
    );
    let mut nul = "k".repeat(40);
    nul.insert(3, '\0');
    assert_eq!(
        set_encryption(&nccl, &Encryption::Psk(nul)),
        Err(Error::InvalidArgument {
            what: "set_encryption",
            problem: "the pre-shared key holds a NUL byte".into()
        })
    );
    assert_eq!(world.calls("ncclSetEncryption"), 0);
    set_encryption(&nccl, &Encryption::Psk("k".repeat(32))).unwrap();
    assert_eq!(world.calls("ncclSetEncryption"), 1);
    assert_eq!(format!("{:?}", Encryption::Psk("secret".into())), "Psk(..)");
    let (_cuda, old, _world) = machine(1, Some(NcclVersion::new(2, 31, 2)));
    assert_eq!(
        set_encryption(&old, &Encryption::None),
        Err(unsupported("ncclSetEncryption", "2.32.3", "2.31.2"))
    );
}
