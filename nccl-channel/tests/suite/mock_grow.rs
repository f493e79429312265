//! Growing a communicator (`grow_id`, `grow`, `join_grown`, `grow_all`) and the scalable
//! init on the simulated NCCL, in one process and across simulated processes (each with
//! its own driver and NCCL, meeting over loopback).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use crate::common::{Rig, streams_of};
use cuda_hal::{Context, Cuda, DeviceBuffer, Stream};
use cuda_mock::MockDriver;
use nccl_channel::{CommConfig, Communicator, Error, ReduceOp, UniqueId};
use nccl_mock::MockNccl;
use nccl_sys::{Nccl, NcclVersion, ncclResult_t};

/// One simulated process of the multi-process mode: its own GPU and NCCL.
struct Process {
    cuda: Cuda,
    nccl: Arc<Nccl>,
    ctx: Context,
}

fn process(timeout: Duration) -> Process {
    let (cuda, gpus) = MockDriver::with_devices(1)
        .build_with(Cuda::from_driver)
        .unwrap();
    let (nccl, _world) = MockNccl::new(&gpus)
        .multi_process(true)
        .timeout(timeout)
        .build()
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    Process {
        cuda,
        nccl: Arc::new(nccl),
        ctx,
    }
}

/// Sums `rank + 1` over the communicator: `n (n + 1) / 2` on every rank.
fn sum_of_ranks(comm: &Communicator) -> Vec<i32> {
    let ctx = comm.context();
    let stream = Stream::new(ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(ctx, &[comm.rank() as i32 + 1, 10]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
        .unwrap();
    stream.synchronize().unwrap();
    buf.to_vec().unwrap()
}

#[test]
fn two_ranks_grow_to_three_with_a_new_rank_in_a_thread() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let rig = Rig::new(3);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let (tx, rx) = channel::<UniqueId>();
    let mut rx = Some(rx);
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let (rig, id, tx) = (&rig, &id, tx.clone());
                let rx = if rank == 2 { rx.take() } else { None };
                s.spawn(move || {
                    let ctx = rig.context(rank);
                    if let Some(rx) = rx {
                        let grow_id = rx.recv().unwrap();
                        let grown =
                            Communicator::join_grown(&rig.nccl, &ctx, &grow_id, 3, 2).unwrap();
                        return ((grown.rank(), grown.size()), sum_of_ranks(&grown), None);
                    }
                    let comm = Communicator::init_rank(&rig.nccl, &ctx, id, 2, rank).unwrap();
                    let grow_id = (rank == 1).then(|| comm.grow_id().unwrap());
                    if let Some(g) = grow_id {
                        tx.send(g).unwrap();
                    }
                    let grown = comm.grow(3, grow_id.as_ref()).unwrap();
                    let got = ((grown.rank(), grown.size()), sum_of_ranks(&grown));
                    // The old communicator still works after the grow.
                    let old = sum_of_ranks(&comm);
                    grown.close().unwrap();
                    comm.close().unwrap();
                    (got.0, got.1, Some(old))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(
        out,
        [
            ((0, 3), vec![6, 30], Some(vec![3, 20])),
            ((1, 3), vec![6, 30], Some(vec![3, 20])),
            ((2, 3), vec![6, 30], None),
        ]
    );
    rig.assert_clean();
}

/// A rank of a process: (rank, size) and sum of the grown communicator.
type Outcome = ((usize, usize), Vec<i32>);

#[test]
fn two_processes_grow_to_three_with_a_new_process() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let timeout = Duration::from_secs(20);
    // Ids travel between "processes" as plain bytes, as they would through a launcher.
    let (id_tx, id_rx) = channel::<[u8; 128]>();
    let (grow_tx, grow_rx) = channel::<[u8; 128]>();
    let existing = |rank: usize,
                    id_rx: Option<Receiver<[u8; 128]>>,
                    id_tx: Sender<[u8; 128]>,
                    grow_tx: Option<Sender<[u8; 128]>>| {
        std::thread::spawn(move || -> Outcome {
            let p = process(timeout);
            let id = match id_rx {
                Some(rx) => UniqueId::from_raw(&nccl_sys::ncclUniqueId {
                    internal: rx.recv().unwrap().map(|b| b as std::ffi::c_char),
                }),
                None => {
                    let id = UniqueId::generate(&p.nccl).unwrap();
                    id_tx.send(*id.as_bytes()).unwrap();
                    id
                }
            };
            let comm = Communicator::init_rank(&p.nccl, &p.ctx, &id, 2, rank).unwrap();
            let grow_id = grow_tx.map(|tx| {
                let g = comm.grow_id().unwrap();
                tx.send(*g.as_bytes()).unwrap();
                g
            });
            let grown = comm.grow(3, grow_id.as_ref()).unwrap();
            comm.close().unwrap();
            let out = ((grown.rank(), grown.size()), sum_of_ranks(&grown));
            grown.close().unwrap();
            drop(p.cuda);
            out
        })
    };
    let r0 = existing(0, None, id_tx.clone(), Some(grow_tx));
    let r1 = existing(1, Some(id_rx), id_tx, None);
    let joiner = std::thread::spawn(move || -> Outcome {
        let p = process(timeout);
        let bytes = grow_rx.recv().unwrap();
        let id: UniqueId = UniqueId::from_raw(&nccl_sys::ncclUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        });
        let grown = Communicator::join_grown(&p.nccl, &p.ctx, &id, 3, 2).unwrap();
        let out = ((grown.rank(), grown.size()), sum_of_ranks(&grown));
        grown.close().unwrap();
        out
    });
    let got: Vec<Outcome> = [r0, r1, joiner]
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(
        got,
        [
            ((0, 3), vec![6, 30]),
            ((1, 3), vec![6, 30]),
            ((2, 3), vec![6, 30])
        ]
    );
}

/// The error of every side of a grow where the new rank asks for 4 ranks and the
/// existing ones for 3, and how long the slowest side took.
fn mismatched_grow(
    existing: [(Arc<Nccl>, Context); 2],
    joiner: (Arc<Nccl>, Context),
) -> (Vec<Error>, Duration) {
    let id = UniqueId::generate(&existing[0].0).unwrap();
    let (tx, rx) = channel::<UniqueId>();
    let started = Instant::now();
    let errors = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (rank, (nccl, ctx)) in existing.iter().enumerate() {
            let (id, tx) = (&id, tx.clone());
            hs.push(s.spawn(move || {
                let comm = Communicator::init_rank(nccl, ctx, id, 2, rank).unwrap();
                let grow_id = (rank == 0).then(|| comm.grow_id().unwrap());
                if let Some(g) = grow_id {
                    tx.send(g).unwrap();
                }
                let e = comm.grow(3, grow_id.as_ref()).unwrap_err();
                comm.close().unwrap();
                e
            }));
        }
        let (nccl, ctx) = &joiner;
        hs.push(s.spawn(move || {
            let grow_id = rx.recv().unwrap();
            Communicator::join_grown(nccl, ctx, &grow_id, 4, 2).unwrap_err()
        }));
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    (errors, started.elapsed())
}

/// The call and code of an NCCL error, and whether its detail says the sizes differ.
fn nccl_error(e: &Error) -> (&'static str, ncclResult_t, bool) {
    match e {
        Error::Nccl {
            call, code, detail, ..
        } => (
            *call,
            *code,
            detail.contains("asked for 4 ranks") || detail.contains("asked for 3 ranks"),
        ),
        other => panic!("not an NCCL error: {other:?}"),
    }
}

#[test]
fn a_grow_whose_ranks_disagree_on_the_size_fails_every_side_in_one_process() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    Rig::new(3).check(|rig| {
        let ctxs = rig.contexts(3);
        let n = || rig.nccl.clone();
        let (errors, took) = mismatched_grow(
            [(n(), ctxs[0].clone()), (n(), ctxs[1].clone())],
            (n(), ctxs[2].clone()),
        );
        // Well within the simulated NCCL's 20 s deadline: nobody waited for it.
        assert!(took < Duration::from_secs(10), "{took:?}");
        let seen: Vec<_> = errors.iter().map(nccl_error).collect();
        let want = ("ncclCommGrow", ncclResult_t::ncclInvalidArgument, true);
        assert_eq!(seen, [want, want, want], "{errors:?}");
    });
}

