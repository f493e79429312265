//! Attacks from an adversarial review: kernels, views and communicators together, on the
//! simulated driver and NCCL; each passes because the design holds. (The review's split
//! and shrink findings are regression tests in `mock_split.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::{Rig, capture, non_blocking_streams, zeroed_on_each};
use cuda_hal::{DeviceBuffer, LaunchConfig, Module, Stream};
use cuda_mock::MockDriver;
use nccl_channel::{ReduceOp, group};

const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\
    .visible .entry inc(.param .u64 p, .param .u32 n) { ret; }\n";

/// A simulated machine of `devices` GPUs whose driver knows the kernel `inc` (adds one to
/// each of `n` i32 at `p`), its NCCL's waits for peers ending after `timeout`.
fn rig(devices: usize, timeout: Duration) -> Rig {
    let driver = MockDriver::with_devices(devices).kernel("inc", &[8, 4], |k| {
        let (p, n) = (k.param::<u64>(0), k.param::<u32>(1));
        let v: Vec<i32> = k.read::<i32>(p, n as usize).iter().map(|x| x + 1).collect();
        k.write(p, &v);
    });
    Rig::from_driver(driver, |nccl| nccl.timeout(timeout))
}

/// Kernels launched inside an open NCCL group, modules and buffers dropped before the
/// group ends, the all-reduce of the kernels' output deferred to the group's end.
#[test]
fn attack_module_and_buffers_dropped_inside_a_group_hold() {
    rig(2, Duration::from_secs(10)).check(|rig| {
        let (ctxs, comms) = rig.all_ranks(2);
        let streams = non_blocking_streams(&ctxs);
        let mut outs = zeroed_on_each::<i32>(&ctxs, 2);
        group(&rig.nccl, || {
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
    });
}

/// A captured kernel + all-reduce on a view; everything but the communicator dropped
/// before the graph is replayed twice.
#[test]
fn attack_captured_kernel_and_collective_on_views_hold() {
    rig(1, Duration::from_secs(10)).check(|rig| {
        let (ctx, comm) = rig.one_rank(0);
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
            capture(&s, || {
                let (_, mut hi) = flat.split_at_mut(2).unwrap();
                // SAFETY: inc reads and writes n i32 at p.
                unsafe { f.launch(&s, LaunchConfig::linear(1, 1), (&mut hi, 2u32)) }.unwrap();
                comm.all_reduce(&hi.as_view(), &mut out, ReduceOp::Sum, &s)
                    .unwrap();
            })
        };
        drop(flat);
        exec.launch(&s).unwrap();
        exec.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(out.to_vec().unwrap(), [2, 2]);
    });
}
