//! Communicators on the simulated NCCL: init forms, split, fallbacks, groups, every bad
//! input and injected fault, unique ids and the environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{
    Rig, all_gather_and_close, assert_nccl_error, on_threads, streams,
    two_ranks_without_a_shared_id,
};
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{
    CommConfig, Communicator, Error, Fp8E4M3, Group, IdSource, ReduceOp, UniqueId, World, group,
};
use nccl_sys::{NcclVersion, ncclResult_t};

#[test]
fn init_all_from_one_thread_with_groups() {
    Rig::new(3).check(|rig| {
        let (ctxs, comms) = rig.all_ranks(3);
        assert_eq!(
            comms
                .iter()
                .map(|c| (c.rank(), c.size(), c.device().ordinal()))
                .collect::<Vec<_>>(),
            [(0, 3, 0), (1, 3, 1), (2, 3, 2)]
        );
        let streams: Vec<_> = streams(&ctxs);
        let sends: Vec<_> = ctxs
            .iter()
            .enumerate()
            .map(|(r, c)| DeviceBuffer::from_slice(c, &[r as i32 + 1; 4]).unwrap())
            .collect();
        let mut recvs: Vec<_> = ctxs
            .iter()
            .map(|c| DeviceBuffer::<i32>::alloc(c, 4).unwrap())
            .collect();
        group(&rig.nccl, || {
            for (i, c) in comms.iter().enumerate() {
                c.all_reduce(&sends[i], &mut recvs[i], ReduceOp::Sum, &streams[i])?;
            }
            Ok(())
        })
        .unwrap();
        for r in &recvs {
            assert_eq!(r.to_vec().unwrap(), [6; 4]);
        }
    });
}

#[test]
fn init_rank_inside_a_group_from_one_thread() {
    Rig::new(2).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let ctxs = rig.contexts(2);
        // Raw: both ranks' init in one group, as NCCL allows.
        let g = Group::start(&rig.nccl).unwrap();
        let mut raws = [std::ptr::null_mut(); 2];
        for (r, ctx) in ctxs.iter().enumerate() {
            let _b = ctx.bind().unwrap();
            // SAFETY: a valid out-pointer.
            let rc = unsafe {
                (rig.nccl.fns().ncclCommInitRank)(&mut raws[r], 2, id.to_raw(), r as i32)
            };
            assert_eq!(rc, ncclResult_t::ncclSuccess);
        }
        g.end().unwrap();
        // SAFETY: both handles were made for these contexts and are owned here. Adopted
        // together: each gets its private channel by a split, which waits for the other's.
        let comms = unsafe {
            Communicator::from_raw_all(&rig.nccl, &[(&ctxs[0], raws[0]), (&ctxs[1], raws[1])])
        }
        .unwrap();
        assert_eq!(comms[1].rank(), 1);
    });
}

#[test]
fn split_into_single_rank_and_strided_comms() {
    Rig::new(4).check(|rig| {
        let out = rig.run(4, |comm, _| {
            let solo = comm.split(Some(comm.rank() as u32), 0).unwrap().unwrap();
            let parity = comm
                .split(Some((comm.rank() % 2) as u32), -(comm.rank() as i32))
                .unwrap()
                .unwrap();
            let none = comm
                .split(if comm.rank() == 3 { None } else { Some(0) }, 0)
                .unwrap();
            let s = Stream::new(comm.context()).unwrap();
            let b = DeviceBuffer::from_slice(comm.context(), &[comm.rank() as i64 + 1]).unwrap();
            let mut r = DeviceBuffer::<i64>::alloc(comm.context(), 1).unwrap();
            parity.all_reduce(&b, &mut r, ReduceOp::Sum, &s).unwrap();
            (
                solo.size(),
                solo.rank(),
                parity.size(),
                parity.rank(),
                none.map(|c| c.size()),
                r.to_vec().unwrap()[0],
            )
        });
        // Keys are minus the rank, so the higher old rank comes first in each parity comm.
        assert_eq!(out[0], (1, 0, 2, 1, Some(3), 1 + 3));
        assert_eq!(out[1], (1, 0, 2, 1, Some(3), 2 + 4));
        assert_eq!(out[2], (1, 0, 2, 0, Some(3), 1 + 3));
        assert_eq!(out[3], (1, 0, 2, 0, None, 2 + 4));
    });
}

