//! The NCCL mock's sanitizer checks for NCCL memory (`ncclMemAlloc`), buffer
//! registrations (`ncclCommRegister`) and windows (`ncclCommWindowRegister`): one test
//! per check, each pinning the exact report and return code. Raw table calls, so every
//! check is the mock's own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{CStr, c_void};

use cuda_sys::{CUdeviceptr, CUresult, CUstream, CUstreamCaptureMode};
use nccl_sys::{
    NCCL_WIN_REQUIRED_ALIGNMENT, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t,
    ncclWindow_t,
};

use crate::common::{NCCL_OK, OK, Rig};

const INVALID: ncclResult_t = ncclResult_t::ncclInvalidArgument;
/// Elements per buffer (f32), 64 bytes.
const N: usize = 16;
/// Bytes per buffer.
const BYTES: usize = N * 4;
/// NCCL registers and allocates whole pages (the mock's pages are 4 KiB).
const PAGE: usize = 4096;

/// The common rig with device 0's context current.
fn rig(devices: usize) -> Rig {
    let rig = Rig::new(devices);
    rig.on(0);
    rig
}

/// This file's helpers on the shared rig (a trait: inherent methods are crate-wide).
trait RegistryRig {
    fn comm(&self) -> ncclComm_t;
    fn stream(&self) -> CUstream;
    fn sync(&self, s: CUstream);
    fn cu_alloc(&self, bytes: usize) -> CUdeviceptr;
    fn cu_free(&self, p: CUdeviceptr) -> CUresult;
    fn mem_alloc(&self, bytes: usize) -> CUdeviceptr;
    fn mem_free(&self, p: CUdeviceptr) -> ncclResult_t;
    fn register(&self, comm: ncclComm_t, p: CUdeviceptr, bytes: usize) -> *mut c_void;
    fn deregister(&self, comm: ncclComm_t, h: *mut c_void) -> ncclResult_t;
    fn window(
        &self,
        comm: ncclComm_t,
        p: CUdeviceptr,
        bytes: usize,
    ) -> (ncclResult_t, ncclWindow_t);
    fn window_deregister(&self, comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t;
    fn all_reduce(&self, comm: ncclComm_t, p: CUdeviceptr, stream: CUstream) -> ncclResult_t;
    fn last_error(&self, comm: ncclComm_t) -> String;
    fn assert_clean(&self);
}

impl RegistryRig for Rig {
    /// A one-rank communicator on device 0.
    fn comm(&self) -> ncclComm_t {
        self.comms(1)[0]
    }

