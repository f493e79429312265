//! Host-bound kernels: a kernel name bound to a Rust function ([`MockDriver::kernel`],
//! [`MockWorld::bind_kernel`]) that runs where the GPU would run the kernel, in stream
//! order (at launch, or at graph replay), with sanitizer-checked device memory access
//! through [`KernelCall`].
//!
//! [`MockDriver::kernel`]: crate::MockDriver::kernel
//! [`MockWorld::bind_kernel`]: crate::MockWorld::bind_kernel

use std::mem::{size_of, size_of_val};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::sanitizer::{Access, Side};
use cuda_sys::CUresult;

/// What a running kernel reaches of the machine it runs on: reports, and checked access
/// to device memory under the machine's lock. The world implements it; this module names
/// no world, so that the state, which stores bindings, can sit above it.
pub(crate) trait Machine: Sync {
    /// Records a violation.
    fn violation(&self, message: String);

    /// Under the machine's lock: checks `access` of a kernel on `device` (as
    /// `State::check_range` does, reporting an illegal one named by `who`, the prefix and
    /// the call) and, when it is legal and not empty, records it as a use by `op` (stream
    /// key and stamp) and runs `copy` on its host address, before the lock is released.
    /// `false` when it is illegal.
    fn touch(
        &self,
        who: (&str, &str),
        access: Access,
        device: i32,
        op: (usize, u64),
        copy: &mut dyn FnMut(*mut u8),
    ) -> bool;
}