#[test]
fn all_to_all_gather_scatter_fall_back_to_send_recv_before_2_28() {
    Rig::with_version(3, NcclVersion::new(2, 27, 7)).check(|rig| {
        assert!(rig.nccl.fns().ncclAlltoAll.is_none());
        let bad = rig.run(3, |comm, s| {
            crate::common::matrix::check_type::<f32>(comm, s).unwrap()
        });
        let bad: Vec<_> = bad.into_iter().flatten().collect();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(rig.world.calls("ncclAlltoAll"), 0);
        assert!(rig.world.calls("ncclSend") > 0);
    });
}

#[test]
fn fp8_needs_nccl_2_24() {
    Rig::with_version(1, NcclVersion::new(2, 23, 4)).check(|rig| {
        let out = rig.run(1, |comm, s| {
            let b = DeviceBuffer::<Fp8E4M3>::zeroed(comm.context(), 2).unwrap();
            let mut r = DeviceBuffer::<Fp8E4M3>::zeroed(comm.context(), 2).unwrap();
            comm.all_reduce(&b, &mut r, ReduceOp::Sum, s).unwrap_err()
        });
        assert_eq!(
            out[0],
            Error::Unsupported {
                feature: "fp8e4m3",
                needed: "2.24.0".into(),
                found: "2.23.4".into()
            }
        );
        assert_eq!(
            rig.world.calls("ncclAllReduce"),
            0,
            "checked before the FFI call"
        );
    });
}

