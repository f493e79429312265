//! A simulated CUDA driver, for tests without a GPU: a full [`Driver`] with no hardware.
//!
//! [`MockDriver`] describes devices (names, UUIDs, memory, compute capability, PCI ids) and
//! a driver version, and builds a [`Driver`] whose table points at Rust functions that
//! simulate them. Device memory is host memory (so a device pointer can be read by other
//! simulations, such as the NCCL mock); stream work runs in order at the time it is
//! enqueued, or is recorded while a stream is being captured into a graph; events keep
//! the host time they were recorded at. Tests steer it through the returned [`MockWorld`]:
//! fault injection (`fail_next`), per-function call counts and live-handle counters.
//!
//! It is also a sanitizer. Its findings are kept as messages naming the call, the address
//! and the reason ([`MockWorld::violations`]); the offending op is skipped and returns
//! `CUDA_ERROR_ILLEGAL_ADDRESS`. Set `CUDA_SYS_MOCK_PANIC_ON_VIOLATION=1` to also print
//! each one to stderr when it happens (it never panics: the callers are `extern "C"`).
//!
//! - Freed device memory is filled with `0xDD` and quarantined (its address is not reused
//!   until the quarantine, bounded at 1 GiB ([`QUARANTINE_BYTES`]) or 4096 blocks
//!   ([`QUARANTINE_BLOCKS`]), evicts it).
//! - When an op executes (at enqueue, or at graph replay), every range it touches must lie
//!   in one live allocation of its stream's device (peer copies may cross devices):
//!   use after free, out-of-bounds ranges and another device's memory are reported, as
//!   are frees of anything but a live allocation's start (double frees).
//! - Vector clocks over streams, events and the host track what each op is ordered after,
//!   with the legacy default stream's implicit synchronisation. A stream-ordered free
//!   (`cuMemFreeAsync`) that is not ordered after every earlier use of the memory on other
//!   streams is reported, though that work already ran.
//! - Kernels are host functions bound to kernel names ([`MockDriver::kernel`]); modules
//!   and libraries loaded from PTX have the bound kernels their `.entry` directives
//!   declare. What a kernel reads and writes ([`KernelCall`]) is checked like any op's
//!   touches; launching a function of an unloaded module (also at graph replay) is
//!   reported, and so is an unload not ordered after the module's launches (the host must
//!   have synchronised with their streams: the driver documents no implicit wait).
//!
//! What it does not catch: since work runs eagerly, other cross-stream races (two
//! unordered writes, or a read racing a write, on live memory) give right answers and go
//! unreported; only frees are checked against the clocks. Device-wide synchronisations
//! (`cuCtxSynchronize`, `cuMemFree`, synchronous copies) order the host after all work of
//! every device, which can hide a missing synchronisation but never reports a false one.
//! Memory evicted from the quarantine is really freed and no longer recognised.
//! Other simulations take part through [`MockWorld::enqueue_op`], [`MockWorld::access`]
//! and [`MockWorld::report`], and move data through [`MockWorld::read_device`] and
//! [`MockWorld::write_device`], which check a range and copy it under the world's lock
//! (device memory is host memory, but reaching it through raw pointers outside that lock
//! could touch memory freed and evicted in between).
//!
//! Each built driver gets its own set of functions (one of [`MAX_WORLDS`] slots), so many
//! simulated machines can live in one process, e.g. one per test thread.
//!
//! ```
//! use cuda_mock::{MockDevice, MockDriver};
//! let (driver, world) = MockDriver::new()
//!     .device(MockDevice::new("Mock GPU A"))
//!     .device(MockDevice::new("Mock GPU B"))
//!     .build()?;
//! let mut n = 0;
//! // SAFETY: plain calls with a valid out-pointer.
//! unsafe {
//!     (driver.fns().cuInit)(0);
//!     (driver.fns().cuDeviceGetCount)(&mut n);
//! }
//! assert_eq!(n, 2);
//! assert!(world.live().is_empty());
//! assert!(world.violations().is_empty());
//! # Ok::<(), cuda_sys::LoadError>(())
//! ```

