//! `libsimgpu.so`: the simulated driver of `cuda-mock` and the simulated NCCL of
//! `nccl-mock` behind the C symbols of `libcuda.so.1` and `libnccl.so.2`, so that an
//! unchanged program runs on simulated GPUs: ours through `CUDA_SYS_LIBRARY` /
//! `NCCL_SYS_LIBRARY` or the library path, and any program that loads the driver itself.
//!
//! One library under both names, because the simulated NCCL moves data in the simulated
//! driver's memory: two libraries would be two machines. `cargo xtask dropin` builds it and
//! lays it out as `libcuda.so.1` and `libnccl.so.2` (links to one file, which the dynamic
//! loader opens once).
//!
//! The machine is built at the first call, from the environment:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `CUDA_MOCK_DEVICES` | how many GPUs | 8 |
//! | `CUDA_MOCK_DRIVER_VERSION` | the driver's CUDA version, as `cuDriverGetVersion` gives it (`12080`) | the simulator's |
//! | `NCCL_MOCK_VERSION` | NCCL's version, `2.28.3` | the simulator's |
//!
//! NCCL is always the multi-process simulation: communicators of other processes on this
//! host find each other over loopback, through the unique id (or `NCCL_COMM_ID`).
//!
//! At exit, after the program's own exit handlers (which may still free memory), the
//! sanitizer's findings (a freed, out-of-bounds or foreign address, a free not ordered after
//! the work that used the memory) are printed to stderr and the process exits with status
//! [`VIOLATION_EXIT_CODE`], its C stdio buffers flushed first. (The check is the library's
//! destructor; the library is linked `-z nodelete`, so a `dlclose` never runs it early.)
//!
//! A program's own kernels run on the simulated devices through host twins it binds with
//! [`twins::simgpu_bind_kernel`] (see [`twins`]).
//!
//! `cuGetProcAddress` offers the CUDA 12.0 ABI and newer only: an older ABI version or an
//! entry newer than the version asked for is "not found". So is every entry asked for with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, even one without a per-thread variant:
//! the simulator has no per-thread default stream, and refusing is better than giving
//! stream-0 semantics the caller did not ask for (programs built with per-thread default
//! streams do not run on it).

pub mod twins;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write as _;
use std::sync::OnceLock;

use cuda_mock::{MockDriver, MockWorld};
use cuda_sys::{
    CUdriverProcAddress_flags, CUdriverProcAddressQueryResult, CUresult, Driver, DriverFns,
    PINNED_API_VERSION, cuuint64_t,
};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::{Nccl, NcclFns, NcclVersion};

/// `cuGetProcAddress`'s flag for the per-thread default stream's variants.
const PER_THREAD: CUdriverProcAddress_flags =
    CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

/// The exit status of a process whose simulated GPUs saw an invalid access.
pub const VIOLATION_EXIT_CODE: c_int = 86;

/// What `ncclGetErrorString` and `ncclGetLastError` say when the environment describes no
/// machine (NCCL's never return NULL).
const NO_MACHINE: &CStr = c"libsimgpu: no simulated machine (its environment is wrong: see stderr)";

/// The simulated machine of this process.
struct Machine {
    driver: Driver,
    nccl: Nccl,
    gpus: MockWorld,
    _nccl_world: MockNcclWorld,
}

static MACHINE: OnceLock<Result<Machine, String>> = OnceLock::new();

unsafe extern "C" {
    fn fflush(stream: *mut c_void) -> c_int;
    fn _exit(status: c_int) -> !;
}

/// The exit check, as the library's destructor: the C library runs the loaded libraries'
/// destructors after every exit handler the program registered, whenever it registered
/// them, so frees made by those handlers are checked too.
#[used]
// SAFETY: `.fini_array` holds pointers to `extern "C" fn()` that take no argument, which
// `at_exit` is; nothing else is placed in the section by this item.
#[unsafe(link_section = ".fini_array")]
static AT_EXIT: extern "C" fn() = at_exit;

fn env_number(var: &str) -> Result<Option<i64>, String> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{var}={v:?} is not a number")),
    }
}

/// `2.28.3`: NCCL's major version 2, minor and patch below 100 (what its version code holds).
fn nccl_version(v: &str) -> Result<NcclVersion, String> {
    let bad = || format!("NCCL_MOCK_VERSION={v:?} is not 2.MINOR.PATCH (each below 100)");
    let parts: Vec<u8> = v
        .trim()
        .split('.')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    match parts[..] {
        [2, b, c] if b < 100 && c < 100 => Ok(NcclVersion::new(2, b.into(), c.into())),
        _ => Err(bad()),
    }
}

fn build() -> Result<Machine, String> {
    let devices = env_number("CUDA_MOCK_DEVICES")?.unwrap_or(8);
    let devices = usize::try_from(devices)
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or_else(|| format!("CUDA_MOCK_DEVICES={devices} is not 1 to 64"))?;
    let mut b = MockDriver::with_devices(devices);
    if let Some(v) = env_number("CUDA_MOCK_DRIVER_VERSION")? {
        let v =
            i32::try_from(v).map_err(|_| format!("CUDA_MOCK_DRIVER_VERSION={v} is too large"))?;
        b = b.version(v);
    }
    let (driver, gpus) = b.build().map_err(|e| e.to_string())?;
    let mut n = MockNccl::new(&gpus).multi_process(true);
    if let Ok(v) = std::env::var("NCCL_MOCK_VERSION") {
        n = n.version(nccl_version(&v)?);
    }
    let (nccl, nccl_world) = n.build().map_err(|e| e.to_string())?;
    Ok(Machine {
        driver,
        nccl,
        gpus,
        _nccl_world: nccl_world,
    })
}

