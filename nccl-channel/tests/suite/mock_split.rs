//! Grouped split and shrink from one thread for every local rank
//! (`Communicator::split_all` / `shrink_all`) on the simulated NCCL, which, like NCCL,
//! writes a grouped split's new communicator only when the group ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{Rig, assert_nccl_error, grouped_sums, streams_of};
use cuda_hal::{Context, DeviceBuffer, Stream};
use nccl_channel::{
    CommConfig, Communicator, Error, Group, ParentsProblem, ReduceOp, UniqueId, group,
};
use nccl_sys::{NcclVersion, ncclResult_t};

fn contexts(rig: &Rig, n: usize) -> Vec<Context> {
    (0..n).map(|d| rig.context(d)).collect()
}

/// `n` blocking communicators of one clique, all on this thread.
fn local(rig: &Rig, n: usize) -> Vec<Communicator> {
    Communicator::init_all(&rig.nccl, &contexts(rig, n)).unwrap()
}

/// `n` non-blocking communicators (5 s deadline), made on threads of their own and
/// handed to this one.
fn local_non_blocking(rig: &Rig, n: usize) -> Vec<Communicator> {
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let config = CommConfig::non_blocking(Duration::from_secs(5));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, config) = (&id, &config);
                s.spawn(move || {
                    let ctx = rig.context(r);
                    Communicator::init_rank_with(&rig.nccl, &ctx, id, n, r, config).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// All-reduces (sum) `values[i]` over `comms[i]`, from this thread in one group; returns
/// each rank's result.
fn sums(nccl: &nccl_sys::Nccl, comms: &[&Communicator], values: &[i64]) -> Vec<i64> {
    let mut bufs: Vec<DeviceBuffer<i64>> = comms
        .iter()
        .zip(values)
        .map(|(c, v)| DeviceBuffer::from_slice(c.context(), &[*v]).unwrap())
        .collect();
    let sums = grouped_sums(nccl, comms, &mut bufs, &streams_of(comms));
    sums.iter().map(|v| v[0]).collect()
}

fn rank_size(c: &Option<Communicator>) -> Option<(usize, usize)> {
    c.as_ref().map(|c| (c.rank(), c.size()))
}

/// Four local ranks on one thread split into two colors in one group;
/// ranks and sizes are right and each child's all-reduce sums its own ranks.
#[test]
fn four_local_ranks_split_into_two_colors_from_one_thread() {
    Rig::new(4).check(|rig| {
        let comms = local(rig, 4);
        let parts: Vec<_> = comms
            .iter()
            .map(|c| (c, Some(c.rank() as u32 % 2), 0))
            .collect();
        let children = Communicator::split_all(&parts).unwrap();
        assert_eq!(
            children.iter().map(rank_size).collect::<Vec<_>>(),
            [Some((0, 2)), Some((0, 2)), Some((1, 2)), Some((1, 2))]
        );
        // Each communicator's private channel is split from it too: the parents' four in
        // init_all's group, the children's four in one more group after split_all's.
        assert_eq!(rig.world.calls("ncclCommSplit"), 12);
        assert_eq!(rig.world.calls("ncclGroupEnd"), 3, "one group each");
        let live: Vec<&Communicator> = children.iter().flatten().collect();
        for (c, parent) in live.iter().zip(&comms) {
            assert!(c.config().is_blocking(), "the parent's configuration");
            assert_eq!(c.device(), parent.device());
        }
        // Ranks 0 and 2 hold 1 and 3; ranks 1 and 3 hold 2 and 4.
        assert_eq!(sums(&rig.nccl, &live, &[1, 2, 3, 4]), [4, 6, 4, 6]);
        rig.assert_no_nccl_violations();
        drop(children);
    });
}

/// `None` opts a rank out (no communicator); keys order the ranks of a color, ties by
/// parent rank.
#[test]
fn nocolor_ranks_get_none_and_keys_reorder_ranks() {
    Rig::new(4).check(|rig| {
        let comms = local(rig, 4);
        let parts = [
            (&comms[0], Some(9), 5),
            (&comms[1], None, 0),
            (&comms[2], Some(9), 1),
            (&comms[3], Some(9), 1),
        ];
        let children = Communicator::split_all(&parts).unwrap();
        assert_eq!(
            children.iter().map(rank_size).collect::<Vec<_>>(),
            [Some((2, 3)), None, Some((0, 3)), Some((1, 3))]
        );
        let live: Vec<&Communicator> = children.iter().flatten().collect();
        assert_eq!(sums(&rig.nccl, &live, &[1, 10, 100]), [111, 111, 111]);
        rig.assert_no_nccl_violations();
        drop(children);
    });
}

/// Non-blocking parents: the group end answers "in progress", the children come after
/// each parent was polled to success, and they are non-blocking with the same deadline.
#[test]
fn non_blocking_parents_split_and_shrink_from_one_thread() {
    Rig::new(2).check(|rig| {
        let comms = local_non_blocking(rig, 2);
        let polls = rig.world.calls("ncclCommGetAsyncError");
        let children =
            Communicator::split_all(&[(&comms[0], Some(0), 1), (&comms[1], Some(0), 0)]).unwrap();
        assert!(rig.world.calls("ncclCommGetAsyncError") > polls, "polled");
        assert_eq!(
            children.iter().map(rank_size).collect::<Vec<_>>(),
            [Some((1, 2)), Some((0, 2))]
        );
        let live: Vec<&Communicator> = children.iter().flatten().collect();
        for c in &live {
            assert_eq!(
                *c.config(),
                CommConfig::non_blocking(Duration::from_secs(5))
            );
        }
        assert_eq!(sums(&rig.nccl, &live, &[3, 4]), [7, 7]);
        // Shrinking the pair to rank 0 alone: one parent, in a group of its own.
        let small = Communicator::shrink_all(&[&comms[0]], &[1]).unwrap();
        assert_eq!((small[0].rank(), small[0].size()), (0, 1));
        assert!(!small[0].config().is_blocking());
        assert_eq!(sums(&rig.nccl, &[&small[0]], &[5]), [5]);
        rig.assert_no_nccl_violations();
    });
}

/// Children whose background init is slow (NCCL answers "in progress" a few times): the
/// split and the shrink poll each child until it is ready, within the deadline, instead of
/// taking the first "in progress" for a missed one.
#[test]
fn slow_children_are_polled_until_ready() {
    Rig::new(2).check(|rig| {
        let comms = local_non_blocking(rig, 2);
        rig.world.slow_new_communicators(3);
        let polls = rig.world.calls("ncclCommGetAsyncError");
        let children =
            Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], Some(0), 1)]).unwrap();
        // Each child: three "in progress" answers, then the one that says it is ready.
        assert!(rig.world.calls("ncclCommGetAsyncError") >= polls + 2 * 4);
        let live: Vec<&Communicator> = children.iter().flatten().collect();
        assert_eq!(sums(&rig.nccl, &live, &[3, 4]), [7, 7]);
        let small = Communicator::shrink_all(&[&comms[0]], &[1]).unwrap();
        assert_eq!((small[0].rank(), small[0].size()), (0, 1));
        assert_eq!(sums(&rig.nccl, &[&small[0]], &[5]), [5]);
        rig.world.slow_new_communicators(0);
        rig.assert_no_nccl_violations();
    });
}