// Declared first: its slot macros serve the modules after it (`world`, `resolver`).
#[macro_use]
mod slots;

mod alloc;
mod checks;
mod context;
mod current;
mod destructor;
mod detail;
mod event;
mod foreign;
mod function;
mod graph;
mod handle;
mod image;
mod init;
mod kernel;
mod launch;
mod library;
mod limits;
mod macros;
mod memory;
mod module;
mod occupancy;
mod op;
mod queue;
mod resolver;
mod sanitizer;
mod state;
mod stream;
mod user_object;
mod world;

use std::sync::{Arc, Mutex};

pub use foreign::AllocationInfo;
pub use kernel::{KernelCall, Plain};
pub use sanitizer::{QUARANTINE_BLOCKS, QUARANTINE_BYTES, Touch};
pub use slots::MAX_WORLDS;
#[doc(hidden)]
pub use slots::SlotGuard;
pub use state::{LiveHandles, MockDevice};
pub use world::{MockWorld, WeakMockWorld};

use cuda_sys::{CUresult, CUstream, Driver, LoadError};
use kernel::Binding;
use state::State;
use world::World;

/// Builder of a simulated driver: its devices, its version, the kernels and globals its
/// modules may hold; [`build`](Self::build) gives the driver table and the [`MockWorld`]
/// that inspects it.
///
/// ```
/// use cuda_mock::{MockDevice, MockDriver};
/// let (driver, world) = MockDriver::new()
///     .device(MockDevice::new("H200"))
///     .device(MockDevice { total_memory: 1 << 30, ..MockDevice::new("small") })
///     .version(12080)
///     .build()?;
/// assert_eq!(driver.version().0, 12080);
/// assert_eq!(world.devices()[1].total_memory, 1 << 30);
/// assert_eq!(world.live(), Default::default(), "nothing made yet");
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MockDriver {
    devices: Vec<MockDevice>,
    version: i32,
    kernels: Vec<(String, Binding)>,
    globals: Vec<(String, usize)>,
}

impl Default for MockDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl MockDriver {
    /// A driver of CUDA 13.0 with no devices yet.
    pub fn new() -> Self {
        MockDriver {
            devices: Vec::new(),
            version: 13000,
            kernels: Vec::new(),
            globals: Vec::new(),
        }
    }

    /// A driver with `n` devices named `Mock GPU <i>`, with distinct UUIDs and PCI ids.
    pub fn with_devices(n: usize) -> Self {
        (0..n).fold(Self::new(), |d, i| {
            d.device(MockDevice::new(&format!("Mock GPU {i}")))
        })
    }

    /// Adds a device; it gets the next ordinal.
    pub fn device(mut self, device: MockDevice) -> Self {
        let ordinal = self.devices.len();
        self.devices.push(device.fill_defaults(ordinal));
        self
    }

    /// The CUDA version `cuDriverGetVersion` reports (e.g. 12040). Functions newer than it
    /// are absent from the table, as they would be on a real driver of that version.
    pub fn version(mut self, version: i32) -> Self {
        self.version = version;
        self
    }

