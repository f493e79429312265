//! Questions a program asks NCCL: version, a communicator's size / device / rank, its
//! asynchronous error, and the error strings.

use std::ffi::{c_char, c_int};

use crate::macros::mock_fns;
use crate::world::world;
use nccl_sys::{ncclComm_t, ncclResult_t};

/// `ncclGetErrorString` and `ncclGetLastError`: declared by hand because they return
/// strings, not `ncclResult_t`, so [`mock_fns!`] does not fit them.
pub(super) fn strings_lookup<const W: usize>(name: &[u8]) -> *const std::ffi::c_void {
    if name == b"ncclGetErrorString" {
        let f: nccl_sys::signatures::ncclGetErrorString = get_error_string;
        return f as *const std::ffi::c_void;
    }
    if name == b"ncclGetLastError" {
        let f: nccl_sys::signatures::ncclGetLastError = get_last_error::<W>;
        return f as *const std::ffi::c_void;
    }
    std::ptr::null()
}

unsafe extern "C" fn get_error_string(rc: ncclResult_t) -> *const c_char {
    match rc {
        ncclResult_t::ncclSuccess => c"no error".as_ptr(),
        ncclResult_t::ncclUnhandledCudaError => c"unhandled cuda error (simulated)".as_ptr(),
        ncclResult_t::ncclSystemError => c"unhandled system error (simulated)".as_ptr(),
        ncclResult_t::ncclInternalError => c"internal error (simulated)".as_ptr(),
        ncclResult_t::ncclInvalidArgument => c"invalid argument (simulated)".as_ptr(),
        ncclResult_t::ncclInvalidUsage => c"invalid usage (simulated)".as_ptr(),
        ncclResult_t::ncclRemoteError => {
            c"remote process exited or there was a network error (simulated)".as_ptr()
        }
        ncclResult_t::ncclInProgress => c"NCCL operation in progress".as_ptr(),
        ncclResult_t::ncclTimeout => c"timeout (simulated)".as_ptr(),
        _ => c"unknown result code".as_ptr(),
    }
}

unsafe extern "C" fn get_last_error<const W: usize>(_comm: ncclComm_t) -> *const c_char {
    let Some(w) = world(W) else {
        return c"".as_ptr();
    };
    let s = w.lock();
    // The string lives in the world until the next error, as NCCL's does until the next call.
    s.last_error.as_ref().map_or(c"".as_ptr(), |e| e.as_ptr())
}

mock_fns! {
    fn ncclGetVersion = get_version(w, s, v: *mut c_int) {
        let _ = &s;
        if v.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *v = w.version };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommGetAsyncError = comm_get_async_error(w, s, comm: ncclComm_t, err: *mut ncclResult_t) {
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        if err.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        let mut e = match &c.clique {
            Some(cl) if cl.is_aborted() => ncclResult_t::ncclRemoteError,
            _ if c.slow_polls > 0 => {
                c.slow_polls -= 1;
                // SAFETY: checked non-null out-pointer.
                unsafe { *err = ncclResult_t::ncclInProgress };
                return ncclResult_t::ncclSuccess;
            }
            _ => c.async_err,
        };
        if e == ncclResult_t::ncclSuccess {
            // Completed operations leave the list; the first failure is reported.
            let mut failed = None;
            let mut failed_part = None;
            c.pending.retain(|d| match *d.lock().unwrap_or_else(|x| x.into_inner()) {
                Some(ncclResult_t::ncclSuccess) => false,
                Some(rc) => {
                    if failed.is_none() {
                        failed = Some(rc);
                        failed_part = Some(d.clone());
                    }
                    false
                }
                None => true,
            });
            // The failed collective's own disagreement, found by its number.
            let seq = failed_part.and_then(|f| {
                c.collectives
                    .iter()
                    .find(|(d, _)| std::sync::Arc::ptr_eq(d, &f))
                    .map(|(_, seq)| *seq)
            });
            c.collectives
                .retain(|(d, _)| d.lock().unwrap_or_else(|x| x.into_inner()).is_none());
            let why = match (failed, seq, &c.clique) {
                (Some(ncclResult_t::ncclInvalidUsage), Some(seq), Some(cl)) => cl.disagreement(seq),
                _ => None,
            };
            e = match failed {
                Some(rc) => rc,
                None if !c.pending.is_empty() => ncclResult_t::ncclInProgress,
                None => ncclResult_t::ncclSuccess,
            };
            if let Some(why) = why {
                s.error(why);
            }
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *err = e };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommCount = comm_count(w, s, comm: ncclComm_t, out: *mut c_int) {
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        if out.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = c.size as c_int };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommCuDevice = comm_cu_device(w, s, comm: ncclComm_t, out: *mut c_int) {
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        if out.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = c.device };
        ncclResult_t::ncclSuccess
    }
    fn ncclCommUserRank = comm_user_rank(w, s, comm: ncclComm_t, out: *mut c_int) {
        let c = match s.comm_mut(w, CALL, comm) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        if out.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = c.rank as c_int };
        ncclResult_t::ncclSuccess
    }
}