/// A shrink from one thread: three local ranks, one lost (aborted); the two others shrink
/// from one thread and keep their order.
#[test]
fn shrink_of_one_rank_from_three_from_one_thread() {
    Rig::new(3).check(|rig| {
        let mut comms = local(rig, 3);
        comms.remove(1).abort().unwrap();
        let small = Communicator::shrink_all(&[&comms[0], &comms[1]], &[1]).unwrap();
        assert_eq!(
            small
                .iter()
                .map(|c| (c.rank(), c.size()))
                .collect::<Vec<_>>(),
            [(0, 2), (1, 2)]
        );
        assert_eq!(small[1].device().ordinal(), 2);
        assert_eq!(
            sums(&rig.nccl, &[&small[0], &small[1]], &[20, 22]),
            [42, 42]
        );
        assert_eq!(rig.world.calls("ncclCommShrink"), 2);
        rig.assert_no_nccl_violations();
    });
}

/// A split that fails in the middle of the group (the third of four calls): the group
/// runs none of them, no child is left, the error is the failing call's, and the parents
/// (a usage error) stay usable.
#[test]
fn a_failure_in_the_middle_of_the_group_leaves_no_child() {
    Rig::new(4).check(|rig| {
        let comms = local(rig, 4);
        let baseline = rig.world.live();
        rig.world
            .fail_after("ncclCommSplit", 2, ncclResult_t::ncclInvalidUsage);
        let parts: Vec<_> = comms.iter().map(|c| (c, Some(0), 0)).collect();
        let e = Communicator::split_all(&parts).unwrap_err();
        match &e {
            Error::Nccl {
                call: "ncclCommSplit",
                code: ncclResult_t::ncclInvalidUsage,
                detail,
                ..
            } => assert_eq!(detail, "ncclCommSplit: injected fault"),
            other => panic!("{other}"),
        }
        // The text ends with NCCL's own detail (ncclGetLastError).
        assert!(
            e.to_string().ends_with(" (ncclCommSplit: injected fault)"),
            "{e}"
        );
        assert_eq!(
            rig.world.calls("ncclCommSplit"),
            7,
            "the fourth is not called"
        );
        assert_eq!(rig.world.live(), baseline);
        assert!(comms.iter().all(|c| !c.is_aborted()));
        // Nothing is left half-done: the same parents split again.
        let children = Communicator::split_all(&parts).unwrap();
        assert_eq!(rank_size(&children[3]), Some((3, 4)));
        rig.assert_no_nccl_violations();
    });
}

