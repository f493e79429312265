//! The variable-size all-to-all (`Communicator::all_to_all_v`) on the simulated NCCL:
//! uneven counts with zeros and layouts with gaps against a host reference, for 2 to 4
//! ranks on every release whose code paths differ; in the user's group (one thread
//! driving every rank), in a stream capture whose graph runs twice, on non-blocking
//! communicators with the buffers dropped right after the call; each bad layout a typed
//! error before any NCCL call; nothing left alive.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{OneRank, Rig, TestVal, on_one_rank, streams};
use cuda_hal::{CaptureMode, DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, Group};
use nccl_sys::{NcclVersion, ncclResult_t};

/// The releases whose code paths differ: the oldest supported, the last without native
/// all-to-all, the first with it, the header's.
const VERSIONS: [NcclVersion; 4] = [
    NcclVersion(21803),
    NcclVersion(22703),
    NcclVersion(22803),
    NcclVersion(nccl_sys::NCCL_VERSION_CODE as i32),
];

/// What the regions that are not received into hold: never written.
const UNTOUCHED: i64 = 99;

/// How many elements rank `r` of `n` sends to rank `p`: uneven, with zeros (to itself and
/// to others) for every world size tested.
fn count(n: usize, r: usize, p: usize) -> usize {
    (r * 3 + p * 5 + n * n) % 4
}

/// Element `i` of what rank `r` sends to rank `p` (below 64: exact in every type).
fn value(r: usize, p: usize, i: usize) -> i64 {
    (r * 16 + p * 4 + i) as i64
}

/// One rank's layout, [`count`]'s: the send regions in rank order with a gap of one
/// element before each, the receive regions in reverse rank order with gaps of two.
struct Layout {
    send_counts: Vec<usize>,
    send_displs: Vec<usize>,
    send_len: usize,
    recv_counts: Vec<usize>,
    recv_displs: Vec<usize>,
    recv_len: usize,
}

impl Layout {
    fn of(n: usize, r: usize) -> Layout {
        let send_counts: Vec<usize> = (0..n).map(|p| count(n, r, p)).collect();
        let mut send_displs = Vec::new();
        let mut at = 0;
        for &c in &send_counts {
            at += 1;
            send_displs.push(at);
            at += c;
        }
        let recv_counts: Vec<usize> = (0..n).map(|p| count(n, p, r)).collect();
        let mut recv_displs = vec![0; n];
        let mut end = 0;
        for p in (0..n).rev() {
            end += 2;
            recv_displs[p] = end;
            end += recv_counts[p];
        }
        Layout {
            send_counts,
            send_displs,
            send_len: at + 1,
            recv_counts,
            recv_displs,
            recv_len: end + 1,
        }
    }

    /// The send buffer's contents: each peer's values in its region, -1 in the gaps.
    fn send<T: TestVal>(&self, r: usize) -> Vec<T> {
        let mut v: Vec<T> = (0..self.send_len).map(|_| T::from_i(-1)).collect();
        for (p, (&c, &d)) in self.send_counts.iter().zip(&self.send_displs).enumerate() {
            for i in 0..c {
                v[d + i] = T::from_i(value(r, p, i));
            }
        }
        v
    }

    /// The host reference of the receive buffer (which starts as [`UNTOUCHED`]).
    fn want<T: TestVal>(&self, r: usize) -> Vec<T> {
        let mut v: Vec<T> = (0..self.recv_len).map(|_| T::from_i(UNTOUCHED)).collect();
        for (p, (&c, &d)) in self.recv_counts.iter().zip(&self.recv_displs).enumerate() {
            for i in 0..c {
                v[d + i] = T::from_i(value(p, r, i));
            }
        }
        v
    }
}

/// One rank's all-to-all-v of `T` on its own thread; the received buffer.
fn exchange<T: TestVal>(comm: &Communicator, s: &Stream) -> Vec<T> {
    let (n, r, ctx) = (comm.size(), comm.rank(), comm.context());
    let l = Layout::of(n, r);
    let send = DeviceBuffer::from_slice(ctx, &l.send::<T>(r)).unwrap();
    let untouched: Vec<T> = (0..l.recv_len).map(|_| T::from_i(UNTOUCHED)).collect();
    let mut recv = DeviceBuffer::from_slice(ctx, &untouched).unwrap();
    comm.all_to_all_v(
        &send,
        &l.send_counts,
        &l.send_displs,
        &mut recv,
        &l.recv_counts,
        &l.recv_displs,
        s,
    )
    .unwrap();
    s.synchronize().unwrap();
    recv.to_vec().unwrap()
}