    /// Binds the kernel `name` to a host function: where the GPU would run the kernel, in
    /// stream order, `f` runs once per launch (not per thread) and reaches the launch's
    /// parameters and device memory through [`KernelCall`]. `params` gives each
    /// parameter's size in bytes (what `cuLaunchKernel` copies, and
    /// `cuFuncGetParamInfo` reports). Binding a name again replaces it.
    ///
    /// A module loaded from PTX has the bound kernels its `.entry` directives declare; one
    /// loaded from binary code (cubin, fatbin, which the mock cannot read) has every bound
    /// kernel. A launch, which checks the shape and copies the parameters like the
    /// driver, counts in [`MockWorld::calls`] as `cuLaunchKernel` and can be failed with
    /// [`MockWorld::fail_next`].
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_sys::{CUdeviceptr, CUresult};
    /// // y = a * x + y over n floats: parameters (n: u32, a: f32, x: ptr, y: ptr).
    /// let (driver, world) = MockDriver::with_devices(1)
    ///     .kernel("saxpy", &[4, 4, 8, 8], |k| {
    ///         let (n, a) = (k.param::<u32>(0) as usize, k.param::<f32>(1));
    ///         let (x, y) = (k.param::<u64>(2), k.param::<u64>(3));
    ///         let xs = k.read::<f32>(x, n);
    ///         let ys: Vec<f32> = k.read::<f32>(y, n).iter().zip(&xs).map(|(y, x)| a * x + y).collect();
    ///         k.write(y, &ys);
    ///     })
    ///     .build()?;
    /// let f = driver.fns();
    /// let ptx = c".version 8.0\n.target sm_90\n.visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y) { ret; }";
    /// let ok = CUresult::CUDA_SUCCESS;
    /// // SAFETY: mock driver calls with valid out-pointers, live handles, and one pointer
    /// // per kernel parameter, each to a value of the declared size.
    /// unsafe {
    ///     let (mut ctx, mut module, mut func) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    ///     assert_eq!((f.cuInit)(0), ok);
    ///     assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx, 0), ok);
    ///     assert_eq!((f.cuCtxSetCurrent)(ctx), ok);
    ///     assert_eq!((f.cuModuleLoadData)(&mut module, ptx.as_ptr().cast()), ok);
    ///     assert_eq!((f.cuModuleGetFunction)(&mut func, module, c"saxpy".as_ptr()), ok);
    ///     let (mut x, mut y): (CUdeviceptr, CUdeviceptr) = (0, 0);
    ///     assert_eq!((f.cuMemAlloc)(&mut x, 16), ok);
    ///     assert_eq!((f.cuMemAlloc)(&mut y, 16), ok);
    ///     let (xs, ys) = ([1f32, 2., 3., 4.], [10f32; 4]);
    ///     assert_eq!((f.cuMemcpyHtoD)(x, xs.as_ptr().cast(), 16), ok);
    ///     assert_eq!((f.cuMemcpyHtoD)(y, ys.as_ptr().cast(), 16), ok);
    ///     let (mut n, mut a) = (4u32, 2f32);
    ///     let mut params = [
    ///         (&raw mut n).cast(),
    ///         (&raw mut a).cast(),
    ///         (&raw mut x).cast(),
    ///         (&raw mut y).cast(),
    ///     ];
    ///     let rc = (f.cuLaunchKernel)(func, 1, 1, 1, 4, 1, 1, 0, std::ptr::null_mut(), params.as_mut_ptr(), std::ptr::null_mut());
    ///     assert_eq!(rc, ok);
    ///     let mut out = [0f32; 4];
    ///     assert_eq!((f.cuMemcpyDtoH)(out.as_mut_ptr().cast(), y, 16), ok);
    ///     assert_eq!(out, [12., 14., 16., 18.]);
    /// }
    /// assert_eq!(world.calls("cuLaunchKernel"), 1);
    /// assert!(world.violations().is_empty());
    /// # Ok::<(), cuda_sys::LoadError>(())
    /// ```
    pub fn kernel(
        mut self,
        name: &str,
        params: &[usize],
        f: impl Fn(&mut KernelCall<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.kernels.push((name.to_string(), binding(params, f)));
        self
    }

    /// Gives every module (and every library, in each context it is used in) a device
    /// global `name` of `bytes` bytes: zeroed device memory of the module's context,
    /// allocated when the module loads and freed when it unloads, found with
    /// `cuModuleGetGlobal` / `cuLibraryGetGlobal`.
    pub fn global(mut self, name: &str, bytes: usize) -> Self {
        self.globals.push((name.to_string(), bytes));
        self
    }

    /// Builds the driver. Fails when [`MAX_WORLDS`] simulated drivers already exist, or
    /// when the version is older than [`cuda_sys::MINIMUM_DRIVER_VERSION`].
    pub fn build(self) -> Result<(Driver, MockWorld), LoadError> {
        let mut state = State::default();
        state.kernels = self.kernels.into_iter().collect();
        state.globals = self.globals.into_iter().collect();
        let world = Arc::new(World {
            id: world::next_world_id(),
            version: self.version,
            devices: self.devices,
            state: Mutex::new(state),
            before: Default::default(),
        });
        let slot = world::claim_slot(world.clone()).ok_or_else(|| LoadError::Unusable {
            library: "CUDA driver",
            origin: "mock driver".into(),
            reason: cuda_sys::dylib::Reason::Open(format!(
                "all {MAX_WORLDS} mock driver slots are in use"
            )),
        })?;
        let handle = Arc::new(SlotGuard {
            slot,
            release: world::release_slot,
        });
        let resolver = resolver::resolver(slot, self_version(&world));
        // SAFETY: the resolver returns the slot's mock functions, each declared with the
        // exact PFN type of its table entry (see macros.rs), valid while the slot is held,
        // which the driver guarantees by owning `handle`.
        let driver = unsafe { Driver::from_resolver_owned("mock driver", handle, resolver) }?;
        Ok((driver, MockWorld { world }))
    }
    /// Builds the driver and hands it to `wrap`, the constructor of a safe layer, so a test
    /// gets that layer and the [`MockWorld`] in one line; `wrap`'s error type takes
    /// [`LoadError`]s.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_sys::{Driver, LoadError};
    /// // Any `FnOnce(Driver) -> Result<T, E>` where `E: From<LoadError>`, e.g.
    /// // `cuda_hal::Cuda::from_driver`.
    /// let (version, world) = MockDriver::with_devices(1)
    ///     .version(12080)
    ///     .build_with(|d: Driver| Ok::<_, LoadError>(d.version().0))?;
    /// assert_eq!(version, 12080);
    /// assert_eq!(world.devices().len(), 1);
    /// # Ok::<(), LoadError>(())
    /// ```
    pub fn build_with<T, E: From<LoadError>>(
        self,
        wrap: impl FnOnce(Driver) -> Result<T, E>,
    ) -> Result<(T, MockWorld), E> {
        let (driver, world) = self.build()?;
        Ok((wrap(driver)?, world))
    }
}

fn self_version(w: &World) -> i32 {
    w.version
}

fn binding(params: &[usize], f: impl Fn(&mut KernelCall<'_>) + Send + Sync + 'static) -> Binding {
    Binding {
        params: params.to_vec(),
        f: Arc::new(f),
    }
}

impl std::fmt::Debug for MockWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockWorld")
            .field("id", &self.world.id)
            .field("devices", &self.world.devices.len())
            .field("live", &self.live())
            .field("violations", &self.world.lock().violations.len())
            .finish()
    }
}