/// A group end that fails (injected): no child is left and the error names the call.
#[test]
fn a_failed_group_end_leaves_no_child() {
    Rig::new(2).check(|rig| {
        let comms = local(rig, 2);
        let baseline = rig.world.live();
        rig.fail_next("ncclGroupEnd", ncclResult_t::ncclInvalidUsage);
        let parts = [(&comms[0], Some(0), 0), (&comms[1], Some(0), 0)];
        let e = Communicator::split_all(&parts).unwrap_err();
        assert_nccl_error(&e, "ncclGroupEnd", ncclResult_t::ncclInvalidUsage);
        assert_eq!(rig.world.live(), baseline);
        assert!(!comms[0].is_aborted());
        rig.assert_no_nccl_violations();
    });
}

/// A group whose splits fail at its end (a peer of the parents never splits): NCCL hands
/// the failed children over; every one is aborted, the error names the group end and the
/// mock's reason, and the parents are aborted (a system error, as for any call).
#[test]
fn a_group_that_fails_at_its_end_aborts_every_child() {
    let rig = Rig::with_nccl(3, |nccl| nccl.timeout(Duration::from_millis(200)));
    let comms = local(&rig, 3);
    let e =
        Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], Some(0), 0)]).unwrap_err();
    match &e {
        Error::Nccl {
            call: "ncclGroupEnd",
            code: ncclResult_t::ncclSystemError,
            detail,
            ..
        } => assert!(
            // Rank 0's or rank 1's split is the first to give up waiting for rank 2.
            [0, 1].iter().any(|r| *detail
                == format!(
                    "ncclCommSplit of rank {r} of 3: not every rank took part within 200ms"
                )),
            "{detail}"
        ),
        other => panic!("{other}"),
    }
    assert!(comms[0].is_aborted() && comms[1].is_aborted());
    // Two parents, two children aborted; rank 2 is all that is left.
    assert_eq!(rig.world.calls("ncclCommAbort"), 6);
    assert_eq!(rig.world.live().comms, 2);
    rig.assert_no_nccl_violations();
    drop(comms);
    rig.assert_clean();
}