#[test]
fn bad_arguments_are_typed_errors_before_any_ffi_call() {
    Rig::new(3).check(|rig| {
        let errs = rig.run(2, |comm, s| {
            let ctx = comm.context();
            let other = rig.context(2);
            let b4 = DeviceBuffer::<i32>::zeroed(ctx, 4).unwrap();
            let mut b3 = DeviceBuffer::<i32>::zeroed(ctx, 3).unwrap();
            let mut b8 = DeviceBuffer::<i32>::zeroed(ctx, 8).unwrap();
            let foreign = DeviceBuffer::<i32>::zeroed(&other, 4).unwrap();
            let foreign_stream = Stream::new(&other).unwrap();
            let e = vec![
                comm.all_reduce(&b4, &mut b3, ReduceOp::Sum, s).unwrap_err(),
                comm.all_gather(&b4, &mut b3, s).unwrap_err(),
                comm.reduce_scatter(&b4, &mut b3, ReduceOp::Sum, s)
                    .unwrap_err(),
                comm.broadcast(Some(b4.as_view()), &mut b8, 2, s)
                    .unwrap_err(),
                comm.reduce(&b4, None, ReduceOp::Max, comm.rank(), s)
                    .unwrap_err(),
                comm.send(&b4, 5, s).unwrap_err(),
                comm.recv(&mut b8, 2, s).unwrap_err(),
                comm.all_reduce(&foreign, &mut b8, ReduceOp::Sum, s)
                    .unwrap_err(),
                comm.all_gather(&b4, &mut b8, &foreign_stream).unwrap_err(),
                comm.all_to_all(&b3, &mut b3.clone_empty(), s).unwrap_err(),
                comm.all_gather_in_place(&mut b3, s).unwrap_err(),
                comm.scatter(None, &mut b3, comm.rank(), s).unwrap_err(),
            ];
            e
        });
        let e = &errs[0];
        assert_eq!(
            e[0],
            Error::LengthMismatch {
                what: "all_reduce",
                buffer: "recv",
                expected: 4,
                got: 3
            }
        );
        assert_eq!(
            e[1],
            Error::LengthMismatch {
                what: "all_gather",
                buffer: "recv",
                expected: 8,
                got: 3
            }
        );
        assert_eq!(
            e[2],
            Error::LengthMismatch {
                what: "reduce_scatter",
                buffer: "send",
                expected: 6,
                got: 4
            }
        );
        assert_eq!(
            e[3],
            Error::InvalidRank {
                what: "broadcast",
                rank: 2,
                size: 2
            }
        );
        assert!(
            matches!(&e[4], Error::InvalidArgument { what: "reduce", problem }
                if problem == "rank 0 is the root and must pass the receive buffer"),
            "{}",
            e[4]
        );
        assert_eq!(
            e[5],
            Error::InvalidRank {
                what: "send",
                rank: 5,
                size: 2
            }
        );
        assert_eq!(
            e[6],
            Error::InvalidRank {
                what: "recv",
                rank: 2,
                size: 2
            }
        );
        assert_eq!(
            e[7],
            Error::WrongDevice {
                what: "all_reduce",
                object: "send buffer",
                expected: 0,
                found: 2
            }
        );
        assert_eq!(
            e[7].to_string(),
            "all_reduce: the send buffer is on device 2, the communicator on device 0"
        );
        assert_eq!(
            e[8],
            Error::WrongDevice {
                what: "all_gather",
                object: "stream",
                expected: 0,
                found: 2
            }
        );
        let invalid = [
            (
                "all_to_all",
                "the send buffer holds 3 elements, not a multiple of the 2 ranks",
            ),
            (
                "all_gather_in_place",
                "the buffer holds 3 elements, not a multiple of the 2 ranks",
            ),
            (
                "scatter",
                "rank 0 is the root and must pass the send buffer",
            ),
        ];
        for (e, (what, problem)) in e[9..].iter().zip(invalid) {
            let problem = problem.to_string();
            assert_eq!(*e, Error::InvalidArgument { what, problem });
        }
        // Each message begins with the operation refused.
        let ops = [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "reduce",
            "send",
            "recv",
            "all_reduce",
            "all_gather",
            "all_to_all",
            "all_gather_in_place",
            "scatter",
        ];
        assert_eq!(e.len(), ops.len());
        for (err, op) in e.iter().zip(ops) {
            assert!(err.to_string().starts_with(&format!("{op}: ")), "{err}");
        }
        assert_eq!(
            errs[1][7],
            Error::WrongDevice {
                what: "all_reduce",
                object: "send buffer",
                expected: 1,
                found: 2
            }
        );
        for f in [
            "ncclAllReduce",
            "ncclAllGather",
            "ncclReduceScatter",
            "ncclBroadcast",
            "ncclReduce",
            "ncclSend",
            "ncclRecv",
            "ncclAlltoAll",
            "ncclScatter",
        ] {
            assert_eq!(rig.world.calls(f), 0, "{f} reached the FFI");
        }
    });
}

trait CloneEmpty {
    fn clone_empty(&self) -> Self;
}
impl CloneEmpty for DeviceBuffer<i32> {
    fn clone_empty(&self) -> Self {
        DeviceBuffer::zeroed(self.context(), self.len()).unwrap()
    }
}

#[test]
fn a_group_ends_even_when_an_operation_inside_fails() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |comm, s| {
            let a = DeviceBuffer::from_slice(comm.context(), &[comm.rank() as u32 + 1; 3]).unwrap();
            let mut b = DeviceBuffer::<u32>::zeroed(comm.context(), 3).unwrap();
            let mut short = DeviceBuffer::<u32>::zeroed(comm.context(), 2).unwrap();
            // Fails validation inside the group: the group still ends.
            let e = group(comm.nccl(), || {
                comm.all_reduce(&a, &mut short, ReduceOp::Sum, s)
            })
            .unwrap_err();
            // If the group were still open, this call would be deferred and `b` stay zero.
            comm.all_reduce(&a, &mut b, ReduceOp::Sum, s).unwrap();
            (e, b.to_vec().unwrap())
        });
        for (e, v) in out {
            assert_eq!(
                e,
                Error::LengthMismatch {
                    what: "all_reduce",
                    buffer: "recv",
                    expected: 3,
                    got: 2
                }
            );
            assert_eq!(v, [3; 3]);
        }
    });
}

