//! A simulated NCCL on top of `cuda-mock`'s simulated driver, for tests without a GPU.
//!
//! [`MockNccl`] builds an [`Nccl`] whose table points at Rust functions: ranks in one
//! process (threads, or one thread with `ncclCommInitAll`/groups) meet per unique id and
//! move real data through the simulated device memory, for every collective, every data
//! type and every reduction op. A rank's call returns once its peers have made the
//! matching call (NCCL's kernels would wait on the device instead), so one thread driving
//! several ranks must use groups, as with real NCCL. A blocking init or collective that
//! waits for its peers longer than `NCCL_CHANNEL_WAIT_NOTICE_SECS` (10 s; `0`: never) says
//! so once on stderr (`simulated NCCL: still waiting after 10 s for ...`, with the likely
//! causes), then fails at the [timeout](MockNccl::timeout); it cannot fail at once, since
//! a peer that has not called yet may be driven by this thread or another.
//! [`MockNcclWorld`] injects faults, counts calls and live handles.
//!
//! It is also a **sanitizer** for the lifetimes of asynchronous work, built on the
//! driver's ([`MockWorld::violations`]); misuse is recorded as a violation (a message
//! naming the calls involved) and the offending call or work fails instead of touching
//! freed memory:
//!
//! - Each rank's collective or send/recv declares the device ranges it really reads and
//!   writes (by kind and count; on the root only for the root's side of rooted
//!   collectives). They are checked, and recorded as uses on the stream, when the work is
//!   due: in stream order, at each launch of a graph that captured it, and at
//!   `ncclGroupEnd` for grouped calls (e.g. `ncclGroupEnd: ncclAllReduce reads sendbuff
//!   0x..+64: freed by cuMemFree`). A stream-ordered free on another stream that is not
//!   ordered after the work is reported by the driver. Refused work is withdrawn from its
//!   peers, which then fail with `ncclRemoteError` instead of waiting for it.
//! - The data itself moves when the last rank's part arrives, through the driver's
//!   checked [`MockWorld::read_device`] and [`MockWorld::write_device`] (never through raw
//!   pointers): a buffer freed after its part was admitted, while it waited for its peers,
//!   is reported (e.g. `ncclAllReduce on rank 0 reads 0x..+64: freed by cuMemFree`, or
//!   `is not in any live device allocation` once the quarantine evicted it) and not
//!   touched. That rank fails with `ncclUnhandledCudaError` (its stream op with
//!   `CUDA_ERROR_ILLEGAL_ADDRESS`, like any illegal op), its peers with `ncclRemoteError`,
//!   and nothing is written. A pre-multiplied sum's device scalar is read the same way.
//! - Destroyed and aborted communicators are remembered (handles are never reused): any
//!   later call with one, or a captured operation replayed after it, is reported as e.g.
//!   `ncclRedOpDestroy: communicator 0x.. was freed by ncclCommAbort` and fails with
//!   `ncclInvalidArgument`.
//! - A split's or shrink's new communicator read inside the group that makes it, before
//!   `ncclGroupEnd` (NCCL has written only NULL yet): a call with that NULL handle while
//!   the thread's group has splits pending is reported, e.g. `ncclCommUserRank:
//!   communicator NULL: a split or shrink inside a group gives its new communicator only
//!   when the group ends ...`, and fails with `ncclInvalidArgument`.
//!
//! - Ranks whose parts of a collective disagree (kind, count, type, root or op) all fail
//!   with `ncclInvalidUsage` instead of hanging or corrupting as with NCCL, and the last
//!   error names rank 0's call and the first that differs: `the ranks disagree on a
//!   collective: rank 0 calls ncclAllGather of 4 ncclInt32, rank 1 ncclAllGather of 6
//!   ncclInt32` (a non-blocking communicator's asynchronous error sets it too).
//!
//! Calls made with bad arguments still fail at the call, as with NCCL; inside a group a
//! failed split or shrink also fails the group (NCCL's group error): its end runs none of
//! the group's work and returns the error. An injected `ncclGroupEnd` failure closes the
//! group too, running nothing.
//!
//! Splits and shrinks (`ncclCommShrink`, from 2.27) hand their new communicator over as
//! NCCL does: `*newcomm` is NULL after the call and is written when the split completes:
//! in the call for a blocking parent; at the outermost `ncclGroupEnd` inside a group
//! (NCCL's pattern for one thread driving several ranks); in the background for a
//! non-blocking parent, whose `ncclCommGetAsyncError` says `ncclInProgress` until then (a
//! group end answers `ncclInProgress`). The caller's `newcomm` must stay valid until then.
//! The parent's ranks meet, from any threads and groups, in their n-th split, and form
//! the children by (color, key, parent rank); a shrink's excluded ranks do not take part.
//! A split that fails hands over its failed child (its async error says why), which the
//! caller aborts; aborting a parent waits for its background splits, as NCCL's abort
//! joins them. The child follows its parent's blocking mode unless the config sets one;
//! a group refuses blocking and non-blocking parents together, as NCCL does.
//!
//! Grows (`ncclCommGetUniqueId`, `ncclCommGrow`, from 2.29.2) and the scalable init
//! (`ncclCommInitRankScalable`, from 2.23) are simulated in one process and across
//! processes: the coordinator's grow id reaches the other existing ranks through the
//! communicator (across processes through its hub), and every rank of the grown
//! communicator meets at that id as an init does; ranks that disagree on the size all
//! fail with one error, late ones included. A second grow id before the grow consumed the
//! first is `ncclInvalidUsage`, as the header forbids (see the `grow` module).
//!
//! Configurations (`ncclCommInitRankConfig`, and a split's or shrink's non-NULL config)
//! are read as NCCL reads them: `min(size, sizeof)` bytes, `magic` checked, fields newer
//! than the config's `version` or than the reported version reset to unset. Stricter than
//! NCCL, a `version` before 2.14 or a `size` too small for the layout its `version` claims
//! is refused too; each refusal is `ncclInvalidArgument` with the reason as last error.
//! [`MockNcclWorld::config_of`] shows what each communicator got (a NULL split config
//! inherits the parent's).
//!
//! **Multi-process mode** ([`MockNccl::multi_process`], off by default): ranks started as
//! separate processes, each with its own simulated driver and NCCL, form one
//! communicator over loopback TCP, with the results of one process. As with NCCL's
//! bootstrap, a *hub* coordinates each communicator: `ncclGetUniqueId` starts it on
//! `127.0.0.1:0` and the id names its address (plain bytes any process can use), or,
//! with `NCCL_COMM_ID=host:port`, rank 0's init starts it at that address. Each rank's
//! part passes the same admission and sanitizer checks as in one process; then the rank
//! reads its own input range through the driver, ships it to the hub, which computes
//! every rank's output with the same code as the in-process mode, and writes the answer
//! to its receive buffer through the driver. A peer that aborts, is destroyed or whose
//! process goes makes what needs it fail with `ncclRemoteError`; a shrink's survivors
//! (a dead peer's too) meet at a new hub started by the lowest of them; one-sided puts
//! and signals travel through the hub to the peer's process, which lands them in its
//! window; a split's ranks of each color meet at a new hub started by the first of them
//! (grouped splits and shrinks are refused: one rank per process). [`network_threads`]
//! counts the mode's threads, for leak checks.
//!
//! ```
//! use cuda_mock::MockDriver;
//! use nccl_mock::MockNccl;
//! let (_driver, gpus) = MockDriver::with_devices(2).build()?;
//! let (nccl, world) = MockNccl::new(&gpus).build()?;
//! assert_eq!(nccl.version(), nccl_sys::NcclVersion::new(2, 32, 3));
//! assert!(world.live().is_empty());
//! # Ok::<(), cuda_sys::LoadError>(())
//! ```

