//! The NCCL mock as a sanitizer: grouped and captured operations checked when they run,
//! calls with freed communicators, and split children that follow their parent's
//! blocking mode. Raw table calls, so every check is the mock's own.
#![cfg(feature = "mock")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cuda_sys::mock::{MockDriver, MockWorld};
use cuda_sys::{CUcontext, CUdeviceptr, CUresult, CUstream, CUstreamCaptureMode, Driver};
use nccl_sys::mock::{MockNccl, MockNcclWorld};
use nccl_sys::{
    NCCL_CONFIG_INITIALIZER, NCCL_SPLIT_NOCOLOR, Nccl, ncclComm_t, ncclDataType_t, ncclRedOp_t,
    ncclResult_t, ncclScalarResidence_t, ncclUniqueId,
};

const OK: CUresult = CUresult::CUDA_SUCCESS;
const NCCL_OK: ncclResult_t = ncclResult_t::ncclSuccess;
/// Elements per buffer (f32), 64 bytes.
const N: usize = 16;

/// A simulated machine with `devices` GPUs (their primary contexts) and its NCCL.
struct Rig {
    driver: Driver,
    gpus: MockWorld,
    nccl: Nccl,
    world: MockNcclWorld,
    ctxs: Vec<CUcontext>,
}

impl Rig {
    /// Peers wait at most `timeout`: long enough that a test which hung would be slow.
    fn new(devices: usize) -> Rig {
        let (driver, gpus) = MockDriver::with_devices(devices).build().unwrap();
        let (nccl, world) = MockNccl::new(&gpus)
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
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
    fn on(&self, d: usize) {
        // SAFETY: a retained primary context.
        let rc = unsafe { (self.driver.fns().cuCtxSetCurrent)(self.ctxs[d]) };
        assert_eq!(rc, OK);
    }

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

    /// `n` communicators of one clique over devices 0..n (ncclCommInitAll).
    fn comms(&self, n: usize) -> Vec<ncclComm_t> {
        let mut comms = vec![std::ptr::null_mut(); n];
        // SAFETY: room for `n` handles; NULL devlist means devices 0..n.
        let rc = unsafe {
            (self.nccl.fns().ncclCommInitAll)(comms.as_mut_ptr(), n as i32, std::ptr::null())
        };
        assert_eq!(rc, NCCL_OK);
        comms
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

    fn split(
        &self,
        comm: ncclComm_t,
        color: i32,
        key: i32,
        blocking: Option<bool>,
    ) -> (ncclResult_t, ncclComm_t) {
        let mut child = std::ptr::null_mut();
        let mut config = NCCL_CONFIG_INITIALIZER;
        let config_ptr = match blocking {
            Some(b) => {
                config.blocking = i32::from(b);
                &mut config as *mut _
            }
            None => std::ptr::null_mut(),
        };
        // SAFETY: valid out-pointer; NULL or an initialised config.
        let rc =
            unsafe { (self.nccl.fns().ncclCommSplit)(comm, color, key, &mut child, config_ptr) };
        (rc, child)
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

    fn destroy(&self, comm: ncclComm_t) {
        // SAFETY: a live communicator.
        assert_eq!(unsafe { (self.nccl.fns().ncclCommDestroy)(comm) }, NCCL_OK);
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

#[test]
fn split_of_a_nonblocking_parent_is_nonblocking_and_completes_while_polled() {
    let rig = Rig::new(2);
    let parents = nonblocking_pair(&rig);
    // Rank 0 alone cannot finish the split: its child is in progress until rank 1 comes.
    let (rc, c0) = rig.split(parents[0], 0, 1, None);
    assert_eq!(rc, ncclResult_t::ncclInProgress);
    assert!(!c0.is_null(), "the child handle is there at once, to poll");
    assert_eq!(rig.async_error(c0), (NCCL_OK, ncclResult_t::ncclInProgress));
    let (rc, c1) = rig.split(parents[1], 0, 0, None);
    assert_eq!(rc, ncclResult_t::ncclInProgress);
    assert_eq!(rig.wait_ready(c0), NCCL_OK);
    assert_eq!(rig.wait_ready(c1), NCCL_OK);
    assert_eq!(rig.count_and_rank(c0), (2, 1), "ordered by key");
    assert_eq!(rig.count_and_rank(c1), (2, 0));
    // The child is non-blocking too: its own split (NULL config) returns at once.
    let (rc, g0) = rig.split(c0, NCCL_SPLIT_NOCOLOR, 0, None);
    assert_eq!((rc, g0), (NCCL_OK, std::ptr::null_mut()));
    let (rc, g1) = rig.split(c1, 0, 0, None);
    assert_eq!(rc, ncclResult_t::ncclInProgress);
    assert_eq!(rig.wait_ready(g1), NCCL_OK);
    assert_eq!(rig.count_and_rank(g1), (1, 0));
    for c in [g1, c0, c1, parents[0], parents[1]] {
        rig.destroy(c);
    }
    assert!(rig.world.live().is_empty(), "{:?}", rig.world.live());
    assert!(rig.world.violations().is_empty());
}

#[test]
fn split_of_a_blocking_parent_is_blocking() {
    let rig = Rig::new(1);
    let parent = rig.comms(1)[0];
    let (rc, child) = rig.split(parent, 0, 0, None);
    assert_eq!(rc, NCCL_OK, "completed in the call");
    assert_eq!(rig.async_error(child), (NCCL_OK, NCCL_OK));
    assert_eq!(rig.count_and_rank(child), (1, 0));
    let (rc, grandchild) = rig.split(child, 0, 0, None);
    assert_eq!(rc, NCCL_OK, "the child is blocking too");
    for c in [grandchild, child, parent] {
        rig.destroy(c);
    }
    assert!(rig.world.live().is_empty(), "{:?}", rig.world.live());
}

#[test]
fn a_config_sets_the_split_childs_mode_explicitly() {
    let rig = Rig::new(1);
    let parent = rig.comms(1)[0];
    let (rc, nb) = rig.split(parent, 0, 0, Some(false));
    assert_eq!(
        rc,
        ncclResult_t::ncclInProgress,
        "non-blocking child of a blocking parent"
    );
    assert_eq!(rig.wait_ready(nb), NCCL_OK);
    let (rc, b) = rig.split(nb, 0, 0, Some(true));
    assert_eq!(rc, NCCL_OK, "blocking child of a non-blocking parent");
    assert_eq!(rig.async_error(b), (NCCL_OK, NCCL_OK));
    for c in [b, nb, parent] {
        rig.destroy(c);
    }
}

#[test]
fn splits_from_one_thread_in_a_group_complete_at_group_end() {
    let rig = Rig::new(2);
    let parents = rig.comms(2);
    let f = rig.nccl.fns();
    // SAFETY: plain group calls.
    unsafe { assert_eq!((f.ncclGroupStart)(), NCCL_OK) };
    let (rc0, c0) = rig.split(parents[0], 7, 0, None);
    let (rc1, c1) = rig.split(parents[1], 7, 0, None);
    assert_eq!((rc0, rc1), (NCCL_OK, NCCL_OK));
    // SAFETY: plain group call.
    assert_eq!(unsafe { (f.ncclGroupEnd)() }, NCCL_OK);
    assert_eq!(rig.count_and_rank(c0), (2, 0));
    assert_eq!(rig.count_and_rank(c1), (2, 1));
    for c in [c0, c1, parents[0], parents[1]] {
        rig.destroy(c);
    }
    assert!(rig.world.live().is_empty(), "{:?}", rig.world.live());
}
