//! The mock driver as a sanitizer: use after free (also at graph replay), double frees,
//! out-of-bounds and wrong-device ranges, and stream-ordered frees that are not ordered
//! after work on other streams, each reported with the call, the address and the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_mock::{MockDriver, MockWorld, QUARANTINE_BLOCKS, Touch};
use cuda_sys::{CUcontext, CUdeviceptr, CUresult, CUstream, CUstreamCaptureMode, Driver};

const OK: CUresult = CUresult::CUDA_SUCCESS;

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

fn alloc(d: &Driver, bytes: usize) -> CUdeviceptr {
    let mut p = 0;
    // SAFETY: valid out-pointer; a context is current.
    assert_eq!(unsafe { (d.fns().cuMemAlloc)(&mut p, bytes) }, OK);
    p
}

/// A stream of the current context; `flags` 1 is `CU_STREAM_NON_BLOCKING`.
fn stream(d: &Driver, flags: u32) -> CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a context is current.
    assert_eq!(unsafe { (d.fns().cuStreamCreate)(&mut s, flags) }, OK);
    s
}

fn read(d: &Driver, p: CUdeviceptr, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: `v` holds `n` bytes.
    let rc = unsafe { (d.fns().cuMemcpyDtoH)(v.as_mut_ptr().cast(), p, n) };
    assert_eq!(rc, OK);
    v
}

#[test]
fn a_graph_replayed_after_its_source_was_freed_is_caught_and_writes_nothing() {
    let (d, world, _) = setup();
    let f = d.fns();
    let s = stream(&d, 0);
    let (src, dst) = (alloc(&d, 64), alloc(&d, 64));
    let mut graph = std::ptr::null_mut();
    let mut exec = std::ptr::null_mut();
    // SAFETY: mock driver calls with live handles and valid out-pointers.
    unsafe {
        assert_eq!((f.cuMemsetD8)(dst, 0x11, 64), OK);
        assert_eq!(
            (f.cuStreamBeginCapture)(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL),
            OK
        );
        assert_eq!((f.cuMemcpyDtoDAsync)(dst, src, 64, s), OK);
        assert_eq!((f.cuStreamEndCapture)(s, &mut graph), OK);
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
        assert!(world.violations().is_empty(), "capture checks nothing");
        assert_eq!((f.cuMemFree)(src), OK);
        assert_eq!(
            (f.cuGraphLaunch)(exec, s),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    assert_eq!(
        world.take_violations(),
        [format!(
            "cuGraphLaunch: cuMemcpyDtoDAsync reads {src:#x}+64: freed by cuMemFree"
        )]
    );
    assert_eq!(
        read(&d, dst, 64),
        [0x11; 64],
        "the skipped copy wrote nothing"
    );
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphExecDestroy)(exec), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
        assert_eq!((f.cuMemFree)(dst), OK);
        assert_eq!((f.cuStreamDestroy)(s), OK);
    }
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// Stream B sets `p`, then stream A frees it after `order` (which may order A after B).
fn free_after_use_on_other_stream(
    flags: u32,
    order: impl FnOnce(&Driver, CUstream, CUstream),
) -> (MockWorld, String) {
    let (d, world, _) = setup();
    let f = d.fns();
    let (a, b) = (stream(&d, flags), stream(&d, flags));
    let p = alloc(&d, 256);
    // SAFETY: live handles.
    assert_eq!(unsafe { (f.cuMemsetD8Async)(p, 7, 256, b) }, OK);
    order(&d, a, b);
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuMemFreeAsync)(p, a), OK);
        assert_eq!((f.cuStreamSynchronize)(a), OK);
    }
    let expected = format!(
        "cuMemFreeAsync on stream {:#x} frees {p:#x}+256 while work enqueued on stream {:#x} (cuMemsetD8Async) is not ordered before it",
        a.addr(),
        b.addr()
    );
    (world, expected)
}

#[test]
fn a_stream_ordered_free_not_ordered_after_other_streams_work_is_caught() {
    let (world, expected) = free_after_use_on_other_stream(1, |_, _, _| {});
    assert_eq!(world.violations(), [expected]);
}

