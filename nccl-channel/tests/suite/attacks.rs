//! Attacks from an adversarial review: kernels, views and communicators together, on the
//! simulated driver and NCCL; each passes because the design holds. (The review's split
//! and shrink findings are regression tests in `mock_split.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use cuda_hal::{CaptureMode, Cuda, DeviceBuffer, LaunchConfig, Module, Stream};
use cuda_mock::{MockDriver, MockWorld};
use nccl_channel::{Communicator, ReduceOp, group};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::Nccl;

const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\
    .visible .entry inc(.param .u64 p, .param .u32 n) { ret; }\n";

fn rig(devices: usize, timeout: Duration) -> (Cuda, MockWorld, Arc<Nccl>, MockNcclWorld) {
    let d = MockDriver::with_devices(devices).kernel("inc", &[8, 4], |k| {
        let (p, n) = (k.param::<u64>(0), k.param::<u32>(1));
        let v: Vec<i32> = k.read::<i32>(p, n as usize).iter().map(|x| x + 1).collect();
        k.write(p, &v);
    });
    let (cuda, gpus) = d.build_with(Cuda::from_driver).unwrap();
    let (nccl, world) = MockNccl::new(&gpus).timeout(timeout).build().unwrap();
    (cuda, gpus, Arc::new(nccl), world)
}

/// Kernels launched inside an open NCCL group, modules and buffers dropped before the
/// group ends, the all-reduce of the kernels' output deferred to the group's end.
#[test]
fn attack_module_and_buffers_dropped_inside_a_group_hold() {
    let (cuda, gpus, nccl, world) = rig(2, Duration::from_secs(10));
    let ctxs: Vec<_> = (0..2)
        .map(|d| cuda.device(d).unwrap().primary_context().unwrap())
        .collect();
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams: Vec<_> = ctxs
        .iter()
        .map(|c| Stream::non_blocking(c).unwrap())
        .collect();
    let mut outs: Vec<_> = ctxs
        .iter()
        .map(|c| DeviceBuffer::<i32>::zeroed(c, 2).unwrap())
        .collect();
    group(&nccl, || {
        for ((c, s), out) in comms.iter().zip(&streams).zip(outs.iter_mut()) {
            let module = Module::from_ptx(c.context(), PTX).unwrap();
            let f = module.function("inc").unwrap();
            let mut big = DeviceBuffer::from_slice(c.context(), &[1i32, 2, 3, 4]).unwrap();
            let mut v = big.slice_mut(1..3).unwrap();
            // SAFETY: inc reads and writes n i32 at p.
            unsafe { f.launch(s, LaunchConfig::linear(1, 1), (&mut v, 2u32)) }.unwrap();
            c.all_reduce(&v.as_view(), out, ReduceOp::Sum, s)?;
            drop(f);
            drop(module);
            drop(big);
        }
        Ok(())
    })
    .unwrap();
    for (c, (s, out)) in comms.iter().zip(streams.iter().zip(&outs)) {
        c.wait(s).unwrap();
        assert_eq!(out.to_vec().unwrap(), [6, 8]);
    }
    drop((outs, streams, comms, ctxs));
    drop((nccl, cuda));
    assert!(gpus.violations().is_empty(), "{:?}", gpus.violations());
    assert!(gpus.live().is_empty(), "{:?}", gpus.live());
    assert!(world.live().is_empty(), "{:?}", world.live());
}

/// A captured kernel + all-reduce on a view; everything but the communicator dropped
/// before the graph is replayed twice.
#[test]
fn attack_captured_kernel_and_collective_on_views_hold() {
    let (cuda, gpus, nccl, world) = rig(1, Duration::from_secs(10));
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<i32>::zeroed(&ctx, 2).unwrap();
    let mut flat = DeviceBuffer::from_slice(&ctx, &[0i32; 4]).unwrap();
    // Warm up outside the capture, as with real NCCL.
    comm.all_reduce_in_place(&mut out, ReduceOp::Sum, &s)
        .unwrap();
    s.synchronize().unwrap();
    let exec = {
        let module = Module::from_ptx(&ctx, PTX).unwrap();
        let f = module.function("inc").unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let (_, mut hi) = flat.split_at_mut(2).unwrap();
        // SAFETY: inc reads and writes n i32 at p.
        unsafe { f.launch(&s, LaunchConfig::linear(1, 1), (&mut hi, 2u32)) }.unwrap();
        comm.all_reduce(&hi.as_view(), &mut out, ReduceOp::Sum, &s)
            .unwrap();
        s.end_capture().unwrap().instantiate().unwrap()
    };
    drop(flat);
    exec.launch(&s).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [2, 2]);
    drop((exec, out, s, comm, ctx));
    drop((nccl, cuda));
    assert!(gpus.violations().is_empty(), "{:?}", gpus.violations());
    assert!(gpus.live().is_empty(), "{:?}", gpus.live());
    assert!(world.live().is_empty(), "{:?}", world.live());
}