/// Non-blocking parents whose wait fails: each parent is aborted (which stops its split,
/// so NCCL writes nothing afterwards), every child handed over is aborted, and the error
/// is the wait's.
#[test]
fn a_failed_wait_for_non_blocking_parents_aborts_parents_and_children() {
    Rig::new(2).check(|rig| {
        let comms = local_non_blocking(rig, 2);
        rig.fail_next("ncclCommGetAsyncError", ncclResult_t::ncclInternalError);
        let e = Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], Some(0), 0)])
            .unwrap_err();
        assert_nccl_error(&e, "ncclCommGetAsyncError", ncclResult_t::ncclInternalError);
        assert!(comms[0].is_aborted() && comms[1].is_aborted());
        assert_eq!(rig.world.live().comms, 0, "parents and children");
        rig.assert_no_nccl_violations();
    });
}

/// The regression: reading a grouped split's new communicator at once, as the old code
/// would (`from_raw` reads its rank inside the group), gets NCCL's NULL handle; the mock
/// reports it. The grouped API on the same parents reads after the group and is clean.
#[test]
fn reading_the_rank_before_the_group_ends_is_detected() {
    Rig::new(2).check(|rig| {
        let comms = local(rig, 2);
        let ctxs = contexts(rig, 2);
        let mut raws = [std::ptr::null_mut(); 2];
        let g = Group::start(&rig.nccl).unwrap();
        let mut early = Vec::new();
        for r in 0..2 {
            let _b = ctxs[r].bind().unwrap();
            // SAFETY: live communicators; `raws` outlives the group; NULL config inherits.
            let rc = unsafe {
                (rig.nccl.fns().ncclCommSplit)(
                    comms[r].as_raw(),
                    0,
                    0,
                    &mut raws[r],
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, ncclResult_t::ncclSuccess);
            // SAFETY: what the old code did: adopt the handle right after the call.
            early.push(unsafe { Communicator::from_raw(&rig.nccl, &ctxs[r], raws[r]) });
        }
        g.end().unwrap();
        for e in early {
            assert_nccl_error(
                e.as_ref().unwrap_err(),
                "ncclCommUserRank",
                ncclResult_t::ncclInvalidArgument,
            );
        }
        // Each early read is reported (and so is the abort of the NULL handle that the
        // failed adoption then made).
        let v = rig.world.take_violations();
        let reads = v
            .iter()
            .filter(|m| {
                m.starts_with(
                    "ncclCommUserRank: communicator NULL: a split or shrink inside a group gives",
                )
            })
            .count();
        assert_eq!(reads, 2, "{v:?}");
        assert!(
            v.iter()
                .all(|m| m.contains("communicator NULL: a split or shrink")),
            "{v:?}"
        );
        // After the group the handles are there: adopt them now, then split the same parents
        // again with the grouped API, which reads only after its group.
        // SAFETY: made for these devices by the split and owned here.
        let adopted = unsafe {
            Communicator::from_raw_all(&rig.nccl, &[(&ctxs[0], raws[0]), (&ctxs[1], raws[1])])
        }
        .unwrap();
        for (r, c) in adopted.iter().enumerate() {
            assert_eq!((c.rank(), c.size()), (r, 2));
        }
        let children =
            Communicator::split_all(&[(&comms[0], Some(1), 0), (&comms[1], Some(1), 0)]).unwrap();
        assert_eq!(rank_size(&children[1]), Some((1, 2)));
        rig.assert_no_nccl_violations();
    });
}

/// One rank per thread (as one rank per process) still splits on its own, with `split`
/// or a one-parent `split_all`, and both meet in the same split.
#[test]
fn one_rank_per_thread_still_splits_alone() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |comm, _| {
            let child = if comm.rank() == 0 {
                comm.split(Some(3), 0).unwrap()
            } else {
                Communicator::split_all(&[(comm, Some(3), 0)])
                    .unwrap()
                    .pop()
                    .unwrap()
            };
            rank_size(&child)
        });
        assert_eq!(out, [Some((0, 2)), Some((1, 2))]);
    });
}

