//! Collectives on views, on other crates' memory and on raw addresses, on the simulated
//! driver and NCCL (whose sanitizers check every address when the work executes).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{Rig, capture, non_blocking_streams, zeroed_on_each};
use cuda_hal::{DeviceBuffer, DeviceView};
use nccl_channel::{Error, ReduceOp, group};

/// The most common all-reduce of all: gradients of one flat buffer, averaged in buckets.
#[test]
fn bucketed_average_over_one_flat_buffer() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let r = c.rank() as f32;
            let grads: Vec<f32> = (0..10).map(|i| i as f32 + 10.0 * r).collect();
            let mut flat = DeviceBuffer::from_slice(c.context(), &grads).unwrap();
            let mut buckets = 0;
            for mut bucket in flat.chunks_mut(4).unwrap() {
                c.all_reduce_in_place(&mut bucket, ReduceOp::Avg, s)
                    .unwrap();
                buckets += 1;
            }
            s.synchronize().unwrap();
            (buckets, flat.to_vec().unwrap())
        });
        let want: Vec<f32> = (0..10).map(|i| i as f32 + 5.0).collect();
        for (buckets, v) in out {
            assert_eq!(buckets, 3);
            assert_eq!(v, want);
        }
    });
}

/// Out-of-place collectives between views of one buffer, and the in-place forms on views.
#[test]
fn collectives_between_views_of_one_buffer() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let r = c.rank() as i32;
            // [send: 2][gathered: 4][spare: 2]
            let mut b =
                DeviceBuffer::from_slice(c.context(), &[r + 1, r + 2, 0, 0, 0, 0, -1, -1]).unwrap();
            let (send, mut rest) = b.split_at_mut(2).unwrap();
            let send = send.into_view();
            c.all_gather(&send, &mut rest.reborrow().slice_mut(..4).unwrap(), s)
                .unwrap();
            // In place on a view: this rank's part is at rank * 1 of the two-element view.
            let mut pair = rest.slice_mut(4..).unwrap();
            pair.copy_from_host(&[10 * (r + 1), 10 * (r + 1)]).unwrap();
            c.all_gather_in_place(&mut pair, s).unwrap();
            s.synchronize().unwrap();
            b.to_vec().unwrap()
        });
        for (r, v) in out.iter().enumerate() {
            let r = r as i32;
            assert_eq!(v, &[r + 1, r + 2, 1, 2, 2, 3, 10, 20]);
        }
    });
}

/// Root-only arguments are views; a view of the wrong length is a typed error naming it.
#[test]
fn root_only_views_and_their_checks() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let mut b = DeviceBuffer::from_slice(c.context(), &[c.rank() as u32 * 7; 4]).unwrap();
            let mut dst = DeviceBuffer::<u32>::zeroed(c.context(), 2).unwrap();
            let root = c.rank() == 1;
            c.broadcast(root.then(|| b.slice(1..3).unwrap()), &mut dst, 1, s)
                .unwrap();
            // Refused before any NCCL call, so only the root makes it.
            let err = root
                .then(|| {
                    c.broadcast(Some(b.slice(..1).unwrap()), &mut dst, 1, s)
                        .err()
                })
                .flatten();
            c.reduce(
                &dst,
                root.then(|| b.slice_mut(2..).unwrap()),
                ReduceOp::Sum,
                1,
                s,
            )
            .unwrap();
            s.synchronize().unwrap();
            (b.to_vec().unwrap(), err)
        });
        assert_eq!(out[0].0, [0, 0, 0, 0]);
        assert_eq!(out[0].1, None);
        assert_eq!(out[1].0, [7, 7, 14, 14]);
        assert_eq!(
            out[1].1,
            Some(Error::LengthMismatch {
                what: "broadcast",
                buffer: "send",
                expected: 2,
                got: 1
            })
        );
    });
}