#[test]
fn an_event_wait_orders_the_free() {
    let (world, _) = free_after_use_on_other_stream(1, |d, a, b| {
        let f = d.fns();
        let mut e = std::ptr::null_mut();
        // SAFETY: live handles and a valid out-pointer.
        unsafe {
            assert_eq!((f.cuEventCreate)(&mut e, 0), OK);
            assert_eq!((f.cuEventRecord)(e, b), OK);
            assert_eq!((f.cuStreamWaitEvent)(a, e, 0), OK);
            assert_eq!((f.cuEventDestroy)(e), OK);
        }
    });
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn an_event_recorded_before_the_work_does_not_order_the_free() {
    let (d, world, _) = setup();
    let f = d.fns();
    let (a, b) = (stream(&d, 1), stream(&d, 1));
    let p = alloc(&d, 64);
    let mut e = std::ptr::null_mut();
    // SAFETY: live handles and a valid out-pointer.
    unsafe {
        assert_eq!((f.cuEventCreate)(&mut e, 0), OK);
        assert_eq!((f.cuEventRecord)(e, b), OK);
        assert_eq!((f.cuMemsetD8Async)(p, 7, 64, b), OK);
        assert_eq!((f.cuStreamWaitEvent)(a, e, 0), OK);
        assert_eq!((f.cuMemFreeAsync)(p, a), OK);
    }
    let v = world.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("(cuMemsetD8Async) is not ordered before it"),
        "{v:?}"
    );
}