#[test]
fn injected_nccl_faults_surface_typed() {
    Rig::new(1).check(|rig| {
        rig.fail_next("ncclGetUniqueId", ncclResult_t::ncclSystemError);
        let e = UniqueId::generate(&rig.nccl).unwrap_err();
        match &e {
            Error::Nccl {
                call,
                code,
                name,
                message,
                detail,
            } => {
                assert_eq!(*call, "ncclGetUniqueId");
                assert_eq!(*code, ncclResult_t::ncclSystemError);
                assert_eq!(name, "ncclSystemError");
                assert_eq!(message, "unhandled system error (simulated)");
                assert_eq!(detail, "ncclGetUniqueId: injected fault");
            }
            other => panic!("{other}"),
        }
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let ctx = rig.context(0);
        rig.fail_next("ncclCommInitRank", ncclResult_t::ncclInternalError);
        let e = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ncclCommInitRank failed: ncclInternalError (3): internal error (simulated) \
             (ncclCommInitRank: injected fault)"
        );
        let comm = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap();
        let s = Stream::new(&ctx).unwrap();
        let a = DeviceBuffer::from_slice(&ctx, &[1.0f32]).unwrap();
        let mut b = DeviceBuffer::<f32>::zeroed(&ctx, 1).unwrap();
        for f in ["ncclAllReduce", "ncclRedOpCreatePreMulSum"] {
            rig.fail_next(f, ncclResult_t::ncclInvalidUsage);
            let r = match f {
                "ncclGroupEnd" => {
                    group(&rig.nccl, || comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s))
                }
                "ncclRedOpCreatePreMulSum" => {
                    comm.all_reduce(&a, &mut b, ReduceOp::PreMulSum(2.0), &s)
                }
                _ => comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s),
            };
            match r.unwrap_err() {
                Error::Nccl { call, code, .. } => {
                    assert_eq!((call, code), (f, ncclResult_t::ncclInvalidUsage));
                }
                other => panic!("{f}: {other}"),
            }
        }
        assert!(
            !comm.is_aborted(),
            "usage errors leave the communicator usable"
        );
        // A group whose end fails may have left its work queued in NCCL without a peer's
        // part: it aborts its communicators before letting go of what they used.
        {
            let comm = Communicator::init_rank(
                &rig.nccl,
                &ctx,
                &UniqueId::generate(&rig.nccl).unwrap(),
                1,
                0,
            )
            .unwrap();
            rig.fail_next("ncclGroupEnd", ncclResult_t::ncclInvalidUsage);
            let r = group(&rig.nccl, || comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s));
            match r.unwrap_err() {
                Error::Nccl { call, code, .. } => {
                    assert_eq!(
                        (call, code),
                        ("ncclGroupEnd", ncclResult_t::ncclInvalidUsage)
                    );
                }
                other => panic!("ncclGroupEnd: {other}"),
            }
            assert!(
                comm.is_aborted(),
                "a failed group end leaves its communicators aborted"
            );
        }
        // The next group of this thread starts afresh: its end succeeds, nothing is aborted.
        group(&rig.nccl, || comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s)).unwrap();
        assert!(
            !comm.is_aborted(),
            "a failed group's end taints no later group"
        );
        // A CUDA (or system, remote, internal) error aborts it: later calls say so.
        rig.fail_next("ncclAllReduce", ncclResult_t::ncclUnhandledCudaError);
        let e = comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s).unwrap_err();
        assert_nccl_error(&e, "ncclAllReduce", ncclResult_t::ncclUnhandledCudaError);
        assert!(comm.is_aborted());
        assert_eq!(
            comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s).unwrap_err(),
            Error::Aborted
        );
    });
}