    /// A stream in the current context.
    fn stream(&self) -> CUstream {
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (self.driver.fns().cuStreamCreate)(&mut s, 0) }, OK);
        s
    }

    fn sync(&self, s: CUstream) {
        // SAFETY: a live stream.
        assert_eq!(unsafe { (self.driver.fns().cuStreamSynchronize)(s) }, OK);
    }

    /// `bytes` of driver memory (cuMemAlloc) in the current context, zeroed.
    fn cu_alloc(&self, bytes: usize) -> CUdeviceptr {
        let f = self.driver.fns();
        let mut p = 0;
        // SAFETY: valid out-pointer; a fresh allocation of `bytes`.
        unsafe {
            assert_eq!((f.cuMemAlloc)(&mut p, bytes), OK);
            assert_eq!((f.cuMemsetD8)(p, 0, bytes), OK);
        }
        p
    }

    fn cu_free(&self, p: CUdeviceptr) -> CUresult {
        // SAFETY: the mock checks the address.
        unsafe { (self.driver.fns().cuMemFree)(p) }
    }

    /// `bytes` of NCCL memory (ncclMemAlloc) in the current context, zeroed.
    fn mem_alloc(&self, bytes: usize) -> CUdeviceptr {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.nccl.fns().ncclMemAlloc.expect("ncclMemAlloc"))(&mut p, bytes) };
        assert_eq!(rc, NCCL_OK);
        assert!(!p.is_null());
        let p = p.addr() as CUdeviceptr;
        // SAFETY: `bytes` of live device memory at `p`.
        assert_eq!(unsafe { (self.driver.fns().cuMemsetD8)(p, 0, bytes) }, OK);
        p
    }

    fn mem_free(&self, p: CUdeviceptr) -> ncclResult_t {
        // SAFETY: the mock checks the address.
        unsafe { (self.nccl.fns().ncclMemFree.expect("ncclMemFree"))(dev(p)) }
    }

    /// `ncclCommRegister` of `bytes` at `p`, which must succeed: the handle.
    fn register(&self, comm: ncclComm_t, p: CUdeviceptr, bytes: usize) -> *mut c_void {
        let mut h = std::ptr::null_mut();
        let f = self.nccl.fns().ncclCommRegister.expect("ncclCommRegister");
        // SAFETY: valid out-pointer; the mock checks the rest.
        assert_eq!(unsafe { f(comm, dev(p), bytes, &mut h) }, NCCL_OK);
        assert!(!h.is_null());
        h
    }

    fn deregister(&self, comm: ncclComm_t, h: *mut c_void) -> ncclResult_t {
        let f = self
            .nccl
            .fns()
            .ncclCommDeregister
            .expect("ncclCommDeregister");
        // SAFETY: the mock checks the handles.
        unsafe { f(comm, h) }
    }

    /// `ncclCommWindowRegister` (flags 0): its result and the handle it wrote.
    fn window(
        &self,
        comm: ncclComm_t,
        p: CUdeviceptr,
        bytes: usize,
    ) -> (ncclResult_t, ncclWindow_t) {
        let mut win = std::ptr::null_mut();
        let f = self
            .nccl
            .fns()
            .ncclCommWindowRegister
            .expect("ncclCommWindowRegister");
        // SAFETY: valid out-pointer; the mock checks the rest.
        let rc = unsafe { f(comm, dev(p), bytes, &mut win, 0) };
        (rc, win)
    }

    fn window_deregister(&self, comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        let f = self
            .nccl
            .fns()
            .ncclCommWindowDeregister
            .expect("ncclCommWindowDeregister");
        // SAFETY: the mock checks the handles.
        unsafe { f(comm, win) }
    }

    /// In-place all-reduce of N f32 at `p` on `stream`.
    fn all_reduce(&self, comm: ncclComm_t, p: CUdeviceptr, stream: CUstream) -> ncclResult_t {
        // SAFETY: the mock checks the buffer, communicator and stream.
        unsafe {
            (self.nccl.fns().ncclAllReduce)(
                p as *const c_void,
                dev(p),
                N,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                comm,
                stream,
            )
        }
    }

    fn last_error(&self, comm: ncclComm_t) -> String {
        // SAFETY: the mock returns a NUL-terminated string that stays valid until the
        // next failing call; it is copied at once.
        unsafe { CStr::from_ptr((self.nccl.fns().ncclGetLastError)(comm)) }
            .to_string_lossy()
            .into_owned()
    }

    fn assert_clean(&self) {
        assert!(
            self.world.violations().is_empty(),
            "{:?}",
            self.world.violations()
        );
    }
}

/// A device address as the pointer NCCL takes.
fn dev(p: CUdeviceptr) -> *mut c_void {
    std::ptr::without_provenance_mut(p as usize)
}

#[test]
fn cu_mem_free_of_nccl_memory_is_refused_and_nccl_mem_free_releases_it() {
    let rig = rig(1);
    let p = rig.mem_alloc(BYTES);
    assert_eq!(rig.cu_free(p), CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "cuMemFree of {p:#x}: allocated by ncclMemAlloc, which must free it"
        )]
    );
    assert_eq!(
        rig.mem_free(p),
        NCCL_OK,
        "still live: cuMemFree did nothing"
    );
    rig.assert_clean();
    assert_eq!(rig.gpus.used_memory(0), 0);
}

#[test]
fn nccl_mem_free_of_registered_memory_is_reported_and_of_driver_memory_refused() {
    let rig = rig(1);
    let comm = rig.comm();
    let p = rig.mem_alloc(BYTES);
    let h = rig.register(comm, p, BYTES);
    assert_eq!(rig.mem_free(p), NCCL_OK);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclMemFree of {p:#x}: still held by NCCL registration {:#x} of communicator {:#x} (ncclCommRegister)",
            h.addr(),
            comm.addr()
        )]
    );
    assert_eq!(rig.deregister(comm, h), NCCL_OK);
    rig.assert_clean();

    let q = rig.cu_alloc(BYTES);
    assert_eq!(rig.mem_free(q), INVALID);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclMemFree of {q:#x}: not allocated by ncclMemAlloc"
        )]
    );
    assert_eq!(
        rig.last_error(comm),
        format!("ncclMemFree: {q:#x} is not NCCL memory")
    );
    assert_eq!(rig.cu_free(q), OK, "ncclMemFree left it alone");
    rig.destroy(comm);
    rig.assert_clean();
}

