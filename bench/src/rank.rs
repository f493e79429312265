//! One rank's part in a run, however it was started (a thread, or a process of a
//! launcher): its communicator, its stream and how the ranks agree on a number.

use cuda_hal::Stream;
use nccl_channel::half::{bf16, f16};
use nccl_channel::{Communicator, Result};

use crate::options::Opts;
use crate::sweep::run_type;

/// One rank's view of the run: its communicator, stream and a way to agree on times.
pub(crate) struct Rank<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) stream: &'a Stream,
    /// The largest of every rank's value (a time, a count of wrong elements): called by
    /// every rank in the same order, as a collective.
    pub(crate) max_time: &'a dyn Fn(f64) -> Result<f64>,
}

/// Runs the whole sweep on this rank in the element type `-d` names.
pub(crate) fn run_rank(r: &Rank, o: &Opts) -> Result<()> {
    let mut out = String::new();
    match o.dtype.as_str() {
        "float" => run_type::<f32>(r, o, &mut out),
        "double" => run_type::<f64>(r, o, &mut out),
        "half" => run_type::<f16>(r, o, &mut out),
        "bfloat16" => run_type::<bf16>(r, o, &mut out),
        "int32" => run_type::<i32>(r, o, &mut out),
        "int8" => run_type::<i8>(r, o, &mut out),
        "uint8" => run_type::<u8>(r, o, &mut out),
        other => Err(nccl_channel::Error::InvalidArgument {
            what: "options",
            problem: format!("unknown -d {other}"),
        }),
    }
}