/// The sends a world of `n` ranks makes in one all-to-all-v: one per non-zero count.
fn sends(n: usize) -> u64 {
    let nonzero = (0..n).flat_map(|r| (0..n).map(move |p| count(n, r, p) > 0));
    nonzero.filter(|&x| x).count() as u64
}

#[test]
fn uneven_counts_with_zeros_match_a_host_reference_on_2_3_4_ranks_and_every_release() {
    for version in VERSIONS {
        for n in 2..=4 {
            let rig = Rig::with_version(n, version);
            let got = rig.run(n, |comm, s| {
                (
                    exchange::<i32>(comm, s),
                    exchange::<f64>(comm, s),
                    exchange::<u8>(comm, s),
                )
            });
            for (r, (a, b, c)) in got.into_iter().enumerate() {
                let l = Layout::of(n, r);
                assert_eq!(a, l.want::<i32>(r), "i32, rank {r} of {n}, NCCL {version}");
                assert_eq!(b, l.want::<f64>(r), "f64, rank {r} of {n}, NCCL {version}");
                assert_eq!(c, l.want::<u8>(r), "u8, rank {r} of {n}, NCCL {version}");
            }
            // Zero counts make no call: one send and one receive per non-zero count.
            assert_eq!(rig.world.calls("ncclSend"), 3 * sends(n), "NCCL {version}");
            assert_eq!(rig.world.calls("ncclRecv"), 3 * sends(n), "NCCL {version}");
            rig.assert_clean();
        }
    }
}

/// Every count zero: nothing moves, nothing is sent, and the call still succeeds.
#[test]
fn all_counts_zero_moves_nothing() {
    Rig::new(2).check(|rig| {
        let got = rig.run(2, |comm, s| {
            let ctx = comm.context();
            let send = DeviceBuffer::<i32>::zeroed(ctx, 0).unwrap();
            let mut recv = DeviceBuffer::from_slice(ctx, &[5i32, 6]).unwrap();
            // Empty regions may start anywhere up to the end, and overlap.
            comm.all_to_all_v(&send, &[0, 0], &[0, 0], &mut recv, &[0, 0], &[2, 2], s)
                .unwrap();
            s.synchronize().unwrap();
            recv.to_vec().unwrap()
        });
        assert_eq!(got, [[5, 6], [5, 6]]);
        assert_eq!(rig.world.calls("ncclSend"), 0);
        assert_eq!(rig.world.calls("ncclRecv"), 0);
    });
}