#[test]
fn a_grow_whose_ranks_disagree_on_the_size_fails_every_side_across_processes() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let timeout = Duration::from_secs(20);
    let ps = [process(timeout), process(timeout), process(timeout)];
    let pair = |p: &Process| (p.nccl.clone(), p.ctx.clone());
    let (errors, took) = mismatched_grow([pair(&ps[0]), pair(&ps[1])], pair(&ps[2]));
    assert!(took < Duration::from_secs(10), "{took:?}");
    let seen: Vec<_> = errors.iter().map(nccl_error).collect();
    let want = ("ncclCommGrow", ncclResult_t::ncclInvalidUsage, true);
    assert_eq!(seen, [want, want, want], "{errors:?}");
}

#[test]
fn grow_all_grows_every_local_rank_from_one_thread() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    Rig::new(3).check(|rig| {
        let ctxs = rig.contexts(3);
        let comms = Communicator::init_all(&rig.nccl, &ctxs[..2]).unwrap();
        let id = comms[1].grow_id().unwrap();
        let (grown, new) = std::thread::scope(|s| {
            let joiner = s.spawn(|| Communicator::join_grown(&rig.nccl, &ctxs[2], &id, 3, 2));
            let grown = Communicator::grow_all(&[(&comms[0], None), (&comms[1], Some(&id))], 3);
            (grown.unwrap(), joiner.join().unwrap().unwrap())
        });
        // One thread drives the three ranks: their all-reduce is one group.
        let all: Vec<&Communicator> = grown.iter().chain([&new]).collect();
        let streams = streams_of(&all);
        let mut bufs: Vec<DeviceBuffer<i32>> = all
            .iter()
            .map(|c| DeviceBuffer::from_slice(c.context(), &[c.rank() as i32 + 1, 10]).unwrap())
            .collect();
        nccl_channel::group(&rig.nccl, || {
            for ((c, b), st) in all.iter().zip(&mut bufs).zip(&streams) {
                c.all_reduce_in_place(b, ReduceOp::Sum, st)?;
            }
            Ok(())
        })
        .unwrap();
        let sums: Vec<Vec<i32>> = bufs
            .iter()
            .zip(&streams)
            .map(|(b, st)| {
                st.synchronize().unwrap();
                b.to_vec().unwrap()
            })
            .collect();
        drop((bufs, streams, all));
        assert_eq!(sums, [vec![6, 30], vec![6, 30], vec![6, 30]]);
    });
}

