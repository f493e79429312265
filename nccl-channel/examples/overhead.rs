//! Host overhead of the safe layer: time per call through nccl-channel / cuda-hal against
//! the same call through the raw function table, on the simulated backends (with NCCL's
//! collectives as no-ops), so that only our own code differs between the two columns.
//!
//! ```text
//! cargo run --release -p nccl-channel --example overhead [-- ITERS]
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use cuda_hal::{Cuda, DeviceBuffer, Event, Stream};
use cuda_mock::MockDriver;
use nccl_channel::{Communicator, ReduceOp, UniqueId};
use nccl_mock::MockNccl;
use nccl_sys::{ncclDataType_t, ncclRedOp_t};

fn ns_per_call(iters: u64, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    let (nccl, _w) = MockNccl::new(&gpus).null_collectives(true).build()?;
    let nccl = Arc::new(nccl);
    let ctx = cuda.device(0)?.primary_context()?;
    let id = UniqueId::generate(&nccl)?;
    let comm = Communicator::init_rank(&nccl, &ctx, &id, 1, 0)?;
    let id2 = UniqueId::generate(&nccl)?;
    let comm2 = Communicator::init_rank(&nccl, &ctx, &id2, 1, 0)?;
    // A second communicator with a live pooled buffer that no collective registered (as
    // a training loop's all-reduced gradients under the measured table): its registry has
    // slots, so every collective of comm2 asks the pool's table whether to register.
    let _live = comm2.buffer::<f32>(16)?;
    let mut big = comm2.buffer::<f32>(1 << 20)?; // 4 MiB, all-reduced: plain in the table
    let stream = Stream::non_blocking(&ctx)?;
    let send = DeviceBuffer::<f32>::zeroed(&ctx, 1024)?;
    let mut recv = DeviceBuffer::<f32>::zeroed(&ctx, 1024)?;
    let ev = Event::without_timing(&ctx)?;
    let f = nccl.fns();
    let d = cuda.fns();
    let (sp, rp) = (
        send.as_raw() as usize as *const _,
        recv.as_raw() as usize as *mut _,
    );
    let (c, s) = (comm.as_raw(), stream.as_raw());
    let rounds = 15;
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        ("all_reduce enqueue", vec![], vec![]),
        ("event record + query", vec![], vec![]),
        ("all_reduce, slots live", vec![], vec![]),
        ("all_reduce 4M pooled", vec![], vec![]),
    ];
    for _ in 0..rounds {
        rows[0].1.push(ns_per_call(iters, || {
            // SAFETY: valid buffers of 1024 floats, communicator and stream.
            let rc = unsafe {
                (f.ncclAllReduce)(
                    sp,
                    rp,
                    1024,
                    ncclDataType_t::ncclFloat32,
                    ncclRedOp_t::ncclSum,
                    c,
                    s,
                )
            };
            black_box(rc);
        }));
        rows[0].2.push(ns_per_call(iters, || {
            black_box(comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)).ok();
        }));
        // The same raw call (the simulated collectives are no-ops at any size).
        let last = rows[0].1[rows[0].1.len() - 1];
        rows[2].1.push(last);
        rows[2].2.push(ns_per_call(iters, || {
            black_box(comm2.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)).ok();
        }));
        rows[3].1.push(last);
        rows[3].2.push(ns_per_call(iters, || {
            black_box(comm2.all_reduce_in_place(&mut big, ReduceOp::Sum, &stream)).ok();
        }));
        rows[1].1.push(ns_per_call(iters, || {
            // SAFETY: valid event and stream of the same context.
            let rc = unsafe {
                (
                    (d.cuEventRecord)(ev.as_raw(), s),
                    (d.cuEventQuery)(ev.as_raw()),
                )
            };
            black_box(rc);
        }));
        rows[1].2.push(ns_per_call(iters, || {
            black_box(stream.record(&ev).and_then(|_| ev.is_complete())).ok();
        }));
    }
    println!(
        "# host overhead per call, simulated backends, {rounds} interleaved rounds of {iters} calls"
    );
    println!(
        "# {:<24} {:>10} {:>10} {:>14} {:>10} {:>10} {:>14}",
        "operation", "raw min", "safe min", "overhead min", "raw med", "safe med", "overhead med"
    );
    for (name, raw, safe) in rows {
        let (rm, sm) = (min(&raw), min(&safe));
        let (rd, sd) = (median(raw), median(safe));
        println!(
            "  {:<24} {:>10.1} {:>10.1} {:>14.1} {:>10.1} {:>10.1} {:>14.1}",
            name,
            rm,
            sm,
            sm - rm,
            rd,
            sd,
            sd - rd
        );
    }
    println!("# ns per call; overhead = safe - raw");
    Ok(())
}