/// One thread drives every rank, so the ranks' parts must be in one group (the user's):
/// two all-to-all-v of different types, the send buffers dropped inside the group,
/// before its end enqueues the work (the group holds them).
#[test]
fn in_the_users_group_from_one_thread_the_group_holds_the_buffers() {
    for version in [VERSIONS[0], VERSIONS[3]] {
        let n = 3;
        let rig = Rig::with_version(n, version);
        let (ctxs, comms) = rig.all_ranks(n);
        let streams: Vec<Stream> = streams(&ctxs);
        let layouts: Vec<Layout> = (0..n).map(|r| Layout::of(n, r)).collect();
        let mut ints: Vec<DeviceBuffer<i32>> = Vec::new();
        let mut floats: Vec<DeviceBuffer<f32>> = Vec::new();
        for (r, l) in layouts.iter().enumerate() {
            let untouched = vec![UNTOUCHED as i32; l.recv_len];
            ints.push(DeviceBuffer::from_slice(&ctxs[r], &untouched).unwrap());
            let untouched = vec![UNTOUCHED as f32; l.recv_len];
            floats.push(DeviceBuffer::from_slice(&ctxs[r], &untouched).unwrap());
        }
        let ends = rig.world.calls("ncclGroupEnd");
        let g = Group::start(&rig.nccl).unwrap();
        for r in 0..n {
            let l = &layouts[r];
            let a = DeviceBuffer::from_slice(&ctxs[r], &l.send::<i32>(r)).unwrap();
            let b = DeviceBuffer::from_slice(&ctxs[r], &l.send::<f32>(r)).unwrap();
            let (sc, sd, rc, rd) = (
                &l.send_counts,
                &l.send_displs,
                &l.recv_counts,
                &l.recv_displs,
            );
            comms[r]
                .all_to_all_v(&a, sc, sd, &mut ints[r], rc, rd, &streams[r])
                .unwrap();
            comms[r]
                .all_to_all_v(&b, sc, sd, &mut floats[r], rc, rd, &streams[r])
                .unwrap();
            drop((a, b));
        }
        // Each call's own group, nested in the user's: only the outermost end launches.
        assert_eq!(rig.world.calls("ncclGroupEnd"), ends + 2 * n as u64);
        g.end().unwrap();
        for r in 0..n {
            streams[r].synchronize().unwrap();
            assert_eq!(ints[r].to_vec().unwrap(), layouts[r].want::<i32>(r));
            assert_eq!(floats[r].to_vec().unwrap(), layouts[r].want::<f32>(r));
        }
        drop((ints, floats, streams, comms, ctxs));
        rig.assert_clean();
    }
}

/// Captured on each rank's stream, the graph launched twice. The send buffer is dropped
/// before the launches: the graph holds its memory until it goes. (The simulated NCCL
/// runs a group's work at the group's end, also when its stream is captured, where NCCL
/// records it into the graph: the data check holds for both.)
#[test]
fn captured_the_graph_runs_twice_and_holds_the_buffers() {
    for version in [VERSIONS[0], VERSIONS[3]] {
        let n = 3;
        let rig = Rig::with_version(n, version);
        let got = rig.run(n, |comm, s| {
            let (r, ctx) = (comm.rank(), comm.context());
            let l = Layout::of(n, r);
            let send = DeviceBuffer::from_slice(ctx, &l.send::<i32>(r)).unwrap();
            let untouched = vec![UNTOUCHED as i32; l.recv_len];
            let mut recv = DeviceBuffer::from_slice(ctx, &untouched).unwrap();
            s.begin_capture(CaptureMode::ThreadLocal).unwrap();
            comm.all_to_all_v(
                &send,
                &l.send_counts,
                &l.send_displs,
                &mut recv,
                &l.recv_counts,
                &l.recv_displs,
                s,
            )
            .unwrap();
            let graph = s.end_capture().unwrap().instantiate().unwrap();
            let used = rig.gpus.used_memory(r);
            drop(send);
            assert_eq!(
                rig.gpus.used_memory(r),
                used,
                "the graph holds the send buffer"
            );
            graph.launch(s).unwrap();
            graph.launch(s).unwrap();
            s.synchronize().unwrap();
            let got = recv.to_vec().unwrap();
            drop(graph);
            assert!(rig.gpus.used_memory(r) < used, "released with the graph");
            got
        });
        for (r, got) in got.into_iter().enumerate() {
            assert_eq!(
                got,
                Layout::of(n, r).want::<i32>(r),
                "rank {r}, NCCL {version}"
            );
        }
        let v = rig.gpus.violations();
        assert!(v.is_empty(), "the sanitizer saw:\n{}", v.join("\n"));
        rig.assert_clean();
    }
}