mod clique;
mod collective;
mod comms;
mod config;
mod dtype;
mod encryption;
mod group;
mod grow;
mod grow_id;
mod handle;
mod init;
mod macros;
mod net;
mod notice;
mod onesided;
mod params;
mod parts;
mod query;
mod redop;
mod registry;
mod rendezvous;
mod resolver;
mod rma;
mod simulate;
mod state;
mod suspend;
mod thread_groups;
mod work;
mod world;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cuda_mock::{MockWorld, SlotGuard};

use nccl_sys::{LoadError, Nccl, NcclVersion, ncclResult_t};

pub use config::MockConfig;
pub use net::network_threads;
pub use parts::collectives;
pub use simulate::{BYTES_PER_US, LATENCY_US};
pub use state::LiveComms;

use world::NWorld;

/// Builder of a simulated NCCL over a simulated driver's devices: its version, its
/// deadline for ranks that never come, and which features it offers;
/// [`build`](Self::build) gives the NCCL table and the [`MockNcclWorld`] that inspects it.
///
/// ```
/// use cuda_mock::MockDriver;
/// use nccl_sys::NcclVersion;
/// use nccl_mock::MockNccl;
/// let (_driver, machine) = MockDriver::with_devices(2).build()?;
/// let (nccl, sim) = MockNccl::new(&machine)
///     .version(NcclVersion::new(2, 21, 5))
///     .timeout(std::time::Duration::from_secs(10))
///     .build()?;
/// assert_eq!(nccl.version().to_string(), "2.21.5");
/// assert_eq!(nccl.fns().ncclCommShrink, None, "2.27 introduced it");
/// assert_eq!(sim.live().comms, 0);
/// # Ok::<(), nccl_sys::LoadError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MockNccl {
    cuda: MockWorld,
    version: NcclVersion,
    timeout: Duration,
    null_ops: bool,
    windows: bool,
    local_registration: bool,
    multi_process: bool,
}