impl MockWorld {
    /// The next call of `function` (a table name such as `"cuMemAlloc"`) returns `error`
    /// without doing anything. Several faults queue up in order.
    pub fn fail_next(&self, function: &str, error: CUresult) {
        self.fail_after(function, 0, error);
    }

    /// The call of `function` after `skip` successful ones returns `error`.
    pub fn fail_after(&self, function: &str, skip: u64, error: CUresult) {
        self.world.lock().faults.push(state::Fault {
            function: function.to_string(),
            skip,
            error,
        });
    }

    /// Runs `run` just before the call of `function` after `skip` others does anything
    /// (it is not yet counted, nor faulted), on the calling thread and without the
    /// simulator's lock: it may call the driver itself, or start a thread that does and
    /// wait for it. That makes a race with another thread deterministic, e.g. another
    /// library beginning a capture of a stream at the very moment an event is recorded
    /// there.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use cuda_mock::MockDriver;
    ///
    /// let (driver, world) = MockDriver::with_devices(1).build()?;
    /// let seen = Arc::new(AtomicU32::new(0));
    /// let s = seen.clone();
    /// world.before_call("cuDriverGetVersion", 1, move || {
    ///     s.store(1, Ordering::SeqCst);
    /// });
    /// let mut v = 0;
    /// // SAFETY: a valid out-pointer.
    /// unsafe { (driver.fns().cuDriverGetVersion)(&mut v) };
    /// assert_eq!(seen.load(Ordering::SeqCst), 0, "one call skipped");
    /// // SAFETY: as above.
    /// unsafe { (driver.fns().cuDriverGetVersion)(&mut v) };
    /// assert_eq!(seen.load(Ordering::SeqCst), 1, "then it ran, once");
    /// # Ok::<(), cuda_sys::LoadError>(())
    /// ```
    pub fn before_call(&self, function: &str, skip: u64, run: impl FnOnce() + Send + 'static) {
        self.world.before.add(function, skip, Box::new(run));
    }