/// Non-blocking communicators: the group's end may answer "in progress" and NCCL enqueue
/// the work later; the buffers dropped right after the call live until then.
#[test]
fn on_non_blocking_communicators_the_buffers_live_until_the_work_is_enqueued() {
    for version in [VERSIONS[0], VERSIONS[3]] {
        let rig = Rig::with_version(2, version);
        let got = rig.non_blocking_ranks(Duration::from_secs(10), |r, ctx, comm| {
            let s = Stream::non_blocking(ctx).unwrap();
            let l = Layout::of(2, r);
            let mut out = DeviceBuffer::<i32>::zeroed(ctx, l.recv_len).unwrap();
            {
                let send = DeviceBuffer::from_slice(ctx, &l.send::<i32>(r)).unwrap();
                let untouched = vec![UNTOUCHED as i32; l.recv_len];
                let mut recv = DeviceBuffer::from_slice(ctx, &untouched).unwrap();
                comm.all_to_all_v(
                    &send,
                    &l.send_counts,
                    &l.send_displs,
                    &mut recv,
                    &l.recv_counts,
                    &l.recv_displs,
                    &s,
                )
                .unwrap();
                out.copy_from_async(&recv, &s).unwrap();
            }
            comm.wait(&s).unwrap();
            s.synchronize().unwrap();
            out.to_vec().unwrap()
        });
        for (r, got) in got.into_iter().enumerate() {
            assert_eq!(got, Layout::of(2, r).want::<i32>(r), "NCCL {version}");
        }
        let v = rig.gpus.violations();
        assert!(v.is_empty(), "the sanitizer saw:\n{}", v.join("\n"));
        rig.assert_clean();
    }
}

/// A receive NCCL refuses inside the call's own group: the error is NCCL's, and the
/// communicator is aborted only after the group ended (it held the recorded send, which
/// waits in vain for its receive until the simulated NCCL's timeout: short here).
#[test]
fn a_failure_inside_its_group_aborts_after_the_group() {
    let rig = Rig::with_nccl(1, |nccl| nccl.timeout(Duration::from_millis(300)));
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    let send = DeviceBuffer::from_slice(&ctx, &[1i32, 2]).unwrap();
    let mut recv = DeviceBuffer::<i32>::zeroed(&ctx, 2).unwrap();
    let ends = rig.world.calls("ncclGroupEnd");
    rig.fail_next("ncclRecv", ncclResult_t::ncclSystemError);
    let e = comm
        .all_to_all_v(&send, &[2], &[0], &mut recv, &[2], &[0], &s)
        .unwrap_err();
    assert!(
        matches!(&e, Error::Nccl { call: "ncclRecv", code, .. } if *code == ncclResult_t::ncclSystemError),
        "{e:?}"
    );
    assert_eq!(rig.world.calls("ncclGroupEnd"), ends + 1, "its group ended");
    let again = comm.all_to_all_v(&send, &[2], &[0], &mut recv, &[2], &[0], &s);
    assert_eq!(again, Err(Error::Aborted));
    assert!(comm.is_aborted());
    assert_eq!(
        rig.world.calls("ncclGroupEnd"),
        ends + 1,
        "refused before a group"
    );
    let v = rig.gpus.violations();
    assert!(v.is_empty(), "the sanitizer saw:\n{}", v.join("\n"));
    drop((send, recv, s, comm, ctx));
    rig.assert_clean();
}

fn invalid(problem: &str) -> Error {
    Error::InvalidArgument {
        what: "all_to_all_v",
        problem: problem.into(),
    }
}