impl MockNccl {
    /// A simulated NCCL of this crate's header version over `cuda`'s simulated devices.
    pub fn new(cuda: &MockWorld) -> Self {
        MockNccl {
            cuda: cuda.clone(),
            version: NcclVersion(nccl_sys::NCCL_VERSION_CODE as i32),
            timeout: Duration::from_secs(60),
            null_ops: false,
            windows: true,
            local_registration: true,
            multi_process: false,
        }
    }

    /// Collectives and send/recv return success at once, doing nothing: a backend that
    /// costs only the call itself, for measuring the overhead of the layers above it.
    pub fn null_collectives(mut self, on: bool) -> Self {
        self.null_ops = on;
        self
    }

    /// Whether `ncclCommRegister` registers (default `true`). `false` is NCCL with
    /// `NCCL_LOCAL_REGISTER=0`: the call checks its communicator and out-pointer, then
    /// succeeds with a NULL handle, which `ncclCommDeregister` accepts.
    pub fn local_registration(mut self, on: bool) -> Self {
        self.local_registration = on;
        self
    }

    /// Whether `ncclCommWindowRegister` makes windows (default `true`). `false` is NCCL
    /// with `NCCL_WIN_ENABLE=0`: the call checks its communicator and out-pointer, then
    /// succeeds with a NULL window, which `ncclCommWindowDeregister` accepts.
    pub fn windows(mut self, on: bool) -> Self {
        self.windows = on;
        self
    }

    /// The version `ncclGetVersion` reports; functions newer than it are absent.
    pub fn version(mut self, version: NcclVersion) -> Self {
        self.version = version;
        self
    }