/// The machine, built at the first call; a bad environment is reported once and leaves
/// every call failing.
fn machine() -> Option<&'static Machine> {
    let m = MACHINE.get_or_init(|| {
        let m = build();
        if let Err(e) = &m {
            let _ = writeln!(std::io::stderr(), "libsimgpu: {e}");
        }
        m
    });
    m.as_ref().ok()
}

/// The simulated driver's table; `None` when the environment does not describe a machine.
fn driver() -> Option<&'static DriverFns> {
    machine().map(|m| m.driver.fns())
}

/// The simulated NCCL's table; `None` when the environment does not describe a machine.
fn nccl() -> Option<&'static NcclFns> {
    machine().map(|m| m.nccl.fns())
}

extern "C" fn at_exit() {
    let Some(Ok(m)) = MACHINE.get() else { return };
    let v = m.gpus.violations();
    if v.is_empty() {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "libsimgpu: the simulated GPUs' sanitizer reported {} invalid access(es):",
        v.len()
    );
    for line in &v {
        let _ = writeln!(err, "  {line}");
    }
    let _ = err.flush();
    // SAFETY: fflush(NULL) flushes every C stdio stream (the program's output, which the C
    // library would flush after this destructor); _exit then ends the process with the
    // status, running nothing more of it.
    unsafe {
        fflush(std::ptr::null_mut());
        _exit(VIOLATION_EXIT_CODE)
    }
}

/// The `user` pointer of [`simgpu_before_call`], moved to the call it runs before.
struct BeforeUser(*mut c_void);
// SAFETY: `simgpu_before_call`'s contract: `user` may be used from any thread.
unsafe impl Send for BeforeUser {}

/// Runs `run(user)` once, just before the call of the driver function `function` (its API
/// name, `"cuEventRecord"`) after `skip` others does anything, on the calling thread and
/// outside the simulator's lock: `run` may call the driver, or start a thread that does and
/// wait for it (another library's thread, in a test that needs a race to happen at one
/// exact moment). Returns 0, or -1 when an argument is null or not UTF-8, or when the
/// environment describes no machine.
///
/// # Safety
/// `function` is NUL-terminated; `run` may be called with `user` from any thread, once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simgpu_before_call(
    function: *const c_char,
    skip: u64,
    run: Option<unsafe extern "C" fn(user: *mut c_void)>,
    user: *mut c_void,
) -> c_int {
    let (Some(run), false) = (run, function.is_null()) else {
        return -1;
    };
    // SAFETY: a NUL-terminated string (the caller's contract).
    let Ok(function) = unsafe { CStr::from_ptr(function) }.to_str() else {
        return -1;
    };
    let Some(m) = machine() else { return -1 };
    let user = BeforeUser(user);
    m.gpus.before_call(function, skip, move || {
        let user = user;
        // SAFETY: the caller's contract: `run` takes `user`, once, on any thread.
        unsafe { run(user.0) }
    });
    0
}

/// `cuGetProcAddress_v2`: the entries of the simulated driver's table by API name, at the
/// CUDA 12.0 ABI or newer (CUDA 12's loaders resolve every function so): an entry newer
/// than the simulated driver, or than `cuda_version`, is not found
/// (`CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT` for the latter); so is every entry asked for
/// an older ABI or with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, which the simulator
/// does not have.
///
/// # Safety
/// `symbol` is a NUL-terminated string; `pfn` and, when not null, `symbol_status` are
/// valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let name = name.to_str().unwrap_or("");
    let since = DriverFns::OPTIONAL
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(PINNED_API_VERSION, |&(_, v)| v);
    let per_thread = flags & cuuint64_t::from(PER_THREAD.0) != 0;
    let found = driver()
        .and_then(|t| t.address_of(name))
        .filter(|p| !p.is_null());
    let (rc, status, p) = match found {
        Some(p) if cuda_version >= since && !per_thread => (
            CUresult::CUDA_SUCCESS,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS,
            p.cast_mut(),
        ),
        Some(_) if !per_thread => (
            CUresult::CUDA_ERROR_NOT_FOUND,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            std::ptr::null_mut(),
        ),
        _ => (
            CUresult::CUDA_ERROR_NOT_FOUND,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            std::ptr::null_mut(),
        ),
    };
    // SAFETY: the caller passes valid out-pointers (checked non-null above, or skipped).
    unsafe {
        *pfn = p;
        if !symbol_status.is_null() {
            *symbol_status = status;
        }
    }
    rc
}

/// `cuGetProcAddress` (before CUDA 12.0): as `cuGetProcAddress_v2`, without the status.
///
/// # Safety
/// As `cuGetProcAddress_v2`'s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    // SAFETY: the caller's contract is the same, and a null status is skipped.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

// Generated by build.rs in one shape for every entry, so lints about one entry are off.
#[allow(
    non_snake_case,
    clippy::missing_safety_doc,
    clippy::undocumented_unsafe_blocks,
    clippy::unused_unit,
    clippy::single_match
)]
mod exports {
    use super::{driver, nccl};
    use cuda_sys::*;
    use nccl_sys::*;
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
pub use exports::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_versions_are_2_minor_patch_below_100() {
        assert_eq!(nccl_version("2.28.3"), Ok(NcclVersion::new(2, 28, 3)));
        assert_eq!(nccl_version(" 2.99.99 "), Ok(NcclVersion::new(2, 99, 99)));
        for bad in [
            "2.1000.0", "2.100.0", "2.28.100", "-1.2.3", "3.0.0", "2.28", "2.28.3.1", "",
        ] {
            assert_eq!(
                nccl_version(bad),
                Err(format!(
                    "NCCL_MOCK_VERSION={bad:?} is not 2.MINOR.PATCH (each below 100)"
                )),
            );
        }
    }
}
