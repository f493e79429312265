//! The NCCL mock as a sanitizer: grouped and captured operations checked when they run,
//! calls with freed communicators, and split children that follow their parent's
//! blocking mode. Raw table calls, so every check is the mock's own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;

use crate::common::{NCCL_OK, OK, Rig};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use cuda_mock::{MockDriver, QUARANTINE_BLOCKS};
use cuda_sys::{CUdeviceptr, CUresult, CUstream, CUstreamCaptureMode};
use nccl_mock::MockNccl;
use nccl_sys::{
    NCCL_CONFIG_INITIALIZER, NCCL_SPLIT_NOCOLOR, ncclComm, ncclComm_t, ncclDataType_t, ncclRedOp_t,
    ncclResult_t, ncclScalarResidence_t, ncclUniqueId,
};

/// Where NCCL writes a split's new communicator, possibly from another thread.
type Slot = AtomicPtr<ncclComm>;

/// The communicator in `slot` (NULL while the split has not completed).
fn got(slot: &Slot) -> ncclComm_t {
    slot.load(Ordering::Acquire)
}

/// The child a non-blocking split outside a group stores: as with NCCL 2.28, it may come
/// after the parent's async error already reads success, so wait for it (at most 5 s).
fn stored(slot: &Slot) -> ncclComm_t {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got(slot).is_null() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    got(slot)
}

/// Elements per buffer (f32), 64 bytes.
const N: usize = 16;

/// This file's helpers on the shared rig (a trait: inherent methods are crate-wide).
trait SanitizerRig {
    fn buffers(&self, d: usize, value: f32) -> (CUstream, CUdeviceptr, CUdeviceptr);
    fn read(&self, d: usize, p: CUdeviceptr) -> [f32; N];
    fn free(&self, p: CUdeviceptr);
    fn all_reduce(&self, comm: ncclComm_t, _: (CUstream, CUdeviceptr, CUdeviceptr))
    -> ncclResult_t;
    fn async_error(&self, comm: ncclComm_t) -> (ncclResult_t, ncclResult_t);
    fn wait_ready(&self, comm: ncclComm_t) -> ncclResult_t;
    fn split(
        &self,
        comm: ncclComm_t,
        color: i32,
        key: i32,
        blocking: Option<bool>,
        out: &Slot,
    ) -> ncclResult_t;
    fn shrink(&self, comm: ncclComm_t, exclude: &[i32], out: &Slot) -> ncclResult_t;
    fn shrink_with(
        &self,
        comm: ncclComm_t,
        exclude: &[i32],
        flags: i32,
        out: &Slot,
    ) -> ncclResult_t;
    fn count_and_rank(&self, comm: ncclComm_t) -> (i32, i32);
}

impl SanitizerRig for Rig {
    /// A stream and a send and a receive buffer (N f32 each) on device `d`; the send
    /// buffer holds `value`.
    fn buffers(&self, d: usize, value: f32) -> (CUstream, CUdeviceptr, CUdeviceptr) {
        self.on(d);
        let f = self.driver.fns();
        let (mut s, mut send, mut recv) = (std::ptr::null_mut(), 0, 0);
        let data = [value; N];
        // SAFETY: valid out-pointers; `data` holds N f32.
        unsafe {
            assert_eq!((f.cuStreamCreate)(&mut s, 0), OK);
            assert_eq!((f.cuMemAlloc)(&mut send, N * 4), OK);
            assert_eq!((f.cuMemAlloc)(&mut recv, N * 4), OK);
            assert_eq!((f.cuMemcpyHtoD)(send, data.as_ptr().cast(), N * 4), OK);
            assert_eq!((f.cuMemsetD8)(recv, 0, N * 4), OK);
        }
        (s, send, recv)
    }

    /// Reads N f32 at `p` on device `d`.
    fn read(&self, d: usize, p: CUdeviceptr) -> [f32; N] {
        self.on(d);
        let mut v = [0f32; N];
        // SAFETY: `v` holds N f32.
        let rc = unsafe { (self.driver.fns().cuMemcpyDtoH)(v.as_mut_ptr().cast(), p, N * 4) };
        assert_eq!(rc, OK);
        v
    }

    fn free(&self, p: CUdeviceptr) {
        // SAFETY: a live allocation.
        assert_eq!(unsafe { (self.driver.fns().cuMemFree)(p) }, OK);
    }

    fn all_reduce(
        &self,
        comm: ncclComm_t,
        (s, send, recv): (CUstream, CUdeviceptr, CUdeviceptr),
    ) -> ncclResult_t {
        // SAFETY: device buffers of N f32 on the communicator's device (or freed ones,
        // which the mock checks).
        unsafe {
            (self.nccl.fns().ncclAllReduce)(
                send as *const c_void,
                recv as *mut c_void,
                N,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                comm,
                s,
            )
        }
    }

    fn async_error(&self, comm: ncclComm_t) -> (ncclResult_t, ncclResult_t) {
        let mut e = ncclResult_t::ncclInternalError;
        // SAFETY: valid out-pointer; a live or freed handle (checked by the mock).
        let rc = unsafe { (self.nccl.fns().ncclCommGetAsyncError)(comm, &mut e) };
        (rc, e)
    }

    /// Polls `comm`'s asynchronous error until it is no longer in progress.
    fn wait_ready(&self, comm: ncclComm_t) -> ncclResult_t {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (rc, e) = self.async_error(comm);
            assert_eq!(rc, NCCL_OK);
            if e != ncclResult_t::ncclInProgress || Instant::now() > deadline {
                return e;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// `ncclCommSplit` into `out`, which NCCL (and the mock) write only when the split
    /// completes: it must stay where it is until then.
    fn split(
        &self,
        comm: ncclComm_t,
        color: i32,
        key: i32,
        blocking: Option<bool>,
        out: &Slot,
    ) -> ncclResult_t {
        let mut config = NCCL_CONFIG_INITIALIZER;
        let config_ptr = match blocking {
            Some(b) => {
                config.blocking = i32::from(b);
                &mut config as *mut _
            }
            None => std::ptr::null_mut(),
        };
        // SAFETY: `out` outlives the split (the tests keep it until it completed); NULL
        // or an initialised config.
        unsafe { (self.nccl.fns().ncclCommSplit)(comm, color, key, out.as_ptr(), config_ptr) }
    }

    /// `ncclCommShrink` (default flags, NULL config) into `out`.
    fn shrink(&self, comm: ncclComm_t, exclude: &[i32], out: &Slot) -> ncclResult_t {
        self.shrink_with(comm, exclude, 0, out)
    }

    fn shrink_with(
        &self,
        comm: ncclComm_t,
        exclude: &[i32],
        flags: i32,
        out: &Slot,
    ) -> ncclResult_t {
        let f = self
            .nccl
            .fns()
            .ncclCommShrink
            .expect("ncclCommShrink (2.27)");
        let mut list = exclude.to_vec();
        // SAFETY: `list` holds `len` ranks; `out` outlives the shrink; NULL config.
        unsafe {
            f(
                comm,
                list.as_mut_ptr(),
                list.len() as i32,
                out.as_ptr(),
                std::ptr::null_mut(),
                flags,
            )
        }
    }

    fn count_and_rank(&self, comm: ncclComm_t) -> (i32, i32) {
        let (mut n, mut r) = (-1, -1);
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!((self.nccl.fns().ncclCommCount)(comm, &mut n), NCCL_OK);
            assert_eq!((self.nccl.fns().ncclCommUserRank)(comm, &mut r), NCCL_OK);
        }
        (n, r)
    }
}

#[test]
fn a_grouped_all_reduce_whose_buffer_was_freed_before_group_end_is_caught_and_nobody_hangs() {
    let rig = Rig::new(2);
    let comms = rig.comms(2);
    let (b0, b1) = (rig.buffers(0, 1.0), rig.buffers(1, 2.0));
    let f = rig.nccl.fns();
    let start = Instant::now();
    // SAFETY: plain group calls.
    unsafe {
        assert_eq!((f.ncclGroupStart)(), NCCL_OK);
        assert_eq!(rig.all_reduce(comms[0], b0), NCCL_OK, "checked at the call");
        assert_eq!(rig.all_reduce(comms[1], b1), NCCL_OK);
        assert!(rig.world.violations().is_empty(), "nothing ran yet");
        rig.free(b0.1);
        assert_eq!((f.ncclGroupEnd)(), ncclResult_t::ncclUnhandledCudaError);
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the peer failed at once instead of waiting for the refused rank"
    );
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclGroupEnd: ncclAllReduce reads sendbuff {:#x}+{}: freed by cuMemFree",
            b0.1,
            N * 4
        )]
    );
    assert_eq!(rig.read(1, b1.2), [0.0; N], "the collective did not run");
    assert_eq!(rig.world.live().unmatched_operations, 0);
    for c in comms {
        rig.destroy(c);
    }
    assert!(rig.world.violations().is_empty());
}