    /// Whether ranks may live in separate processes (default `false`: every rank of a
    /// communicator is in this process, and nothing here changes).
    ///
    /// On, each process runs its own simulated driver and NCCL, and the ranks of one
    /// unique id meet over loopback TCP, as NCCL's bootstrap does:
    ///
    /// - `ncclGetUniqueId` starts a *hub* (rank 0's coordinator) on `127.0.0.1:0`, and
    ///   the id names its address (`MOCKNET1` and the address): plain bytes, usable in
    ///   any process that can reach it. With `NCCL_COMM_ID=host:port` every call gives
    ///   the same id naming that address, and rank 0's init starts the hub there (a port
    ///   in use is retried for up to 2 s, within the timeout, as the previous hub's
    ///   listener there may be closing; one still in use then fails that init with
    ///   `ncclSystemError`, the last error naming it).
    /// - Inits connect to the hub, retrying until it is there (each attempt bounded by
    ///   the time left, so a host that drops connection attempts does not hold an init
    ///   past its timeout), and complete once every rank came (blocking, non-blocking
    ///   and grouped, as in one process). Ranks that disagree on the size, or a rank
    ///   that comes twice, fail with `ncclInvalidUsage`; a rank still missing at the
    ///   [`timeout`](MockNccl::timeout) fails the init with `ncclSystemError`, the last
    ///   error naming the address and the missing ranks.
    /// - Collectives and send/receive run through the same admission and sanitizer
    ///   checks; when a part is due, the rank reads its own input range through
    ///   [`MockWorld::read_device`] and ships it; the hub computes every rank's output
    ///   with the code of the in-process mode, and each rank writes its own through
    ///   [`MockWorld::write_device`]. The results, and the errors of parts that disagree
    ///   or were withdrawn, are those of one process.
    /// - A rank whose communicator is aborted, or whose process (connection) goes, makes
    ///   every pending and later operation that needs it fail with `ncclRemoteError`, and
    ///   its peers' asynchronous error say so; a destroyed one fails what still waits for
    ///   it the same way. Nothing waits past the timeout.
    /// - One-sided puts and signals (`ncclPutSignal`, `ncclSignal`) pass the same checks
    ///   at the call; the sender reads its source through its driver and ships it; the
    ///   hub forwards it, in the sender's order, to the peer's process, whose driver
    ///   writes it into the window (checked to fit it; a put for a window not registered
    ///   there yet waits for it) and counts the signal for `ncclWaitSignal`.
    /// - Not simulated across processes: splits and shrinks (they fail with
    ///   `ncclInvalidUsage` and say so). A rank's input is read when its part is due, so
    ///   a send buffer freed after that, while the part waits for its peers, goes
    ///   unreported; a receive buffer freed meanwhile fails that rank only (its peers
    ///   already have their data). `ncclCommInitAll` and ids of the in-process mode keep
    ///   working within one process.
    ///
    /// Each communicator holds one connection and a reader thread, which end when it is
    /// destroyed or aborted; a hub ends when its last rank has gone, or after the timeout
    /// when no rank comes. [`network_threads`] counts them.
    ///
    /// Two "processes" in one test, each with its own driver and NCCL:
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use nccl_mock::MockNccl;
    /// use nccl_sys::{ncclComm_t, ncclResult_t, ncclUniqueId};
    ///
    /// let rank = |id: ncclUniqueId, r: i32| {
    ///     let (driver, gpus) = MockDriver::with_devices(1).build().unwrap();
    ///     let (nccl, world) = MockNccl::new(&gpus).multi_process(true).build().unwrap();
    ///     let (cu, f) = (driver.fns(), nccl.fns());
    ///     let mut comm: ncclComm_t = std::ptr::null_mut();
    ///     let (mut ctx, mut stream, mut buf) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
    ///     let mut out = [0i32; 2];
    ///     // SAFETY: simulated calls with valid out-pointers and sizes.
    ///     unsafe {
    ///         (cu.cuInit)(0);
    ///         (cu.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
    ///         (cu.cuCtxSetCurrent)(ctx);
    ///         (cu.cuStreamCreate)(&mut stream, 0);
    ///         (cu.cuMemAlloc)(&mut buf, 8);
    ///         let mine = 101 + r;
    ///         (cu.cuMemcpyHtoD)(buf + 4 * r as u64, (&raw const mine).cast(), 4);
    ///         assert_eq!((f.ncclCommInitRank)(&mut comm, 2, id, r), ncclResult_t::ncclSuccess);
    ///         let at = (buf + 4 * r as u64) as *const std::ffi::c_void;
    ///         let rc = (f.ncclAllGather)(at, buf as *mut _, 1, nccl_sys::ncclDataType_t::ncclInt32, comm, stream);
    ///         assert_eq!(rc, ncclResult_t::ncclSuccess);
    ///         (cu.cuMemcpyDtoH)(out.as_mut_ptr().cast(), buf, 8);
    ///         assert_eq!((f.ncclCommDestroy)(comm), ncclResult_t::ncclSuccess);
    ///     }
    ///     assert!(world.live().is_empty());
    ///     out
    /// };
    /// // Rank 0's process makes the id (and runs the hub); the bytes go to rank 1's.
    /// let (_d, gpus) = MockDriver::with_devices(1).build()?;
    /// let (nccl, _w) = MockNccl::new(&gpus).multi_process(true).build()?;
    /// let mut id = ncclUniqueId { internal: [0; 128] };
    /// // SAFETY: a valid out-pointer.
    /// assert_eq!(unsafe { (nccl.fns().ncclGetUniqueId)(&mut id) }, ncclResult_t::ncclSuccess);
    /// let peer = std::thread::spawn(move || rank(id, 1));
    /// assert_eq!(rank(id, 0), [101, 102]);
    /// assert_eq!(peer.join().unwrap(), [101, 102]);
    /// # Ok::<(), cuda_sys::LoadError>(())
    /// ```
    pub fn multi_process(mut self, on: bool) -> Self {
        self.multi_process = on;
        self
    }