/// Frees NCCL memory that an all-reduce used, with or without waiting for its stream.
fn mem_free_after_all_reduce(wait: bool) -> (Vec<String>, CUdeviceptr, CUstream) {
    let rig = rig(1);
    let comm = rig.comm();
    let s = rig.stream();
    let p = rig.mem_alloc(BYTES);
    assert_eq!(rig.all_reduce(comm, p, s), NCCL_OK);
    rig.assert_clean();
    if wait {
        rig.sync(s);
    }
    assert_eq!(rig.mem_free(p), NCCL_OK, "ncclMemFree does not fail for it");
    let v = rig.world.take_violations();
    rig.destroy(comm);
    rig.assert_clean();
    (v, p, s)
}

#[test]
fn nccl_mem_free_while_a_collective_may_still_run_is_reported() {
    let (v, p, s) = mem_free_after_all_reduce(false);
    assert_eq!(
        v,
        [format!(
            "ncclMemFree frees {p:#x}+{PAGE} while work enqueued on stream {:#x} (ncclAllReduce) may still run: the host did not wait for it",
            s.addr()
        )]
    );
}

#[test]
fn nccl_mem_free_after_the_host_waited_for_the_collective_is_fine() {
    let (v, _, _) = mem_free_after_all_reduce(true);
    assert!(v.is_empty(), "{v:?}");
}

/// Deregisters a buffer an all-reduce used, with or without waiting for its stream.
fn deregister_after_all_reduce(wait: bool) -> (Vec<String>, CUdeviceptr, CUstream, usize) {
    let rig = rig(1);
    let comm = rig.comm();
    let s = rig.stream();
    let p = rig.cu_alloc(BYTES);
    let h = rig.register(comm, p, BYTES);
    assert_eq!(rig.all_reduce(comm, p, s), NCCL_OK);
    rig.assert_clean();
    if wait {
        rig.sync(s);
    }
    assert_eq!(rig.deregister(comm, h), NCCL_OK, "reported, not refused");
    let v = rig.world.take_violations();
    rig.sync(s);
    assert_eq!(rig.cu_free(p), OK);
    rig.destroy(comm);
    rig.assert_clean();
    (v, p, s, h.addr())
}

#[test]
fn deregistering_a_buffer_a_collective_may_still_use_is_reported() {
    let (v, p, s, h) = deregister_after_all_reduce(false);
    assert_eq!(
        v,
        [format!(
            "ncclCommDeregister of registration {h:#x} ({:#x}+{PAGE}): work enqueued on stream {:#x} (ncclAllReduce) may still use it: the host did not wait for it",
            p & !(PAGE as u64 - 1),
            s.addr()
        )]
    );
}

/// A send whose buffer reaches into a registered page only with its last bytes still
/// uses that registration: deregistering it before the host waited is reported. (A
/// buffer is `count * size of the type` bytes: a shorter range would miss the page.)
#[test]
fn a_send_whose_tail_lies_in_a_registration_uses_it() {
    let rig = rig(1);
    let comm = rig.comm();
    let s = rig.stream();
    let p = rig.cu_alloc(3 * PAGE);
    // The first page boundary inside the allocation, with room before and after it.
    let page = (p + PAGE as u64) & !(PAGE as u64 - 1);
    let send = page - 32;
    let recv = page + PAGE as u64;
    let h = rig.register(comm, page, 4);
    let f = rig.nccl.fns();
    let t = ncclDataType_t::ncclFloat32;
    // SAFETY: N f32 of live device memory at each buffer; the mock checks the rest.
    unsafe {
        assert_eq!((f.ncclGroupStart)(), NCCL_OK);
        assert_eq!((f.ncclSend)(dev(send), N, t, 0, comm, s), NCCL_OK);
        assert_eq!((f.ncclRecv)(dev(recv), N, t, 0, comm, s), NCCL_OK);
        assert_eq!((f.ncclGroupEnd)(), NCCL_OK);
    }
    rig.assert_clean();
    assert_eq!(rig.deregister(comm, h), NCCL_OK, "reported, not refused");
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclCommDeregister of registration {:#x} ({page:#x}+{PAGE}): work enqueued on stream {:#x} (ncclGroupEnd: ncclSend) may still use it: the host did not wait for it",
            h.addr(),
            s.addr()
        )]
    );
    rig.sync(s);
    assert_eq!(rig.cu_free(p), OK);
    rig.destroy(comm);
    rig.assert_clean();
}