#[test]
fn a_second_grow_id_before_the_grow_is_an_nccl_usage_error() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let rig = Rig::new(1);
    let (_ctx, comm) = rig.one_rank(0);
    comm.grow_id().unwrap();
    let e = comm.grow_id().unwrap_err();
    let Error::Nccl {
        call, code, detail, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(
        (*call, *code),
        ("ncclCommGetUniqueId", ncclResult_t::ncclInvalidUsage)
    );
    assert!(detail.contains("not consumed yet"), "{detail}");
    // The communicator is still usable: a usage error does not abort it.
    assert!(!comm.is_aborted());
}

#[test]
fn a_grow_that_does_not_grow_and_a_new_rank_out_of_range_are_refused_before_nccl() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let rig = Rig::new(2);
    let (ctx, comm) = rig.one_rank(0);
    assert_eq!(
        comm.grow(1, None).unwrap_err(),
        Error::InvalidArgument {
            what: "Communicator::grow",
            problem: "new size 1 does not grow a communicator of 1 ranks".into(),
        }
    );
    let id = UniqueId::generate(&rig.nccl).unwrap();
    assert_eq!(
        Communicator::join_grown(&rig.nccl, &ctx, &id, 2, 2).unwrap_err(),
        Error::InvalidRank {
            what: "Communicator::join_grown",
            rank: 2,
            size: 2,
        }
    );
    assert_eq!(rig.world.calls("ncclCommGrow"), 0);
}

#[test]
fn grow_and_scalable_init_are_unsupported_naming_their_release() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let rig = Rig::with_version(1, NcclVersion::new(2, 28, 9));
    let (ctx, comm) = rig.one_rank(0);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let unsupported = |feature, needed: &str| Error::Unsupported {
        feature,
        needed: needed.into(),
        found: "2.28.9".into(),
    };
    assert_eq!(
        comm.grow_id().unwrap_err(),
        unsupported("ncclCommGetUniqueId", "2.29.2")
    );
    assert_eq!(
        comm.grow(2, None).unwrap_err(),
        unsupported("ncclCommGrow", "2.29.2")
    );
    assert_eq!(
        Communicator::join_grown(&rig.nccl, &ctx, &id, 2, 1).unwrap_err(),
        unsupported("ncclCommGrow", "2.29.2")
    );
    let old = Rig::with_version(1, NcclVersion::new(2, 22, 3));
    let ctx = old.contexts(1).remove(0);
    let id = UniqueId::generate(&old.nccl).unwrap();
    assert_eq!(
        Communicator::init_rank_scalable(&old.nccl, &ctx, &[id], 1, 0, &CommConfig::new())
            .unwrap_err(),
        Error::Unsupported {
            feature: "ncclCommInitRankScalable",
            needed: "2.23.4".into(),
            found: "2.22.3".into(),
        }
    );
}

#[test]
fn a_scalable_init_needs_one_to_size_ids_and_sums_over_several() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what
    // ids NCCL hands out (a launcher's environment must not steer these worlds).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let rig = Rig::new(3);
    let ctx = rig.contexts(1).remove(0);
    let config = CommConfig::new();
    let refused = |ids: &[UniqueId], size| {
        Communicator::init_rank_scalable(&rig.nccl, &ctx, ids, size, 0, &config).unwrap_err()
    };
    assert_eq!(
        refused(&[], 3),
        Error::InvalidArgument {
            what: "Communicator::init_rank_scalable",
            problem: "0 unique ids for 3 ranks: NCCL takes 1 to one per rank".into(),
        }
    );
    let id = UniqueId::generate(&rig.nccl).unwrap();
    assert_eq!(
        refused(&[id, id], 1),
        Error::InvalidArgument {
            what: "Communicator::init_rank_scalable",
            problem: "2 unique ids for 1 ranks: NCCL takes 1 to one per rank".into(),
        }
    );
    drop(ctx);
    let ids = [
        UniqueId::generate(&rig.nccl).unwrap(),
        UniqueId::generate(&rig.nccl).unwrap(),
    ];
    let sums = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let (rig, ids) = (&rig, &ids);
                s.spawn(move || {
                    let ctx = rig.context(rank);
                    let config = CommConfig::non_blocking(Duration::from_secs(10));
                    let comm =
                        Communicator::init_rank_scalable(&rig.nccl, &ctx, ids, 3, rank, &config)
                            .unwrap();
                    (comm.rank(), sum_of_ranks(&comm))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(sums, [(0, vec![6, 30]), (1, vec![6, 30]), (2, vec![6, 30])]);
    rig.assert_clean();
}