/// Inputs that cannot split together are typed errors before any NCCL split call.
#[test]
fn bad_inputs_are_typed_errors() {
    let rig = Rig::new(3);
    let comms = local(&rig, 3);
    let grouped = |what, problem| Error::GroupedParents { what, problem };
    const SPLIT: &str = "Communicator::split_all";
    const SHRINK: &str = "Communicator::shrink_all";
    assert_eq!(
        Communicator::split_all(&[]).unwrap_err(),
        grouped(SPLIT, ParentsProblem::Empty)
    );
    assert_eq!(
        Communicator::shrink_all(&[], &[1]).unwrap_err(),
        grouped(SHRINK, ParentsProblem::Empty)
    );
    assert_eq!(
        Communicator::split_all(&[
            (&comms[0], Some(0), 0),
            (&comms[1], Some(0), 0),
            (&comms[0], Some(0), 0)
        ])
        .unwrap_err(),
        grouped(SPLIT, ParentsProblem::Duplicate { first: 0, again: 2 })
    );
    // Another NCCL library (another simulated world), and a non-blocking communicator.
    let other = Rig::new(1);
    let foreign = local(&other, 1);
    assert_eq!(
        Communicator::split_all(&[(&comms[0], Some(0), 0), (&foreign[0], Some(0), 0)]).unwrap_err(),
        grouped(SPLIT, ParentsProblem::MixedLibraries { first: 0, other: 1 })
    );
    let nb = local_non_blocking(&rig, 1);
    let e = Communicator::shrink_all(&[&comms[0], &nb[0]], &[2]).unwrap_err();
    assert_eq!(
        e,
        grouped(
            SHRINK,
            ParentsProblem::MixedModes {
                first: 0,
                first_blocking: true,
                other: 1
            }
        )
    );
    assert_eq!(
        e.to_string(),
        "Communicator::shrink_all: communicator 0 is blocking and communicator 1 is not"
    );
    assert_eq!(
        Communicator::split_all(&[(&comms[0], Some(u32::MAX), 0)]).unwrap_err(),
        Error::InvalidArgument {
            what: "color",
            problem: "4294967295 does not fit NCCL's int".into()
        }
    );
    // Shrink lists: a parent excluding itself, a rank out of range, none at all.
    assert_eq!(
        Communicator::shrink_all(&[&comms[0], &comms[2]], &[1, 2]).unwrap_err(),
        grouped(SHRINK, ParentsProblem::ExcludesItself { index: 1, rank: 2 })
    );
    assert_eq!(
        Communicator::shrink_all(&[&comms[0]], &[3]).unwrap_err(),
        Error::InvalidRank {
            what: SHRINK,
            rank: 3,
            size: 3
        }
    );
    // The empty list and a communicator excluding itself are different refusals.
    let none = "no rank to exclude (NCCL needs at least one; keep the communicator)";
    assert_eq!(
        Communicator::shrink_all(&[&comms[0]], &[]).unwrap_err(),
        Error::InvalidArgument {
            what: SHRINK,
            problem: none.into()
        }
    );
    assert_eq!(
        comms[0].shrink(&[]).unwrap_err(),
        Error::InvalidArgument {
            what: "shrink",
            problem: none.into()
        }
    );
    assert_eq!(
        comms[1].shrink(&[1]).unwrap_err(),
        Error::InvalidArgument {
            what: "shrink",
            problem: "rank 1 is this communicator's own rank; excluded ranks do not call shrink"
                .into()
        }
    );
    // Inside an open group of this thread.
    let e = group(&rig.nccl, || {
        Communicator::shrink_all(&[&comms[0]], &[1]).map(|_| ())
    })
    .unwrap_err();
    assert_eq!(
        e,
        Error::SplitInGroup {
            what: SHRINK,
            instead: SHRINK
        }
    );
    // The private channels' splits of the communicators made above only.
    assert_eq!(rig.world.calls("ncclCommSplit"), 4);
    assert_eq!(rig.world.calls("ncclCommShrink"), 0);
    rig.assert_no_nccl_violations();
    drop((comms, nb, foreign));
    rig.assert_clean();
    other.assert_clean();
}