#[test]
fn deregistering_after_the_host_waited_for_the_collective_is_fine() {
    let (v, ..) = deregister_after_all_reduce(true);
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn a_captured_collective_whose_registration_was_released_before_launch_fails() {
    let rig = rig(1);
    let comm = rig.comm();
    let s = rig.stream();
    let p = rig.cu_alloc(BYTES);
    let h = rig.register(comm, p, BYTES);
    let f = rig.driver.fns();
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: live handles and valid out-pointers.
    unsafe {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!((f.cuStreamBeginCapture)(s, mode), OK);
        assert_eq!(rig.all_reduce(comm, p, s), NCCL_OK);
        assert_eq!((f.cuStreamEndCapture)(s, &mut graph), OK);
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
    }
    assert_eq!(
        rig.deregister(comm, h),
        NCCL_OK,
        "captured work has not run: nothing may still use it"
    );
    rig.assert_clean();
    // SAFETY: live graph handles and stream.
    unsafe {
        assert_eq!(
            (f.cuGraphLaunch)(exec, s),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclAllReduce: buffer registration {:#x} was released by ncclCommDeregister before the work ran",
            h.addr()
        )]
    );
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphExecDestroy)(exec), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
    }
    assert_eq!(rig.cu_free(p), OK);
    rig.destroy(comm);
    rig.assert_clean();
}

#[test]
fn deregistering_through_another_comm_twice_or_a_window_is_refused() {
    let rig = rig(1);
    let (a, b) = (rig.comm(), rig.comm());
    let p = rig.mem_alloc(2 * NCCL_WIN_REQUIRED_ALIGNMENT as usize);
    let h = rig.register(a, p, BYTES);

    assert_eq!(rig.deregister(b, h), INVALID);
    let m = format!(
        "ncclCommDeregister: registration {:#x} belongs to communicator {:#x}, not {:#x}",
        h.addr(),
        a.addr(),
        b.addr()
    );
    assert_eq!(rig.world.take_violations(), std::slice::from_ref(&m));
    assert_eq!(rig.last_error(b), m);

    assert_eq!(rig.deregister(a, h), NCCL_OK, "still registered");
    rig.assert_clean();
    assert_eq!(rig.deregister(a, h), INVALID);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclCommDeregister: registration {:#x} was already released by ncclCommDeregister",
            h.addr()
        )]
    );

    let (rc, win) = rig.window(a, p, NCCL_WIN_REQUIRED_ALIGNMENT as usize);
    assert_eq!(rc, NCCL_OK);
    assert_eq!(rig.deregister(a, win.cast()), INVALID);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclCommDeregister: {:#x} is a window, not a registration",
            win.addr()
        )]
    );
    assert_eq!(rig.window_deregister(a, win), NCCL_OK, "still a window");
    assert_eq!(rig.mem_free(p), NCCL_OK);
    rig.destroy(a);
    rig.destroy(b);
    rig.assert_clean();
}

#[test]
fn a_window_needs_nccl_memory() {
    let rig = rig(1);
    let comm = rig.comm();
    let q = rig.cu_alloc(NCCL_WIN_REQUIRED_ALIGNMENT as usize);
    let (rc, win) = rig.window(comm, q, NCCL_WIN_REQUIRED_ALIGNMENT as usize);
    assert_eq!(rc, INVALID);
    assert!(win.is_null());
    let e = rig.last_error(comm);
    assert_eq!(
        e,
        format!(
            "ncclCommWindowRegister: {q:#x} is not memory from ncclMemAlloc (windows need cuMem memory)"
        )
    );
    rig.assert_clean();
    assert_eq!(rig.cu_free(q), OK, "not pinned");
    rig.destroy(comm);
    rig.assert_clean();
}

