//! The mock driver's API for simulations layered on it (the NCCL mock's `ncclMemAlloc`
//! and registrations): memory of another allocator, holds on allocations, and where
//! streams stand. Each check pins the exact report and value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use cuda_mock::{AllocationInfo, MockDriver, MockWorld, Touch};
use cuda_sys::{CUcontext, CUdeviceptr, CUresult, CUstream, Driver};

const OK: CUresult = CUresult::CUDA_SUCCESS;
const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;

/// A two-device world with device 0's primary context current on this thread.
fn setup() -> (Driver, MockWorld, CUcontext) {
    let (driver, world) = MockDriver::with_devices(2).build().unwrap();
    let f = driver.fns();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: mock driver calls with valid out-pointers.
    unsafe {
        assert_eq!((f.cuInit)(0), OK);
        assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx, 0), OK);
        assert_eq!((f.cuCtxSetCurrent)(ctx), OK);
    }
    (driver, world, ctx)
}

fn stream(d: &Driver) -> CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a context is current.
    assert_eq!(unsafe { (d.fns().cuStreamCreate)(&mut s, 0) }, OK);
    s
}

fn sync(d: &Driver, s: CUstream) {
    // SAFETY: a live stream.
    assert_eq!(unsafe { (d.fns().cuStreamSynchronize)(s) }, OK);
}

fn writes(ptr: CUdeviceptr, len: usize) -> Vec<Touch> {
    vec![Touch {
        ptr,
        len,
        what: "writes",
    }]
}

#[test]
fn foreign_memory_is_device_memory_that_only_its_allocator_frees() {
    let (d, world, _) = setup();
    let p = world.alloc_foreign(4096, "pool").unwrap();
    assert_ne!(p, 0);
    assert_eq!(world.used_memory(0), 4096);
    let info = AllocationInfo {
        start: p,
        len: 4096,
        device: 0,
        foreign: Some("pool"),
    };
    assert_eq!(world.allocation_of(p, 4096), Some(info));
    assert_eq!(world.allocation_of(p + 4000, 96), Some(info));
    assert_eq!(world.allocation_of(p + 4000, 97), None, "past its end");
    // Another allocator's name, twice the start, an inner address: refused, reported.
    assert_eq!(world.free_foreign(p, "otherFree", "other"), Err(INVALID));
    assert_eq!(world.free_foreign(p + 8, "poolFree", "pool"), Err(INVALID));
    assert_eq!(
        world.take_violations(),
        [
            format!("otherFree of {p:#x}: not allocated by other"),
            format!(
                "poolFree of {:#x}: inside the allocation at {p:#x} (4096 bytes), not its start",
                p + 8
            ),
        ]
    );
    assert_eq!(world.allocation_of(p, 1), Some(info), "still live");
    assert_eq!(world.free_foreign(p, "poolFree", "pool"), Ok(()));
    assert!(world.violations().is_empty(), "{:?}", world.violations());
    assert_eq!(world.allocation_of(p, 1), None);
    assert_eq!(world.used_memory(0), 0);
    assert_eq!(world.free_foreign(p, "poolFree", "pool"), Err(INVALID));
    assert_eq!(
        world.take_violations(),
        [format!(
            "poolFree of {p:#x}: double free (already freed by poolFree)"
        )]
    );

    // Driver memory is not the pool's, and says so.
    let mut q = 0;
    // SAFETY: valid out-pointer; a context is current.
    assert_eq!(unsafe { (d.fns().cuMemAlloc)(&mut q, 64) }, OK);
    assert_eq!(
        world.allocation_of(q, 64),
        Some(AllocationInfo {
            start: q,
            len: 64,
            device: 0,
            foreign: None
        })
    );
    assert_eq!(world.free_foreign(q, "poolFree", "pool"), Err(INVALID));
    assert_eq!(
        world.take_violations(),
        [format!("poolFree of {q:#x}: not allocated by pool")]
    );
    // SAFETY: a live allocation, freed once.
    assert_eq!(unsafe { (d.fns().cuMemFree)(q) }, OK);
    assert!(world.violations().is_empty());
}