/// A parent whose work is in a group still open on another thread is refused (NCCL
/// allows one thread at a time); an aborted parent is `Aborted`.
#[test]
fn a_parent_grouped_elsewhere_or_aborted_is_refused() {
    Rig::new(2).check(|rig| {
        let mut comms = local(rig, 2);
        let c1 = comms.pop().unwrap();
        let c0 = comms.pop().unwrap();
        let s = Stream::new(c0.context()).unwrap();
        let mut b = DeviceBuffer::from_slice(c0.context(), &[1i32]).unwrap();
        let mut b1 = DeviceBuffer::from_slice(c1.context(), &[2i32]).unwrap();
        let s1 = Stream::new(c1.context()).unwrap();
        // Moved to another thread while this thread's group holds its work, and back.
        let c0 = group(&rig.nccl, || {
            c0.all_reduce_in_place(&mut b, ReduceOp::Sum, &s)?;
            c1.all_reduce_in_place(&mut b1, ReduceOp::Sum, &s1)?;
            let c0 = std::thread::scope(|sc| {
                sc.spawn(move || {
                    let e = Communicator::split_all(&[(&c0, Some(0), 0)]).unwrap_err();
                    assert_eq!(
                        e,
                        Error::GroupedElsewhere {
                            what: "Communicator::split_all"
                        }
                    );
                    c0
                })
                .join()
                .unwrap()
            });
            Ok(c0)
        })
        .unwrap();
        s.synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [3]);
        c1.abort_handle().abort();
        assert_eq!(
            Communicator::split_all(&[(&c0, Some(0), 0), (&c1, Some(0), 0)]).unwrap_err(),
            Error::Aborted
        );
        assert!(c1.is_aborted(), "the requested abort was performed");
        // The parents' private channels' splits only.
        assert_eq!(rig.world.calls("ncclCommSplit"), 2);
    });
}

/// Shrink needs NCCL 2.27: on older libraries the grouped shrink names the version.
#[test]
fn shrink_all_needs_2_27() {
    Rig::with_version(2, NcclVersion::new(2, 26, 6)).check(|rig| {
        let comms = local(rig, 2);
        match Communicator::shrink_all(&[&comms[0]], &[1]).unwrap_err() {
            Error::Unsupported {
                feature, needed, ..
            } => assert_eq!((feature, needed.as_str()), ("ncclCommShrink", "2.27.3")),
            other => panic!("{other}"),
        }
    });
}

/// An NCCL group opened through the raw table and left open defers the splits past the
/// grouped API's own group end: NCCL has not written the new communicators, so it is an
/// error, and the slots NCCL will write later stay valid (leaked, not freed).
#[test]
fn a_raw_group_left_open_is_an_error_not_a_dangling_write() {
    let rig = Rig::new(2);
    let comms = local(&rig, 2);
    // SAFETY: plain group call, ended below.
    let rc = unsafe { (rig.nccl.fns().ncclGroupStart)() };
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let e = Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], None, 0)]).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { what: "ncclCommSplit", problem }
            if problem == "NCCL gave no new communicator after the group ended; is an NCCL \
                           group opened through the raw table still open on this thread?"),
        "{e}"
    );
    // SAFETY: ends the raw group: NCCL now completes the split into the leaked slot.
    let rc = unsafe { (rig.nccl.fns().ncclGroupEnd)() };
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    assert_eq!(rig.world.live().comms, 5, "the orphaned child of rank 0");
    rig.assert_no_nccl_violations();
}

/// A non-blocking split outside a group, one rank per thread (as on the GPU machine with
/// NCCL 2.28): the parent's state reads "success" before NCCL stores the child, so the
/// child is awaited itself. The code before this test read the empty slot and failed
/// with "NCCL gave no new communicator".
#[test]
fn a_non_blocking_split_waits_for_the_child_itself() {
    Rig::new(2).check(|rig| {
        let comms = local_non_blocking(rig, 2);
        let got: Vec<Option<(usize, usize)>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| s.spawn(move || rank_size(&c.split(Some(0), -(c.rank() as i32)).unwrap())))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, [Some((1, 2)), Some((0, 2))]);
        rig.assert_no_nccl_violations();
    });
}