#[test]
fn a_window_at_a_misaligned_offset_is_refused() {
    let rig = rig(1);
    let comm = rig.comm();
    let align = NCCL_WIN_REQUIRED_ALIGNMENT as usize;
    let p = rig.mem_alloc(2 * align);
    let (rc, win) = rig.window(comm, p + 256, align);
    assert_eq!(rc, INVALID);
    assert!(win.is_null());
    assert_eq!(
        rig.last_error(comm),
        format!(
            "ncclCommWindowRegister: offset 256 into its allocation is not a multiple of {align}"
        )
    );
    let (rc, win) = rig.window(comm, p + align as CUdeviceptr, align);
    assert_eq!(rc, NCCL_OK, "an aligned offset is fine");
    assert_eq!(rig.window_deregister(comm, win), NCCL_OK);
    assert_eq!(rig.mem_free(p), NCCL_OK);
    rig.destroy(comm);
    rig.assert_clean();
}

#[test]
fn the_ranks_windows_may_have_different_sizes() {
    let rig = rig(2);
    let comms = rig.comms(2);
    let align = NCCL_WIN_REQUIRED_ALIGNMENT as usize;
    let mems: Vec<CUdeviceptr> = (0..2)
        .map(|d| {
            rig.on(d);
            rig.mem_alloc(4 * align)
        })
        .collect();

    // Window 1: both ranks agree.
    let (rc0, w0) = rig.window(comms[0], mems[0], align);
    let (rc1, w1) = rig.window(comms[1], mems[1], align);
    assert_eq!((rc0, rc1), (NCCL_OK, NCCL_OK));
    assert!(!w0.is_null() && !w1.is_null());
    assert_ne!(w0, w1);
    rig.assert_clean();

    // Window 2: rank 1's is smaller, as NCCL allows (a put must fit the peer's: the safe
    // crate bounds puts by the smallest; a put that does not fit is reported when it runs).
    let (rc0, v0) = rig.window(comms[0], mems[0] + align as CUdeviceptr, 2 * align);
    let (rc1, v1) = rig.window(comms[1], mems[1] + align as CUdeviceptr, align);
    assert_eq!((rc0, rc1), (NCCL_OK, NCCL_OK));
    assert!(!v0.is_null() && !v1.is_null());
    rig.assert_clean();

    for (c, w) in [
        (comms[0], w0),
        (comms[1], w1),
        (comms[0], v0),
        (comms[1], v1),
    ] {
        assert_eq!(rig.window_deregister(c, w), NCCL_OK);
    }
    for (d, p) in mems.into_iter().enumerate() {
        rig.on(d);
        assert_eq!(rig.mem_free(p), NCCL_OK);
    }
    for c in comms {
        rig.destroy(c);
    }
    rig.assert_clean();
}

#[test]
fn destroying_a_communicator_releases_its_registrations_and_windows() {
    let rig = rig(1);
    let (a, b) = (rig.comm(), rig.comm());
    let align = NCCL_WIN_REQUIRED_ALIGNMENT as usize;
    let p = rig.mem_alloc(align);
    let h = rig.register(a, p, BYTES);
    let (rc, win) = rig.window(a, p, align);
    assert_eq!(rc, NCCL_OK);
    rig.destroy(a);
    assert_eq!(rig.mem_free(p), NCCL_OK);
    rig.assert_clean();

    assert_eq!(rig.deregister(b, h), INVALID);
    assert_eq!(rig.window_deregister(b, win), INVALID);
    assert_eq!(
        rig.world.take_violations(),
        [
            format!(
                "ncclCommDeregister: registration {:#x} was already released by ncclCommDestroy",
                h.addr()
            ),
            format!(
                "ncclCommWindowDeregister: window {:#x} was already released by ncclCommDestroy",
                win.addr()
            ),
        ]
    );
    rig.destroy(b);
    rig.assert_clean();
}

#[test]
fn a_registration_does_not_attach_to_another_communicators_collectives() {
    let rig = rig(1);
    let (a, b) = (rig.comm(), rig.comm());
    let s = rig.stream();
    let p = rig.cu_alloc(BYTES);
    let h = rig.register(a, p, BYTES);
    let f = rig.driver.fns();

    // Run now on B while A's registration is live: B's work does not use it.
    assert_eq!(rig.all_reduce(b, p, s), NCCL_OK);
    // Captured on B while A's registration is live: replayed after it went.
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: live handles and valid out-pointers.
    unsafe {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!((f.cuStreamBeginCapture)(s, mode), OK);
        assert_eq!(rig.all_reduce(b, p, s), NCCL_OK);
        assert_eq!((f.cuStreamEndCapture)(s, &mut graph), OK);
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
    }
    assert_eq!(
        rig.deregister(a, h),
        NCCL_OK,
        "no wait needed: A never used it"
    );
    rig.assert_clean();
    // SAFETY: live graph handles and stream.
    unsafe {
        assert_eq!((f.cuGraphLaunch)(exec, s), OK);
    }
    assert_eq!(rig.all_reduce(b, p, s), NCCL_OK, "after the deregistration");
    rig.sync(s);
    rig.assert_clean();
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphExecDestroy)(exec), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
    }
    assert_eq!(rig.cu_free(p), OK);
    rig.destroy(a);
    rig.destroy(b);
    rig.assert_clean();
}

