//! Faults on real GPUs (`#[ignore]`d; GPU machine): a peer killed with SIGKILL in the
//! middle of a stream of all-reduces, and a peer that never joins init. The survivor must
//! return an error within its deadline (+1 s), exit cleanly and release its GPU memory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::loopback_port;
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{ChannelBuilder, CommConfig, Error, ReduceOp, World};

use test_support::env;

const DEADLINE: Duration = Duration::from_secs(5);
const WORKER: &str = "NCCL_CHANNEL_FAULT_WORKER";

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// Child: one rank doing all-reduces until something fails; reports how it ended.
fn worker_collectives() {
    let ch = ChannelBuilder::new()
        .config(CommConfig::non_blocking(DEADLINE))
        .build()
        .unwrap()
        .unwrap();
    let comm = ch.comm();
    let ctx = comm.context().clone();
    let free_start = ctx.memory_info().unwrap().free;
    let st = Stream::non_blocking(&ctx).unwrap();
    let a = DeviceBuffer::<f32>::zeroed(&ctx, 16 << 20).unwrap();
    let mut b = DeviceBuffer::<f32>::zeroed(&ctx, 16 << 20).unwrap();
    let free_busy = ctx.memory_info().unwrap().free;
    let started = Instant::now();
    let mut last_ok = Instant::now();
    let mut i = 0u64;
    let err = loop {
        match comm
            .all_reduce(&a, &mut b, ReduceOp::Sum, &st)
            .and_then(|_| comm.wait(&st))
        {
            Ok(()) => {
                last_ok = Instant::now();
                i += 1;
                if i.is_multiple_of(100) {
                    println!("iter {i}");
                }
            }
            Err(e) => break e,
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no failure after 120 s"
        );
    };
    let detect = last_ok.elapsed();
    println!(
        "survivor: error {detect:.3?} after the last completed all_reduce (iteration {i}): {err}"
    );
    drop((a, b));
    drop(st);
    let aborted = comm.is_aborted();
    drop(ch);
    let free_end = ctx.memory_info().unwrap().free;
    println!(
        "survivor: communicator aborted: {aborted}; free GPU memory: {:.0} MiB at start, {:.0} MiB while running, {:.0} MiB after cleanup",
        mib(free_start),
        mib(free_busy),
        mib(free_end)
    );
    assert!(
        matches!(err, Error::Timeout { .. } | Error::Nccl { .. }),
        "{err}"
    );
    assert!(detect <= DEADLINE + Duration::from_secs(1), "{detect:?}");
    assert!(
        free_end + (64 << 20) >= free_start,
        "GPU memory not released"
    );
}

/// Child: rank 0 of two, whose peer never comes.
fn worker_lonely_init() {
    let t = Instant::now();
    let e = ChannelBuilder::new()
        .world(World::new(2, 0).unwrap())
        .config(CommConfig::non_blocking(Duration::from_secs(3)))
        .build()
        .unwrap_err();
    let took = t.elapsed();
    println!("lonely rank: init failed after {took:.3?}: {e}");
    assert!(
        matches!(&e, Error::Timeout { what, after }
            if what == "ncclCommInitRankConfig" && *after == Duration::from_secs(3)),
        "{e}"
    );
    assert!(took <= Duration::from_secs(4), "{took:?}");
}

fn spawn(rank: usize, size: usize, port: u16, mode: &str) -> std::process::Child {
    env::scrubbed_for_gpu(std::env::current_exe().unwrap())
        .args([
            &test_support::test_name(module_path!(), "faults_on_real_gpus"),
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env(WORKER, mode)
        .env("NCCL_CHANNEL_NPROCS", size.to_string())
        .env("NCCL_CHANNEL_PROCID", rank.to_string())
        .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
        .env("NCCL_NVLS_ENABLE", "0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("process still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn faults_on_real_gpus() {
    match std::env::var(WORKER).as_deref() {
        Ok("collectives") => return worker_collectives(),
        Ok("lonely") => return worker_lonely_init(),
        _ => {}
    }
    let cuda = cuda_hal::Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    if !test_support::enough_gpus(cuda.device_count().unwrap(), 2) {
        return;
    }
    drop(cuda);
    let port = || loopback_port();
    // 1. SIGKILL one of two ranks in the middle of a stream of all-reduces.
    let p = port();
    let mut survivor = spawn(0, 2, p, "collectives");
    let mut victim = spawn(1, 2, p, "collectives");
    let out = victim.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        let l = lines.next().expect("victim output").unwrap();
        if l == "iter 200" {
            break;
        }
    }
    let killed = Instant::now();
    victim.kill().unwrap();
    victim.wait().unwrap();
    let st = wait_exit(&mut survivor, DEADLINE + Duration::from_secs(15));
    let took = killed.elapsed();
    let mut text = String::new();
    for l in BufReader::new(survivor.stdout.take().unwrap()).lines() {
        text.push_str(&l.unwrap());
        text.push('\n');
    }
    println!("{text}");
    println!("killed rank 1 with SIGKILL; rank 0 exited {st} {took:.3?} later");
    assert!(st.success(), "the survivor did not exit cleanly");
    assert!(text.contains("survivor: error"), "{text}");
    // 2. A peer that never joins init.
    let mut lonely = spawn(0, 2, port(), "lonely");
    let st = wait_exit(&mut lonely, Duration::from_secs(20));
    let mut text = String::new();
    for l in BufReader::new(lonely.stdout.take().unwrap()).lines() {
        text.push_str(&l.unwrap());
        text.push('\n');
    }
    println!("{text}");
    assert!(
        st.success() && text.contains("lonely rank: init failed"),
        "{text}"
    );
}