    /// How long a rank waits for its peers before its call fails with `ncclSystemError`
    /// (a simulated hang that ends; real NCCL would wait forever). Default: 60 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Builds it. Fails when all simulation slots are in use or the version is too old.
    pub fn build(self) -> Result<(Nccl, MockNcclWorld), LoadError> {
        let world = Arc::new(NWorld {
            id: world::next_world_id(),
            version: self.version.0,
            timeout: self.timeout,
            null_ops: self.null_ops,
            windows: self.windows,
            local_registration: self.local_registration,
            multi_process: self.multi_process,
            cuda: self.cuda,
            state: Mutex::new(state::State::default()),
            cond: Condvar::new(),
        });
        let slot = world::claim_slot(world.clone()).ok_or_else(|| LoadError::Unusable {
            library: "NCCL",
            origin: "mock NCCL".into(),
            reason: cuda_sys::dylib::Reason::Open("all mock slots are in use".into()),
        })?;
        let guard = Arc::new(SlotGuard {
            slot,
            release: world::release_slot,
        });
        let resolver = resolver::resolver(slot, world.version);
        // SAFETY: the resolver returns the slot's mock functions, each declared with its
        // table entry's exact type (checked by each module's `lookup`), valid while
        // `guard` holds the slot.
        let nccl = unsafe { Nccl::from_resolver_owned("mock NCCL", guard, resolver) }?;
        Ok((nccl, MockNcclWorld { world }))
    }
}

