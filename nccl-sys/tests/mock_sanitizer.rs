//! The NCCL mock as a sanitizer: grouped and captured operations checked when they run,
//! calls with freed communicators, and split children that follow their parent's
//! blocking mode. Raw table calls, so every check is the mock's own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::ffi::c_void;

use common::{NCCL_OK, OK, Rig};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use cuda_sys::mock::{MockDriver, QUARANTINE_BLOCKS};
use cuda_sys::{CUdeviceptr, CUresult, CUstream, CUstreamCaptureMode};
use nccl_sys::mock::MockNccl;
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

impl Rig {
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

impl Rig {
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

impl Rig {
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
