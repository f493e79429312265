//! The drop-in library as programs meet it: opened by path under both names, its symbols
//! found with `dlsym`, its machine shaped by the environment, its sanitizer's verdict in
//! the exit status. Each case runs in a child process (the machine is per process).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cudarc_attacks;
mod cudarc_interop;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, OnceLock};

use cuda_hal::{Cuda, DeviceBuffer, Stream};
use nccl_channel::{Communicator, group};

/// The drop-in library, built once for these tests (see `test_support::dropin`).
fn library() -> PathBuf {
    test_support::dropin::library(Path::new(env!("CARGO_TARGET_TMPDIR")))
}

/// A folder where the driver's and NCCL's names all link to the drop-in.
fn dropin_dir() -> PathBuf {
    test_support::dropin::dir(Path::new(env!("CARGO_TARGET_TMPDIR")))
}

/// Runs the test `name` of this binary in a child with `env`.
fn child(name: &str, env: &[(&str, &str)]) -> Output {
    // Without the caller's launcher, NCCL or loader variables (a hostile environment must
    // not steer the drop-in's machine), plus what the case sets.
    let mut c = test_support::env::scrubbed(std::env::current_exe().unwrap());
    c.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("DROPIN_CHILD", name)
        .env("DROPIN_LIBRARY", library())
        .env("NCCL_NVLS_ENABLE", "0");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    // A name that matched no test would pass without running anything.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed") || !out.status.success(),
        "the child ran no test named {name}"
    );
    out
}

