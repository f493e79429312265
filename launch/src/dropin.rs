//! Host twins for a program's kernels when the loaded driver is the drop-in simulator
//! (`libsimgpu.so` as `libcuda.so.1`): found by `dlsym` in the driver already loaded, so
//! the same program runs its kernels on a GPU and on the simulated devices.

use std::ffi::{CString, c_int, c_void};
use std::sync::OnceLock;

use libc::{RTLD_NOLOAD, RTLD_NOW};
use libloading::os::unix::Library;

type Bind = unsafe extern "C" fn(
    *const std::ffi::c_char,
    *const usize,
    usize,
    Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
    *mut c_void,
) -> c_int;
type Param = unsafe extern "C" fn(*mut c_void, usize, *mut c_void, usize) -> c_int;
type Read = unsafe extern "C" fn(*mut c_void, u64, *mut c_void, usize) -> c_int;
type Write = unsafe extern "C" fn(*mut c_void, u64, *const c_void, usize) -> c_int;

/// The drop-in's twin functions.
struct Api {
    bind: Bind,
    param: Param,
    read: Read,
    write: Write,
}

/// The drop-in's functions, if the driver loaded in this process is the drop-in.
fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| {
        // Only a library already loaded: nothing new is opened (the flag loads nothing).
        // SAFETY: RTLD_NOLOAD runs no initialiser; the symbols are the drop-in's C
        // functions with these signatures (`dropin/src/twins.rs`), and the library stays
        // loaded (it is linked `-z nodelete`, and the driver's user holds it too).
        unsafe {
            let lib = Library::open(Some("libcuda.so.1"), RTLD_NOLOAD | RTLD_NOW).ok()?;
            let api = Api {
                bind: *lib.get::<Bind>(b"simgpu_bind_kernel").ok()?,
                param: *lib.get::<Param>(b"simgpu_kernel_param").ok()?,
                read: *lib.get::<Read>(b"simgpu_kernel_read").ok()?,
                write: *lib.get::<Write>(b"simgpu_kernel_write").ok()?,
            };
            std::mem::forget(lib);
            Some(api)
        }
    })
    .as_ref()
}

/// Whether the driver loaded in this process is the drop-in simulator.
pub fn is_dropin() -> bool {
    api().is_some()
}

/// Plain values a twin may read and write: any bit pattern is one.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes is a valid value.
pub unsafe trait Plain: Copy + Default {}
// SAFETY: any bit pattern is a valid value of these.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for u64 {}

/// One launch of a kernel, as its twin sees it.
pub struct Launch {
    raw: *mut c_void,
    api: &'static Api,
}

impl Launch {
    /// Parameter `i` (`None`: no such parameter, or not of `T`'s size).
    pub fn param<T: Plain>(&self, i: usize) -> Option<T> {
        let mut v = T::default();
        // SAFETY: the launch handle during its call; `v` holds size_of::<T>() bytes, and
        // any bit pattern is a `T`.
        let rc = unsafe { (self.api.param)(self.raw, i, (&raw mut v).cast(), size_of::<T>()) };
        (rc == 0).then_some(v)
    }

    /// `len` values at device address `ptr` (`None`: not live memory; the launch faults).
    pub fn read<T: Plain>(&self, ptr: u64, len: usize) -> Option<Vec<T>> {
        let mut v = vec![T::default(); len];
        let bytes = std::mem::size_of_val(v.as_slice());
        // SAFETY: as above, for `len` values.
        let rc = unsafe { (self.api.read)(self.raw, ptr, v.as_mut_ptr().cast(), bytes) };
        (rc == 0).then_some(v)
    }

    /// Writes `data` at device address `ptr` (`false`: not live memory; the launch faults).
    pub fn write<T: Plain>(&self, ptr: u64, data: &[T]) -> bool {
        let bytes = std::mem::size_of_val(data);
        // SAFETY: the launch handle during its call; `data` is `bytes` readable bytes.
        unsafe { (self.api.write)(self.raw, ptr, data.as_ptr().cast(), bytes) == 0 }
    }
}

unsafe extern "C" fn trampoline(raw: *mut c_void, user: *mut c_void) {
    let Some(api) = api() else { return };
    // SAFETY: `user` is the `fn(&Launch)` that `bind` passed (a function pointer, valid
    // for the life of the program).
    let twin: fn(&Launch) = unsafe { std::mem::transmute::<*mut c_void, fn(&Launch)>(user) };
    twin(&Launch { raw, api });
}

/// Binds `twin` as the host twin of kernel `name`, whose parameters are `params` bytes
/// each, when the loaded driver is the drop-in; returns whether it is (on a real driver
/// nothing happens). Bind before the module that declares the kernel is loaded.
pub fn bind(name: &str, params: &[usize], twin: fn(&Launch)) -> Result<bool, String> {
    let Some(api) = api() else { return Ok(false) };
    let c = CString::new(name).map_err(|_| format!("kernel name {name:?} has a NUL"))?;
    let user = twin as *mut c_void;
    // SAFETY: a NUL-terminated name, `params.len()` sizes, and a trampoline that may be
    // called from any thread with `user`, a function pointer valid for the program's life.
    let rc = unsafe {
        (api.bind)(
            c.as_ptr(),
            params.as_ptr(),
            params.len(),
            Some(trampoline),
            user,
        )
    };
    if rc != 0 {
        return Err(format!("the drop-in refused the twin of kernel {name}"));
    }
    Ok(true)
}