    /// Removes every pending fault.
    pub fn clear_faults(&self) {
        self.world.lock().faults.clear();
    }

    /// How many times `function` was called (faulted calls included).
    pub fn calls(&self, function: &str) -> u64 {
        self.world.lock().calls.get(function).copied().unwrap_or(0)
    }

    /// Handles alive now: retained primary contexts, streams, events, device and host
    /// allocations, graphs.
    pub fn live(&self) -> LiveHandles {
        self.world.lock().live()
    }

    /// Device memory in use on `ordinal`, in bytes.
    pub fn used_memory(&self, ordinal: usize) -> u64 {
        self.world.lock().used.get(ordinal).copied().unwrap_or(0)
    }

    /// How many times a context was destroyed while memory, streams or events still
    /// lived in it (a release in the wrong order).
    pub fn order_violations(&self) -> u64 {
        self.world.lock().order_violations
    }

    /// The devices of this machine.
    pub fn devices(&self) -> &[MockDevice] {
        &self.world.devices
    }

    /// The device ordinal of the context current on the calling thread, if any (for other
    /// simulations, such as the NCCL mock, which act on the "current device").
    pub fn current_device(&self) -> Option<i32> {
        let ctx = current::current_context(self.world.id)?;
        self.world.lock().contexts.get(&ctx).map(|c| c.device)
    }

    /// Checks that `[ptr, ptr + len)` lies inside one live device allocation and returns
    /// that allocation's device ordinal (for other simulations that touch device memory).
    pub fn device_range(&self, ptr: u64, len: usize) -> Option<i32> {
        self.world
            .lock()
            .find_alloc(ptr as usize, len)
            .map(|a| a.device)
    }