/// Each bad layout, buffer or stream is its typed error, and no NCCL call is made (no
/// group, no send, no receive); the communicators work afterwards.
#[test]
fn bad_layouts_are_typed_errors_before_any_nccl_call() {
    let rig = Rig::new(3);
    let elsewhere = Rig::new(1); // another `Cuda`: its device 0 is another context
    let calls = ["ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv"];
    let before: Vec<u64> = calls.iter().map(|c| rig.world.calls(c)).collect();
    let results = rig.run(2, |comm, s| {
        let (r, ctx) = (comm.rank(), comm.context());
        let other = rig.context(2);
        let foreign_ctx = elsewhere.cuda.device(0).unwrap().primary_context().unwrap();
        let send = DeviceBuffer::<i32>::zeroed(ctx, 8).unwrap();
        let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 8).unwrap();
        let foreign = DeviceBuffer::<i32>::zeroed(&other, 8).unwrap();
        let mut foreign_recv = DeviceBuffer::<i32>::zeroed(&other, 8).unwrap();
        let mut other_cuda = DeviceBuffer::<i32>::zeroed(&foreign_ctx, 8).unwrap();
        let foreign_stream = Stream::new(&other).unwrap();
        let ok = [2usize, 2];
        let at = [0usize, 2];
        let mut self_counts = [2usize, 2];
        self_counts[r] = 1;
        let e = vec![
            comm.all_to_all_v(&send, &[1, 1, 1], &at, &mut recv, &ok, &at, s),
            comm.all_to_all_v(&send, &ok, &at, &mut recv, &ok, &[0], s),
            comm.all_to_all_v(&send, &ok, &[0, 7], &mut recv, &ok, &at, s),
            comm.all_to_all_v(&send, &ok, &at, &mut recv, &ok, &[0, usize::MAX], s),
            comm.all_to_all_v(&send, &[0, 2], &[9, 0], &mut recv, &ok, &at, s),
            comm.all_to_all_v(&send, &ok, &at, &mut recv, &ok, &[3, 2], s),
            comm.all_to_all_v(&send, &self_counts, &at, &mut recv, &ok, &at, s),
            comm.all_to_all_v(&foreign, &ok, &at, &mut recv, &ok, &at, s),
            comm.all_to_all_v(&send, &ok, &at, &mut foreign_recv, &ok, &at, s),
            comm.all_to_all_v(&send, &ok, &at, &mut recv, &ok, &at, &foreign_stream),
            comm.all_to_all_v(&send, &ok, &at, &mut other_cuda, &ok, &at, s),
        ];
        e.into_iter().map(Result::unwrap_err).collect::<Vec<_>>()
    });
    for (r, e) in results.iter().enumerate() {
        let want = [
            invalid("send_counts has 3 entries, it needs one per rank (2)"),
            invalid("recv_displs has 1 entry, it needs one per rank (2)"),
            invalid(
                "send_displs[1] + send_counts[1] = 7 + 2 = 9 is past the end of the send \
                 buffer (8 elements)",
            ),
            invalid(&format!(
                "recv_displs[1] + recv_counts[1] = {} + 2 overflows",
                usize::MAX
            )),
            invalid(
                "send_displs[0] + send_counts[0] = 9 + 0 = 9 is past the end of the send \
                 buffer (8 elements)",
            ),
            invalid(
                "the receive regions from rank 1 (elements 2..4) and rank 0 (elements 3..5) \
                 overlap: both would be written at once",
            ),
            invalid(&format!(
                "rank {r} sends 1 element to itself (send_counts[{r}]) but receives 2 \
                 (recv_counts[{r}])"
            )),
            Error::WrongDevice {
                what: "all_to_all_v",
                object: "send buffer",
                expected: r as i32,
                found: 2,
            },
            Error::WrongDevice {
                what: "all_to_all_v",
                object: "recv buffer",
                expected: r as i32,
                found: 2,
            },
            Error::WrongDevice {
                what: "all_to_all_v",
                object: "stream",
                expected: r as i32,
                found: 2,
            },
            if r == 0 {
                Error::WrongContext {
                    what: "all_to_all_v",
                    object: "recv buffer",
                    device: 0,
                }
            } else {
                Error::WrongDevice {
                    what: "all_to_all_v",
                    object: "recv buffer",
                    expected: 1,
                    found: 0,
                }
            },
        ];
        assert_eq!(e.len(), want.len());
        for (i, (got, want)) in e.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "rank {r}, case {i}: {got}");
            assert!(got.to_string().starts_with("all_to_all_v: "), "{got}");
        }
    }
    for (c, b) in calls.iter().zip(&before) {
        assert_eq!(rig.world.calls(c), *b, "{c}: refused calls reach no NCCL");
    }
    // The communicators were left as they were.
    let got = rig.run(2, exchange::<i32>);
    for (r, got) in got.into_iter().enumerate() {
        assert_eq!(got, Layout::of(2, r).want::<i32>(r));
    }
    rig.assert_clean();
    elsewhere.assert_clean();
}

