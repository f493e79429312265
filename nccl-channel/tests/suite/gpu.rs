//! nccl-channel on real GPUs (`#[ignore]`d; run with `--include-ignored` on the GPU
//! machine): every collective × data type × op, as one process driving the devices and as
//! one process per device configured by the environment; init-all; split.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use crate::common::backend::Machine;
use crate::common::{loopback_port, non_blocking_streams};
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Channel, Communicator, ReduceOp, UniqueId, group};

fn report(label: &str, nccl: &nccl_sys::Nccl, bad: &[String], ranks: usize, t: Instant) {
    let fp8 = nccl.version() >= nccl_sys::NcclVersion::new(2, 24, 0);
    println!(
        "{label}: NCCL {} ({}), {ranks} ranks, {} checks per rank, {} wrong, {:.2?}",
        nccl.version(),
        nccl.origin(),
        crate::common::matrix::checks_per_rank(fp8),
        bad.len(),
        t.elapsed()
    );
    assert!(bad.is_empty(), "{}", bad[..bad.len().min(20)].join("\n"));
}

#[test]
#[ignore = "needs 2 GPUs"]
fn every_collective_one_process_two_devices() {
    let Some(Machine { cuda, nccl, .. }) = Machine::gpus(2) else {
        return;
    };
    let n = 2;
    let id = UniqueId::generate(&nccl).unwrap();
    let t = Instant::now();
    let bad: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (cuda, nccl) = (cuda.clone(), nccl.clone());
                s.spawn(move || {
                    let ctx = cuda.device(r).unwrap().primary_context().unwrap();
                    let comm = Communicator::init_rank(&nccl, &ctx, &id, n, r).unwrap();
                    let st = Stream::non_blocking(&ctx).unwrap();
                    crate::common::matrix::check_every_type(&comm, &st).unwrap()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    report("one process, two devices", &nccl, &bad, n, t);
}

#[test]
#[ignore = "needs 2 GPUs"]
fn every_collective_two_processes_configured_by_env() {
    if std::env::var_os("NCCL_CHANNEL_GPU_WORKER").is_some() {
        // Child: one rank, everything from the environment.
        let t = Instant::now();
        let ch = Channel::from_env()
            .unwrap()
            .expect("the parent set a world");
        let bad = crate::common::matrix::check_every_type(ch.comm(), ch.stream()).unwrap();
        report(
            &format!("process rank {}", ch.comm().rank()),
            ch.comm().nccl(),
            &bad,
            ch.comm().size(),
            t,
        );
        ch.close().unwrap();
        return;
    }
    if !crate::common::gpus_or_skip(2) {
        return;
    }
    let port = loopback_port();
    let exe = std::env::current_exe().unwrap();
    let t = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|r| {
            test_support::env::scrubbed_for_gpu(&exe)
                .args([
                    &test_support::test_name(
                        module_path!(),
                        "every_collective_two_processes_configured_by_env",
                    ),
                    "--exact",
                    "--include-ignored",
                    "--nocapture",
                ])
                .env("NCCL_CHANNEL_GPU_WORKER", "1")
                .env("NCCL_CHANNEL_NPROCS", "2")
                .env("NCCL_CHANNEL_PROCID", r.to_string())
                .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
                .env("NCCL_NVLS_ENABLE", "0")
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait().unwrap();
        assert!(st.success(), "rank {r} failed: {st}");
    }
    println!(
        "two processes (NCCL_COMM_ID=127.0.0.1:{port}): both ranks passed in {:.2?}",
        t.elapsed()
    );
}

#[test]
#[ignore = "needs 2 GPUs"]
fn init_all_from_one_thread_and_split() {
    let Some(Machine { nccl, ctxs, .. }) = Machine::gpus(2) else {
        return;
    };
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams = non_blocking_streams(&ctxs);
    let sends: Vec<_> = (0..2)
        .map(|r| DeviceBuffer::from_slice(&ctxs[r], &vec![r as f32 + 1.0; 1 << 20]).unwrap())
        .collect();
    let mut recvs: Vec<_> = (0..2)
        .map(|r| DeviceBuffer::<f32>::alloc(&ctxs[r], 1 << 20).unwrap())
        .collect();
    group(&nccl, || {
        for r in 0..2 {
            comms[r].all_reduce(&sends[r], &mut recvs[r], ReduceOp::Sum, &streams[r])?;
        }
        Ok(())
    })
    .unwrap();
    for r in 0..2 {
        streams[r].synchronize().unwrap();
        assert!(recvs[r].to_vec().unwrap().iter().all(|&x| x == 3.0));
    }
    // Split into two single-rank communicators (a collective: one group for both ranks).
    let mut solos: Vec<Option<Communicator>> = vec![None, None];
    {
        let mut raws = [std::ptr::null_mut(); 2];
        let g = nccl_channel::Group::start(&nccl).unwrap();
        for r in 0..2 {
            let _b = ctxs[r].bind().unwrap();
            // SAFETY: live communicators and valid out-pointers; NULL config inherits.
            let rc = unsafe {
                (nccl.fns().ncclCommSplit)(
                    comms[r].as_raw(),
                    r as i32,
                    0,
                    &mut raws[r],
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, nccl_sys::ncclResult_t::ncclSuccess);
        }
        g.end().unwrap();
        for r in 0..2 {
            // SAFETY: made for this device by the split and owned here.
            solos[r] = Some(unsafe { Communicator::from_raw(&nccl, &ctxs[r], raws[r]) }.unwrap());
        }
    }
    for (r, solo) in solos.iter().enumerate() {
        let solo = solo.as_ref().unwrap();
        assert_eq!((solo.size(), solo.rank()), (1, 0));
        let mut b = DeviceBuffer::from_slice(&ctxs[r], &[7i64; 16]).unwrap();
        solo.all_reduce_in_place(&mut b, ReduceOp::Sum, &streams[r])
            .unwrap();
        streams[r].synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [7; 16]);
    }
    println!(
        "init_all + grouped all_reduce of 4 MiB on 2 GPUs, split into 2 single-rank comms: ok"
    );
}