/// Replays an all-reduce captured on one stream on another, then deregisters its buffer,
/// with or without waiting for the launch stream.
fn deregister_after_graph_launch(wait: bool) -> (Vec<String>, CUdeviceptr, CUstream, usize) {
    let rig = rig(1);
    let comm = rig.comm();
    let (s, launch) = (rig.stream(), rig.stream());
    let p = rig.cu_alloc(BYTES);
    let h = rig.register(comm, p, BYTES);
    let f = rig.driver.fns();
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: live handles and valid out-pointers.
    unsafe {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!((f.cuStreamBeginCapture)(s, mode), OK);
        assert_eq!(rig.all_reduce(comm, p, s), NCCL_OK);
        assert_eq!((f.cuStreamEndCapture)(s, &mut graph), OK);
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
        assert_eq!((f.cuGraphLaunch)(exec, launch), OK);
    }
    rig.assert_clean();
    if wait {
        rig.sync(launch);
    }
    assert_eq!(rig.deregister(comm, h), NCCL_OK, "reported, not refused");
    let v = rig.world.take_violations();
    rig.sync(launch);
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphExecDestroy)(exec), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
    }
    assert_eq!(rig.cu_free(p), OK);
    rig.destroy(comm);
    rig.assert_clean();
    (v, p, launch, h.addr())
}

#[test]
fn deregistering_a_buffer_a_graph_launch_may_still_use_is_reported() {
    let (v, p, launch, h) = deregister_after_graph_launch(false);
    assert_eq!(
        v,
        [format!(
            "ncclCommDeregister of registration {h:#x} ({:#x}+{PAGE}): work enqueued on stream {:#x} (ncclAllReduce) may still use it: the host did not wait for it",
            p & !(PAGE as u64 - 1),
            launch.addr()
        )]
    );
}

#[test]
fn deregistering_after_the_host_waited_for_the_graph_launch_is_fine() {
    let (v, ..) = deregister_after_graph_launch(true);
    assert!(v.is_empty(), "{v:?}");
}

/// In-place all-reduce of `n` f32 at `p` on `stream`.
fn all_reduce_n(rig: &Rig, comm: ncclComm_t, p: CUdeviceptr, n: usize, s: CUstream) {
    // SAFETY: the mock checks the buffer, communicator and stream.
    let rc = unsafe {
        (rig.nccl.fns().ncclAllReduce)(
            p as *const c_void,
            dev(p),
            n,
            ncclDataType_t::ncclFloat32,
            ncclRedOp_t::ncclSum,
            comm,
            s,
        )
    };
    assert_eq!(rc, NCCL_OK);
}

/// A registration covers whole pages and nothing else: only work that overlaps them
/// (a byte or more) uses it, so only that work must be waited for before deregistering.
#[test]
fn only_work_that_overlaps_the_registered_pages_uses_the_registration() {
    let rig = rig(1);
    let comm = rig.comm();
    let (near, inside) = (rig.stream(), rig.stream());
    let m = rig.mem_alloc(3 * PAGE);
    let elsewhere = rig.mem_alloc(PAGE);
    let reg = m + PAGE as CUdeviceptr;
    let h = rig.register(comm, reg + 16, BYTES);
    // Ending where its page begins, beginning where it ends, no byte at all inside it,
    // and other memory: none of it uses the registration.
    all_reduce_n(&rig, comm, reg - BYTES as CUdeviceptr, N, near);
    all_reduce_n(&rig, comm, reg + PAGE as CUdeviceptr, N, near);
    all_reduce_n(&rig, comm, reg + 64, 0, near);
    all_reduce_n(&rig, comm, elsewhere, N, near);
    // From its first byte: uses it.
    all_reduce_n(&rig, comm, reg, N, inside);
    rig.assert_clean();
    assert_eq!(rig.deregister(comm, h), NCCL_OK);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclCommDeregister of registration {:#x} ({reg:#x}+{PAGE}): work enqueued on stream {:#x} (ncclAllReduce) may still use it: the host did not wait for it",
            h.addr(),
            inside.addr()
        )]
    );
    rig.sync(near);
    rig.sync(inside);
    assert_eq!(rig.mem_free(m), NCCL_OK);
    assert_eq!(rig.mem_free(elsewhere), NCCL_OK);
    rig.destroy(comm);
    rig.assert_clean();
}