/// Test-side handle of a simulated NCCL: faults, call counts, live handles, violations.
///
/// ```
/// use cuda_mock::MockDriver;
/// use nccl_mock::{LiveComms, MockNccl};
/// use nccl_sys::ncclResult_t;
///
/// let (driver, gpus) = MockDriver::with_devices(2).build()?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let f = nccl.fns();
/// let mut comms = [std::ptr::null_mut(); 2];
/// world.fail_next("ncclCommInitAll", ncclResult_t::ncclSystemError);
/// // SAFETY: the simulated driver is initialised; room for two handles, for devices 0
/// // and 1 (NULL list); each live communicator is destroyed once.
/// unsafe {
///     (driver.fns().cuInit)(0);
///     let init = |comms: &mut [_; 2]| (f.ncclCommInitAll)(comms.as_mut_ptr(), 2, std::ptr::null());
///     assert_eq!(init(&mut comms), ncclResult_t::ncclSystemError, "the injected fault");
///     assert_eq!(init(&mut comms), ncclResult_t::ncclSuccess);
///     assert_eq!(world.live(), LiveComms { comms: 2, ..LiveComms::default() });
///     for c in comms {
///         assert_eq!((f.ncclCommDestroy)(c), ncclResult_t::ncclSuccess);
///     }
///     // A destroyed communicator is remembered: using it again is reported.
///     let mut rank = 0;
///     assert_eq!((f.ncclCommUserRank)(comms[0], &mut rank), ncclResult_t::ncclInvalidArgument);
/// }
/// assert_eq!(world.calls("ncclCommInitAll"), 2);
/// assert!(world.live().is_empty());
/// assert_eq!(world.take_violations().len(), 1);
/// # Ok::<(), nccl_sys::LoadError>(())
/// ```
#[derive(Clone)]
pub struct MockNcclWorld {
    world: Arc<NWorld>,
}

impl std::fmt::Debug for MockNcclWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockNcclWorld")
            .field("id", &self.world.id)
            .field("live", &self.live())
            .field("violations", &self.violations().len())
            .finish()
    }
}

impl MockNcclWorld {
    /// The next call of `function` (e.g. `"ncclAllReduce"`) returns `error` and does nothing.
    pub fn fail_next(&self, function: &str, error: ncclResult_t) {
        self.fail_after(function, 0, error);
    }

    /// The call of `function` after `skip` successful ones returns `error`.
    pub fn fail_after(&self, function: &str, skip: u64, error: ncclResult_t) {
        self.world
            .lock()
            .faults
            .push((function.to_string(), skip, error));
    }

    /// Every communicator made from now on (init, split, shrink) answers its first
    /// `polls` calls of `ncclCommGetAsyncError` with `ncclInProgress`, as one whose
    /// background work is slow would, then reports its state; 0 turns it off. For tests
    /// of code that polls a new communicator within a deadline.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use nccl_sys::{ncclComm_t, ncclResult_t};
    /// use nccl_mock::MockNccl;
    /// let (_driver, machine) = MockDriver::with_devices(1).build()?;
    /// let (nccl, sim) = MockNccl::new(&machine).build()?;
    /// sim.slow_new_communicators(2);
    /// let mut comm: ncclComm_t = std::ptr::null_mut();
    /// let f = nccl.fns();
    /// // SAFETY: valid out-pointers and device list; the simulated driver is current.
    /// unsafe {
    ///     let rc = (f.ncclCommInitAll)(&mut comm, 1, [0].as_ptr());
    ///     assert_eq!(rc, ncclResult_t::ncclSuccess);
    ///     let mut seen = Vec::new();
    ///     for _ in 0..3 {
    ///         let mut e = ncclResult_t::ncclSuccess;
    ///         assert_eq!((f.ncclCommGetAsyncError)(comm, &mut e), ncclResult_t::ncclSuccess);
    ///         seen.push(e);
    ///     }
    ///     let busy = ncclResult_t::ncclInProgress;
    ///     assert_eq!(seen, [busy, busy, ncclResult_t::ncclSuccess]);
    ///     assert_eq!((f.ncclCommDestroy)(comm), ncclResult_t::ncclSuccess);
    /// }
    /// # Ok::<(), nccl_sys::LoadError>(())
    /// ```
    pub fn slow_new_communicators(&self, polls: u64) {
        self.world.lock().slow_new_comms = polls;
    }

