//! One rank's part in a run, however it was started (a thread, or a process of a
//! launcher): its communicator, its stream and how the ranks agree on a number.

use cuda_hal::Stream;
use nccl_channel::{Communicator, Result};

/// One rank's view of the run: its communicator, stream and a way to agree on times.
pub(crate) struct Rank<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) stream: &'a Stream,
    /// The largest of every rank's value (a time, a count of wrong elements): called by
    /// every rank in the same order, as a collective.
    pub(crate) max_time: &'a dyn Fn(f64) -> Result<f64>,
}
