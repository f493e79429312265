//! The raw-table test rig of the NCCL mock's tests: a simulated machine (its primary
//! contexts retained) and its NCCL, driven through the function tables themselves so
//! that every check a test sees is the mock's own.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

pub mod procs;

use std::time::Duration;

use cuda_mock::{MockDriver, MockWorld};
use cuda_sys::{CUcontext, CUresult, Driver};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

pub const OK: CUresult = CUresult::CUDA_SUCCESS;
pub const NCCL_OK: ncclResult_t = ncclResult_t::ncclSuccess;

/// A simulated machine with some GPUs (their primary contexts) and its NCCL.
pub struct Rig {
    pub driver: Driver,
    pub gpus: MockWorld,
    pub nccl: Nccl,
    pub world: MockNcclWorld,
    pub ctxs: Vec<CUcontext>,
}

impl Rig {
    /// Peers wait at most 30 s: long enough that a test which hung would be slow.
    pub fn new(devices: usize) -> Rig {
        Self::with_timeout(devices, Duration::from_secs(30))
    }

    /// Peers wait at most `timeout`, for tests of a peer that never comes.
    pub fn with_timeout(devices: usize, timeout: Duration) -> Rig {
        Self::with_nccl(devices, |n| n.timeout(timeout))
    }

    /// The NCCL built as `nccl` says (its peers wait 30 s unless it says otherwise).
    pub fn with_nccl(devices: usize, nccl: impl FnOnce(MockNccl) -> MockNccl) -> Rig {
        let (driver, gpus) = MockDriver::with_devices(devices).build().unwrap();
        let builder = MockNccl::new(&gpus).timeout(Duration::from_secs(30));
        let (nccl, world) = nccl(builder).build().unwrap();
        let f = driver.fns();
        // SAFETY: mock driver call.
        assert_eq!(unsafe { (f.cuInit)(0) }, OK);
        let ctxs = (0..devices)
            .map(|d| {
                let mut ctx = std::ptr::null_mut();
                // SAFETY: valid out-pointer, existing device.
                let rc = unsafe { (f.cuDevicePrimaryCtxRetain)(&mut ctx, d as i32) };
                assert_eq!(rc, OK);
                ctx
            })
            .collect();
        Rig {
            driver,
            gpus,
            nccl,
            world,
            ctxs,
        }
    }

    /// Makes device `d`'s context current on this thread.
    pub fn on(&self, d: usize) {
        // SAFETY: a retained primary context.
        let rc = unsafe { (self.driver.fns().cuCtxSetCurrent)(self.ctxs[d]) };
        assert_eq!(rc, OK);
    }

    /// `n` communicators of one clique over devices 0..n (ncclCommInitAll).
    pub fn comms(&self, n: usize) -> Vec<ncclComm_t> {
        let mut comms = vec![std::ptr::null_mut(); n];
        // SAFETY: room for `n` handles; NULL devlist means devices 0..n.
        let rc = unsafe {
            (self.nccl.fns().ncclCommInitAll)(comms.as_mut_ptr(), n as i32, std::ptr::null())
        };
        assert_eq!(rc, NCCL_OK);
        comms
    }

    pub fn destroy(&self, comm: ncclComm_t) {
        // SAFETY: a live communicator.
        assert_eq!(unsafe { (self.nccl.fns().ncclCommDestroy)(comm) }, NCCL_OK);
    }
}