#[test]
fn a_rank_that_never_arrives_times_out_in_the_mock() {
    Rig::with_nccl(2, |nccl| nccl.timeout(Duration::from_millis(300))).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let ctx = rig.context(0);
        let t = std::time::Instant::now();
        let e = Communicator::init_rank(&rig.nccl, &ctx, &id, 2, 0).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(
            e.to_string(),
            "ncclCommInitRank failed: ncclSystemError (2): unhandled system error (simulated) \
             (rank 0: not every rank of 2 joined within 300ms)"
        );
    });
}

#[test]
fn unique_ids_round_trip_as_hex_and_reject_bad_text() {
    // Without NCCL_COMM_ID, which makes every id the same (the last check).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    Rig::new(1).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let text = id.to_hex();
        assert_eq!(text.len(), 256);
        assert_eq!(text.parse::<UniqueId>().unwrap(), id);
        assert_eq!(text.to_uppercase().parse::<UniqueId>().unwrap(), id);
        assert_eq!(format!(" {text}\n").parse::<UniqueId>().unwrap(), id);
        assert_eq!(UniqueId(*id.as_bytes()), id);
        assert_eq!(UniqueId::from_raw(&id.to_raw()), id);
        // Debug shows none of its bytes (the first 8 are NCCL's bootstrap magic).
        assert_eq!(format!("{id:?}"), "UniqueId(..)");
        for bad in [
            "",
            "00",
            &text[..255],
            &format!("{}zz", &text[..254]),
            &format!("{text}00"),
        ] {
            assert!(
                matches!(bad.parse::<UniqueId>(), Err(Error::UniqueId(_))),
                "{bad}"
            );
        }
        assert_ne!(UniqueId::generate(&rig.nccl).unwrap(), id);
    });
}

