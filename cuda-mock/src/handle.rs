//! Handles as the C API passes them, and out-pointer checks: ABI helpers with no state, a leaf every domain module uses.

use cuda_sys::CUresult;

/// A handle value as the opaque pointer the API passes around (never dereferenced).
pub(crate) fn h2p<T>(h: usize) -> *mut T {
    std::ptr::without_provenance_mut(h)
}

/// An opaque handle pointer back to its value.
pub(crate) fn p2h<T>(p: *mut T) -> usize {
    p.addr()
}

pub(crate) fn ok(r: Result<(), CUresult>) -> CUresult {
    match r {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e,
    }
}

pub(crate) fn check_ptr<T>(p: *const T) -> Result<(), CUresult> {
    if p.is_null() {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}