    /// The call that freed device memory overlapping `[ptr, ptr + len)`, while it is in
    /// the quarantine (freed memory is kept poisoned for a while so that late uses are
    /// caught): for simulated libraries that report a freed address passed to them.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// let (driver, world) = MockDriver::with_devices(1).build()?;
    /// let f = driver.fns();
    /// let (mut ctx, mut p) = (std::ptr::null_mut(), 0);
    /// // SAFETY: valid out-pointers; the context is made current before the allocation.
    /// unsafe {
    ///     (f.cuInit)(0);
    ///     (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
    ///     (f.cuCtxSetCurrent)(ctx);
    ///     (f.cuMemAlloc)(&mut p, 64);
    ///     assert_eq!(world.freed_by(p, 64), None);
    ///     (f.cuMemFree)(p);
    /// }
    /// assert_eq!(world.freed_by(p + 8, 4), Some("cuMemFree"));
    /// # Ok::<(), cuda_sys::LoadError>(())
    /// ```
    pub fn freed_by(&self, ptr: u64, len: usize) -> Option<&'static str> {
        self.world.lock().freed.overlapping(ptr as usize, len)
    }

    /// The device ordinal of a stream's context (0: the calling thread's current context).
    pub fn stream_device(&self, stream: CUstream) -> Option<i32> {
        queue::stream_device(&self.world, stream)
    }

    /// Runs `op` on `stream` in stream order: now, or when the captured graph is launched
    /// if the stream is being captured. `stream` 0 is the legacy default stream of the
    /// calling thread's current context. For simulations layered on this one; the same as
    /// [`enqueue_op`](Self::enqueue_op) with no touches.
    pub fn enqueue(
        &self,
        stream: CUstream,
        op: Arc<dyn Fn() -> CUresult + Send + Sync>,
    ) -> CUresult {
        queue::enqueue_op(&self.world, stream, "custom op", Vec::new(), op)
    }

    /// Enqueues `op` on `stream` like [`enqueue`](Self::enqueue), but when it executes (now,
    /// or at graph replay) it is stamped on the stream, every touch is checked (violations
    /// recorded; the op is then skipped and `CUDA_ERROR_ILLEGAL_ADDRESS` returned) and
    /// recorded as a use of its allocation. `call` names the op in reports.
    pub fn enqueue_op(
        &self,
        stream: CUstream,
        call: &'static str,
        touches: Vec<Touch>,
        op: Arc<dyn Fn() -> CUresult + Send + Sync>,
    ) -> CUresult {
        queue::enqueue_op(&self.world, stream, call, touches, op)
    }

    /// The same checks and use-recording as [`enqueue_op`](Self::enqueue_op), for work
    /// another simulation executes itself right now (e.g. at `ncclGroupEnd`) in the order
    /// of `stream`: stamps an op on `stream`. `Err(CUDA_ERROR_ILLEGAL_ADDRESS)` when a
    /// touch is illegal (reported), `Err(CUDA_ERROR_INVALID_HANDLE)` for an unknown stream.
    pub fn access(&self, stream: CUstream, call: &str, touches: &[Touch]) -> Result<(), CUresult> {
        queue::access(&self.world, stream, call, touches)
    }

    /// Reads `len` bytes of device memory at `ptr`, for another simulation that moves data
    /// itself (e.g. the NCCL mock's collectives): the range is checked and copied while the
    /// world is locked, so no free (and no eviction from the quarantine) can interleave.
    /// The range must lie in one live device allocation, of any device; otherwise nothing
    /// is read, a violation is recorded as `{call} reads 0x..+len: reason` (e.g. `freed by
    /// cuMemFree`, or `is not in any live device allocation`) and the result is
    /// `Err(CUDA_ERROR_ILLEGAL_ADDRESS)`. Nothing is allocated before the check passes, so
    /// a bogus length is reported, not attempted. No stream is involved: uses are not
    /// recorded (check them with [`access`](Self::access) or
    /// [`enqueue_op`](Self::enqueue_op) when the work is due).
    pub fn read_device(&self, call: &str, ptr: u64, len: usize) -> Result<Vec<u8>, CUresult> {
        self.world.lock().read_device(call, ptr, len)
    }

    /// Writes `data` to device memory at `ptr`, checked and copied under the world's lock
    /// like [`read_device`](Self::read_device): an illegal range writes nothing, is
    /// recorded as `{call} writes 0x..+len: reason` and gives
    /// `Err(CUDA_ERROR_ILLEGAL_ADDRESS)`.
    pub fn write_device(&self, call: &str, ptr: u64, data: &[u8]) -> Result<(), CUresult> {
        self.world.lock().write_device(call, ptr, data)
    }

    /// A handle that does not keep the simulated machine alive, for work another
    /// simulation leaves with this one (e.g. an op in a captured graph, which the machine
    /// itself holds).
    pub fn downgrade(&self) -> WeakMockWorld {
        WeakMockWorld {
            world: Arc::downgrade(&self.world),
        }
    }

    /// Records a violation found by another simulation (e.g. a call on a destroyed
    /// communicator).
    pub fn report(&self, violation: String) {
        self.world.lock().violation(violation);
    }

    /// Every violation recorded so far, oldest first.
    pub fn violations(&self) -> Vec<String> {
        self.world.lock().violations.clone()
    }

    /// Returns the violations recorded so far, oldest first, and clears them.
    pub fn take_violations(&self) -> Vec<String> {
        std::mem::take(&mut self.world.lock().violations)
    }

    /// [`MockDriver::kernel`], after the build: binds (or rebinds) the kernel `name`.
    /// Modules loaded already see it from their next `cuModuleGetFunction` on; launches
    /// made already keep the binding they were made with.
    pub fn bind_kernel(
        &self,
        name: &str,
        params: &[usize],
        f: impl Fn(&mut KernelCall<'_>) + Send + Sync + 'static,
    ) {
        let b = binding(params, f);
        self.world.lock().kernels.insert(name.to_string(), b);
    }

    /// [`MockDriver::global`], after the build: modules loaded from now on have it.
    pub fn bind_global(&self, name: &str, bytes: usize) {
        self.world.lock().globals.insert(name.to_string(), bytes);
    }
}

// The README (the crate's registry page) runs as doctests, on the simulated devices.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
