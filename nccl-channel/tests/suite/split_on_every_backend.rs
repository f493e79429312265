//! Grouped split and shrink of local ranks from one thread, written once and run on every
//! backend: the simulated machine, and real NCCL on 2 GPUs (`--include-ignored` on the GPU
//! machine; the shrink needs NCCL >= 2.27 and says it skipped otherwise). NCCL writes a
//! grouped split's new communicators only when the group ends, and a non-blocking
//! parent's only when its split completed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::grouped_sums;
use cuda_hal::{Context, DeviceBuffer, Stream};
use nccl_channel::{CommConfig, Communicator, Error, UniqueId};

use crate::on_every_backend;
use nccl_sys::Nccl;

/// Two non-blocking ranks (30 s deadline), made on threads of their own, handed here.
fn non_blocking(nccl: &Arc<Nccl>, ctxs: &[Context]) -> Vec<Communicator> {
    let id = UniqueId::generate(nccl).unwrap();
    let config = CommConfig::non_blocking(Duration::from_secs(30));
    std::thread::scope(|s| {
        let hs: Vec<_> = ctxs
            .iter()
            .enumerate()
            .map(|(r, ctx)| {
                let (id, config) = (&id, &config);
                s.spawn(move || Communicator::init_rank_with(nccl, ctx, id, 2, r, config).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// All-reduces (sum) `values[i]` (1 Mi elements each) over `comms[i]` in one group from
/// this thread; returns the first element of each result, checking all are equal.
fn sums(nccl: &Nccl, comms: &[&Communicator], values: &[f32]) -> Vec<f32> {
    const N: usize = 1 << 20;
    let streams: Vec<Stream> = comms
        .iter()
        .map(|c| Stream::non_blocking(c.context()).unwrap())
        .collect();
    let mut bufs: Vec<DeviceBuffer<f32>> = comms
        .iter()
        .zip(values)
        .map(|(c, v)| DeviceBuffer::from_slice(c.context(), &vec![*v; N]).unwrap())
        .collect();
    let sums = grouped_sums(nccl, comms, &mut bufs, &streams);
    for v in &sums {
        assert!(v.iter().all(|x| *x == v[0]));
    }
    sums.iter().map(|v| v[0]).collect()
}

/// The children of a grouped split that gives every parent one.
fn every_child(parts: &[(&Communicator, Option<u32>, i32)]) -> Vec<Communicator> {
    let children = Communicator::split_all(parts).unwrap();
    children.into_iter().map(Option::unwrap).collect()
}

/// Each communicator's rank and size.
fn ranks_and_sizes(comms: &[Communicator]) -> Vec<(usize, usize)> {
    comms.iter().map(|c| (c.rank(), c.size())).collect()
}

on_every_backend! {
    fn grouped_split_of_two_local_ranks_from_one_thread(m, gpus = 2) {
        let (nccl, ctxs) = (&m.nccl, &m.ctxs);
        let comms = Communicator::init_all(nccl, ctxs).unwrap();
        // One color, keys reversed: the children's ranks are swapped.
        let swapped = every_child(&[(&comms[0], Some(0), 1), (&comms[1], Some(0), 0)]);
        assert_eq!(ranks_and_sizes(&swapped), [(1, 2), (0, 2)]);
        assert_eq!(
            sums(nccl, &[&swapped[0], &swapped[1]], &[1.0, 2.0]),
            [3.0, 3.0]
        );
        // Rank 1 opts out; rank 0 alone.
        let solo = Communicator::split_all(&[(&comms[0], Some(4), 0), (&comms[1], None, 0)]).unwrap();
        assert!(solo[1].is_none());
        let solo = solo.into_iter().next().flatten().unwrap();
        assert_eq!((solo.rank(), solo.size()), (0, 1));
        assert_eq!(sums(nccl, &[&solo], &[5.0]), [5.0]);
        println!("blocking: grouped split of 2 local ranks (keys swap them, one opts out): ok");
    }
}

on_every_backend! {
    fn grouped_and_single_split_of_non_blocking_ranks(m, gpus = 2) {
        let (nccl, ctxs) = (&m.nccl, &m.ctxs);
        let comms = non_blocking(nccl, ctxs);
        let children = every_child(&[(&comms[0], Some(1), 0), (&comms[1], Some(1), 0)]);
        assert_eq!(ranks_and_sizes(&children), [(0, 2), (1, 2)]);
        assert!(children.iter().all(|c| !c.config().is_blocking()));
        assert_eq!(
            sums(nccl, &[&children[0], &children[1]], &[3.0, 4.0]),
            [7.0, 7.0]
        );
        println!("non-blocking: grouped split of 2 local ranks from one thread: ok");
        // One rank per thread, each with `split` (the child is written by NCCL only when the
        // split completed: read after polling the parent).
        let pairs: Vec<(usize, usize)> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let child = c.split(Some(0), -(c.rank() as i32)).unwrap().unwrap();
                        (child.rank(), child.size())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(pairs, [(1, 2), (0, 2)]);
        println!("non-blocking: split of one rank per thread: ok");
    }
}

on_every_backend! {
    fn grouped_shrink_from_one_thread(m, gpus = 2) {
        let (nccl, ctxs) = (&m.nccl, &m.ctxs);
        if nccl.fns().ncclCommShrink.is_none() {
            // An NCCL before 2.27: the grouped shrink must be refused, typed, before any call.
            let comms = Communicator::init_all(nccl, ctxs).unwrap();
            let e = Communicator::shrink_all(&[&comms[0]], &[1]).unwrap_err();
            assert!(
                matches!(&e, Error::Unsupported { feature, .. } if *feature == "ncclCommShrink"),
                "{e}"
            );
            println!("NCCL {}: shrink_all refused ({e})", nccl.version());
            return;
        }
        for blocking in [true, false] {
            let comms = if blocking {
                Communicator::init_all(nccl, ctxs).unwrap()
            } else {
                non_blocking(nccl, ctxs)
            };
            // Rank 1 is "lost": rank 0 shrinks it away from this thread, in a group.
            let small = Communicator::shrink_all(&[&comms[0]], &[1]).unwrap();
            assert_eq!((small[0].rank(), small[0].size()), (0, 1));
            assert_eq!(small[0].config().is_blocking(), blocking);
            assert_eq!(sums(nccl, &[&small[0]], &[6.0]), [6.0]);
            println!("blocking {blocking}: grouped shrink of rank 1 from rank 0: ok");
            drop(small);
            for c in comms {
                c.abort().unwrap();
            }
        }
    }
}
