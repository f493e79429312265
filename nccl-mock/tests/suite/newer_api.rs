//! The simulated NCCL's suspend and simulated group end, through its raw table: what a
//! sanitizer reports that the safe layer never lets through.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_mock::MockDriver;
use nccl_mock::MockNccl;
use nccl_sys::{NCCL_SIM_INFO_INITIALIZER, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

#[test]
fn work_on_a_suspended_communicator_is_reported_and_refused() {
    let (driver, gpus) = MockDriver::with_devices(1).build().unwrap();
    let (nccl, world) = MockNccl::new(&gpus).build().unwrap();
    let (cu, f) = (driver.fns(), nccl.fns());
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let (mut ctx, mut stream, mut buf) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
    // SAFETY: simulated calls with valid out-pointers and sizes.
    unsafe {
        (cu.cuInit)(0);
        (cu.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
        (cu.cuCtxSetCurrent)(ctx);
        (cu.cuStreamCreate)(&mut stream, 0);
        (cu.cuMemAlloc)(&mut buf, 8);
        assert_eq!(
            (f.ncclCommInitAll)(&mut comm, 1, [0].as_ptr()),
            ncclResult_t::ncclSuccess
        );
        let suspend = f.ncclCommSuspend.unwrap();
        let resume = f.ncclCommResume.unwrap();
        assert_eq!(
            resume(comm),
            ncclResult_t::ncclInvalidUsage,
            "not suspended"
        );
        assert_eq!(suspend(comm, 1), ncclResult_t::ncclSuccess);
        assert_eq!(suspend(comm, 1), ncclResult_t::ncclInvalidUsage, "already");
        let p = buf as *mut std::ffi::c_void;
        let rc = (f.ncclAllReduce)(
            p,
            p,
            2,
            ncclDataType_t::ncclInt32,
            ncclRedOp_t::ncclSum,
            comm,
            stream,
        );
        assert_eq!(rc, ncclResult_t::ncclInvalidUsage);
        let v = world.take_violations();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].starts_with("ncclAllReduce: communicator 0x"), "{v:?}");
        assert!(
            v[0].ends_with(
                "is suspended (ncclCommSuspend): its memory is released until ncclCommResume"
            ),
            "{v:?}"
        );
        assert_eq!(resume(comm), ncclResult_t::ncclSuccess);
        let rc = (f.ncclAllReduce)(
            p,
            p,
            2,
            ncclDataType_t::ncclInt32,
            ncclRedOp_t::ncclSum,
            comm,
            stream,
        );
        assert_eq!(rc, ncclResult_t::ncclSuccess);
        assert_eq!((f.ncclCommDestroy)(comm), ncclResult_t::ncclSuccess);
    }
    assert!(world.take_violations().is_empty());
}

#[test]
fn a_simulated_end_checks_the_magic_and_closes_the_group() {
    let (driver, gpus) = MockDriver::with_devices(1).build().unwrap();
    let (nccl, _world) = MockNccl::new(&gpus).build().unwrap();
    let f = nccl.fns();
    let sim_end = f.ncclGroupSimulateEnd.unwrap();
    let mut bad = NCCL_SIM_INFO_INITIALIZER;
    bad.magic = 0;
    // SAFETY: simulated calls with valid pointers.
    unsafe {
        (driver.fns().cuInit)(0);
        assert_eq!(
            sim_end(&mut bad),
            ncclResult_t::ncclInvalidUsage,
            "no group open"
        );
        (f.ncclGroupStart)();
        (f.ncclGroupStart)();
        let mut info = NCCL_SIM_INFO_INITIALIZER;
        assert_eq!(
            sim_end(&mut info),
            ncclResult_t::ncclSuccess,
            "nested: closes a level"
        );
        assert_eq!(info.estimatedTime, -1.0);
        assert_eq!(
            sim_end(&mut bad),
            ncclResult_t::ncclInvalidArgument,
            "outermost: checked"
        );
        assert_eq!(
            (f.ncclGroupEnd)(),
            ncclResult_t::ncclInvalidUsage,
            "the group is closed"
        );
    }
}
