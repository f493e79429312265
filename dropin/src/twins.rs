//! Host twins for a program's own kernels: the simulator runs a kernel by calling a host
//! function bound to its name (as `MockDriver::kernel` binds one in process). An unchanged
//! program has none, so its launches fail, naming the kernel; a program that knows it may
//! run on the drop-in binds its twins through these C functions (found with `dlsym` in
//! the loaded `libcuda`), before it loads the module.
//!
//! A twin is called once per launch with an opaque launch handle, valid during the call
//! only: it reads its parameters with [`simgpu_kernel_param`] and device memory with
//! [`simgpu_kernel_read`] / [`simgpu_kernel_write`], which the sanitizer checks like any
//! kernel's accesses (an access outside live memory of the launch's device faults the
//! launch and is reported at exit).

use std::ffi::{CStr, c_char, c_int, c_void};

use cuda_mock::KernelCall;

/// A launch, as a twin sees it (opaque).
#[repr(C)]
pub struct SimgpuLaunch {
    _opaque: [u8; 0],
}

/// A host twin: called with the launch and the `user` pointer given at binding.
pub type SimgpuTwin = unsafe extern "C" fn(launch: *mut SimgpuLaunch, user: *mut c_void);

/// The `user` pointer, shared with the twin's calls on any thread (the binder's promise).
struct User(*mut c_void);
// SAFETY: `simgpu_bind_kernel`'s contract: `user` may be used from any thread.
unsafe impl Send for User {}
// SAFETY: as above.
unsafe impl Sync for User {}

/// Binds (or rebinds) kernel `name`, whose parameters have the sizes `param_sizes[..n]`
/// in bytes, to `twin`. Returns 0, or -1 when an argument is null or not UTF-8, or when
/// the environment describes no machine.
///
/// # Safety
/// `name` is NUL-terminated; `param_sizes` points to `n` sizes (or is null with `n == 0`);
/// `twin` may be called with `user` from any thread, for as long as the process runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simgpu_bind_kernel(
    name: *const c_char,
    param_sizes: *const usize,
    n: usize,
    twin: Option<SimgpuTwin>,
    user: *mut c_void,
) -> c_int {
    let (Some(twin), false) = (twin, name.is_null() || (param_sizes.is_null() && n > 0)) else {
        return -1;
    };
    // SAFETY: a NUL-terminated string (the caller's contract).
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
        return -1;
    };
    let sizes = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: `n` sizes at `param_sizes` (the caller's contract).
        unsafe { std::slice::from_raw_parts(param_sizes, n) }.to_vec()
    };
    let Some(m) = crate::machine() else { return -1 };
    let user = User(user);
    m.gpus
        .bind_kernel(name, &sizes, move |call: &mut KernelCall<'_>| {
            let launch = std::ptr::from_mut(call).cast::<SimgpuLaunch>();
            let user = &user;
            // SAFETY: the twin's contract (the binder's); `launch` is valid for this call.
            unsafe { twin(launch, user.0) }
        });
    0
}

/// The launch behind the opaque handle.
///
/// # Safety
/// `launch` is the handle a twin was called with, during that call.
unsafe fn call<'a>(launch: *mut SimgpuLaunch) -> &'a mut KernelCall<'a> {
    // SAFETY: the caller's contract: the handle is a `KernelCall` alive for the call.
    unsafe { &mut *launch.cast::<KernelCall<'a>>() }
}

/// Copies parameter `i` (of the size bound for it) to `out`, which holds `size` bytes.
/// Returns 0, or -1 when there is no parameter `i` or its size is not `size`.
///
/// # Safety
/// `launch` is the handle the twin was called with, during the call; `out` is valid for
/// `size` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simgpu_kernel_param(
    launch: *mut SimgpuLaunch,
    i: usize,
    out: *mut c_void,
    size: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let c = unsafe { call(launch) };
    if i >= c.param_count() || c.param_bytes(i).len() != size || out.is_null() {
        return -1;
    }
    // SAFETY: `size` bytes, from the parameter to the caller's buffer (no overlap).
    unsafe { std::ptr::copy_nonoverlapping(c.param_bytes(i).as_ptr(), out.cast(), size) };
    0
}

/// Reads `bytes` bytes of device memory at `ptr` into `out`. Returns 0, or -1 when the
/// range is not live memory of the launch's device (the launch then faults; `out` is
/// left as it was).
///
/// # Safety
/// `launch` is the handle the twin was called with, during the call; `out` is valid for
/// `bytes` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simgpu_kernel_read(
    launch: *mut SimgpuLaunch,
    ptr: u64,
    out: *mut c_void,
    bytes: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let c = unsafe { call(launch) };
    let data = c.read::<u8>(ptr, bytes);
    if c.failed() || data.len() != bytes || out.is_null() {
        return -1;
    }
    // SAFETY: `bytes` bytes into the caller's buffer.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), out.cast(), bytes) };
    0
}

/// Writes `bytes` bytes from `data` to device memory at `ptr`. Returns 0, or -1 when the
/// range is not live memory of the launch's device (the launch then faults).
///
/// # Safety
/// `launch` is the handle the twin was called with, during the call; `data` is valid for
/// `bytes` bytes of reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simgpu_kernel_write(
    launch: *mut SimgpuLaunch,
    ptr: u64,
    data: *const c_void,
    bytes: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let c = unsafe { call(launch) };
    if data.is_null() && bytes > 0 {
        return -1;
    }
    let src = if bytes == 0 {
        &[][..]
    } else {
        // SAFETY: `bytes` readable bytes (the caller's contract).
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), bytes) }
    };
    c.write(ptr, src);
    if c.failed() { -1 } else { 0 }
}