/// The host function of a bound kernel.
pub(crate) type KernelFn = Arc<dyn Fn(&mut KernelCall<'_>) + Send + Sync>;

/// A kernel name's binding: its parameters' sizes in bytes and its host function.
#[derive(Clone)]
pub(crate) struct Binding {
    pub(crate) params: Vec<usize>,
    pub(crate) f: KernelFn,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A primitive number, valid for any bit pattern: what a host-bound kernel may read from
/// its parameters and from device memory, and write to device memory. Sealed.
///
/// Generic host kernels are written over it:
///
/// ```
/// use cuda_mock::{KernelCall, MockDriver, Plain};
///
/// /// `x[i] += x[i]` for the `n` elements at `x`: parameters (x: ptr, n: u32).
/// fn double<T: Plain + std::ops::Add<Output = T>>(k: &mut KernelCall<'_>) {
///     let (x, n) = (k.param::<u64>(0), k.param::<u32>(1) as usize);
///     let v: Vec<T> = k.read::<T>(x, n).into_iter().map(|v| v + v).collect();
///     k.write(x, &v);
/// }
/// let (_driver, _world) = MockDriver::with_devices(1)
///     .kernel("double_f32", &[8, 4], double::<f32>)
///     .kernel("double_i64", &[8, 4], double::<i64>)
///     .build()?;
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
///
/// (See [`MockDriver::kernel`](crate::MockDriver::kernel) for a launch.)
pub trait Plain: Copy + Default + Send + Sync + 'static + sealed::Sealed {}

macro_rules! plain {
    ($($t:ty),*) => { $(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )* };
}
plain!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

/// One launch as recorded by `cuLaunchKernel`: the parameters are copied at launch, as
/// the driver does, so a captured launch replays with the values it was captured with.
pub(crate) struct Launch {
    pub(crate) function: usize,
    pub(crate) module: usize,
    pub(crate) name: String,
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) shared: u32,
    pub(crate) params: Vec<Vec<u8>>,
    pub(crate) f: KernelFn,
}

/// What a host-bound kernel sees of its launch: the launch shape, the parameters, and
/// device memory.
///
/// Memory access is checked like any other op's touches, when the kernel runs: a range
/// must lie in one live allocation of the launch stream's device, aligned for its element
/// type. An illegal access is recorded as a violation naming the kernel and makes the
/// launch return `CUDA_ERROR_ILLEGAL_ADDRESS` (at graph replay, the graph launch). Like a
/// GPU kernel that faults, the kernel then stops touching memory: that access and every
/// later one read nothing (an empty vector; [`read_one`](Self::read_one) gives zero) and
/// write nothing. A range is checked before anything is allocated for it, so a bogus
/// length is reported like any illegal range. Legal accesses are recorded as uses of the
/// memory, so a free not ordered after the kernel is reported. The kernel runs once per
/// launch, not once per thread: it loops over its elements itself.
///
/// One element per thread of the launch; a grid larger than the buffer writes past its
/// end, which faults the launch instead of corrupting memory:
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_sys::{CUdeviceptr, CUresult};
///
/// let (driver, world) = MockDriver::with_devices(1)
///     .kernel("iota", &[8], |k| {
///         assert_eq!((k.name(), k.param_count(), k.device()), ("iota", 1, 0));
///         let out = k.param::<u64>(0);
///         let n = k.threads() as u32; // grid × block
///         k.write(out, &(0..n).collect::<Vec<u32>>());
///     })
///     .build()?;
/// let f = driver.fns();
/// let ptx = c".version 8.0\n.target sm_90\n.visible .entry iota(.param .u64 out) { ret; }";
/// let ok = CUresult::CUDA_SUCCESS;
/// let mut got = [0u32; 8];
/// // SAFETY: valid out-pointers and live handles; one parameter pointer, to a device
/// // address (8 bytes, as declared); the simulated kernel's accesses are checked.
/// let (fits, too_big) = unsafe {
///     let (mut ctx, mut module, mut func) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
///     assert_eq!((f.cuInit)(0), ok);
///     assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx, 0), ok);
///     assert_eq!((f.cuCtxSetCurrent)(ctx), ok);
///     assert_eq!((f.cuModuleLoadData)(&mut module, ptx.as_ptr().cast()), ok);
///     assert_eq!((f.cuModuleGetFunction)(&mut func, module, c"iota".as_ptr()), ok);
///     let mut out: CUdeviceptr = 0;
///     assert_eq!((f.cuMemAlloc)(&mut out, 32), ok);
///     let mut params = [(&raw mut out).cast()];
///     let (stream, extra) = (std::ptr::null_mut(), std::ptr::null_mut());
///     // 2 blocks of 4 threads: 8 u32s, the whole buffer.
///     let fits = (f.cuLaunchKernel)(func, 2, 1, 1, 4, 1, 1, 0, stream, params.as_mut_ptr(), extra);
///     assert_eq!((f.cuMemcpyDtoH)(got.as_mut_ptr().cast(), out, 32), ok);
///     // 4 blocks of 4: 16 u32s, twice the buffer.
///     let too_big = (f.cuLaunchKernel)(func, 4, 1, 1, 4, 1, 1, 0, stream, params.as_mut_ptr(), extra);
///     (fits, too_big)
/// };
/// assert_eq!((fits, too_big), (ok, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
/// assert_eq!(got, [0, 1, 2, 3, 4, 5, 6, 7]);
/// let found = world.take_violations();
/// assert!(found.len() == 1 && found[0].starts_with("cuLaunchKernel iota writes"), "{found:?}");
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
pub struct KernelCall<'a> {
    machine: &'a dyn Machine,
    launch: &'a Launch,
    /// The launch stream's sanitizer key and the launch's stamp on it.
    key: usize,
    stamp: u64,
    device: i32,
    /// `cuLaunchKernel <name>`, with `cuGraphLaunch: ` before it at replay.
    prefix: &'a str,
    call: String,
    illegal: bool,
}

impl std::fmt::Debug for KernelCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCall")
            .field("name", &self.launch.name)
            .field("grid", &self.launch.grid)
            .field("block", &self.launch.block)
            .field("shared_mem_bytes", &self.launch.shared)
            .field("params", &self.launch.params.len())
            .finish()
    }
}