fn is_child(name: &str) -> bool {
    std::env::var("DROPIN_CHILD").is_ok_and(|c| c == name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_safe_crates_all_gather_on_it_as_on_real_libraries() {
    const ME: &str = "the_safe_crates_all_gather_on_it_as_on_real_libraries";
    if !is_child(ME) {
        let o = child(ME, &[("CUDA_MOCK_DEVICES", "2")]);
        assert!(o.status.success(), "{}", stderr(&o));
        return;
    }
    let lib = library();
    // SAFETY: the drop-in implements the driver API with the header's signatures.
    let driver = unsafe { cuda_sys::Driver::load_from(&lib) }.unwrap();
    // SAFETY: and NCCL's.
    let nccl = Arc::new(unsafe { nccl_sys::Nccl::load_from(&lib) }.unwrap());
    let cuda = Cuda::from_driver(driver).unwrap();
    assert_eq!(cuda.device_count().unwrap(), 2);
    let ctxs = [0, 1].map(|i| cuda.device(i).unwrap().primary_context().unwrap());
    let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
    let streams = ctxs.each_ref().map(|c| Stream::new(c).unwrap());
    let sends = [0, 1].map(|r| DeviceBuffer::from_slice(&ctxs[r], &[101i32 + r as i32]).unwrap());
    let mut recvs = ctxs
        .each_ref()
        .map(|c| DeviceBuffer::<i32>::zeroed(c, 2).unwrap());
    group(&nccl, || {
        for (r, recv) in recvs.iter_mut().enumerate() {
            comms[r].all_gather(&sends[r], recv, &streams[r])?;
        }
        Ok(())
    })
    .unwrap();
    for (r, recv) in recvs.iter().enumerate() {
        streams[r].synchronize().unwrap();
        assert_eq!(recv.to_vec().unwrap(), [101, 102]);
    }
}

#[test]
fn its_symbols_are_the_c_librarys_names_and_the_environment_shapes_the_machine() {
    const ME: &str = "its_symbols_are_the_c_librarys_names_and_the_environment_shapes_the_machine";
    if !is_child(ME) {
        let o = child(
            ME,
            &[
                ("CUDA_MOCK_DEVICES", "3"),
                ("CUDA_MOCK_DRIVER_VERSION", "12040"),
                ("NCCL_MOCK_VERSION", "2.21.5"),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        return;
    }
    type Init = unsafe extern "C" fn(u32) -> cuda_sys::CUresult;
    type Count = unsafe extern "C" fn(*mut i32) -> cuda_sys::CUresult;
    type Alloc = unsafe extern "C" fn(*mut u64, usize) -> cuda_sys::CUresult;
    type Version = unsafe extern "C" fn(*mut i32) -> cuda_sys::CUresult;
    type NcclVersion = unsafe extern "C" fn(*mut i32) -> nccl_sys::ncclResult_t;
    // SAFETY: loading the drop-in runs no initialiser of consequence.
    let lib = unsafe { libloading::Library::new(library()) }.unwrap();
    // SAFETY: each symbol has the signature its type says (cuda.h's and nccl.h's).
    unsafe {
        let init = lib.get::<Init>(b"cuInit").unwrap();
        let count = lib.get::<Count>(b"cuDeviceGetCount").unwrap();
        let version = lib.get::<Version>(b"cuDriverGetVersion").unwrap();
        let nccl_version = lib.get::<NcclVersion>(b"ncclGetVersion").unwrap();
        // The ABI variant, as a `dlsym` user such as cudarc asks for it.
        assert!(lib.get::<Alloc>(b"cuMemAlloc_v2").is_ok());
        let mut n = 0;
        assert_eq!(init(0), cuda_sys::CUresult::CUDA_SUCCESS);
        assert_eq!(count(&mut n), cuda_sys::CUresult::CUDA_SUCCESS);
        assert_eq!(n, 3);
        assert_eq!(version(&mut n), cuda_sys::CUresult::CUDA_SUCCESS);
        assert_eq!(n, 12040);
        assert_eq!(nccl_version(&mut n), nccl_sys::ncclResult_t::ncclSuccess);
        assert_eq!(n, 22105);
        let gpa = lib
            .get::<cuda_sys::PFN_cuGetProcAddress_v2>(b"cuGetProcAddress_v2")
            .unwrap();
        let ask = |name: &std::ffi::CStr, version: i32, flags: u64| {
            let mut p = std::ptr::null_mut();
            let mut status = cuda_sys::CUdriverProcAddressQueryResult(99);
            let rc = gpa(name.as_ptr(), &mut p, version, flags, &mut status);
            (rc, status, !p.is_null())
        };
        use cuda_sys::CUdriverProcAddressQueryResult as Q;
        use cuda_sys::CUresult as R;
        // cuFuncGetParamInfo came with 12.4, which this simulated driver is.
        assert_eq!(
            ask(c"cuFuncGetParamInfo", 12040, 0),
            (R::CUDA_SUCCESS, Q::CU_GET_PROC_ADDRESS_SUCCESS, true)
        );
        assert_eq!(
            ask(c"cuFuncGetParamInfo", 12030, 0),
            (
                R::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                false
            )
        );
        // Older ABIs (cuMemAlloc's 32-bit one) and the per-thread stream's variants: none.
        assert_eq!(
            ask(c"cuMemAlloc", 12000, 0),
            (R::CUDA_SUCCESS, Q::CU_GET_PROC_ADDRESS_SUCCESS, true)
        );
        assert_eq!(
            ask(c"cuMemAlloc", 3000, 0),
            (
                R::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                false
            )
        );
        assert_eq!(
            ask(c"cuMemAlloc", 12000, 2),
            (
                R::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                false
            )
        );
        // Newer than the simulated 12.4 driver, and unknown.
        assert_eq!(
            ask(c"cuStreamGetDevice", 12080, 0),
            (
                R::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                false
            )
        );
        assert_eq!(
            ask(c"cuNoSuchFunction", 12080, 0),
            (
                R::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                false
            )
        );
    }
}

#[test]
fn an_invalid_access_fails_the_process_at_exit_and_names_it() {
    const ME: &str = "an_invalid_access_fails_the_process_at_exit_and_names_it";
    if !is_child(ME) {
        let o = child(ME, &[]);
        assert_eq!(o.status.code(), Some(86), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("reported 1 invalid access(es)"), "{err}");
        assert!(err.contains("cuMemFree"), "{err}");
        return;
    }
    // SAFETY: the drop-in implements the driver API with the header's signatures.
    let driver = unsafe { cuda_sys::Driver::load_from(library()) }.unwrap();
    let f = driver.fns();
    let (mut dev, mut ctx, mut p) = (0, std::ptr::null_mut(), 0);
    // SAFETY: valid out-pointers; the second free is the invalid access under test, which
    // the simulator refuses (and reports) instead of performing.
    unsafe {
        (f.cuInit)(0);
        (f.cuDeviceGet)(&mut dev, 0);
        (f.cuDevicePrimaryCtxRetain)(&mut ctx, dev);
        (f.cuCtxSetCurrent)(ctx);
        (f.cuMemAlloc)(&mut p, 64);
        (f.cuMemFree)(p);
        (f.cuMemFree)(p);
    }
}

#[test]
fn a_bad_environment_is_said_and_every_call_fails() {
    const ME: &str = "a_bad_environment_is_said_and_every_call_fails";
    if !is_child(ME) {
        let o = child(ME, &[("CUDA_MOCK_DEVICES", "lots")]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("libsimgpu: CUDA_MOCK_DEVICES=\"lots\" is not a number"),
            "{}",
            stderr(&o)
        );
        return;
    }
    // SAFETY: as above.
    let err = unsafe { cuda_sys::Driver::load_from(library()) }.unwrap_err();
    // The first entry the loader asks for is not there: no machine, no table.
    assert!(
        err.to_string().contains("`cuDriverGetVersion` is missing"),
        "{err}"
    );
    // SAFETY: as above.
    let lib = unsafe { libloading::Library::new(library()) }.unwrap();
    type Init = unsafe extern "C" fn(u32) -> cuda_sys::CUresult;
    // SAFETY: `cuInit` has this signature; a call with no machine only returns an error.
    let rc = unsafe { lib.get::<Init>(b"cuInit").unwrap()(0) };
    assert_eq!(rc, cuda_sys::CUresult::CUDA_ERROR_NOT_INITIALIZED);
    // NCCL's string functions never return NULL, and do not here either.
    type ErrorString = unsafe extern "C" fn(nccl_sys::ncclResult_t) -> *const std::ffi::c_char;
    // SAFETY: `ncclGetErrorString` has this signature; the string it returns is static.
    let s = unsafe {
        let f = lib.get::<ErrorString>(b"ncclGetErrorString").unwrap();
        std::ffi::CStr::from_ptr(f(nccl_sys::ncclResult_t::ncclSuccess))
    };
    assert_eq!(
        s.to_str().unwrap(),
        "libsimgpu: no simulated machine (its environment is wrong: see stderr)"
    );
}

#[test]
fn cudarc_runs_on_it_unchanged() {
    const ME: &str = "cudarc_runs_on_it_unchanged";
    if !is_child(ME) {
        let dir = dropin_dir();
        let o = child(
            ME,
            &[
                ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
                ("CUDA_MOCK_DEVICES", "2"),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        return;
    }
    use cudarc::driver::CudaContext;
    // cudarc opens `libcuda.so` and `libnccl.so` by itself, through the library path.
    assert_eq!(CudaContext::device_count().unwrap(), 2);
    let ctxs = [0, 1].map(|d| CudaContext::new(d).unwrap());
    // Streams of their own: with the legacy default stream (a null handle), real NCCL
    // switches to the communicator's device first, which the simulated NCCL does not do yet.
    let streams: Vec<_> = ctxs.iter().map(|c| c.new_stream().unwrap()).collect();
    let comms = cudarc::nccl::Comm::from_devices(streams.clone()).unwrap();
    let sends = [0, 1].map(|r| streams[r].clone_htod(&[101i32 + r as i32]).unwrap());
    let mut recvs = [0, 1].map(|r| streams[r].alloc_zeros::<i32>(2).unwrap());
    cudarc::nccl::group_start().unwrap();
    for (r, recv) in recvs.iter_mut().enumerate() {
        if let Err(e) = comms[r].all_gather(&sends[r], recv) {
            panic!("{e:?}");
        }
    }
    cudarc::nccl::group_end().unwrap();
    for (r, recv) in recvs.iter().enumerate() {
        assert_eq!(streams[r].clone_dtoh(recv).unwrap(), [101, 102]);
    }
}

/// The state the exit handler of [`an_exit_handlers_free_is_checked_and_c_output_survives`]
/// uses: the table and the allocation it frees twice.
static AT_EXIT: OnceLock<(cuda_sys::DriverFns, u64)> = OnceLock::new();

extern "C" fn free_twice_at_exit() {
    let (f, p) = AT_EXIT.get().unwrap();
    // SAFETY: the second free is the invalid access under test, which the simulator
    // refuses (and reports) instead of performing.
    unsafe {
        (f.cuMemFree)(*p);
        (f.cuMemFree)(*p);
    }
}

#[test]
fn an_exit_handlers_free_is_checked_and_c_output_survives() {
    const ME: &str = "an_exit_handlers_free_is_checked_and_c_output_survives";
    if !is_child(ME) {
        let o = child(ME, &[]);
        assert_eq!(o.status.code(), Some(86), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("reported 1 invalid access(es)"),
            "{}",
            stderr(&o)
        );
        // C stdio's buffer (full: stdout is a pipe) was flushed before the exit status.
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("from C stdio, not flushed by the program"),
            "{out}"
        );
        return;
    }
    // Registered before the library is even loaded: exit handlers run in the reverse
    // order, so this one runs last of the program's, after any the library could register.
    // SAFETY: a function that stays in this binary.
    unsafe { libc::atexit(free_twice_at_exit) };
    // SAFETY: the drop-in implements the driver API with the header's signatures.
    let driver = unsafe { cuda_sys::Driver::load_from(library()) }.unwrap();
    let f = *driver.fns();
    let (mut ctx, mut p) = (std::ptr::null_mut(), 0);
    // SAFETY: valid out-pointers; `printf` gets a NUL-terminated format without arguments.
    unsafe {
        (f.cuInit)(0);
        (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
        (f.cuCtxSetCurrent)(ctx);
        (f.cuMemAlloc)(&mut p, 64);
        libc::printf(c"from C stdio, not flushed by the program\n".as_ptr());
    }
    AT_EXIT.set((f, p)).unwrap();
    std::mem::forget(driver);
}

#[test]
fn it_stays_loaded_after_dlclose() {
    let lib = library();
    // SAFETY: loading runs no initialiser of consequence; no symbol is used.
    let handle = unsafe { libloading::Library::new(&lib) }.unwrap();
    drop(handle);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        maps.contains(lib.to_str().unwrap()),
        "libsimgpu.so was unmapped by dlclose: its exit check would run in mid-process"
    );
}
