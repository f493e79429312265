//! User objects as CUDA documents them: a graph owns references, an executable graph owns
//! copies of its graph's, each goes when its owner is destroyed, the destructor runs when
//! the last one goes (on another thread), and a CUDA call from it is a sanitizer finding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_mock::{MockDriver, MockWorld};
use cuda_sys::{
    CUgraph, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CUuserObject,
    CUuserObject_flags, CUuserObjectRetain_flags, Driver,
};

const OK: CUresult = CUresult::CUDA_SUCCESS;
const NO_SYNC: u32 = CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0;
const MOVE: u32 = CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0;

fn setup() -> (Driver, MockWorld, CUstream) {
    let (driver, world) = MockDriver::with_devices(1).build().unwrap();
    let f = driver.fns();
    let (mut ctx, mut s) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: mock driver calls with valid out-pointers.
    unsafe {
        assert_eq!((f.cuInit)(0), OK);
        assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx, 0), OK);
        assert_eq!((f.cuCtxSetCurrent)(ctx), OK);
        assert_eq!((f.cuStreamCreate)(&mut s, 1), OK);
    }
    (driver, world, s)
}

/// Counts its destructor's runs (`ptr` is a `&'static Counter`).
struct Counter(AtomicUsize, std::sync::Mutex<Option<std::thread::ThreadId>>);

unsafe extern "C" fn count(ptr: *mut c_void) {
    // SAFETY: a leaked `Counter`, as every test passes.
    let c = unsafe { &*ptr.cast::<Counter>() };
    c.0.fetch_add(1, Ordering::SeqCst);
    *c.1.lock().unwrap() = Some(std::thread::current().id());
}

fn counter() -> &'static Counter {
    Box::leak(Box::new(Counter(
        AtomicUsize::new(0),
        std::sync::Mutex::new(None),
    )))
}

fn user_object(d: &Driver, c: &'static Counter, refs: u32) -> CUuserObject {
    let mut o = std::ptr::null_mut();
    let ptr = std::ptr::from_ref(c).cast_mut().cast();
    // SAFETY: a valid out-pointer, destructor and pointer.
    let rc = unsafe { (d.fns().cuUserObjectCreate)(&mut o, ptr, Some(count), refs, NO_SYNC) };
    assert_eq!(rc, OK);
    o
}

/// Begins a capture of `s` and returns the graph it records into.
fn capture(d: &Driver, s: CUstream) -> CUgraph {
    let f = d.fns();
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointers (the optional ones null).
    unsafe {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        assert_eq!((f.cuStreamBeginCapture)(s, mode), OK);
        let rc = (f.cuStreamGetCaptureInfo)(
            s,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(rc, OK);
    }
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    assert!(!graph.is_null());
    graph
}

#[test]
fn the_destructor_runs_once_the_graph_and_every_instance_are_gone() {
    let (d, world, s) = setup();
    let f = d.fns();
    let c = counter();
    let graph = capture(&d, s);
    let o = user_object(&d, c, 1);
    // SAFETY: the capture's graph; our one reference moved to it.
    let rc = unsafe { (f.cuGraphRetainUserObject)(graph, o, 1, MOVE) };
    assert_eq!(rc, OK);
    let mut ended = std::ptr::null_mut();
    // SAFETY: ends the capture begun above.
    assert_eq!(unsafe { (f.cuStreamEndCapture)(s, &mut ended) }, OK);
    assert_eq!(ended, graph, "the graph the capture recorded into");
    let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: two executable graphs of the live graph, each destroyed once below.
    unsafe {
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut a, graph, 0), OK);
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut b, graph, 0), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
        assert_eq!(c.0.load(Ordering::SeqCst), 0, "the instances own copies");
        assert_eq!((f.cuGraphExecDestroy)(a), OK);
        assert_eq!(c.0.load(Ordering::SeqCst), 0, "one instance left");
        assert_eq!((f.cuGraphExecDestroy)(b), OK);
    }
    assert_eq!(c.0.load(Ordering::SeqCst), 1);
    assert_ne!(
        *c.1.lock().unwrap(),
        Some(std::thread::current().id()),
        "another thread"
    );
    // SAFETY: a released object: no reference left to release.
    let rc = unsafe { (f.cuUserObjectRelease)(o, 1) };
    assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

#[test]
fn references_are_counted_and_bad_arguments_refused() {
    let (d, world, s) = setup();
    let f = d.fns();
    let c = counter();
    let o = user_object(&d, c, 2);
    let graph = capture(&d, s);
    let mut p = std::ptr::null_mut();
    // SAFETY: valid or deliberately invalid arguments; nothing is dereferenced but `p`.
    unsafe {
        let bad = CUresult::CUDA_ERROR_INVALID_VALUE;
        assert_eq!(
            (f.cuUserObjectCreate)(&mut p, p.cast(), Some(count), 0, NO_SYNC),
            bad
        );
        assert_eq!(
            (f.cuUserObjectCreate)(&mut p, p.cast(), Some(count), 1, 0),
            bad
        );
        assert_eq!(
            (f.cuUserObjectCreate)(&mut p, p.cast(), None, 1, NO_SYNC),
            bad
        );
        assert_eq!(
            (f.cuGraphRetainUserObject)(graph, o, 3, MOVE),
            bad,
            "more than ours"
        );
        assert_eq!(
            (f.cuGraphRetainUserObject)(graph, o, 1, 7),
            bad,
            "unknown flag"
        );
        assert_eq!(
            (f.cuGraphRetainUserObject)(std::ptr::null_mut(), o, 1, 0),
            bad
        );
        // A copy (no move): the graph's own reference, ours stay 2.
        assert_eq!((f.cuGraphRetainUserObject)(graph, o, 1, 0), OK);
        assert_eq!((f.cuUserObjectRelease)(o, 2), OK);
        assert_eq!(
            c.0.load(Ordering::SeqCst),
            0,
            "the graph's reference is left"
        );
        // The graph the capture made goes, and with it its reference.
        let mut g = std::ptr::null_mut();
        (f.cuStreamEndCapture)(s, &mut g);
        assert_eq!((f.cuGraphDestroy)(g), OK);
    }
    assert_eq!(c.0.load(Ordering::SeqCst), 1);
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}

/// The driver table of the world whose destructor below calls it.
static DRIVER: std::sync::OnceLock<Driver> = std::sync::OnceLock::new();

unsafe extern "C" fn calls_cuda(_: *mut c_void) {
    let mut n = 0;
    // SAFETY: a valid out-pointer (the call itself is what CUDA forbids here).
    let _ = unsafe { (DRIVER.get().unwrap().fns().cuDeviceGetCount)(&mut n) };
}

#[test]
fn a_cuda_call_from_a_destructor_is_a_finding() {
    let (d, world, _s) = setup();
    let d = DRIVER.get_or_init(|| d);
    let f = d.fns();
    let mut o = std::ptr::null_mut();
    // SAFETY: valid out-pointer and destructor; the one reference is released once.
    unsafe {
        assert_eq!(
            (f.cuUserObjectCreate)(&mut o, std::ptr::null_mut(), Some(calls_cuda), 1, NO_SYNC),
            OK
        );
        assert_eq!((f.cuUserObjectRelease)(o, 1), OK);
    }
    let v = world.violations();
    assert!(
        v.iter()
            .any(|m| m.contains("cuDeviceGetCount called from a user object's destructor")),
        "{v:?}"
    );
}