impl KernelCall<'_> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.launch.name
    }

    /// Grid dimensions (blocks in x, y, z).
    pub fn grid(&self) -> [u32; 3] {
        self.launch.grid
    }

    /// Block dimensions (threads in x, y, z).
    pub fn block(&self) -> [u32; 3] {
        self.launch.block
    }

    /// Threads of the whole launch (grid × block), the usual bound of a kernel's loop.
    pub fn threads(&self) -> u64 {
        let n = |d: [u32; 3]| d.iter().map(|v| u64::from(*v)).product::<u64>();
        n(self.launch.grid).saturating_mul(n(self.launch.block))
    }

    /// Dynamic shared memory per block, in bytes.
    pub fn shared_mem_bytes(&self) -> u32 {
        self.launch.shared
    }

    /// The device ordinal the kernel runs on.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Number of parameters (as the binding declares).
    pub fn param_count(&self) -> usize {
        self.launch.params.len()
    }

    /// The bytes of parameter `i`, as copied at launch. An index out of range is a
    /// violation and gives an empty slice.
    pub fn param_bytes(&self, i: usize) -> &[u8] {
        match self.launch.params.get(i) {
            Some(p) => p,
            None => {
                self.report(format!(
                    "parameter {i} does not exist ({} declared)",
                    self.launch.params.len()
                ));
                &[]
            }
        }
    }

    /// Parameter `i` as a `T`. Its declared size must be `size_of::<T>()`: otherwise
    /// (or for an index out of range) a violation is recorded and `T::default()` returned.
    pub fn param<T: Plain>(&self, i: usize) -> T {
        let Some(bytes) = self.launch.params.get(i) else {
            self.report(format!(
                "parameter {i} does not exist ({} declared)",
                self.launch.params.len()
            ));
            return T::default();
        };
        if bytes.len() != size_of::<T>() {
            self.report(format!(
                "parameter {i} is {} bytes, read as {} ({} bytes)",
                bytes.len(),
                std::any::type_name::<T>(),
                size_of::<T>()
            ));
            return T::default();
        }
        // SAFETY: `bytes` holds exactly `size_of::<T>()` bytes, and `T` is `Plain`: any bit
        // pattern is a valid value; the read is unaligned-safe.
        unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
    }

    /// Reads `len` elements at device address `ptr`. The range is checked before anything
    /// is allocated for the result: an illegal one (or any read once the kernel faulted)
    /// gives an empty vector, so a bogus length is reported, never attempted.
    pub fn read<T: Plain>(&mut self, ptr: u64, len: usize) -> Vec<T> {
        let Some(bytes) = len.checked_mul(size_of::<T>()) else {
            self.overflow("reads", ptr, len, size_of::<T>());
            return Vec::new();
        };
        let read = self.touch(ptr, bytes, align_of::<T>(), "reads", |src| {
            // The range lies in a live allocation, so its copy is no bigger than that.
            let mut out = zeros::<T>(len);
            if out.len() == len {
                // SAFETY: `src` is `bytes` bytes of one live allocation (checked under the
                // world's lock, which is held during the copy); `out` holds `len` elements
                // of `T`, `bytes` bytes, any bit pattern of which is a valid `T`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.cast_const(),
                        out.as_mut_ptr().cast::<u8>(),
                        bytes,
                    );
                }
            }
            out
        });
        match read {
            Some(out) if out.len() == len => out,
            Some(_) => {
                // The host could not hold a copy of memory the device holds.
                self.report(format!(
                    "reads {ptr:#x}+{bytes}: the host cannot hold a copy of {bytes} bytes"
                ));
                self.illegal = true;
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// Reads one element at device address `ptr` (checked; zero if illegal).
    pub fn read_one<T: Plain>(&mut self, ptr: u64) -> T {
        self.read::<T>(ptr, 1).first().copied().unwrap_or_default()
    }

    /// Writes `data` at device address `ptr` (checked; nothing is written if illegal).
    pub fn write<T: Plain>(&mut self, ptr: u64, data: &[T]) {
        let bytes = size_of_val(data);
        let src = data.as_ptr().cast::<u8>();
        self.touch(ptr, bytes, align_of::<T>(), "writes", |dst| {
            // SAFETY: `dst` is `bytes` bytes of one live allocation (checked under the
            // world's lock, held during the copy); `data` is `bytes` readable bytes. `copy`
            // tolerates overlap.
            unsafe { std::ptr::copy(src, dst, bytes) }
        });
    }

    /// Writes one element at device address `ptr` (checked).
    pub fn write_one<T: Plain>(&mut self, ptr: u64, value: T) {
        self.write(ptr, std::slice::from_ref(&value));
    }

    /// Whether an access so far was illegal: the kernel has faulted, later accesses do
    /// nothing, and the launch fails.
    pub fn failed(&self) -> bool {
        self.illegal
    }

    /// Checks `[ptr, ptr + bytes)` and, if legal, records the use and runs `copy` on the
    /// range's host address, all under the world's lock (so no free interleaves); `copy`'s
    /// result, or `None` when the range is empty or illegal (or the kernel faulted).
    fn touch<R>(
        &mut self,
        ptr: u64,
        bytes: usize,
        align: usize,
        what: &'static str,
        copy: impl FnOnce(*mut u8) -> R,
    ) -> Option<R> {
        // A faulted kernel touches nothing more (and is reported once).
        if bytes == 0 || self.illegal {
            return None;
        }
        let Ok(addr) = usize::try_from(ptr) else {
            self.overflow(what, ptr, bytes, 1);
            return None;
        };
        if !addr.is_multiple_of(align) {
            self.machine.violation(format!(
                "{}{} {what} {ptr:#x}+{bytes}: misaligned for {align}-byte elements",
                self.prefix, self.call
            ));
            self.illegal = true;
            return None;
        }
        let access = Access {
            ptr: addr,
            len: bytes,
            what,
            side: Side::Device,
        };
        let (mut copy, mut copied) = (Some(copy), None);
        let legal = self.machine.touch(
            (self.prefix, &self.call),
            access,
            self.device,
            (self.key, self.stamp),
            &mut |host| copied = copy.take().map(|c| c(host)),
        );
        if !legal {
            self.illegal = true;
        }
        copied
    }

    fn overflow(&mut self, what: &str, ptr: u64, len: usize, size: usize) {
        if self.illegal {
            return;
        }
        self.report(format!(
            "{what} {len} elements of {size} bytes at {ptr:#x}: more than any allocation"
        ));
        self.illegal = true;
    }

    /// Records a violation about this launch.
    fn report(&self, what: String) {
        let m = format!("{}{}: {what}", self.prefix, self.call);
        self.machine.violation(m);
    }
}

/// `len` default values, or none if the host cannot hold them.
fn zeros<T: Plain>(len: usize) -> Vec<T> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_ok() {
        v.resize(len, T::default());
    }
    v
}

/// Runs a launch's host function (called with the world unlocked, after the op was
/// stamped `stamp` on stream `key` of `device`). A panic in it is caught (this runs
/// inside `extern "C"` functions), reported, and fails the launch.
pub(crate) fn run(
    machine: &dyn Machine,
    launch: &Launch,
    key: usize,
    stamp: u64,
    device: i32,
    prefix: &str,
) -> CUresult {
    let mut call = KernelCall {
        machine,
        launch,
        key,
        stamp,
        device,
        prefix,
        call: format!("cuLaunchKernel {}", launch.name),
        illegal: false,
    };
    let ran = catch_unwind(AssertUnwindSafe(|| (launch.f)(&mut call)));
    match ran {
        Ok(()) if call.illegal => CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".into());
            call.report(format!("the host function panicked: {why}"));
            CUresult::CUDA_ERROR_LAUNCH_FAILED
        }
    }
}