#[test]
fn a_stream_synchronize_orders_the_free() {
    let (world, _) = free_after_use_on_other_stream(1, |d, _, b| {
        // SAFETY: a live stream.
        assert_eq!(unsafe { (d.fns().cuStreamSynchronize)(b) }, OK);
    });
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn the_legacy_stream_orders_blocking_streams_but_not_non_blocking_ones() {
    // An op on the legacy stream waits for blocking streams, and a blocking stream's next
    // op waits for the legacy stream: B -> legacy -> A.
    let through_legacy = |d: &Driver, _: CUstream, _: CUstream| {
        let q = alloc(d, 16);
        // SAFETY: live allocation; stream 0 is the legacy stream.
        unsafe {
            assert_eq!(
                (d.fns().cuMemsetD8Async)(q, 0, 16, std::ptr::null_mut()),
                OK
            );
        }
    };
    let (world, _) = free_after_use_on_other_stream(0, through_legacy);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
    let (world, expected) = free_after_use_on_other_stream(1, through_legacy);
    assert_eq!(world.violations(), [expected]);
}

#[test]
fn double_frees_are_reported() {
    let (d, world, _) = setup();
    let f = d.fns();
    let s = stream(&d, 0);
    let (p, q) = (alloc(&d, 64), alloc(&d, 64));
    // SAFETY: mock driver calls; the double frees are what is tested.
    unsafe {
        assert_eq!((f.cuMemFree)(p), OK);
        assert_eq!((f.cuMemFree)(p), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!((f.cuMemFreeAsync)(q, s), OK);
        assert_eq!((f.cuMemFreeAsync)(q, s), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!((f.cuMemFree)(q + 8), CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    assert_eq!(
        world.take_violations(),
        [
            format!("cuMemFree of {p:#x}: double free (already freed by cuMemFree)"),
            format!("cuMemFreeAsync of {q:#x}: double free (already freed by cuMemFreeAsync)"),
            format!(
                "cuMemFree of {:#x}: double free (already freed by cuMemFreeAsync)",
                q + 8
            ),
        ]
    );
}

#[test]
fn an_out_of_bounds_async_memset_is_caught_and_writes_nothing() {
    let (d, world, _) = setup();
    let f = d.fns();
    let s = stream(&d, 0);
    let p = alloc(&d, 256);
    // SAFETY: mock driver call; the range is out of bounds on purpose.
    let rc = unsafe { (f.cuMemsetD8Async)(p + 128, 0, 256, s) };
    assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(
        world.take_violations(),
        [format!(
            "cuMemsetD8Async writes {:#x}+256: out of bounds of the allocation at {p:#x} (256 bytes)",
            p + 128
        )]
    );
    assert_eq!(read(&d, p, 256), [0xA5; 256], "nothing was written");
}

#[test]
fn other_simulations_ops_are_checked_against_the_streams_device() {
    let (d, world, ctx0) = setup();
    let f = d.fns();
    let s = stream(&d, 1);
    let mine = alloc(&d, 64);
    let mut ctx1 = std::ptr::null_mut();
    // SAFETY: valid out-pointer; device 1 exists.
    unsafe {
        assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx1, 1), OK);
        assert_eq!((f.cuCtxSetCurrent)(ctx1), OK);
    }
    let theirs = alloc(&d, 64);
    // SAFETY: a live context.
    assert_eq!(unsafe { (f.cuCtxSetCurrent)(ctx0) }, OK);
    let ran = Arc::new(AtomicBool::new(false));
    let op = {
        let ran = ran.clone();
        Arc::new(move || {
            ran.store(true, Ordering::SeqCst);
            CUresult::CUDA_SUCCESS
        })
    };
    let touch = |ptr, what| Touch { ptr, len: 64, what };
    let rc = world.enqueue_op(
        s,
        "ncclAllReduce",
        vec![touch(mine, "reads"), touch(theirs, "writes")],
        op.clone(),
    );
    assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(!ran.load(Ordering::SeqCst), "an illegal op is skipped");
    assert_eq!(
        world.take_violations(),
        [format!(
            "ncclAllReduce writes {theirs:#x}+64: belongs to device 1, the stream is on device 0"
        )]
    );
    assert_eq!(
        world.enqueue_op(s, "ncclAllReduce", vec![touch(mine, "writes")], op),
        OK
    );
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(
        world.access(s, "ncclBroadcast", &[touch(theirs, "reads")]),
        Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
    );
    assert_eq!(
        world.take_violations(),
        [format!(
            "ncclBroadcast reads {theirs:#x}+64: belongs to device 1, the stream is on device 0"
        )]
    );
    // A use recorded by `access` orders a later stream-ordered free.
    let other = stream(&d, 1);
    assert_eq!(
        world.access(s, "ncclAllGather", &[touch(mine, "reads")]),
        Ok(())
    );
    // SAFETY: live handles.
    assert_eq!(unsafe { (f.cuMemFreeAsync)(mine, other) }, OK);
    let v = world.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains(&format!(
            "frees {mine:#x}+64 while work enqueued on stream {:#x} (ncclAllGather)",
            s.addr()
        )),
        "{v:?}"
    );
}

#[test]
fn freed_memory_is_poisoned_quarantined_and_not_live() {
    let (d, world, _) = setup();
    let f = d.fns();
    let p = alloc(&d, 64);
    let mut host = [0x33u8; 64];
    // SAFETY: live allocation.
    assert_eq!(unsafe { (f.cuMemsetD8)(p, 0x11, 64) }, OK);
    assert_eq!(world.device_range(p, 64), Some(0));
    // SAFETY: live allocation.
    assert_eq!(unsafe { (f.cuMemFree)(p) }, OK);
    assert_eq!(
        world.device_range(p, 64),
        None,
        "quarantined memory is not live"
    );
    // SAFETY: the quarantine keeps the memory allocated while the world lives (that is
    // what is tested), and device addresses are exposed host addresses in the mock.
    let bytes = unsafe {
        std::slice::from_raw_parts(std::ptr::with_exposed_provenance::<u8>(p as usize), 64)
    }
    .to_vec();
    assert_eq!(bytes, [0xDD; 64], "freed memory is poisoned");
    // SAFETY: `host` holds 64 bytes; the device sides are freed on purpose.
    unsafe {
        assert_eq!(
            (f.cuMemcpyDtoH)(host.as_mut_ptr().cast(), p, 64),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert_eq!(
            (f.cuMemcpy)(p, host.as_ptr() as CUdeviceptr, 64),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    assert_eq!(host, [0x33; 64], "nothing was read");
    assert_eq!(
        world.take_violations(),
        [
            format!("cuMemcpyDtoH reads {p:#x}+64: freed by cuMemFree"),
            format!("cuMemcpy writes {p:#x}+64: freed by cuMemFree"),
        ]
    );
}

#[test]
fn reports_from_other_simulations_are_kept_counted_and_taken() {
    let (_d, world, _) = setup();
    world.report("ncclAllReduce on a destroyed communicator".to_string());
    assert!(format!("{world:?}").contains("violations: 1"), "{world:?}");
    assert_eq!(
        world.violations(),
        ["ncclAllReduce on a destroyed communicator"]
    );
    assert_eq!(world.take_violations().len(), 1);
    assert!(world.violations().is_empty());
}

#[test]
fn context_teardown_quarantines_what_it_frees() {
    let (d, world, _) = setup();
    let p = alloc(&d, 64);
    // SAFETY: releases the context retained in `setup` (its memory is freed with it).
    assert_eq!(unsafe { (d.fns().cuDevicePrimaryCtxRelease)(0) }, OK);
    assert_eq!(world.device_range(p, 64), None);
    assert_eq!(world.order_violations(), 1);
    assert_eq!(world.used_memory(0), 0);
}

/// A stream that waits for an event recorded in a running capture joins it: its work is
/// recorded into the same graph (checked at replay), and it leaves when the capture ends.
#[test]
fn a_stream_joins_a_capture_through_an_event() {
    let (d, world, _) = setup();
    let f = d.fns();
    let (a, b) = (stream(&d, 1), stream(&d, 1));
    let buf = alloc(&d, 16);
    let (mut fork, mut join) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut status = cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: mock driver calls with live handles and valid out-pointers.
    unsafe {
        assert_eq!((f.cuEventCreate)(&mut fork, 2), OK);
        assert_eq!((f.cuEventCreate)(&mut join, 2), OK);
        assert_eq!((f.cuMemsetD8)(buf, 0, 16), OK);
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!((f.cuStreamBeginCapture)(a, mode), OK);
        assert_eq!((f.cuEventRecord)(fork, a), OK);
        assert_eq!((f.cuStreamWaitEvent)(b, fork, 0), OK);
        assert_eq!((f.cuStreamIsCapturing)(b, &mut status), OK);
        assert_eq!(
            status,
            cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        );
        assert_eq!((f.cuMemsetD8Async)(buf, 0x42, 16, b), OK);
        assert_eq!(read(&d, buf, 16), [0; 16], "recorded, not run");
        assert_eq!((f.cuEventRecord)(join, b), OK);
        assert_eq!((f.cuStreamWaitEvent)(a, join, 0), OK);
        assert_eq!((f.cuStreamEndCapture)(a, &mut graph), OK);
        assert_eq!((f.cuStreamIsCapturing)(b, &mut status), OK);
        assert_eq!(
            status,
            cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        );
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
        assert_eq!((f.cuGraphLaunch)(exec, a), OK);
        assert_eq!(read(&d, buf, 16), [0x42; 16], "replayed");
        assert_eq!((f.cuMemFree)(buf), OK);
        assert_eq!(
            (f.cuGraphLaunch)(exec, a),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    assert_eq!(
        world.take_violations(),
        [format!(
            "cuGraphLaunch: cuMemsetD8Async writes {buf:#x}+16: freed by cuMemFree"
        )]
    );
}

/// A capture that ends in failure (invalidated by a synchronisation) releases the streams
/// that joined it, as CUDA does: the joined stream's later work runs at once, and is not
/// recorded by the origin's next capture.
#[test]
fn a_failed_capture_releases_the_streams_that_joined_it() {
    let (d, world, _) = setup();
    let f = d.fns();
    let (a, b) = (stream(&d, 1), stream(&d, 1));
    let buf = alloc(&d, 4);
    let mut fork = std::ptr::null_mut();
    let mut graph = std::ptr::null_mut();
    let mut status = cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    // SAFETY: mock driver calls with live handles and valid out-pointers.
    unsafe {
        assert_eq!((f.cuEventCreate)(&mut fork, 2), OK);
        assert_eq!((f.cuMemsetD8)(buf, 0, 4), OK);
        assert_eq!((f.cuStreamBeginCapture)(a, mode), OK);
        assert_eq!((f.cuEventRecord)(fork, a), OK);
        assert_eq!((f.cuStreamWaitEvent)(b, fork, 0), OK);
        assert_eq!(
            (f.cuStreamSynchronize)(b),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        assert_eq!(
            (f.cuStreamEndCapture)(a, &mut graph),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        assert_eq!((f.cuStreamIsCapturing)(b, &mut status), OK);
        assert_eq!(
            status,
            cuda_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            "released by the failed end"
        );
        // The origin captures again: b's work is its own, and runs now.
        assert_eq!((f.cuStreamBeginCapture)(a, mode), OK);
        assert_eq!((f.cuMemsetD8Async)(buf, 7, 4, b), OK);
        assert_eq!(read(&d, buf, 4), [7; 4], "run, not recorded");
        assert_eq!((f.cuStreamEndCapture)(a, &mut graph), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
        assert_eq!((f.cuMemFree)(buf), OK);
    }
    assert_eq!(world.take_violations(), Vec::<String>::new());
}

/// A stream-ordered free recorded by a capture is a free node: it frees at every replay,
/// so a second launch is a double free.
#[test]
fn a_captured_free_frees_at_each_replay() {
    let (d, world, _) = setup();
    let f = d.fns();
    let s = stream(&d, 1);
    let mut p = 0;
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: mock driver calls with live handles and valid out-pointers.
    unsafe {
        assert_eq!((f.cuMemAllocAsync)(&mut p, 32, s), OK);
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!((f.cuStreamBeginCapture)(s, mode), OK);
        assert_eq!((f.cuMemFreeAsync)(p, s), OK);
        assert_eq!((f.cuStreamEndCapture)(s, &mut graph), OK);
        assert_eq!(world.live().device_allocations, 1, "recorded, not freed");
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
        assert_eq!((f.cuGraphLaunch)(exec, s), OK);
        assert_eq!(world.live().device_allocations, 0);
        assert!(world.violations().is_empty());
        assert_eq!(
            (f.cuGraphLaunch)(exec, s),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
    }
    assert_eq!(
        world.take_violations(),
        [format!(
            "cuMemFreeAsync of {p:#x}: double free (already freed by cuMemFreeAsync)"
        )]
    );
}

fn free(d: &Driver, p: CUdeviceptr) {
    // SAFETY: a live allocation.
    assert_eq!(unsafe { (d.fns().cuMemFree)(p) }, OK);
}

#[test]
fn read_device_and_write_device_move_checked_data_under_the_lock() {
    let (d, world, ctx0) = setup();
    let p = alloc(&d, 64);
    // Device 1's memory is reachable too: no stream, so no device to match.
    let mut ctx1 = std::ptr::null_mut();
    // SAFETY: valid out-pointer; device 1 exists.
    unsafe {
        assert_eq!((d.fns().cuDevicePrimaryCtxRetain)(&mut ctx1, 1), OK);
        assert_eq!((d.fns().cuCtxSetCurrent)(ctx1), OK);
    }
    let other = alloc(&d, 16);
    // SAFETY: a retained primary context.
    assert_eq!(unsafe { (d.fns().cuCtxSetCurrent)(ctx0) }, OK);
    let data: Vec<u8> = (0..16).collect();
    assert_eq!(world.write_device("test", p + 8, &data), Ok(()));
    assert_eq!(world.write_device("test", other, &data), Ok(()));
    assert_eq!(read(&d, p + 8, 16), data);
    assert_eq!(world.read_device("test", p + 8, 16), Ok(data.clone()));
    assert_eq!(world.read_device("test", other, 16), Ok(data));
    assert_eq!(world.read_device("test", p, 0), Ok(Vec::new()));
    assert_eq!(world.write_device("test", 0, &[]), Ok(()), "empty: nothing");
    assert!(world.violations().is_empty(), "{:?}", world.violations());

    // Out of bounds, a length no host could hold (reported, not allocated), and memory
    // that was never allocated.
    const ILLEGAL: CUresult = CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
    assert_eq!(world.read_device("mine", p + 32, 64), Err(ILLEGAL));
    assert_eq!(world.read_device("mine", p, usize::MAX), Err(ILLEGAL));
    assert_eq!(world.write_device("mine", p + 60, &[1; 8]), Err(ILLEGAL));
    assert_eq!(world.read_device("mine", 0x10, 4), Err(ILLEGAL));
    assert_eq!(
        world.take_violations(),
        [
            format!(
                "mine reads {:#x}+64: out of bounds of the allocation at {p:#x} (64 bytes)",
                p + 32
            ),
            format!(
                "mine reads {p:#x}+{}: out of bounds of the allocation at {p:#x} (64 bytes)",
                usize::MAX
            ),
            format!(
                "mine writes {:#x}+8: out of bounds of the allocation at {p:#x} (64 bytes)",
                p + 60
            ),
            "mine reads 0x10+4: is not in any live device allocation".to_string(),
        ]
    );
    assert_eq!(&read(&d, p + 56, 8), &[0xA5; 8], "nothing was written");

    // Freed: quarantined (recognised), then evicted (really freed, no longer known).
    free(&d, p);
    assert_eq!(world.read_device("late", p, 4), Err(ILLEGAL));
    assert_eq!(world.write_device("late", p, &[1; 4]), Err(ILLEGAL));
    let blocks: Vec<CUdeviceptr> = (0..QUARANTINE_BLOCKS).map(|_| alloc(&d, 256)).collect();
    for b in blocks {
        free(&d, b);
    }
    assert_eq!(world.read_device("evicted", p, 4), Err(ILLEGAL));
    assert_eq!(world.write_device("evicted", p, &[1; 4]), Err(ILLEGAL));
    assert_eq!(
        world.take_violations(),
        [
            format!("late reads {p:#x}+4: freed by cuMemFree"),
            format!("late writes {p:#x}+4: freed by cuMemFree"),
            format!("evicted reads {p:#x}+4: is not in any live device allocation"),
            format!("evicted writes {p:#x}+4: is not in any live device allocation"),
        ]
    );
    free(&d, other);
}

/// As CUDA: a capture begun in thread-local mode forbids its thread host
/// synchronisations (they fail and spoil the capture), a global one every thread's, a
/// relaxed one none. (Found on an H200: the simulator used to allow them.)
#[test]
fn a_capture_forbids_host_synchronisations_as_its_mode_says() {
    let (d, _world, ctx) = setup();
    let f = d.fns();
    let (s, other) = (stream(&d, 1), stream(&d, 1));
    let mut graph = std::ptr::null_mut();
    const THREAD_LOCAL: CUstreamCaptureMode =
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: mock driver calls with live handles and valid out-pointers.
    unsafe {
        // Thread-local: this thread's synchronisation of another stream fails, and so does
        // the capture at its end.
        assert_eq!((f.cuStreamBeginCapture)(s, THREAD_LOCAL), OK);
        assert_eq!(
            (f.cuStreamSynchronize)(other),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        assert_eq!(
            (f.cuCtxSynchronize)(),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        // Another thread is not concerned.
        let (fns, other_addr, ctx_addr) = (*f, other as usize, ctx as usize);
        let rc = std::thread::spawn(move || {
            (fns.cuCtxSetCurrent)(ctx_addr as CUcontext);
            (fns.cuStreamSynchronize)(other_addr as CUstream)
        })
        .join()
        .unwrap();
        assert_eq!(rc, OK);
        assert_eq!(
            (f.cuStreamEndCapture)(s, &mut graph),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        // Global: another thread's synchronisation fails too.
        assert_eq!((f.cuStreamBeginCapture)(s, GLOBAL), OK);
        let rc = std::thread::spawn(move || {
            (fns.cuCtxSetCurrent)(ctx_addr as CUcontext);
            (fns.cuStreamSynchronize)(other_addr as CUstream)
        })
        .join()
        .unwrap();
        assert_eq!(rc, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(
            (f.cuStreamEndCapture)(s, &mut graph),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        // Relaxed: allowed, and the capture ends well.
        assert_eq!((f.cuStreamBeginCapture)(s, RELAXED), OK);
        assert_eq!((f.cuStreamSynchronize)(other), OK);
        assert_eq!((f.cuCtxSynchronize)(), OK);
        assert_eq!((f.cuStreamEndCapture)(s, &mut graph), OK);
        // Ended: nothing is forbidden any more.
        assert_eq!((f.cuStreamSynchronize)(other), OK);
    }
}
