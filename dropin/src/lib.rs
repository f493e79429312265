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
//! At exit, the sanitizer's findings (a freed, out-of-bounds or foreign address, a free not
//! ordered after the work that used the memory) are printed to stderr and the process
//! exits with status [`VIOLATION_EXIT_CODE`].

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write as _;
use std::sync::OnceLock;

use cuda_mock::{MockDriver, MockWorld};
use cuda_sys::{CUdriverProcAddressQueryResult, CUresult, Driver, DriverFns, cuuint64_t};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::{Nccl, NcclFns, NcclVersion};

/// The exit status of a process whose simulated GPUs saw an invalid access.
pub const VIOLATION_EXIT_CODE: c_int = 86;

/// The simulated machine of this process.
struct Machine {
    driver: Driver,
    nccl: Nccl,
    gpus: MockWorld,
    _nccl_world: MockNcclWorld,
}

static MACHINE: OnceLock<Result<Machine, String>> = OnceLock::new();

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
    fn _exit(status: c_int) -> !;
}

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

fn nccl_version(v: &str) -> Result<NcclVersion, String> {
    let parts: Vec<i32> = v
        .trim()
        .split('.')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| format!("NCCL_MOCK_VERSION={v:?} is not MAJOR.MINOR.PATCH"))?;
    match parts[..] {
        [a, b, c] => Ok(NcclVersion::new(a, b, c)),
        _ => Err(format!("NCCL_MOCK_VERSION={v:?} is not MAJOR.MINOR.PATCH")),
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
    // SAFETY: `at_exit` is a plain function that stays loaded: this library is never
    // unloaded while the process runs its exit handlers, as nothing dlcloses it (the
    // loaders of cuda-sys and nccl-sys keep it open for the process's life).
    unsafe { atexit(at_exit) };
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
    // SAFETY: ends the process at once; nothing runs after this exit handler that could
    // need this process's state.
    unsafe { _exit(VIOLATION_EXIT_CODE) }
}

/// `cuGetProcAddress_v2`: the entries of the simulated driver's table by API name, as a
/// driver of the simulated version gives them (CUDA 12's loaders resolve every function so).
///
/// # Safety
/// `symbol` is a NUL-terminated string; `pfn` and, when not null, `symbol_status` are
/// valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _cuda_version: c_int,
    _flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let found = name
        .to_str()
        .ok()
        .and_then(|n| driver()?.address_of(n))
        .filter(|p| !p.is_null());
    let (rc, status, p) = match found {
        Some(p) => (
            CUresult::CUDA_SUCCESS,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS,
            p.cast_mut(),
        ),
        None => (
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

// Generated (build.rs): one shape for every entry, so a `void` one returns `-> ()` and
// matches with an empty arm.
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