#[test]
fn unique_ids_through_a_file() {
    Rig::new(2).check(|rig| {
        let dir = std::env::temp_dir().join(format!("nccl-channel-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let _ = std::fs::remove_file(&path);
        let p2 = path.clone();
        let nccl = rig.nccl.clone();
        let reader = std::thread::spawn(move || {
            UniqueId::exchange_via_file(&nccl, &p2, 1, Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(50));
        let written =
            UniqueId::exchange_via_file(&rig.nccl, &path, 0, Duration::from_secs(10)).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), written);
        // A rank waiting for a file that never comes times out, naming the file.
        let missing = dir.join("never");
        let e = UniqueId::exchange_via_file(&rig.nccl, &missing, 1, Duration::from_millis(100))
            .unwrap_err();
        assert_eq!(
            e,
            Error::Timeout {
                what: format!("rank 0 to write the unique id to {}", missing.display()),
                after: Duration::from_millis(100)
            }
        );
        // A path that cannot be read (a directory) is an error at once, not a wait for rank 0.
        let e =
            UniqueId::exchange_via_file(&rig.nccl, &dir, 1, Duration::from_secs(2)).unwrap_err();
        assert_eq!(
            e,
            Error::UniqueId(format!(
                "{} is a directory, not the file rank 0 writes the id to",
                dir.display()
            ))
        );
        // A corrupt file is an error, not a hang.
        std::fs::write(dir.join("bad"), "not an id").unwrap();
        assert_eq!(
            UniqueId::exchange_via_file(&rig.nccl, &dir.join("bad"), 1, Duration::from_secs(1)),
            Err(Error::UniqueId(
                "expected 256 hex digits, got 9 characters".into()
            ))
        );
        // Rank 0 cannot write into a directory that does not exist: the OS error is the
        // source, whole.
        let unwritable = dir.join("no-such-dir").join("id");
        let e = UniqueId::exchange_via_file(&rig.nccl, &unwritable, 0, Duration::from_secs(1))
            .unwrap_err();
        let Error::Io { what, path, source } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(
            (*what, path.as_str(), source.kind()),
            (
                "writing",
                unwritable.display().to_string().as_str(),
                std::io::ErrorKind::NotFound
            )
        );
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<nccl_channel::IoError>())
            .unwrap();
        assert_eq!(io.get().kind(), std::io::ErrorKind::NotFound);
        assert_eq!(io.get().raw_os_error(), Some(2), "ENOENT");
        assert_eq!(e.to_string(), format!("writing {path} failed"));
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn channel_builder_on_the_mock() {
    Rig::new(2).check(|rig| {
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let out = on_threads(2, |r| {
            let ch = rig
                .channel(World::new(2, r).unwrap())
                .device(format!("cuda://{}", 1 - r))
                .unique_id(IdSource::Given(id))
                .build()
                .unwrap()
                .unwrap();
            assert_eq!(ch.comm().device().ordinal(), 1 - r as i32);
            all_gather_and_close(ch, &[101, 102])
        });
        assert_eq!(out, vec![vec![101, 102, 101, 102]; 2]);
    });
}

#[test]
fn a_channel_for_several_ranks_without_a_way_to_share_the_id_says_how() {
    // The builder reads NCCL_COMM_ID and the launchers' variables: none may be set.
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    assert_eq!(
        two_ranks_without_a_shared_id().to_string(),
        "ChannelBuilder::build: 2 ranks (code world) need a shared unique id and the \
         environment names no rendezvous: set NCCL_COMM_ID=host:port (rank 0's address) or \
         NCCL_CHANNEL_RENDEZVOUS=host:port (rank 0 serves the id there), launch with torchrun, \
         srun, mpirun or mpiexec (their variables give one), or pass one with IdSource::Given \
         / IdSource::File / IdSource::Rendezvous"
    );
}

/// `NCCL_COMM_ID=host:port` gives the same id on every call (the simulated NCCL derives it
/// from the address, as NCCL does); a plain address is not taken for one with spaces.
#[test]
fn unique_ids_from_comm_id_agree() {
    let comm_id = std::ffi::OsStr::new("127.0.0.1:8123");
    if !test_support::this_test_in_scrubbed_child!(&[("NCCL_COMM_ID", comm_id)]) {
        return;
    }
    let rig = Rig::new(1);
    let a = UniqueId::from_comm_id(&rig.nccl).unwrap();
    assert_eq!(a, UniqueId::from_comm_id(&rig.nccl).unwrap());
    assert_eq!(&a.as_bytes()[..22], b"MOCKADDR127.0.0.1:8123");
}

/// `Channel::close` waits for its stream and closes its communicator, reporting either's
/// failure (here the injected one of the communicator's finalize).
#[test]
fn a_channel_close_reports_the_communicators_failure() {
    let rig = Rig::new(1);
    let ch = rig
        .channel(World::new(1, 0).unwrap())
        .device("cuda://0")
        .unique_id(IdSource::Given(UniqueId::generate(&rig.nccl).unwrap()))
        .build()
        .unwrap()
        .unwrap();
    rig.fail_next("ncclCommFinalize", ncclResult_t::ncclInternalError);
    let e = ch.close().unwrap_err();
    assert_nccl_error(&e, "ncclCommFinalize", ncclResult_t::ncclInternalError);
}

/// The builder's config reaches the communicator it builds.
#[test]
fn a_channel_builder_applies_its_config() {
    let rig = Rig::new(1);
    let ch = rig
        .channel(World::new(1, 0).unwrap())
        .device("cuda://0")
        .unique_id(IdSource::Given(UniqueId::generate(&rig.nccl).unwrap()))
        .config(nccl_channel::CommConfig::non_blocking(Duration::from_secs(
            7,
        )))
        .build()
        .unwrap()
        .unwrap();
    assert!(!ch.comm().config().is_blocking());
    assert_eq!(ch.comm().config().get_timeout(), Duration::from_secs(7));
    ch.close().unwrap();
}

/// `Channel::from_env` in a world of one opens the driver (here one that cannot be
/// loaded, so the error names it) rather than answering "no world".
#[test]
fn channel_from_env_in_a_world_opens_the_driver() {
    let missing = std::ffi::OsStr::new("/nonexistent/libcuda.so.1");
    let one = std::ffi::OsStr::new("1");
    let zero = std::ffi::OsStr::new("0");
    if !test_support::this_test_in_scrubbed_child!(&[
        ("IREE_CUDA_NCCL_NPROCS", one),
        ("IREE_CUDA_NCCL_PROCID", zero),
        ("CUDA_SYS_LIBRARY", missing),
    ]) {
        return;
    }
    match nccl_channel::Channel::from_env() {
        Err(e) => assert!(
            matches!(
                &e,
                Error::Cuda(cuda_hal::Error::Load(cuda_hal::cuda_sys::LoadError::Unusable {
                    library: "CUDA driver",
                    origin,
                    reason: cuda_hal::cuda_sys::dylib::Reason::NoSuchFile,
                })) if origin == "/nonexistent/libcuda.so.1 ($CUDA_SYS_LIBRARY)"
            ),
            "{e:?}"
        ),
        Ok(ch) => panic!("a world of one with no driver gave {:?}", ch.is_some()),
    }
}

/// A blocking init's answer is final: nothing polls it afterwards (a poll could only add a
/// failure of its own).
#[test]
fn a_blocking_init_is_not_polled() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let _comm = Communicator::init_rank_with(
            &rig.nccl,
            &ctx,
            &id,
            1,
            0,
            &CommConfig::new().max_ctas(4),
        )
        .unwrap();
        assert_eq!(rig.world.calls("ncclCommInitRankConfig"), 1);
        assert_eq!(rig.world.calls("ncclCommGetAsyncError"), 0);
    });
}

/// A world of one rank needs nobody to agree with: its id is generated, whatever
/// `NCCL_COMM_ID` or a launcher's variables say (a one-rank job must not reach for a
/// rendezvous).
#[test]
fn a_one_rank_channel_generates_its_id() {
    Rig::new(1).check(|rig| {
        let ch = rig
            .channel(World::new(1, 0).unwrap())
            .build()
            .unwrap()
            .unwrap();
        assert_eq!(ch.id_origin(), "generated (one rank)");
        assert_eq!((ch.comm().rank(), ch.comm().size()), (0, 1));
    });
}

/// Inside an open group a communicator cannot get its private channel (the group would
/// defer the split to its end): init and adoption are refused before NCCL makes anything,
/// and nothing is left alive. Before, `init_all` inside a group aborted its communicators
/// while their private channels' splits were still queued in the group.
#[test]
fn a_communicator_is_not_made_inside_an_open_group() {
    Rig::new(2).check(|rig| {
        let ctxs = rig.contexts(2);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let r = group(&rig.nccl, || {
            let all = Communicator::init_all(&rig.nccl, &ctxs).map(drop);
            let one = Communicator::init_rank(&rig.nccl, &ctxs[0], &id, 1, 0).map(drop);
            let with = Communicator::init_rank_with(
                &rig.nccl,
                &ctxs[0],
                &id,
                1,
                0,
                &nccl_channel::CommConfig::non_blocking(std::time::Duration::from_secs(5)),
            )
            .map(drop);
            for (what, r) in [
                ("Communicator::init_all", all),
                ("Communicator::init_rank", one),
                ("Communicator::init_rank_with", with),
            ] {
                assert!(
                    matches!(&r, Err(Error::InvalidArgument { what: w, problem }) if *w == what && problem.contains("open group")),
                    "{what}: {r:?}"
                );
            }
            Ok(())
        });
        r.unwrap();
        assert_eq!(rig.world.calls("ncclCommInitAll"), 0);
        assert_eq!(rig.world.calls("ncclCommInitRank"), 0);
        assert_eq!(rig.world.calls("ncclCommSplit"), 0);
        assert_eq!(rig.world.live().comms, 0);
    });
}
