//! The simulated machines nccl-channel's doc examples start from, so that an example's
//! hidden setup is one line (`# let doc_support::Ranks { comms, streams, .. } =
//! doc_support::ranks(2)?;`) and its visible code is what the reader needs. Not
//! published: the examples' visible code never names it.

use std::sync::Arc;

use cuda_hal::{Context, Cuda, Stream};
use cuda_mock::{MockDriver, MockWorld};
use nccl_channel::Communicator;
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::Nccl;

/// One simulated machine of `n` GPUs driven from one thread: its driver and NCCL (with
/// the simulations' handles), a primary context, a communicator of all of them (made
/// with `Communicator::init_all`) and a stream per rank.
#[derive(Debug)]
pub struct Ranks {
    /// The simulated driver.
    pub cuda: Cuda,
    /// The simulated GPUs' handle (call counts, leaks, violations).
    pub gpus: MockWorld,
    /// The simulated NCCL.
    pub nccl: Arc<Nccl>,
    /// The simulated NCCL's handle.
    pub world: MockNcclWorld,
    /// GPU r's primary context.
    pub ctxs: Vec<Context>,
    /// Rank r's communicator, on GPU r.
    pub comms: Vec<Communicator>,
    /// A stream of GPU r.
    pub streams: Vec<Stream>,
}

/// [`Ranks`] of `n` simulated GPUs.
///
/// ```
/// let doc_support::Ranks { comms, streams, .. } = doc_support::ranks(2)?;
/// assert_eq!((comms.len(), comms[1].rank(), streams.len()), (2, 1, 2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn ranks(n: usize) -> Result<Ranks, Box<dyn std::error::Error>> {
    let (cuda, gpus) = MockDriver::with_devices(n).build_with(Cuda::from_driver)?;
    let (nccl, world) = MockNccl::new(&gpus).build()?;
    let nccl = Arc::new(nccl);
    let ctxs = (0..n)
        .map(|d| cuda.device(d)?.primary_context())
        .collect::<Result<Vec<_>, _>>()?;
    let comms = Communicator::init_all(&nccl, &ctxs)?;
    let streams = ctxs
        .iter()
        .map(Stream::new)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Ranks {
        cuda,
        gpus,
        nccl,
        world,
        ctxs,
        comms,
        streams,
    })
}

/// One simulated GPU with its rank of a one-rank communicator: the machine most single-rank
/// examples start from.
#[derive(Debug)]
pub struct OneRank {
    /// The simulated driver.
    pub cuda: Cuda,
    /// The simulated GPU's handle (call counts, leaks, violations).
    pub gpus: MockWorld,
    /// The simulated NCCL.
    pub nccl: Arc<Nccl>,
    /// The simulated NCCL's handle.
    pub world: MockNcclWorld,
    /// The GPU's primary context.
    pub ctx: Context,
    /// The one-rank communicator.
    pub comm: Communicator,
    /// A stream of the GPU.
    pub stream: Stream,
}

/// [`OneRank`]: one simulated GPU, a one-rank communicator and a stream.
///
/// ```
/// let doc_support::OneRank { comm, stream, .. } = doc_support::one_rank()?;
/// assert_eq!((comm.rank(), comm.size()), (0, 1));
/// # drop(stream);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn one_rank() -> Result<OneRank, Box<dyn std::error::Error>> {
    let Ranks {
        cuda,
        gpus,
        nccl,
        world,
        mut ctxs,
        mut comms,
        mut streams,
    } = ranks(1)?;
    Ok(OneRank {
        cuda,
        gpus,
        nccl,
        world,
        ctx: ctxs.remove(0),
        comm: comms.remove(0),
        stream: streams.remove(0),
    })
}