#[test]
fn a_grouped_all_reduce_with_live_buffers_still_runs_and_reports_nothing() {
    let rig = Rig::new(2);
    let comms = rig.comms(2);
    let (b0, b1) = (rig.buffers(0, 1.0), rig.buffers(1, 2.0));
    let f = rig.nccl.fns();
    // SAFETY: plain group calls.
    unsafe {
        assert_eq!((f.ncclGroupStart)(), NCCL_OK);
        assert_eq!(rig.all_reduce(comms[0], b0), NCCL_OK);
        assert_eq!(rig.all_reduce(comms[1], b1), NCCL_OK);
        assert_eq!((f.ncclGroupEnd)(), NCCL_OK);
    }
    assert_eq!(rig.read(0, b0.2), [3.0; N]);
    assert_eq!(rig.read(1, b1.2), [3.0; N]);
    assert!(
        rig.world.violations().is_empty(),
        "{:?}",
        rig.world.violations()
    );
}

/// Captures one all_reduce of a one-rank communicator into a graph; returns the graph,
/// its executable and the buffers.
fn capture_all_reduce(
    rig: &Rig,
    comm: ncclComm_t,
) -> (
    cuda_sys::CUgraph,
    cuda_sys::CUgraphExec,
    (CUstream, CUdeviceptr, CUdeviceptr),
) {
    let b = rig.buffers(0, 5.0);
    let f = rig.driver.fns();
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: live handles and valid out-pointers.
    unsafe {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!((f.cuStreamBeginCapture)(b.0, mode), OK);
        assert_eq!(rig.all_reduce(comm, b), NCCL_OK);
        assert_eq!((f.cuStreamEndCapture)(b.0, &mut graph), OK);
        assert_eq!((f.cuGraphInstantiateWithFlags)(&mut exec, graph, 0), OK);
    }
    assert_eq!(rig.read(0, b.2), [0.0; N], "captured, not run");
    (graph, exec, b)
}

#[test]
fn a_captured_all_reduce_replayed_after_its_buffer_was_freed_is_caught_at_launch() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let (graph, exec, b) = capture_all_reduce(&rig, comm);
    let f = rig.driver.fns();
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphLaunch)(exec, b.0), OK);
        assert_eq!(rig.read(0, b.2), [5.0; N], "the replay ran the collective");
        rig.free(b.1);
        assert_eq!(
            (f.cuGraphLaunch)(exec, b.0),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    assert_eq!(
        rig.gpus.take_violations(),
        [format!(
            "cuGraphLaunch: ncclAllReduce reads sendbuff {:#x}+{}: freed by cuMemFree",
            b.1,
            N * 4
        )]
    );
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphExecDestroy)(exec), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
    }
    rig.destroy(comm);
    assert!(rig.world.violations().is_empty());
}

#[test]
fn a_captured_all_reduce_replayed_after_its_communicator_was_destroyed_is_caught() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let (graph, exec, b) = capture_all_reduce(&rig, comm);
    rig.destroy(comm);
    let f = rig.driver.fns();
    // SAFETY: live graph handles.
    unsafe {
        assert_eq!(
            (f.cuGraphLaunch)(exec, b.0),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclAllReduce: communicator {:#x} was freed by ncclCommDestroy before the work ran",
            comm.addr()
        )]
    );
    assert_eq!(rig.read(0, b.2), [0.0; N], "nothing ran");
    // SAFETY: live handles.
    unsafe {
        assert_eq!((f.cuGraphExecDestroy)(exec), OK);
        assert_eq!((f.cuGraphDestroy)(graph), OK);
    }
}

#[test]
fn a_stream_ordered_free_on_another_stream_is_checked_against_an_nccl_operation() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let b = rig.buffers(0, 1.0);
    let f = rig.driver.fns();
    let mut other = std::ptr::null_mut();
    // SAFETY: valid out-pointer; device 0's context is current.
    assert_eq!(unsafe { (f.cuStreamCreate)(&mut other, 1) }, OK);
    assert_eq!(rig.all_reduce(comm, b), NCCL_OK);
    // SAFETY: a live allocation and stream.
    unsafe {
        assert_eq!((f.cuMemFreeAsync)(b.1, other), OK);
        assert_eq!((f.cuStreamSynchronize)(other), OK);
    }
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "cuMemFreeAsync on stream {:#x} frees {:#x}+{} while work enqueued on stream {:#x} (ncclAllReduce) is not ordered before it",
            other.addr(),
            b.1,
            N * 4,
            b.0.addr()
        )]
    );
    rig.destroy(comm);
}

#[test]
fn red_op_destroy_after_comm_abort_is_a_use_after_free() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let f = rig.nccl.fns();
    let mut op = ncclRedOp_t::ncclSum;
    let mut scalar = 2.0f32;
    // SAFETY: valid out-pointer and host scalar; a live communicator.
    unsafe {
        let rc = (f.ncclRedOpCreatePreMulSum)(
            &mut op,
            (&mut scalar as *mut f32).cast(),
            ncclDataType_t::ncclFloat32,
            ncclScalarResidence_t::ncclScalarHostImmediate,
            comm,
        );
        assert_eq!(rc, NCCL_OK);
        assert_eq!((f.ncclCommAbort)(comm), NCCL_OK);
        assert_eq!(
            (f.ncclRedOpDestroy)(op, comm),
            ncclResult_t::ncclInvalidArgument
        );
    }
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclRedOpDestroy: communicator {:#x} was freed by ncclCommAbort",
            comm.addr()
        )]
    );
    assert!(rig.world.live().is_empty(), "{:?}", rig.world.live());
}

#[test]
fn async_error_and_other_calls_after_destroy_are_uses_after_free() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let b = rig.buffers(0, 1.0);
    rig.destroy(comm);
    let (rc, _) = rig.async_error(comm);
    assert_eq!(rc, ncclResult_t::ncclInvalidArgument);
    assert_eq!(rig.all_reduce(comm, b), ncclResult_t::ncclInvalidArgument);
    // SAFETY: a freed handle, which the mock checks.
    let rc = unsafe { (rig.nccl.fns().ncclCommDestroy)(comm) };
    assert_eq!(rc, ncclResult_t::ncclInvalidArgument);
    let h = comm.addr();
    assert_eq!(
        rig.world.take_violations(),
        [
            format!("ncclCommGetAsyncError: communicator {h:#x} was freed by ncclCommDestroy"),
            format!("ncclAllReduce: communicator {h:#x} was freed by ncclCommDestroy"),
            format!("ncclCommDestroy: communicator {h:#x} was freed by ncclCommDestroy"),
        ]
    );
    assert_eq!(rig.read(0, b.2), [0.0; N]);
}

#[test]
fn a_handle_that_never_existed_is_an_error_but_not_a_use_after_free() {
    let rig = Rig::new(1);
    let bogus: ncclComm_t = std::ptr::without_provenance_mut(0x1230);
    assert_eq!(rig.async_error(bogus).0, ncclResult_t::ncclInvalidArgument);
    assert!(rig.world.violations().is_empty());
}

/// Two non-blocking ranks of one id, both initialised from this one thread.
fn nonblocking_pair(rig: &Rig) -> [ncclComm_t; 2] {
    let f = rig.nccl.fns();
    let mut id = ncclUniqueId::default();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (f.ncclGetUniqueId)(&mut id) }, NCCL_OK);
    let mut comms = [std::ptr::null_mut(); 2];
    for (r, c) in comms.iter_mut().enumerate() {
        rig.on(r);
        let mut config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        // SAFETY: valid out-pointer and initialised config.
        let rc = unsafe { (f.ncclCommInitRankConfig)(c, 2, id, r as i32, &mut config) };
        assert_eq!(rc, ncclResult_t::ncclInProgress);
    }
    for c in comms {
        assert_eq!(rig.wait_ready(c), NCCL_OK);
    }
    comms
}

/// This file's helpers on the shared rig (a trait: inherent methods are crate-wide).
trait SanitizerRig2 {
    fn group_start(&self);
    fn group_end(&self) -> ncclResult_t;
    fn abort(&self, comm: ncclComm_t);
    fn user_rank(&self, comm: ncclComm_t) -> ncclResult_t;
    fn last_error(&self) -> String;
    fn assert_clean(&self);
}

impl SanitizerRig2 for Rig {
    fn group_start(&self) {
        // SAFETY: plain group call.
        assert_eq!(unsafe { (self.nccl.fns().ncclGroupStart)() }, NCCL_OK);
    }

    fn group_end(&self) -> ncclResult_t {
        // SAFETY: plain group call.
        unsafe { (self.nccl.fns().ncclGroupEnd)() }
    }

    fn abort(&self, comm: ncclComm_t) {
        // SAFETY: a live communicator.
        assert_eq!(unsafe { (self.nccl.fns().ncclCommAbort)(comm) }, NCCL_OK);
    }

    fn user_rank(&self, comm: ncclComm_t) -> ncclResult_t {
        let mut r = -1;
        // SAFETY: valid out-pointer; the handle is checked by the mock.
        unsafe { (self.nccl.fns().ncclCommUserRank)(comm, &mut r) }
    }