/// Views used inside a group whose buffer is dropped before the group ends: the group
/// holds the whole allocation until NCCL has enqueued the work.
#[test]
fn a_group_holds_the_memory_behind_its_views() {
    Rig::new(2).check(|rig| {
        let (ctxs, comms) = rig.all_ranks(2);
        let streams: Vec<_> = non_blocking_streams(&ctxs);
        let mut outs: Vec<_> = zeroed_on_each::<i64>(&ctxs, 2);
        group(&rig.nccl, || {
            for ((c, s), out) in comms.iter().zip(&streams).zip(outs.iter_mut()) {
                let r = c.rank() as i64;
                let big = DeviceBuffer::from_slice(c.context(), &[r, r + 1, 5, 6]).unwrap();
                c.all_reduce(&big.slice(..2)?, out, ReduceOp::Sum, s)?;
                // `big` goes here, before ncclGroupEnd enqueued the all-reduce.
            }
            Ok(())
        })
        .unwrap();
        for (s, out) in streams.iter().zip(&outs) {
            s.synchronize().unwrap();
            assert_eq!(out.to_vec().unwrap(), [1, 3]);
        }
    });
}

/// A captured all-reduce on a view, replayed after the buffer was dropped.
#[test]
fn a_graph_holds_the_memory_behind_its_views() {
    Rig::new(1).check(|rig| {
        let out = rig.run(1, |c, s| {
            let mut flat = DeviceBuffer::from_slice(c.context(), &[1.0f64, 2.0, 3.0]).unwrap();
            let mut res = DeviceBuffer::<f64>::zeroed(c.context(), 2).unwrap();
            // Warm up outside the capture, as with real NCCL.
            c.all_reduce_in_place(&mut flat.slice_mut(..1).unwrap(), ReduceOp::Sum, s)
                .unwrap();
            s.synchronize().unwrap();
            let exec = capture(s, || {
                c.all_reduce(&flat.slice(1..).unwrap(), &mut res, ReduceOp::Sum, s)
                    .unwrap();
            });
            drop(flat);
            exec.launch(s).unwrap();
            s.synchronize().unwrap();
            res.to_vec().unwrap()
        });
        assert_eq!(out[0], [2.0, 3.0]);
    });
}

#[test]
fn raw_addresses_through_the_unsafe_api() {
    Rig::new(2).check(|rig| {
        let out = rig.run(2, |c, s| {
            let r = c.rank() as i32;
            let mut b = DeviceBuffer::from_slice(c.context(), &[9, r, r, 5]).unwrap();
            let p = b.as_raw();
            // SAFETY: `b` holds 4 i32 of this communicator's context and outlives the
            // synchronisation below; nothing is captured or grouped.
            unsafe {
                // In-place all-gather: this rank's element at p + rank, into [p + 1, p + 3).
                c.raw()
                    .all_gather::<i32>(p + 4 * (1 + r as u64), p + 4, 1, s)
                    .unwrap();
                c.raw()
                    .all_reduce::<i32>(p + 12, p + 12, 1, ReduceOp::Sum, s)
                    .unwrap();
            }
            s.synchronize().unwrap();
            // SAFETY: as above; ranks are checked like in the safe API.
            let bad = unsafe { c.raw().broadcast::<i32>(p, p, 1, 5, s) }.unwrap_err();
            assert!(
                matches!(
                    bad,
                    Error::InvalidRank {
                        rank: 5,
                        size: 2,
                        ..
                    }
                ),
                "{bad:?}"
            );
            let _ = &mut b;
            b.to_vec().unwrap()
        });
        // Rank r sent its element at 1 + r (value r): the gathered pair is [0, 1]; the sum
        // of the 5s is 10.
        assert_eq!(out[0], [9, 0, 1, 10]);
        assert_eq!(out[1], [9, 0, 1, 10]);
    });
}

/// A raw view reads memory it does not own; a copy into it needs it to be mutable.
#[test]
fn raw_views_of_foreign_addresses_feed_collectives() {
    Rig::new(1).check(|rig| {
        let out = rig.run(1, |c, s| {
            let b = DeviceBuffer::from_slice(c.context(), &[3u8, 4]).unwrap();
            let mut out = DeviceBuffer::<u8>::zeroed(c.context(), 2).unwrap();
            // SAFETY: `b` holds 2 u8 of this context and outlives the synchronisation.
            let v = unsafe { DeviceView::<u8>::from_raw_parts(c.context(), b.as_raw(), 2) };
            c.all_reduce(&v, &mut out, ReduceOp::Max, s).unwrap();
            s.synchronize().unwrap();
            out.to_vec().unwrap()
        });
        assert_eq!(out[0], [3, 4]);
    });
}