/// A context that cannot be made current refuses the whole grouped split before any
/// split is issued. Before, the first parent's split was issued and then waited for its
/// peer until NCCL's timeout (with real NCCL and blocking parents: forever).
#[test]
fn a_bind_failure_refuses_split_all_before_any_split() {
    Rig::new(2).check(|rig| {
        let comms = local(rig, 2);
        // The second parent's bind (its cuCtxGetCurrent) fails.
        rig.gpus.fail_after(
            "cuCtxGetCurrent",
            1,
            cuda_hal::cuda_sys::CUresult::CUDA_ERROR_UNKNOWN,
        );
        let t = std::time::Instant::now();
        let e = Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], Some(0), 0)])
            .unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Cuda(cuda_hal::Error::Driver {
                    call: "cuCtxGetCurrent",
                    code: cuda_hal::cuda_sys::CUresult::CUDA_ERROR_UNKNOWN,
                    ..
                })
            ),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // The parents' private channels' splits only.
        assert_eq!(rig.world.calls("ncclCommSplit"), 2, "nothing issued");
        rig.gpus.clear_faults();
        // The parents are intact: a retry works.
        let children =
            Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], Some(0), 0)]).unwrap();
        assert_eq!(
            children.iter().map(rank_size).collect::<Vec<_>>(),
            [Some((0, 2)), Some((1, 2))]
        );
    });
}

/// NCCL sizes a shrink's child by the exclude list's length: a repeated rank would give
/// the survivors a wrong size (on NCCL 2.28.9 with 2 ranks and `[1, 1]`: "invalid device
/// count (0)"). Refused before any NCCL call; the simulated NCCL refuses it too (it used to
/// deduplicate, hiding the problem).
#[test]
fn a_rank_excluded_twice_is_refused() {
    Rig::new(3).check(|rig| {
        let mut comms = local(rig, 3);
        comms.remove(1).abort().unwrap();
        let e = Communicator::shrink_all(&[&comms[0], &comms[1]], &[1, 1]).unwrap_err();
        assert_eq!(
            e,
            Error::InvalidArgument {
                what: "Communicator::shrink_all",
                problem: "rank 1 is excluded twice".into()
            }
        );
        let e = comms[0].shrink(&[1, 2, 1]).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what: "shrink", problem } if problem == "rank 1 is excluded twice"),
            "{e}"
        );
        assert_eq!(rig.world.calls("ncclCommShrink"), 0);
        // The raw NCCL refuses it as well.
        let mut list = [1i32, 1];
        let mut out: nccl_sys::ncclComm_t = std::ptr::null_mut();
        let _g = comms[0].context().bind().unwrap();
        // SAFETY: a live communicator, a list of 2 ranks and a valid out-pointer.
        let rc = unsafe {
            (rig.nccl.fns().ncclCommShrink.unwrap())(
                comms[0].as_raw(),
                list.as_mut_ptr(),
                2,
                &mut out,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, ncclResult_t::ncclInvalidArgument);
        assert!(out.is_null());
        drop(_g);
    });
}

/// A non-blocking split whose child is stored only after the parent's deadline: the
/// parent reads "success" at once (one rank), but the mock, like NCCL 2.28, stores the
/// child 20 ms later, past the 5 ms deadline. The wait for the child times out, the
/// parent is aborted (which joins its split), and the child NCCL then hands over is
/// aborted too: nothing leaks. The split here is the one every init makes, of its private
/// channel: the init fails with the split's timeout.
#[test]
fn a_child_stored_after_the_deadline_is_a_timeout() {
    Rig::new(1).check(|rig| {
        let timeout = Duration::from_millis(5);
        let config = CommConfig::non_blocking(timeout);
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let e = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &config).unwrap_err();
        assert!(
            matches!(&e, Error::Timeout { after, .. } if *after == timeout),
            "{e}"
        );
        assert_eq!(rig.world.live().comms, 0, "the parent and the child");
        rig.assert_no_nccl_violations();
    });
}
