//! Handles as the opaque pointers NCCL hands out: ABI helpers with no state, a leaf every module that takes or gives a handle uses.

/// A handle value as the opaque pointer NCCL hands out (it is never dereferenced).
pub(crate) fn h2p<T>(h: usize) -> *mut T {
    std::ptr::without_provenance_mut(h)
}

/// An opaque handle pointer back to its value.
pub(crate) fn p2h<T>(p: *mut T) -> usize {
    p.addr()
}