/// Registering a range an existing registration covers hands that one out again,
/// counted: it stays registered (and its memory held) until the last deregistration.
#[test]
fn a_registration_handed_out_again_is_released_at_its_last_deregistration() {
    let rig = rig(1);
    let comm = rig.comm();
    let p = rig.mem_alloc(PAGE);
    let h = rig.register(comm, p, PAGE);
    assert_eq!(
        rig.register(comm, p + 64, BYTES),
        h,
        "covered: the same one"
    );
    assert_eq!(rig.register(comm, p, BYTES), h);
    for _ in 0..2 {
        assert_eq!(rig.deregister(comm, h), NCCL_OK);
        rig.assert_clean();
    }
    assert_eq!(rig.mem_free(p), NCCL_OK);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclMemFree of {p:#x}: still held by NCCL registration {:#x} of communicator {:#x} (ncclCommRegister)",
            h.addr(),
            comm.addr()
        )]
    );
    assert_eq!(rig.deregister(comm, h), NCCL_OK, "the last one");
    rig.assert_clean();
    assert_eq!(rig.deregister(comm, h), INVALID);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclCommDeregister: registration {:#x} was already released by ncclCommDeregister",
            h.addr()
        )]
    );
    rig.destroy(comm);
    rig.assert_clean();
}

#[test]
fn registering_memory_of_another_device_is_refused() {
    let rig = rig(2);
    let comms = rig.comms(2);
    rig.on(1);
    let q = rig.cu_alloc(BYTES);
    let mut h = std::ptr::null_mut();
    let f = rig.nccl.fns().ncclCommRegister.expect("ncclCommRegister");
    // SAFETY: valid out-pointer; the mock checks the rest.
    assert_eq!(unsafe { f(comms[0], dev(q), BYTES, &mut h) }, INVALID);
    assert!(h.is_null());
    assert_eq!(
        rig.last_error(comms[0]),
        "ncclCommRegister: memory of device 1, communicator of device 0"
    );
    assert_eq!(rig.cu_free(q), OK, "not pinned");
    for c in comms {
        rig.destroy(c);
    }
    rig.assert_clean();
}

#[test]
fn with_windows_off_a_window_registration_succeeds_with_no_window() {
    let rig = Rig::with_nccl(1, |n| n.windows(false));
    rig.on(0);
    let comm = rig.comm();
    let p = rig.mem_alloc(PAGE);
    let (rc, win) = rig.window(comm, p, PAGE);
    assert_eq!(rc, NCCL_OK);
    assert!(win.is_null());
    assert_eq!(rig.window_deregister(comm, win), NCCL_OK);
    assert_eq!(rig.mem_free(p), NCCL_OK, "nothing holds it");
    rig.assert_clean();
    rig.destroy(comm);
    assert!(rig.world.live().is_empty());
}

#[test]
fn with_local_registration_off_a_registration_succeeds_with_no_handle() {
    let rig = Rig::with_nccl(1, |n| n.local_registration(false));
    rig.on(0);
    let comm = rig.comm();
    let s = rig.stream();
    let p = rig.cu_alloc(BYTES);
    let mut h = std::ptr::dangling_mut();
    let reg = rig.nccl.fns().ncclCommRegister.expect("ncclCommRegister");
    // SAFETY: valid out-pointer; the mock checks the rest.
    assert_eq!(unsafe { reg(comm, dev(p), BYTES, &mut h) }, NCCL_OK);
    assert!(h.is_null());
    // Nothing resolves it, holds the memory, or waits for it.
    assert_eq!(rig.all_reduce(comm, p, s), NCCL_OK);
    assert_eq!(rig.deregister(comm, h), NCCL_OK);
    rig.assert_clean();
    rig.sync(s);
    assert_eq!(rig.cu_free(p), OK);
    rig.destroy(comm);
    rig.assert_clean();
    assert!(rig.world.live().is_empty());
}