    /// A registration (`ncclCommRegister`) or window registration on a non-blocking
    /// communicator answers `ncclInProgress` from now on (the handle is written at the
    /// call), and the communicator's
    /// `ncclCommGetAsyncError` says `ncclInProgress` for its next `polls` calls, as a
    /// registration still completing in the background would; 0 turns it off. For tests
    /// of what a caller keeps while such a registration may still complete.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use nccl_sys::{ncclComm_t, ncclResult_t, ncclWindow_t};
    /// use nccl_mock::MockNccl;
    /// let (driver, machine) = MockDriver::with_devices(1).build()?;
    /// let (nccl, sim) = MockNccl::new(&machine).build()?;
    /// sim.slow_registrations(1);
    /// let (f, d) = (nccl.fns(), driver.fns());
    /// # let mut ctx = std::ptr::null_mut();
    /// let mut config = nccl_sys::NCCL_CONFIG_INITIALIZER;
    /// config.blocking = 0;
    /// let mut comm: ncclComm_t = std::ptr::null_mut();
    /// let mut id = nccl_sys::ncclUniqueId { internal: [0; 128] };
    /// let (mut mem, mut win) = (std::ptr::null_mut(), std::ptr::null_mut() as ncclWindow_t);
    /// // SAFETY: valid out-pointers; the simulated driver's context is made current first.
    /// unsafe {
    ///     (d.cuInit)(0);
    ///     (d.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
    ///     (d.cuCtxSetCurrent)(ctx);
    ///     assert_eq!((f.ncclGetUniqueId)(&mut id), ncclResult_t::ncclSuccess);
    ///     (f.ncclCommInitRankConfig)(&mut comm, 1, id, 0, &mut config);
    ///     let mut e = ncclResult_t::ncclInProgress;
    ///     while e == ncclResult_t::ncclInProgress {
    ///         (f.ncclCommGetAsyncError)(comm, &mut e);
    ///     }
    ///     assert_eq!((f.ncclMemAlloc.expect("2.19+"))(&mut mem, 4096), ncclResult_t::ncclSuccess);
    ///     let register = f.ncclCommWindowRegister.expect("2.27+");
    ///     let rc = register(comm, mem, 4096, &mut win, 0);
    ///     assert_eq!(rc, ncclResult_t::ncclInProgress); // completing in the background
    ///     (f.ncclCommGetAsyncError)(comm, &mut e);
    ///     assert_eq!(e, ncclResult_t::ncclInProgress); // its one slow poll
    ///     (f.ncclCommGetAsyncError)(comm, &mut e);
    ///     assert_eq!(e, ncclResult_t::ncclSuccess);
    ///     assert!(!win.is_null());
    ///     (f.ncclCommWindowDeregister.expect("2.27+"))(comm, win);
    ///     (f.ncclMemFree.expect("2.19+"))(mem);
    ///     (f.ncclCommDestroy)(comm);
    /// }
    /// # Ok::<(), nccl_sys::LoadError>(())
    /// ```
    pub fn slow_registrations(&self, polls: u64) {
        self.world.lock().slow_registrations = polls;
    }

    /// How many times `function` was called.
    pub fn calls(&self, function: &str) -> u64 {
        self.world.lock().calls.get(function).copied().unwrap_or(0)
    }

    /// Live communicators, reduction ops, pending inits and unmatched operations.
    pub fn live(&self) -> LiveComms {
        self.world.lock().live()
    }

    /// The sanitizer's reports so far, oldest first: this NCCL's and its driver's (they
    /// share one list, [`MockWorld::violations`]).
    pub fn violations(&self) -> Vec<String> {
        self.world.cuda.violations()
    }

    /// The configuration `comm` was created with, as NCCL saw it: `ncclCommInitRankConfig`'s,
    /// or a split's or shrink's (a NULL config inherits the parent's, as with NCCL).
    /// `None` for a communicator made without one (`ncclCommInitRank`, `ncclCommInitAll`)
    /// and for a handle that is not live.
    pub fn config_of(&self, comm: nccl_sys::ncclComm_t) -> Option<MockConfig> {
        let h = handle::p2h(comm);
        self.world
            .lock()
            .comms
            .get(&h)
            .and_then(|c| c.config.clone())
    }

    /// Returns the reports so far and clears them ([`MockWorld::take_violations`]).
    pub fn take_violations(&self) -> Vec<String> {
        self.world.cuda.take_violations()
    }
}

// The README (the crate's registry page) runs as doctests, on the simulated devices.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