/// Pooled buffers follow the pool table's `all_to_all` rules: registered at their first
/// all-to-all-v from the table's size on, not below it, and never by the rules of
/// another collective.
#[test]
fn pooled_buffers_register_by_the_all_to_all_rules() {
    use crate::common::{MIB_F32, pooled};
    on_one_rank(1, |_, OneRank { comm, s, .. }| {
        // The test table registers all-to-all buffers from 1 MiB.
        let mut small_send = pooled(&comm).buffer::<f32>(16).unwrap();
        small_send.fill(1.0).unwrap();
        let mut small_recv = pooled(&comm).buffer::<f32>(16).unwrap();
        comm.all_to_all_v(&small_send, &[8], &[8], &mut small_recv, &[8], &[0], &s)
            .unwrap();
        assert!(!small_send.is_registered() && !small_recv.is_registered());
        let mut send = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        send.fill(2.0).unwrap();
        let mut recv = pooled(&comm).buffer::<f32>(MIB_F32).unwrap();
        let half = MIB_F32 / 2;
        comm.all_to_all_v(&send, &[half], &[0], &mut recv, &[half], &[half], &s)
            .unwrap();
        assert!(send.is_registered() && recv.is_registered());
        s.synchronize().unwrap();
        let got = recv.to_vec().unwrap();
        assert!(got[half..].iter().all(|&x| x == 2.0));
        assert_eq!(small_recv.to_vec().unwrap()[..8], [1.0; 8]);
        // Only the all-to-all rules: a table without them registers nothing.
        comm.set_pool_policy(nccl_channel::PoolPolicy::parse("sendrecv 0 registered").unwrap());
        let other_send = comm.buffer::<f32>(MIB_F32).unwrap();
        let mut other_recv = comm.buffer::<f32>(MIB_F32).unwrap();
        comm.all_to_all_v(&other_send, &[4], &[0], &mut other_recv, &[4], &[0], &s)
            .unwrap();
        assert!(!other_send.is_registered() && !other_recv.is_registered());
        s.synchronize().unwrap();
        drop((small_send, small_recv, send, recv, other_send, other_recv));
    });
}

/// A group that launches rank 0's part while rank 1's call inside it was refused: rank
/// 0's sends and receives have no peer, and NCCL keeps them queued. Before, the group let
/// go of rank 0's buffers and the communicator stayed usable: the next exchange paired
/// with the queued work, which read and wrote the freed buffers. A group that ends in an
/// error now aborts its communicators and keeps what their calls used.
#[test]
fn a_group_whose_peer_part_was_refused_keeps_its_buffers_and_aborts() {
    let version = NcclVersion(nccl_sys::NCCL_VERSION_CODE as i32);
    let rig = Rig::with_timeout(2, version, Duration::from_millis(500));
    let (ctxs, comms) = rig.all_ranks(2);
    let st: Vec<Stream> = streams(&ctxs);
    let a0 = DeviceBuffer::from_slice(&ctxs[0], &[1i32, 2, 3, 4]).unwrap();
    let mut r0 = DeviceBuffer::<i32>::zeroed(&ctxs[0], 4).unwrap();
    let a1 = DeviceBuffer::from_slice(&ctxs[1], &[5i32, 6, 7, 8]).unwrap();
    let mut r1 = DeviceBuffer::<i32>::zeroed(&ctxs[1], 4).unwrap();
    let failed = nccl_channel::group(&rig.nccl, || {
        comms[0].all_to_all_v(&a0, &[2, 2], &[0, 2], &mut r0, &[2, 2], &[0, 2], &st[0])?;
        // Overlapping receive regions: refused before any NCCL call.
        comms[1].all_to_all_v(&a1, &[2, 2], &[0, 2], &mut r1, &[2, 2], &[0, 1], &st[1])?;
        Ok(())
    });
    assert!(failed.is_err());
    drop((a0, r0));
    // A later exchange: rank 0's communicator is aborted, nothing pairs with the old part.
    let later = nccl_channel::group(&rig.nccl, || {
        for r in 0..2 {
            let a = DeviceBuffer::from_slice(&ctxs[r], &[9i32; 4]).unwrap();
            let mut b = DeviceBuffer::<i32>::zeroed(&ctxs[r], 4).unwrap();
            comms[r].all_to_all_v(&a, &[2, 2], &[0, 2], &mut b, &[2, 2], &[0, 2], &st[r])?;
        }
        Ok(())
    });
    assert!(later.is_err(), "the aborted communicator refuses");
    let v = rig.gpus.violations();
    assert!(v.is_empty(), "sanitizer: {v:?}");
}