#[test]
fn foreign_memory_needs_a_current_context() {
    let (d, world, _) = setup();
    // SAFETY: NULL unsets the current context; nothing here uses it afterwards.
    let rc = unsafe { (d.fns().cuCtxSetCurrent)(std::ptr::null_mut()) };
    assert_eq!(rc, OK);
    assert_eq!(
        world.alloc_foreign(64, "pool"),
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    );
    assert_eq!(world.live().device_allocations, 0);
}

#[test]
fn freeing_foreign_memory_reports_work_the_host_did_not_wait_for() {
    let (d, world, _) = setup();
    let s = stream(&d);
    for wait in [false, true] {
        let p = world.alloc_foreign(256, "pool").unwrap();
        world.access(s, "poolKernel", &writes(p, 256)).unwrap();
        if wait {
            sync(&d, s);
        }
        assert_eq!(world.free_foreign(p, "poolFree", "pool"), Ok(()));
        let expected = if wait {
            Vec::new()
        } else {
            vec![format!(
                "poolFree frees {p:#x}+256 while work enqueued on stream {:#x} (poolKernel) may still run: the host did not wait for it",
                s.addr()
            )]
        };
        assert_eq!(world.take_violations(), expected, "waited: {wait}");
    }
    sync(&d, s);
}

#[test]
fn a_pinned_allocation_is_reported_when_freed_until_each_pin_is_released() {
    let (_d, world, _) = setup();
    let p = world.alloc_foreign(4096, "pool").unwrap();
    assert!(world.pin(p + 100, 7, "registration 7".into()));
    assert!(world.pin(p + 4095, 8, "window 8".into()));
    assert!(!world.pin(p + 4096, 9, "past the end".into()));
    assert!(!world.pin(1, 9, "no allocation".into()));
    world.unpin(7);
    assert_eq!(world.free_foreign(p, "poolFree", "pool"), Ok(()));
    assert_eq!(
        world.take_violations(),
        [format!("poolFree of {p:#x}: still held by window 8")]
    );

    let p = world.alloc_foreign(64, "pool").unwrap();
    assert!(world.pin(p, 10, "registration 10".into()));
    world.unpin(10);
    assert_eq!(world.free_foreign(p, "poolFree", "pool"), Ok(()));
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn stream_positions_running_ops_and_host_waits() {
    let (d, world, _) = setup();
    let s = stream(&d);
    let p = world.alloc_foreign(64, "pool").unwrap();
    let (key, start) = world.stream_position(s).unwrap();
    assert_eq!((key, start), (s.addr(), 0), "no op yet");
    assert!(world.host_waited_for(key, 0));
    assert_eq!(world.running_op(), None, "outside any op");

    let seen = Arc::new(Mutex::new(None));
    let (w, seen2) = (world.clone(), seen.clone());
    let op = Arc::new(move || {
        *seen2.lock().unwrap() = Some(w.running_op());
        OK
    });
    assert_eq!(world.enqueue_op(s, "poolKernel", writes(p, 64), op), OK);
    let after = world.stream_position(s).unwrap();
    assert_eq!(after, (key, 1), "the stream's first op");
    assert_eq!(*seen.lock().unwrap(), Some(Some(after)));
    assert!(!world.host_waited_for(key, after.1));
    world.access(s, "poolKernel", &writes(p, 64)).unwrap();
    let last = world.stream_position(s).unwrap();
    assert_eq!(last, (key, 2));
    sync(&d, s);
    assert!(world.host_waited_for(key, after.1));
    assert!(world.host_waited_for(key, last.1));
    assert!(!world.host_waited_for(key, last.1 + 1));
    assert_eq!(world.running_op(), None);
    // Stream 0 is the current context's legacy stream, another key; a bogus one is none.
    let legacy = world.stream_position(std::ptr::null_mut()).unwrap();
    assert_ne!(legacy.0, key);
    assert_eq!(world.stream_position(8 as CUstream), None);
    assert_eq!(world.free_foreign(p, "poolFree", "pool"), Ok(()));
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}
