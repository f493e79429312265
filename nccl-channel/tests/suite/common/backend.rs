//! Tests written once, run on every backend: the simulated machine in every run, the real
//! GPUs and NCCL with `--include-ignored` on the GPU machine (wgpu's model). A GPU run on
//! a machine with fewer GPUs than the test needs says "skipped: needs N GPUs" and passes.

use std::sync::Arc;

use cuda_hal::{Context, Cuda};
use cuda_mock::{MockDriver, MockWorld};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::Nccl;

/// The machine a test body runs on: NCCL and one primary context per GPU it asked for.
pub struct Machine {
    pub cuda: Cuda,
    pub nccl: Arc<Nccl>,
    pub ctxs: Vec<Context>,
    /// The simulated machine's handles, on the simulated backend.
    pub sim: Option<(MockWorld, MockNcclWorld)>,
}

impl Machine {
    /// A simulated machine with `gpus` devices.
    pub fn simulated(gpus: usize) -> Machine {
        let (cuda, world) = MockDriver::with_devices(gpus)
            .build_with(Cuda::from_driver)
            .unwrap();
        let (nccl, nccl_world) = MockNccl::new(&world).build().unwrap();
        let ctxs = (0..gpus)
            .map(|d| cuda.device(d).unwrap().primary_context().unwrap())
            .collect();
        Machine {
            cuda,
            nccl: Arc::new(nccl),
            ctxs,
            sim: Some((world, nccl_world)),
        }
    }

    /// This machine's GPUs and NCCL, or `None` (said on stdout) when it has fewer than
    /// `gpus`. Fails when there is no driver or no NCCL: a GPU test run where there is none.
    pub fn gpus(gpus: usize) -> Option<Machine> {
        let cuda = Cuda::load()
            .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
        let nccl = nccl_channel::nccl()
            .expect("a GPU test (run with --include-ignored on the GPU machine): no NCCL");
        println!("NCCL {} ({})", nccl.version(), nccl.origin());
        let have = cuda.device_count().unwrap();
        if have < gpus {
            println!("skipped: needs {gpus} GPUs, this machine has {have}");
            return None;
        }
        let ctxs = (0..gpus)
            .map(|d| cuda.device(d).unwrap().primary_context().unwrap())
            .collect();
        Some(Machine {
            cuda,
            nccl,
            ctxs,
            sim: None,
        })
    }

    /// On the simulated backend: the sanitizer saw no invalid access.
    pub fn check(&self) {
        if let Some((world, _)) = &self.sim {
            assert!(world.violations().is_empty(), "{:?}", world.violations());
        }
    }
}

/// `on_every_backend! { fn name(m, gpus = N) { body } }`: a module `name` with the tests
/// `simulated` (every run) and `gpu` (`#[ignore]`d: the GPU machine), both running `body`
/// with `m: &Machine`.
#[macro_export]
macro_rules! on_every_backend {
    ($(#[doc = $doc:literal])* fn $name:ident($m:ident, gpus = $n:literal) $body:block) => {
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::backend::Machine;

            fn body($m: &Machine) $body

            #[test]
            fn simulated() {
                let m = Machine::simulated($n);
                body(&m);
                m.check();
            }

            #[test]
            #[ignore = "a GPU test: --include-ignored on the GPU machine"]
            fn gpu() {
                if let Some(m) = Machine::gpus($n) {
                    body(&m);
                }
            }
        }
    };
}
