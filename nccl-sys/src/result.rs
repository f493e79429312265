//! Names for `ncclResult_t` codes (NCCL has `ncclGetErrorString`, but no name function).

use crate::ncclResult_t;

impl ncclResult_t {
    /// The C name of the code (`"ncclInvalidArgument"`), or `"ncclUnknownResult"` for a
    /// code this header does not list.
    pub fn name(self) -> &'static str {
        match self {
            ncclResult_t::ncclSuccess => "ncclSuccess",
            ncclResult_t::ncclUnhandledCudaError => "ncclUnhandledCudaError",
            ncclResult_t::ncclSystemError => "ncclSystemError",
            ncclResult_t::ncclInternalError => "ncclInternalError",
            ncclResult_t::ncclInvalidArgument => "ncclInvalidArgument",
            ncclResult_t::ncclInvalidUsage => "ncclInvalidUsage",
            ncclResult_t::ncclRemoteError => "ncclRemoteError",
            ncclResult_t::ncclInProgress => "ncclInProgress",
            ncclResult_t::ncclTimeout => "ncclTimeout",
            _ => "ncclUnknownResult",
        }
    }
}
