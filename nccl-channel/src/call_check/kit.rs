//! What a communicator keeps for the checked mode: made at its first check, reused after.

use cuda_hal::{DeviceBuffer, Stream};

/// What a communicator keeps for its checks: made at the first, reused after.
pub(crate) struct CheckKit {
    pub(crate) stream: Stream,
    pub(crate) send: DeviceBuffer<u64>,
    pub(crate) recv: DeviceBuffer<u64>,
}
