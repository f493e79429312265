//! NCCL memory, registrations, windows and the pool on real NCCL and two GPUs
//! (`#[ignore]`d; run with `--include-ignored`). One thread drives both ranks, so every
//! collective (and the windows' collective registration) goes through one group.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use cuda_hal::{CaptureMode, Context, DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, ReduceOp, WindowFlags, group};
use nccl_sys::Nccl;

use crate::common::{non_blocking_streams, pooled};

/// NCCL and two GPUs' contexts, or `None` (said) on a machine with fewer.
fn two_gpus() -> Option<(Arc<Nccl>, Vec<Context>)> {
    crate::common::backend::Machine::gpus(2).map(|m| (m.nccl, m.ctxs))
}

const N: usize = 1 << 22; // 16 MiB of f32 per rank

fn filled(c: &Communicator, v: f32) -> DeviceBuffer<f32> {
    let mut b = c.alloc_nccl::<f32>(N).unwrap();
    b.fill(v).unwrap();
    b
}

#[test]
#[ignore = "needs two GPUs and NCCL >= 2.19"]
fn registered_all_gather_and_all_reduce_on_two_gpus() {
    let Some((nccl, ctxs)) = two_gpus() else {
        return;
    };
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams: Vec<Stream> = non_blocking_streams(&ctxs);
    let send: Vec<_> = comms
        .iter()
        .map(|c| filled(c, c.rank() as f32 + 1.0))
        .collect();
    let mut recv: Vec<_> = comms
        .iter()
        .map(|c| c.alloc_nccl::<f32>(2 * N).unwrap())
        .collect();
    let regs: Vec<_> = comms
        .iter()
        .zip(&send)
        .zip(&recv)
        .map(|((c, s), r)| (c.register(s).unwrap(), c.register(r).unwrap()))
        .collect();
    for _ in 0..3 {
        group(&nccl, || {
            for (((c, s), r), st) in comms.iter().zip(&send).zip(&mut recv).zip(&streams) {
                c.all_gather(s, r, st)?;
            }
            Ok(())
        })
        .unwrap();
    }
    for (r, st) in recv.iter().zip(&streams) {
        st.synchronize().unwrap();
        let v = r.to_vec().unwrap();
        assert!(v[..N].iter().all(|x| *x == 1.0) && v[N..].iter().all(|x| *x == 2.0));
    }
    drop(regs);
    println!("all_gather of registered NCCL memory: ok");

    // In place, captured into a graph whose registrations outlive their handles.
    let mut bufs: Vec<_> = comms.iter().map(|c| filled(c, 1.0)).collect();
    let regs: Vec<_> = comms
        .iter()
        .zip(&bufs)
        .map(|(c, b)| c.register(b).unwrap())
        .collect();
    let mut graphs = Vec::new();
    for ((c, b), st) in comms.iter().zip(&mut bufs).zip(&streams) {
        st.begin_capture(CaptureMode::Relaxed).unwrap();
        c.all_reduce_in_place(b, ReduceOp::Sum, st).unwrap();
        graphs.push(st.end_capture().unwrap().instantiate().unwrap());
    }
    drop(regs);
    drop(bufs);
    for _ in 0..4 {
        for (g, st) in graphs.iter().zip(&streams) {
            g.launch(st).unwrap();
        }
    }
    for st in &streams {
        st.synchronize().unwrap();
    }
    drop(graphs);
    for c in &comms {
        c.async_error().unwrap();
    }
    println!("graph replays after the registrations were dropped: ok");
}

#[test]
#[ignore = "needs two GPUs and NCCL >= 2.27"]
fn symmetric_windows_on_two_gpus() {
    let Some((nccl, ctxs)) = two_gpus() else {
        return;
    };
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams: Vec<Stream> = non_blocking_streams(&ctxs);
    let mut bufs: Vec<_> = comms
        .iter()
        .map(|c| filled(c, c.rank() as f32 + 1.0))
        .collect();
    let pairs: Vec<_> = comms.iter().zip(bufs.iter()).collect();
    let wins = match Communicator::register_windows(&pairs, WindowFlags::COLL_SYMMETRIC) {
        // Older than 2.27: the refusal must name the release (and nothing is registered).
        Err(Error::Unsupported {
            feature,
            needed,
            found,
        }) => {
            assert!(
                nccl.version() < nccl_sys::NcclVersion::new(2, 27, 3),
                "{found}"
            );
            assert_eq!(
                (feature, needed.as_str()),
                ("ncclCommWindowRegister", "2.27.3")
            );
            println!("NCCL {found}: windows refused, they need {needed}");
            return;
        }
        r => r.unwrap(),
    };
    println!(
        "windows active: {:?}",
        wins.iter().map(|w| w.is_active()).collect::<Vec<_>>()
    );
    group(&nccl, || {
        for ((c, b), st) in comms.iter().zip(&mut bufs).zip(&streams) {
            c.all_reduce_in_place(b, ReduceOp::Sum, st)?;
        }
        Ok(())
    })
    .unwrap();
    for (b, st) in bufs.iter().zip(&streams) {
        st.synchronize().unwrap();
        assert!(b.to_vec().unwrap().iter().all(|x| *x == 3.0));
    }
    drop(wins);
    println!("all_reduce on symmetric windows: ok");
}

#[test]
#[ignore = "needs two GPUs"]
fn the_pool_on_two_gpus() {
    let Some((nccl, ctxs)) = two_gpus() else {
        return;
    };
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams: Vec<Stream> = non_blocking_streams(&ctxs);
    let mut first = Vec::new();
    for step in 0..5 {
        let mut bufs: Vec<_> = comms
            .iter()
            .map(|c| pooled(c).buffer::<f32>(N).unwrap())
            .collect();
        if step == 0 {
            first = bufs.iter().map(|b| b.as_raw()).collect();
        }
        assert_eq!(bufs.iter().map(|b| b.as_raw()).collect::<Vec<_>>(), first);
        for (c, b) in comms.iter().zip(&mut bufs) {
            b.fill(step as f32 + c.rank() as f32).unwrap();
        }
        // All-reduce leaves the buffers unregistered; the all-gather registers them.
        group(&nccl, || {
            for ((c, b), st) in comms.iter().zip(&mut bufs).zip(&streams) {
                c.all_reduce_in_place(&mut **b, ReduceOp::Sum, st)?;
            }
            Ok(())
        })
        .unwrap();
        assert!(bufs.iter().all(|b| b.is_registered() == (step > 0)));
        group(&nccl, || {
            for ((c, b), st) in comms.iter().zip(&mut bufs).zip(&streams) {
                c.all_gather_in_place(&mut **b, st)?;
            }
            Ok(())
        })
        .unwrap();
        let sum = 2.0 * step as f32 + 1.0;
        for (b, st) in bufs.iter().zip(&streams) {
            st.synchronize().unwrap();
            assert!(b.to_vec().unwrap().iter().all(|x| *x == sum));
        }
        assert!(bufs.iter().all(|b| b.is_registered()));
    }
    for c in &comms {
        assert_eq!(c.pooled_buffers(), 1);
        c.trim_pool().unwrap();
    }
    println!("pool: 5 steps on one buffer per rank, registered by the first all-gather: ok");
}