    fn last_error(&self) -> String {
        // SAFETY: NULL is allowed; the string is NCCL's, read at once.
        let p = unsafe { (self.nccl.fns().ncclGetLastError)(std::ptr::null_mut()) };
        // SAFETY: non-null and NUL-terminated.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }

    fn assert_clean(&self) {
        assert!(self.world.live().is_empty(), "{:?}", self.world.live());
        assert!(
            self.world.violations().is_empty(),
            "{:?}",
            self.world.violations()
        );
    }
}

fn slots(n: usize) -> Vec<Slot> {
    (0..n).map(|_| Slot::default()).collect()
}

/// Like NCCL, a non-blocking split answers ncclInProgress with the new communicator still
/// NULL: the parent's async error says when it is done, and the child is stored then or
/// (outside a group, as seen on NCCL 2.28) a little after.
#[test]
fn split_of_a_nonblocking_parent_is_nonblocking_and_completes_while_polled() {
    let rig = Rig::new(2);
    let parents = nonblocking_pair(&rig);
    let out = slots(2);
    // Rank 0 alone cannot finish the split: its parent is in progress until rank 1 comes.
    assert_eq!(
        rig.split(parents[0], 0, 1, None, &out[0]),
        ncclResult_t::ncclInProgress
    );
    assert!(got(&out[0]).is_null(), "NULL until the split completes");
    assert_eq!(
        rig.async_error(parents[0]),
        (NCCL_OK, ncclResult_t::ncclInProgress)
    );
    assert_eq!(
        rig.split(parents[1], 0, 0, None, &out[1]),
        ncclResult_t::ncclInProgress
    );
    assert_eq!(rig.wait_ready(parents[0]), NCCL_OK);
    assert_eq!(rig.wait_ready(parents[1]), NCCL_OK);
    let (c0, c1) = (stored(&out[0]), stored(&out[1]));
    assert_eq!(rig.async_error(c0), (NCCL_OK, NCCL_OK));
    assert_eq!(rig.count_and_rank(c0), (2, 1), "ordered by key");
    assert_eq!(rig.count_and_rank(c1), (2, 0));
    // The child is non-blocking too: its own split (NULL config) returns at once, the
    // NOCOLOR rank's included (it still takes part).
    let grand = slots(2);
    assert_eq!(
        rig.split(c0, NCCL_SPLIT_NOCOLOR, 0, None, &grand[0]),
        ncclResult_t::ncclInProgress
    );
    assert_eq!(
        rig.split(c1, 0, 0, None, &grand[1]),
        ncclResult_t::ncclInProgress
    );
    assert_eq!(rig.wait_ready(c0), NCCL_OK);
    assert_eq!(rig.wait_ready(c1), NCCL_OK);
    let g1 = stored(&grand[1]);
    assert!(got(&grand[0]).is_null(), "NOCOLOR: no communicator");
    assert_eq!(rig.count_and_rank(g1), (1, 0));
    for c in [g1, c0, c1, parents[0], parents[1]] {
        rig.destroy(c);
    }
    rig.assert_clean();
}

#[test]
fn split_of_a_blocking_parent_is_blocking() {
    let rig = Rig::new(1);
    let parent = rig.comms(1)[0];
    let out = slots(2);
    assert_eq!(rig.split(parent, 0, 0, None, &out[0]), NCCL_OK);
    let child = got(&out[0]);
    assert_eq!(rig.async_error(child), (NCCL_OK, NCCL_OK));
    assert_eq!(rig.count_and_rank(child), (1, 0));
    assert_eq!(
        rig.split(child, 0, 0, None, &out[1]),
        NCCL_OK,
        "the child is blocking too"
    );
    for c in [got(&out[1]), child, parent] {
        rig.destroy(c);
    }
    rig.assert_clean();
}

/// The parent's mode decides whether the split completes in the call (NCCL runs it as
/// the parent's job); the config decides the child's own mode.
#[test]
fn a_config_sets_the_split_childs_mode_explicitly() {
    let rig = Rig::new(1);
    let parent = rig.comms(1)[0];
    let out = slots(4);
    assert_eq!(
        rig.split(parent, 0, 0, Some(false), &out[0]),
        NCCL_OK,
        "a blocking parent completes the split in the call"
    );
    let nb = got(&out[0]);
    assert_eq!(
        rig.split(nb, 0, 0, None, &out[1]),
        ncclResult_t::ncclInProgress,
        "the child is non-blocking"
    );
    assert_eq!(rig.wait_ready(nb), NCCL_OK);
    assert_eq!(
        rig.split(nb, 0, 0, Some(true), &out[2]),
        ncclResult_t::ncclInProgress
    );
    assert_eq!(rig.wait_ready(nb), NCCL_OK);
    let b = stored(&out[2]);
    assert_eq!(rig.async_error(b), (NCCL_OK, NCCL_OK));
    assert_eq!(
        rig.split(b, 0, 0, None, &out[3]),
        NCCL_OK,
        "a blocking child of a non-blocking parent"
    );
    for c in [got(&out[3]), b, stored(&out[1]), nb, parent] {
        rig.destroy(c);
    }
    rig.assert_clean();
}

/// NCCL's pattern for several local ranks: one group, the splits complete at its end,
/// colors and keys decide the children; the new communicators are there only then.
#[test]
fn splits_from_one_thread_in_a_group_complete_at_group_end() {
    let rig = Rig::new(4);
    let parents = rig.comms(4);
    let out = slots(4);
    rig.group_start();
    // (color, key): ranks 0 and 2 form one child, rank 2 first; rank 1 alone; 3 none.
    for (r, (color, key)) in [(7, 1), (3, 0), (7, 0), (NCCL_SPLIT_NOCOLOR, 0)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(rig.split(parents[r], color, key, None, &out[r]), NCCL_OK);
        assert!(got(&out[r]).is_null(), "NULL until the group ends");
    }
    assert_eq!(rig.group_end(), NCCL_OK);
    let c: Vec<ncclComm_t> = out.iter().map(got).collect();
    assert_eq!(rig.count_and_rank(c[0]), (2, 1));
    assert_eq!(rig.count_and_rank(c[1]), (1, 0));
    assert_eq!(rig.count_and_rank(c[2]), (2, 0));
    assert!(c[3].is_null());
    // The children work: an all-reduce of the pair, grouped from this thread.
    let (b0, b2) = (rig.buffers(0, 1.0), rig.buffers(2, 5.0));
    rig.group_start();
    assert_eq!(rig.all_reduce(c[0], b0), NCCL_OK);
    assert_eq!(rig.all_reduce(c[2], b2), NCCL_OK);
    assert_eq!(rig.group_end(), NCCL_OK);
    // SAFETY: streams of the buffers' devices.
    unsafe {
        assert_eq!((rig.driver.fns().cuStreamSynchronize)(b0.0), OK);
        assert_eq!((rig.driver.fns().cuStreamSynchronize)(b2.0), OK);
    }
    assert_eq!(rig.read(0, b0.2), [6.0; N]);
    assert_eq!(rig.read(2, b2.2), [6.0; N]);
    for h in [c[0], c[1], c[2]].into_iter().chain(parents) {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// The bug a grouped split invites: reading the new communicator right after the call,
/// inside the group. NCCL has written nothing yet (NULL); the mock reports the read.
#[test]
fn reading_a_grouped_split_child_before_the_group_ends_is_caught() {
    let rig = Rig::new(2);
    let parents = rig.comms(2);
    let out = slots(2);
    let b0 = rig.buffers(0, 1.0);
    rig.group_start();
    assert_eq!(rig.split(parents[0], 0, 0, None, &out[0]), NCCL_OK);
    assert_eq!(
        rig.user_rank(got(&out[0])),
        ncclResult_t::ncclInvalidArgument
    );
    assert_eq!(
        rig.all_reduce(got(&out[0]), b0),
        ncclResult_t::ncclInvalidArgument
    );
    assert_eq!(rig.split(parents[1], 0, 0, None, &out[1]), NCCL_OK);
    assert_eq!(rig.group_end(), NCCL_OK, "a query is no part of the group");
    let v = rig.world.take_violations();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(
        v[0].starts_with("ncclCommUserRank: communicator NULL: a split or shrink inside a group"),
        "{v:?}"
    );
    assert!(
        v[1].starts_with("ncclAllReduce: communicator NULL"),
        "{v:?}"
    );
    // After the group: there, and usable.
    assert_eq!(rig.user_rank(got(&out[0])), NCCL_OK);
    // Outside a group a NULL handle is a plain bad argument, not a report.
    assert_eq!(
        rig.user_rank(std::ptr::null_mut()),
        ncclResult_t::ncclInvalidArgument
    );
    for h in out.iter().map(got).chain(parents) {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// Splits of non-blocking parents in one group: the group end answers ncclInProgress,
/// the children come in the background, each parent says when.
#[test]
fn grouped_splits_of_nonblocking_parents_complete_in_the_background() {
    let rig = Rig::new(2);
    let parents = nonblocking_pair(&rig);
    let out = slots(2);
    rig.group_start();
    assert_eq!(rig.split(parents[0], 0, 5, None, &out[0]), NCCL_OK);
    assert_eq!(rig.split(parents[1], 0, 4, None, &out[1]), NCCL_OK);
    assert_eq!(rig.group_end(), ncclResult_t::ncclInProgress);
    for p in parents {
        assert_eq!(rig.wait_ready(p), NCCL_OK);
    }
    assert_eq!(rig.count_and_rank(got(&out[0])), (2, 1));
    assert_eq!(rig.count_and_rank(got(&out[1])), (2, 0));
    for h in out.iter().map(got).chain(parents) {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// NCCL refuses blocking and non-blocking parents in one group: the call fails, the
/// group fails, nothing of it runs.
#[test]
fn blocking_and_nonblocking_parents_in_one_group_fail_the_group() {
    let rig = Rig::new(2);
    let nb = nonblocking_pair(&rig);
    let b = rig.comms(2);
    let out = slots(2);
    rig.group_start();
    assert_eq!(rig.split(b[0], 0, 0, None, &out[0]), NCCL_OK);
    assert_eq!(
        rig.split(nb[1], 0, 0, None, &out[1]),
        ncclResult_t::ncclInvalidArgument
    );
    assert_eq!(rig.group_end(), ncclResult_t::ncclInvalidArgument);
    assert!(out.iter().all(|s| got(s).is_null()));
    assert_eq!(rig.world.live().comms, 4, "no child left behind");
    for h in nb.into_iter().chain(b) {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// A split that fails inside the group (here an injected fault) fails the group: its
/// end runs none of the splits and returns the error; the failed call's message stays.
#[test]
fn a_failed_split_inside_a_group_fails_the_group_and_runs_nothing() {
    let rig = Rig::new(3);
    let parents = rig.comms(3);
    let out = slots(3);
    rig.world
        .fail_after("ncclCommSplit", 1, ncclResult_t::ncclInvalidUsage);
    rig.group_start();
    assert_eq!(rig.split(parents[0], 0, 0, None, &out[0]), NCCL_OK);
    assert_eq!(
        rig.split(parents[1], 0, 0, None, &out[1]),
        ncclResult_t::ncclInvalidUsage
    );
    assert_eq!(rig.split(parents[2], 0, 0, None, &out[2]), NCCL_OK);
    assert_eq!(rig.group_end(), ncclResult_t::ncclInvalidUsage);
    assert_eq!(rig.last_error(), "ncclCommSplit: injected fault");
    assert!(out.iter().all(|s| got(s).is_null()));
    assert_eq!(rig.world.live().comms, 3);
    // The group is closed: the next split is a plain (blocking) one... of all three.
    rig.group_start();
    for r in 0..3 {
        assert_eq!(rig.split(parents[r], 0, 0, None, &out[r]), NCCL_OK);
    }
    assert_eq!(rig.group_end(), NCCL_OK);
    assert_eq!(rig.count_and_rank(got(&out[2])), (3, 2));
    for h in out.iter().map(got).chain(parents) {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// An injected failure of ncclGroupEnd itself still closes the group, and none of its
/// work runs (as when NCCL's group end fails).
#[test]
fn a_failed_group_end_closes_the_group() {
    let rig = Rig::new(2);
    let parents = rig.comms(2);
    let out = slots(2);
    rig.world
        .fail_next("ncclGroupEnd", ncclResult_t::ncclInternalError);
    rig.group_start();
    for r in 0..2 {
        assert_eq!(rig.split(parents[r], 0, 0, None, &out[r]), NCCL_OK);
    }
    assert_eq!(rig.group_end(), ncclResult_t::ncclInternalError);
    assert!(out.iter().all(|s| got(s).is_null()));
    assert_eq!(
        rig.world.live().comms,
        2,
        "the children went with the group"
    );
    assert_eq!(
        rig.group_end(),
        ncclResult_t::ncclInvalidUsage,
        "no group is open any more"
    );
    for h in parents {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// A grouped split whose peer never comes fails at the group end; like NCCL, the failed
/// children are handed over (their async error says why), and the owner aborts them.
#[test]
fn a_grouped_split_whose_peer_never_comes_hands_over_failed_children() {
    let rig = Rig::with_timeout(3, Duration::from_millis(200));
    let parents = rig.comms(3);
    let out = slots(2);
    rig.group_start();
    for r in 0..2 {
        assert_eq!(rig.split(parents[r], 0, 0, None, &out[r]), NCCL_OK);
    }
    assert_eq!(rig.group_end(), ncclResult_t::ncclSystemError);
    assert!(
        rig.last_error().starts_with("ncclCommSplit of rank "),
        "{}",
        rig.last_error()
    );
    for s in &out {
        let c = got(s);
        assert!(!c.is_null());
        assert_eq!(rig.async_error(c), (NCCL_OK, ncclResult_t::ncclSystemError));
        rig.abort(c);
    }
    for h in parents {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// Aborting a non-blocking parent whose split is still in flight waits for that split
/// (NCCL's abort joins the parent's job), so nothing is written after it returned.
#[test]
fn aborting_a_nonblocking_parent_settles_its_split_first() {
    let rig = Rig::new(2);
    let parents = nonblocking_pair(&rig);
    let out = slots(1);
    assert_eq!(
        rig.split(parents[0], 0, 0, None, &out[0]),
        ncclResult_t::ncclInProgress
    );
    rig.abort(parents[0]);
    let c = got(&out[0]);
    assert!(!c.is_null(), "the failed child is handed over by the abort");
    assert_eq!(rig.async_error(c), (NCCL_OK, ncclResult_t::ncclRemoteError));
    rig.abort(c);
    rig.destroy(parents[1]);
    rig.assert_clean();
}

/// ncclCommShrink: the ranks not excluded form the child, in their order; it works from
/// one thread in a group, after the excluded rank was aborted.
#[test]
fn grouped_shrink_of_one_rank_from_three() {
    let rig = Rig::new(3);
    let parents = rig.comms(3);
    rig.abort(parents[1]);
    let out = slots(2);
    rig.group_start();
    assert_eq!(rig.shrink(parents[0], &[1], &out[0]), NCCL_OK);
    assert_eq!(rig.shrink(parents[2], &[1], &out[1]), NCCL_OK);
    assert!(got(&out[0]).is_null());
    assert_eq!(rig.group_end(), NCCL_OK);
    assert_eq!(rig.count_and_rank(got(&out[0])), (2, 0));
    assert_eq!(rig.count_and_rank(got(&out[1])), (2, 1));
    let (b0, b2) = (rig.buffers(0, 2.0), rig.buffers(2, 3.0));
    rig.group_start();
    assert_eq!(rig.all_reduce(got(&out[0]), b0), NCCL_OK);
    assert_eq!(rig.all_reduce(got(&out[1]), b2), NCCL_OK);
    assert_eq!(rig.group_end(), NCCL_OK);
    // SAFETY: streams of the buffers' devices.
    unsafe {
        assert_eq!((rig.driver.fns().cuStreamSynchronize)(b0.0), OK);
        assert_eq!((rig.driver.fns().cuStreamSynchronize)(b2.0), OK);
    }
    assert_eq!(rig.read(2, b2.2), [5.0; N]);
    for h in [got(&out[0]), got(&out[1]), parents[0], parents[2]] {
        rig.destroy(h);
    }
    rig.assert_clean();
}

/// NCCL's argument checks of ncclCommShrink, each failing at the call with nothing left;
/// and the function is absent before 2.27.
#[test]
fn shrink_arguments_are_checked_and_it_needs_2_27() {
    let rig = Rig::new(2);
    let parents = rig.comms(2);
    let out = slots(1);
    for (exclude, flags, what) in [
        (&[][..], 0, "must name at least one rank"),
        (&[0][..], 0, "cannot exclude rank 0"),
        (&[2][..], 0, "cannot exclude rank 2"),
        (&[-1][..], 0, "cannot exclude rank -1"),
        (&[1][..], 7, "invalid shrinkFlags 7"),
    ] {
        assert_eq!(
            rig.shrink_with(parents[0], exclude, flags, &out[0]),
            ncclResult_t::ncclInvalidArgument,
            "{what}"
        );
        assert!(rig.last_error().contains(what), "{}", rig.last_error());
    }
    assert_eq!(rig.world.live().comms, 2);
    for h in parents {
        rig.destroy(h);
    }
    rig.assert_clean();
    let (_driver, gpus) = MockDriver::with_devices(1).build().unwrap();
    let (old, _) = MockNccl::new(&gpus)
        .version(nccl_sys::NcclVersion::new(2, 26, 6))
        .build()
        .unwrap();
    assert!(old.fns().ncclCommShrink.is_none());
}

// ---------------------------------------------------------------------------------------
// Buffers freed while a part waits for its peers. The data moves through the driver
// (checked and copied under its lock), so memory the quarantine has already evicted, and
// really freed, is reported instead of touched: the rank whose buffer it was fails with
// ncclUnhandledCudaError, its peers with ncclRemoteError, and nothing is written.

/// This file's helpers on the shared rig (a trait: inherent methods are crate-wide).
trait SanitizerRig3 {
    fn evict_quarantine(&self, d: usize);
    fn p2p(
        &self,
        is_send: bool,
        comm: ncclComm_t,
        buf: CUdeviceptr,
        peer: i32,
        stream: CUstream,
    ) -> ncclResult_t;
}

impl SanitizerRig3 for Rig {
    /// Frees [`QUARANTINE_BLOCKS`] fresh blocks of device `d`: every block freed before is
    /// evicted from the driver's quarantine (really freed, no longer known as freed).
    fn evict_quarantine(&self, d: usize) {
        self.on(d);
        let f = self.driver.fns();
        let blocks: Vec<CUdeviceptr> = (0..QUARANTINE_BLOCKS)
            .map(|_| {
                let mut p = 0;
                // SAFETY: valid out-pointer; a context is current.
                assert_eq!(unsafe { (f.cuMemAlloc)(&mut p, 256) }, OK);
                p
            })
            .collect();
        for p in blocks {
            self.free(p);
        }
    }

    /// `ncclSend` (or `ncclRecv`) of N f32 at `buf` with `peer`.
    fn p2p(
        &self,
        is_send: bool,
        comm: ncclComm_t,
        buf: CUdeviceptr,
        peer: i32,
        stream: CUstream,
    ) -> ncclResult_t {
        let f = self.nccl.fns();
        let (t, buf) = (ncclDataType_t::ncclFloat32, buf as *mut c_void);
        // SAFETY: a device buffer of N f32 on the communicator's device (or a freed one,
        // which the mock checks).
        unsafe {
            if is_send {
                (f.ncclSend)(buf, N, t, peer, comm, stream)
            } else {
                (f.ncclRecv)(buf, N, t, peer, comm, stream)
            }
        }
    }
}

/// Non-blocking ranks: rank 0's all-reduce is admitted and waits for rank 1; its send
/// buffer is then freed (and, with `evict`, evicted from the quarantine) before rank 1's
/// call moves the data. Returns the violations.
fn all_reduce_after_free_while_waiting(evict: bool) -> (Vec<String>, CUdeviceptr) {
    let rig = Rig::new(2);
    let comms = nonblocking_pair(&rig);
    let (b0, b1) = (rig.buffers(0, 1.0), rig.buffers(1, 2.0));
    rig.on(0);
    assert_eq!(
        rig.all_reduce(comms[0], b0),
        ncclResult_t::ncclInProgress,
        "admitted: its buffers were live; it waits for rank 1"
    );
    assert!(rig.world.violations().is_empty());
    rig.free(b0.1);
    if evict {
        rig.evict_quarantine(0);
    }
    assert_eq!(rig.gpus.device_range(b0.1, N * 4), None);
    rig.on(1);
    assert_eq!(
        rig.all_reduce(comms[1], b1),
        ncclResult_t::ncclRemoteError,
        "its peer's part failed"
    );
    assert_eq!(
        rig.wait_ready(comms[0]),
        ncclResult_t::ncclUnhandledCudaError
    );
    let violations = rig.world.take_violations();
    assert_eq!(rig.read(0, b0.2), [0.0; N], "nothing was written");
    assert_eq!(rig.read(1, b1.2), [0.0; N], "nothing was written");
    assert_eq!(rig.world.live().unmatched_operations, 0);
    for c in comms {
        rig.destroy(c);
    }
    rig.assert_clean();
    (violations, b0.1)
}

#[test]
fn an_all_reduce_whose_buffer_was_freed_and_evicted_before_the_data_moved_is_reported() {
    let (violations, send) = all_reduce_after_free_while_waiting(true);
    assert_eq!(
        violations,
        [format!(
            "ncclAllReduce on rank 0 reads {send:#x}+{}: is not in any live device allocation",
            N * 4
        )]
    );
}

#[test]
fn an_all_reduce_whose_buffer_was_freed_before_the_data_moved_is_reported() {
    let (violations, send) = all_reduce_after_free_while_waiting(false);
    assert_eq!(
        violations,
        [format!(
            "ncclAllReduce on rank 0 reads {send:#x}+{}: freed by cuMemFree",
            N * 4
        )]
    );
}

#[test]
fn a_recv_whose_buffer_was_freed_and_evicted_before_the_send_came_is_reported() {
    let rig = Rig::new(2);
    let comms = nonblocking_pair(&rig);
    let (b0, b1) = (rig.buffers(0, 4.0), rig.buffers(1, 0.0));
    rig.on(1);
    assert_eq!(
        rig.p2p(false, comms[1], b1.2, 0, b1.0),
        ncclResult_t::ncclInProgress
    );
    rig.free(b1.2);
    rig.evict_quarantine(1);
    rig.on(0);
    assert_eq!(
        rig.p2p(true, comms[0], b0.1, 1, b0.0),
        ncclResult_t::ncclRemoteError,
        "the receiving side failed"
    );
    assert_eq!(
        rig.wait_ready(comms[1]),
        ncclResult_t::ncclUnhandledCudaError
    );
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclRecv on rank 1 writes {:#x}+{}: is not in any live device allocation",
            b1.2,
            N * 4
        )]
    );
    assert_eq!(rig.world.live().unmatched_operations, 0);
    for c in comms {
        rig.destroy(c);
    }
    rig.assert_clean();
}

/// Blocking ranks on streams, rank 0 on its own thread: its all-reduce runs in stream
/// order and waits there for rank 1 while the main thread frees its send buffer and
/// evicts it. The data moves when rank 1 comes: rank 0's op fails like any illegal op.
#[test]
fn a_stream_ordered_all_reduce_whose_buffer_was_freed_and_evicted_while_it_waited_fails() {
    let rig = Rig::new(2);
    let comms = rig.comms(2);
    let (b0, b1) = (rig.buffers(0, 1.0), rig.buffers(1, 2.0));
    // Handles as numbers, to cross to rank 0's thread.
    let (comm0, s0) = (comms[0].addr(), b0.0.addr());
    let (send0, recv0) = (b0.1, b0.2);
    let fns = rig.nccl.fns();
    let rank0 = std::thread::scope(|scope| {
        let t = scope.spawn(move || {
            // SAFETY: device buffers of N f32 on the communicator's device (freed while it
            // waits, which the mock checks); a live communicator and stream.
            unsafe {
                (fns.ncclAllReduce)(
                    send0 as *const c_void,
                    recv0 as *mut c_void,
                    N,
                    ncclDataType_t::ncclFloat32,
                    ncclRedOp_t::ncclSum,
                    std::ptr::with_exposed_provenance_mut(comm0),
                    std::ptr::with_exposed_provenance_mut(s0),
                )
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while rig.world.live().unmatched_operations == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(rig.world.live().unmatched_operations, 1, "rank 0 waits");
        rig.on(0);
        rig.free(b0.1);
        rig.evict_quarantine(0);
        assert_eq!(
            rig.all_reduce(comms[1], b1),
            ncclResult_t::ncclRemoteError,
            "its peer's part failed"
        );
        t.join().unwrap()
    });
    assert_eq!(rank0, ncclResult_t::ncclUnhandledCudaError);
    // Its part ran (and failed): it is done, not withdrawn a second time.
    assert_eq!(rig.world.live().unmatched_operations, 0);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclAllReduce on rank 0 reads {:#x}+{}: is not in any live device allocation",
            b0.1,
            N * 4
        )]
    );
    assert_eq!(rig.read(0, b0.2), [0.0; N], "nothing was written");
    assert_eq!(rig.read(1, b1.2), [0.0; N], "nothing was written");
    for c in comms {
        rig.destroy(c);
    }
    assert!(rig.world.violations().is_empty());
}

/// A pre-multiplied sum's device scalar is read through the driver when a collective
/// uses it: freed (and evicted) since the op was made, it is reported, not read.
#[test]
fn a_device_scalar_freed_and_evicted_before_a_collective_uses_it_is_reported() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let b = rig.buffers(0, 1.0);
    let f = rig.driver.fns();
    let mut scalar = 0;
    let two = 2.0f32;
    // SAFETY: valid out-pointer; `two` is 4 readable bytes; a context is current.
    unsafe {
        assert_eq!((f.cuMemAlloc)(&mut scalar, 4), OK);
        assert_eq!((f.cuMemcpyHtoD)(scalar, (&raw const two).cast(), 4), OK);
    }
    let mut op = ncclRedOp_t::ncclSum;
    // SAFETY: valid out-pointer; a device scalar of one f32; a live communicator.
    let rc = unsafe {
        (rig.nccl.fns().ncclRedOpCreatePreMulSum)(
            &mut op,
            scalar as *mut c_void,
            ncclDataType_t::ncclFloat32,
            ncclScalarResidence_t::ncclScalarDevice,
            comm,
        )
    };
    assert_eq!(rc, NCCL_OK);
    let all_reduce = |op: ncclRedOp_t| {
        // SAFETY: device buffers of N f32 on the communicator's device.
        unsafe {
            (rig.nccl.fns().ncclAllReduce)(
                b.1 as *const c_void,
                b.2 as *mut c_void,
                N,
                ncclDataType_t::ncclFloat32,
                op,
                comm,
                b.0,
            )
        }
    };
    assert_eq!(all_reduce(op), NCCL_OK);
    assert_eq!(rig.read(0, b.2), [2.0; N], "the scalar was read");
    rig.free(scalar);
    rig.evict_quarantine(0);
    assert_eq!(all_reduce(op), ncclResult_t::ncclInvalidArgument);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclAllReduce (scalar of op {}) reads {scalar:#x}+4: is not in any live device allocation",
            op.0
        )]
    );
    // SAFETY: a live op and communicator.
    let rc = unsafe { (rig.nccl.fns().ncclRedOpDestroy)(op, comm) };
    assert_eq!(rc, NCCL_OK);
    rig.destroy(comm);
    assert!(rig.world.violations().is_empty());
}

/// NCCL checks pointers and streams when a collective is called: a buffer or a stream of
/// another device, or host memory, is `ncclInvalidArgument` (a stream the driver does not
/// know, `ncclUnhandledCudaError`) at once, with nothing run; a right call then works.
#[test]
fn buffers_and_streams_of_another_device_are_refused_when_called() {
    let rig = Rig::new(2);
    let comms = rig.comms(2);
    let (s0, send0, recv0) = rig.buffers(0, 1.0);
    let (s1, send1, _recv1) = rig.buffers(1, 1.0);
    let host = [0f32; N];
    let cases: [(&str, (CUstream, CUdeviceptr, CUdeviceptr), ncclResult_t); 4] = [
        (
            "a send buffer of device 1",
            (s0, send1, recv0),
            ncclResult_t::ncclInvalidArgument,
        ),
        (
            "a stream of device 1",
            (s1, send0, recv0),
            ncclResult_t::ncclInvalidArgument,
        ),
        (
            "host memory",
            (s0, host.as_ptr() as CUdeviceptr, recv0),
            ncclResult_t::ncclInvalidArgument,
        ),
        (
            "a stream the driver does not know",
            (0xdead_0000 as CUstream, send0, recv0),
            ncclResult_t::ncclUnhandledCudaError,
        ),
    ];
    for (what, args, want) in cases {
        assert_eq!(rig.all_reduce(comms[0], args), want, "{what}");
        assert_eq!(rig.read(0, recv0), [0.0; N], "{what}: nothing ran");
    }
    let b1 = rig.buffers(1, 2.0);
    let f = rig.nccl.fns();
    // SAFETY: plain group calls.
    unsafe {
        assert_eq!((f.ncclGroupStart)(), NCCL_OK);
        assert_eq!(rig.all_reduce(comms[0], (s0, send0, recv0)), NCCL_OK);
        assert_eq!(rig.all_reduce(comms[1], b1), NCCL_OK);
        assert_eq!((f.ncclGroupEnd)(), NCCL_OK);
    }
    assert_eq!(rig.read(0, recv0), [3.0; N]);
    for c in comms {
        rig.destroy(c);
    }
    assert!(rig.world.violations().is_empty());
}

/// A group of non-blocking communicators' collectives runs in the background, as NCCL's
/// does: the group's end says `ncclInProgress`, each communicator's async error says so
/// until the work is done, then the results are there.
#[test]
fn grouped_work_of_non_blocking_communicators_finishes_in_the_background() {
    let rig = Rig::new(2);
    let comms = nonblocking_pair(&rig);
    let (b0, b1) = (rig.buffers(0, 1.0), rig.buffers(1, 2.0));
    rig.group_start();
    rig.on(0);
    assert_eq!(rig.all_reduce(comms[0], b0), NCCL_OK);
    rig.on(1);
    assert_eq!(rig.all_reduce(comms[1], b1), NCCL_OK);
    assert_eq!(rig.group_end(), ncclResult_t::ncclInProgress);
    for c in comms {
        assert_eq!(rig.wait_ready(c), NCCL_OK);
    }
    assert_eq!(rig.read(0, b0.2), [3.0; N]);
    assert_eq!(rig.read(1, b1.2), [3.0; N]);
    for c in comms {
        rig.destroy(c);
    }
    rig.assert_clean();
}

// ---------------------------------------------------------------------------------------
// The byte ranges each collective checks and touches. Two ranks, f32, COUNT elements per
// rank: every buffer is its own cuMemAlloc of exactly the bytes NCCL uses, so a buffer
// one element short is a range that runs past the end of its allocation.

/// Elements per rank in the range tests (not 2, so `count * size`, `count + size` and
/// `count / size` all differ).
const COUNT: usize = 4;
/// Ranks in the range tests.
const RANKS: usize = 2;

/// One NCCL call of the range table; the point-to-point calls take the peer as `root`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

/// Which buffer a rooted collective uses on its root only.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RootOnly {
    /// Every rank uses both of its buffers (or the call has no root).
    Neither,
    /// The root alone reads a send buffer (Broadcast, Scatter).
    Send,
    /// The root alone gets a result (Reduce, Gather).
    Recv,
}

/// A row of the table: the elements NCCL reads from the send buffer and writes to the
/// receive buffer on a rank that uses them (0: the call has no such buffer).
struct Shape {
    coll: Coll,
    name: &'static str,
    send_n: usize,
    recv_n: usize,
    root_only: RootOnly,
}

const SHAPES: [Shape; 10] = [
    // Same-sized buffers: every rank reduces COUNT into COUNT.
    shape(Coll::AllReduce, "ncclAllReduce", 1, 1, RootOnly::Neither),
    // The root's COUNT go to every rank.
    shape(Coll::Broadcast, "ncclBroadcast", 1, 1, RootOnly::Send),
    // Every rank's COUNT are summed into the root's COUNT.
    shape(Coll::Reduce, "ncclReduce", 1, 1, RootOnly::Recv),
    // Every rank's COUNT, concatenated on every rank.
    shape(
        Coll::AllGather,
        "ncclAllGather",
        1,
        RANKS,
        RootOnly::Neither,
    ),
    // COUNT per rank in, each rank's reduced COUNT out.
    shape(
        Coll::ReduceScatter,
        "ncclReduceScatter",
        RANKS,
        1,
        RootOnly::Neither,
    ),
    // COUNT to each rank out, COUNT from each rank in.
    shape(
        Coll::AllToAll,
        "ncclAlltoAll",
        RANKS,
        RANKS,
        RootOnly::Neither,
    ),
    // Every rank's COUNT, concatenated on the root.
    shape(Coll::Gather, "ncclGather", 1, RANKS, RootOnly::Recv),
    // The root's COUNT per rank, one part to each.
    shape(Coll::Scatter, "ncclScatter", RANKS, 1, RootOnly::Send),
    // Point to point: one buffer of COUNT.
    shape(Coll::Send, "ncclSend", 1, 0, RootOnly::Neither),
    shape(Coll::Recv, "ncclRecv", 0, 1, RootOnly::Neither),
];

/// A row whose sizes are `send` and `recv` times COUNT.
const fn shape(coll: Coll, name: &'static str, send: usize, recv: usize, r: RootOnly) -> Shape {
    Shape {
        coll,
        name,
        send_n: send * COUNT,
        recv_n: recv * COUNT,
        root_only: r,
    }
}

impl Shape {
    fn rooted(&self) -> bool {
        matches!(
            self.coll,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    fn p2p(&self) -> bool {
        matches!(self.coll, Coll::Send | Coll::Recv)
    }

    /// The roots worth trying (0 alone when the call has none).
    fn roots(&self) -> &'static [i32] {
        if self.rooted() { &[0, 1] } else { &[0] }
    }

    /// Whether `rank` reads its send buffer with `root`.
    fn send_used(&self, rank: usize, root: i32) -> bool {
        self.send_n > 0 && (self.root_only != RootOnly::Send || rank == root as usize)
    }

    /// Whether `rank` writes its receive buffer with `root`.
    fn recv_used(&self, rank: usize, root: i32) -> bool {
        self.recv_n > 0 && (self.root_only != RootOnly::Recv || rank == root as usize)
    }

    /// What `rank`'s call is for a good run with `root`: the call itself, and the peer
    /// a point-to-point call takes as its root (ranks 0 and 1 swap Send and Recv).
    fn call_on(&self, rank: usize, root: i32) -> (Coll, i32) {
        match (self.coll, rank) {
            (Coll::Send, 1) => (Coll::Recv, 0),
            (Coll::Recv, 1) => (Coll::Send, 0),
            (Coll::Send | Coll::Recv, _) => (self.coll, 1),
            (c, _) => (c, root),
        }
    }

    /// Element `i` of `rank`'s send buffer in a good run.
    fn input(rank: usize, i: usize) -> f32 {
        (100 * rank + i) as f32
    }

    /// `rank`'s receive buffer after a good run with `root` (zeros where nothing is
    /// written; the receive buffer of a Send row's rank 1 is its Recv).
    fn expected(&self, rank: usize, root: i32) -> Vec<f32> {
        let x = Self::input;
        let root = root as usize;
        let n = if self.p2p() { COUNT } else { self.recv_n };
        (0..n)
            .map(|i| match self.coll {
                Coll::AllReduce => x(0, i) + x(1, i),
                Coll::Reduce if rank == root => x(0, i) + x(1, i),
                Coll::Gather if rank == root => x(i / COUNT, i % COUNT),
                // Nothing is written off the root.
                Coll::Reduce | Coll::Gather => 0.0,
                Coll::Broadcast => x(root, i),
                Coll::AllGather => x(i / COUNT, i % COUNT),
                Coll::ReduceScatter => x(0, rank * COUNT + i) + x(1, rank * COUNT + i),
                Coll::AllToAll => x(i / COUNT, rank * COUNT + i % COUNT),
                Coll::Scatter => x(root, rank * COUNT + i),
                // The receiving rank gets the sender's buffer; the sender nothing.
                Coll::Send if rank == 1 => x(0, i),
                Coll::Recv if rank == 0 => x(1, i),
                Coll::Send | Coll::Recv => 0.0,
            })
            .collect()
    }
}

/// One rank's buffers and stream for a range test.
#[derive(Clone, Copy)]
struct Bufs {
    stream: CUstream,
    send: CUdeviceptr,
    recv: CUdeviceptr,
}

/// This file's helpers on the shared rig (a trait: inherent methods are crate-wide).
trait SanitizerRig4 {
    fn exact(&self, d: usize, n: usize, rank: usize) -> CUdeviceptr;
    fn zeroed(&self, d: usize, n: usize) -> CUdeviceptr;
    fn read_n(&self, d: usize, p: CUdeviceptr, n: usize) -> Vec<f32>;
    fn stream_on(&self, d: usize) -> CUstream;
    fn coll(&self, coll: Coll, comm: ncclComm_t, b: Bufs, root: i32) -> ncclResult_t;
    fn coll_n(&self, coll: Coll, comm: ncclComm_t, b: Bufs, root: i32, n: usize) -> ncclResult_t;
    fn good(&self, shape: &Shape, rank: usize, root: i32, stream: CUstream) -> Bufs;
    fn run_pair(&self, shape: &Shape, comms: &[ncclComm_t], b0: Bufs, root: i32, check0: bool);
}

impl SanitizerRig4 for Rig {
    /// A fresh allocation of exactly `n` f32 on device `d` holding `rank`'s inputs (0:
    /// no allocation, a NULL pointer).
    fn exact(&self, d: usize, n: usize, rank: usize) -> CUdeviceptr {
        if n == 0 {
            return 0;
        }
        self.on(d);
        let f = self.driver.fns();
        let data: Vec<f32> = (0..n).map(|i| Shape::input(rank, i)).collect();
        let mut p = 0;
        // SAFETY: valid out-pointer; `data` holds n f32.
        unsafe {
            assert_eq!((f.cuMemAlloc)(&mut p, n * 4), OK);
            assert_eq!((f.cuMemcpyHtoD)(p, data.as_ptr().cast(), n * 4), OK);
        }
        assert_eq!(self.gpus.device_range(p, n * 4), Some(d as i32));
        assert_eq!(
            self.gpus.device_range(p, n * 4 + 1),
            None,
            "a range past the end of an allocation is not device memory"
        );
        p
    }

    /// A receive buffer of exactly `n` f32 on device `d`, zeroed (0: NULL).
    fn zeroed(&self, d: usize, n: usize) -> CUdeviceptr {
        let p = self.exact(d, n, 0);
        if n > 0 {
            // SAFETY: `p` holds n f32.
            assert_eq!(unsafe { (self.driver.fns().cuMemsetD8)(p, 0, n * 4) }, OK);
        }
        p
    }

    /// Reads `n` f32 at `p` on device `d`.
    fn read_n(&self, d: usize, p: CUdeviceptr, n: usize) -> Vec<f32> {
        self.on(d);
        let mut v = vec![0f32; n];
        // SAFETY: `v` holds n f32.
        let rc = unsafe { (self.driver.fns().cuMemcpyDtoH)(v.as_mut_ptr().cast(), p, n * 4) };
        assert_eq!(rc, OK);
        v
    }

    /// A stream on device `d`.
    fn stream_on(&self, d: usize) -> CUstream {
        self.on(d);
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer; device d's context is current.
        assert_eq!(unsafe { (self.driver.fns().cuStreamCreate)(&mut s, 0) }, OK);
        s
    }

    /// `coll` of COUNT f32 per rank on `comm` (sum where it reduces); `root` is the
    /// peer of Send and Recv, which take `b.send` and `b.recv` respectively.
    fn coll(&self, coll: Coll, comm: ncclComm_t, b: Bufs, root: i32) -> ncclResult_t {
        self.coll_n(coll, comm, b, root, COUNT)
    }

    /// [`coll`](Self::coll) of `count` f32 per rank.
    fn coll_n(&self, coll: Coll, comm: ncclComm_t, b: Bufs, root: i32, n: usize) -> ncclResult_t {
        let f = self.nccl.fns();
        let (send, recv) = (b.send as *const c_void, b.recv as *mut c_void);
        let (t, sum, s) = (ncclDataType_t::ncclFloat32, ncclRedOp_t::ncclSum, b.stream);
        let (all_to_all, gather, scatter) = (
            f.ncclAlltoAll.expect("ncclAlltoAll"),
            f.ncclGather.expect("ncclGather"),
            f.ncclScatter.expect("ncclScatter"),
        );
        // SAFETY: device buffers (or NULL, or short ones: what the mock checks) and a
        // stream of the communicator's device.
        unsafe {
            match coll {
                Coll::AllReduce => (f.ncclAllReduce)(send, recv, n, t, sum, comm, s),
                Coll::Broadcast => (f.ncclBroadcast)(send, recv, n, t, root, comm, s),
                Coll::Reduce => (f.ncclReduce)(send, recv, n, t, sum, root, comm, s),
                Coll::AllGather => (f.ncclAllGather)(send, recv, n, t, comm, s),
                Coll::ReduceScatter => (f.ncclReduceScatter)(send, recv, n, t, sum, comm, s),
                Coll::AllToAll => all_to_all(send, recv, n, t, comm, s),
                Coll::Gather => gather(send, recv, n, t, root, comm, s),
                Coll::Scatter => scatter(send, recv, n, t, root, comm, s),
                Coll::Send => (f.ncclSend)(send, n, t, root, comm, s),
                Coll::Recv => (f.ncclRecv)(recv, n, t, root, comm, s),
            }
        }
    }

    /// Rank `rank`'s exact buffers for a good run of `shape` with `root`.
    fn good(&self, shape: &Shape, rank: usize, root: i32, stream: CUstream) -> Bufs {
        let (coll, _) = shape.call_on(rank, root);
        let own = |c: Coll| SHAPES.iter().find(|s| s.coll == c).unwrap();
        let s = if shape.p2p() { own(coll) } else { shape };
        Bufs {
            stream,
            send: self.exact(rank, s.send_n, rank),
            recv: self.zeroed(rank, s.recv_n),
        }
    }

    /// Runs `shape` with `root` in one group from this thread: rank 0 with `b0`, rank 1
    /// with good buffers. Asserts success, rank 1's result and, with `check0`, rank 0's
    /// (where it has a receive buffer); nothing may be reported.
    fn run_pair(&self, shape: &Shape, comms: &[ncclComm_t], b0: Bufs, root: i32, check0: bool) {
        let b1 = self.good(shape, 1, root, self.stream_on(1));
        let what = format!("{} root/peer {root}", shape.name);
        self.group_start();
        for (rank, b) in [(0, b0), (1, b1)] {
            let (coll, root) = shape.call_on(rank, root);
            assert_eq!(self.coll(coll, comms[rank], b, root), NCCL_OK, "{what}");
        }
        assert_eq!(self.group_end(), NCCL_OK, "{what}: {}", self.last_error());
        for (rank, b) in [(0, b0), (1, b1)] {
            // SAFETY: a live stream.
            let rc = unsafe { (self.driver.fns().cuStreamSynchronize)(b.stream) };
            assert_eq!(rc, OK);
            if b.recv != 0 && (rank == 1 || check0) {
                let want = shape.expected(rank, root);
                let got = self.read_n(rank, b.recv, want.len());
                assert_eq!(got, want, "{what} on rank {rank}");
            }
        }
        assert!(
            self.world.violations().is_empty(),
            "{what}: {:?}",
            self.world.violations()
        );
    }
}

/// The range rig: two ranks whose peers give up after 5 s (a call the mock wrongly lets
/// through waits for a peer that never comes), its communicators and rank 0's stream.
fn range_rig() -> (Rig, Vec<ncclComm_t>, CUstream) {
    let rig = Rig::with_timeout(RANKS, Duration::from_secs(5));
    let comms = rig.comms(RANKS);
    let s0 = rig.stream_on(0);
    (rig, comms, s0)
}

/// Rank 0 frees its send (or receive) buffer inside the open group: the group end fails,
/// the sanitizer reports the `bytes` the call touches there, and nothing is left waiting.
fn free_before_group_end(rig: &Rig, shape: &Shape, b0: Bufs, send: bool, bytes: usize) {
    let (p, touch) = if send {
        (b0.send, "reads sendbuff")
    } else {
        (b0.recv, "writes recvbuff")
    };
    rig.free(p);
    assert_eq!(rig.group_end(), ncclResult_t::ncclUnhandledCudaError);
    assert_eq!(
        rig.world.take_violations(),
        [format!(
            "ncclGroupEnd: {} {touch} {p:#x}+{bytes}: freed by cuMemFree",
            shape.name
        )]
    );
    assert_eq!(rig.world.live().unmatched_operations, 0);
}

fn range_rig_done(rig: &Rig, comms: Vec<ncclComm_t>) {
    for c in comms {
        rig.destroy(c);
    }
    rig.assert_clean();
}

/// (a) Buffers of exactly the bytes the table says: every call, every root, succeeds in
/// one group from this thread and leaves the right data (zeros where nothing is due).
#[test]
fn every_call_with_buffers_of_exactly_the_bytes_it_uses_runs_and_is_right() {
    let (rig, comms, s0) = range_rig();
    for shape in &SHAPES {
        for &root in shape.roots() {
            let b0 = rig.good(shape, 0, root, s0);
            rig.run_pair(shape, &comms, b0, root, true);
        }
    }
    range_rig_done(&rig, comms);
}

/// (b) A buffer one element short runs past its allocation: refused with
/// ncclInvalidArgument at the call (on rank 0 alone, so nothing waits for rank 1) when
/// the call uses it on that rank, before anything reaches the sanitizer. A rooted
/// collective uses the send (Broadcast, Scatter) or receive (Reduce, Gather) buffer on
/// its root only: elsewhere a short or NULL one is accepted and the call runs.
#[test]
fn a_buffer_one_element_short_is_refused_exactly_where_the_call_uses_it() {
    let (rig, comms, s0) = range_rig();
    for shape in &SHAPES {
        for &root in shape.roots() {
            let (coll, arg) = shape.call_on(0, root);
            for (name, n, used) in [
                ("sendbuff", shape.send_n, shape.send_used(0, root)),
                ("recvbuff", shape.recv_n, shape.recv_used(0, root)),
            ] {
                if n == 0 {
                    continue;
                }
                let what = format!("{} root/peer {root}, {name} short", shape.name);
                let short = rig.exact(0, n - 1, 0);
                let with = |p: CUdeviceptr| {
                    let mut b = rig.good(shape, 0, root, s0);
                    if name == "sendbuff" {
                        b.send = p;
                    } else {
                        b.recv = p;
                    }
                    b
                };
                if used {
                    let rc = rig.coll(coll, comms[0], with(short), arg);
                    assert_eq!(rc, ncclResult_t::ncclInvalidArgument, "{what}");
                    assert_eq!(
                        rig.last_error(),
                        format!("{name} {short:#x} ({} bytes) is not device memory", n * 4),
                        "{what}"
                    );
                    assert!(rig.world.violations().is_empty(), "{what}: at the call");
                } else {
                    for unused in [short, 0] {
                        // Rank 0's receive buffer is only good to read if it is not this one.
                        rig.run_pair(shape, &comms, with(unused), root, name == "sendbuff");
                    }
                }
            }
        }
    }
    assert_eq!(rig.world.live().unmatched_operations, 0, "nothing waits");
    range_rig_done(&rig, comms);
}

/// (c) Roots and peers are ranks of the clique: -1, the size and beyond are refused with
/// ncclInvalidArgument at the call; the last rank is a good root or peer.
#[test]
fn roots_and_peers_outside_the_clique_are_refused() {
    let (rig, comms, s0) = range_rig();
    for shape in SHAPES.iter().filter(|s| s.rooted() || s.p2p()) {
        let b0 = rig.good(shape, 0, 1, s0);
        let (coll, _) = shape.call_on(0, 1);
        let what = if shape.p2p() { "peer" } else { "root" };
        for bad in [-1, RANKS as i32, RANKS as i32 + 1] {
            let rc = rig.coll(coll, comms[0], b0, bad);
            assert_eq!(
                rc,
                ncclResult_t::ncclInvalidArgument,
                "{} {bad}",
                shape.name
            );
            assert_eq!(
                rig.last_error(),
                format!("invalid {what} {bad} for {RANKS} ranks")
            );
        }
        assert!(rig.world.violations().is_empty());
        rig.run_pair(shape, &comms, b0, 1, true);
    }
    assert_eq!(rig.world.live().unmatched_operations, 0, "nothing waits");
    range_rig_done(&rig, comms);
}

/// A grouped call whose buffer rank 0 frees before the group ends: the sanitizer reports
/// the whole range the call touches, `COUNT * RANKS` f32 for an all-gather's receive
/// buffer and a reduce-scatter's send buffer.
#[test]
fn a_grouped_call_whose_buffer_was_freed_is_reported_over_all_the_bytes_it_touches() {
    for (coll, send) in [(Coll::AllGather, false), (Coll::ReduceScatter, true)] {
        let (rig, comms, s0) = range_rig();
        let shape = SHAPES.iter().find(|s| s.coll == coll).unwrap();
        let b0 = rig.good(shape, 0, 0, s0);
        let b1 = rig.good(shape, 1, 0, rig.stream_on(1));
        rig.group_start();
        assert_eq!(rig.coll(coll, comms[0], b0, 0), NCCL_OK);
        assert_eq!(rig.coll(coll, comms[1], b1, 0), NCCL_OK);
        free_before_group_end(&rig, shape, b0, send, COUNT * RANKS * 4);
        range_rig_done(&rig, comms);
    }
}

/// NCCL resolves registrations over the whole range a call uses: one covering only the
/// second page of an all-gather's receive buffer (a reduce-scatter's send buffer), two
/// pages of f32, is used, so releasing it before the group ends fails the call.
#[test]
fn a_registration_of_the_last_page_a_call_uses_is_resolved_by_the_call() {
    const PAGE: usize = 4096;
    let n = PAGE / 4;
    for (coll, name, send) in [
        (Coll::AllGather, "ncclAllGather", false),
        (Coll::ReduceScatter, "ncclReduceScatter", true),
    ] {
        let (rig, comms, s0) = range_rig();
        let (send_n, recv_n) = if send { (2 * n, n) } else { (n, 2 * n) };
        let bufs = |rank: usize, stream| Bufs {
            stream,
            send: rig.exact(rank, send_n, rank),
            recv: rig.zeroed(rank, recv_n),
        };
        let (b0, b1) = (bufs(0, s0), bufs(1, rig.stream_on(1)));
        let big = if send { b0.send } else { b0.recv };
        assert_eq!(big % PAGE as u64, 0, "whole pages are page-aligned");
        let register = rig.nccl.fns().ncclCommRegister.expect("ncclCommRegister");
        let deregister = rig
            .nccl
            .fns()
            .ncclCommDeregister
            .expect("ncclCommDeregister");
        let mut h = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the second page of a live two-page allocation.
        let rc = unsafe { register(comms[0], (big + PAGE as u64) as *mut c_void, PAGE, &mut h) };
        assert_eq!(rc, NCCL_OK);
        rig.group_start();
        assert_eq!(rig.coll_n(coll, comms[0], b0, 0, n), NCCL_OK);
        assert_eq!(rig.coll_n(coll, comms[1], b1, 0, n), NCCL_OK);
        // SAFETY: a live registration of the communicator; the work has not run.
        assert_eq!(unsafe { deregister(comms[0], h) }, NCCL_OK);
        assert_eq!(rig.group_end(), ncclResult_t::ncclUnhandledCudaError);
        assert_eq!(
            rig.world.take_violations(),
            [format!(
                "ncclGroupEnd: {name}: buffer registration {:#x} was released by ncclCommDeregister before the work ran",
                h.addr()
            )]
        );
        range_rig_done(&rig, comms);
    }
}

/// `ncclGetLastError` keeps the last failure: a collective that succeeds leaves it as it
/// was (NCCL only writes it on an error).
#[test]
fn a_successful_collective_leaves_the_last_error_alone() {
    let rig = Rig::new(1);
    let comm = rig.comms(1)[0];
    let b = rig.buffers(0, 2.0);
    // SAFETY: a live communicator; the buffers are device memory of N f32.
    let rc = unsafe {
        (rig.nccl.fns().ncclBroadcast)(
            b.1 as *const c_void,
            b.2 as *mut c_void,
            N,
            ncclDataType_t::ncclFloat32,
            5,
            comm,
            b.0,
        )
    };
    assert_eq!(rc, ncclResult_t::ncclInvalidArgument);
    assert_eq!(rig.last_error(), "invalid root 5 for 1 ranks");
    assert_eq!(rig.all_reduce(comm, b), NCCL_OK);
    assert_eq!(rig.read(0, b.2), [2.0; N]);
    assert_eq!(rig.last_error(), "invalid root 5 for 1 ranks");
    rig.destroy(comm);
}

/// The same for point to point: a grouped send (receive) whose buffer was freed before the
/// group ended is reported over exactly the COUNT elements it reads (writes).
#[test]
fn a_grouped_send_or_recv_whose_buffer_was_freed_is_reported_over_its_bytes() {
    for (coll, send) in [(Coll::Send, true), (Coll::Recv, false)] {
        let (rig, comms, s0) = range_rig();
        let shape = SHAPES.iter().find(|s| s.coll == coll).unwrap();
        let b0 = rig.good(shape, 0, 0, s0);
        let b1 = rig.good(shape, 1, 0, rig.stream_on(1));
        rig.group_start();
        for (rank, b) in [(0, b0), (1, b1)] {
            let (c, peer) = shape.call_on(rank, 0);
            assert_eq!(rig.coll(c, comms[rank], b, peer), NCCL_OK);
        }
        free_before_group_end(&rig, shape, b0, send, COUNT * 4);
        range_rig_done(&rig, comms);
    }
}
