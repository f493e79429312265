//! One rank configured by its launcher's environment, on a GPU or a simulated device.

use std::sync::Arc;

use cuda_hal::Cuda;
use cuda_mock::MockWorld;
use nccl_channel::{Channel, ChannelBuilder, World};

use crate::setup::RankSetup;
use crate::{rendezvous, report, simulated, watch};

/// One rank's channel and what it runs on.
pub struct RankChannel {
    /// The rank's channel: its communicator and stream.
    pub channel: Channel,
    /// `rank R/N on GPU I (uuid), NCCL V`, or the simulated equivalent.
    pub line: String,
    /// The simulated driver (with no CUDA driver): its sanitizer's reports are checked
    /// by [`RankChannel::close`].
    sim: Option<MockWorld>,
}

impl RankChannel {
    /// Whether the rank runs on a simulated device.
    pub fn simulated(&self) -> bool {
        self.sim.is_some()
    }

    /// Closes the channel; on simulated devices, fails if the sanitizer saw an invalid
    /// access (so that a program run without a GPU still checks its memory accesses).
    pub fn close(self) -> Result<(), String> {
        self.channel.close().map_err(|e| report(&e))?;
        match self.sim {
            Some(gpus) if !gpus.violations().is_empty() => Err(format!(
                "the simulated driver's sanitizer reported:\n{}",
                gpus.violations().join("\n")
            )),
            _ => Ok(()),
        }
    }
}

/// One rank configured by its launcher's environment: on the GPU `--device` names (else
/// the local rank's); with no CUDA driver, on a simulated device of a simulated machine
/// with a device per rank, whose NCCL moves data between the processes over loopback. The
/// unique id comes as [`IdSource::Auto`](nccl_channel::IdSource::Auto) says
/// (`NCCL_COMM_ID`, or the launcher's rendezvous).
pub fn rank_channel(world: World, setup: &RankSetup) -> Result<RankChannel, String> {
    let mut b = ChannelBuilder::new().world(world);
    if let Some(d) = &setup.device {
        b = b.device(d.clone());
    }
    if let Some(c) = &setup.config {
        b = b.config(c.clone());
    }
    let (b, sim) = match Cuda::load() {
        Ok(cuda) => (b.cuda(cuda), None),
        Err(e) => {
            let m = simulated::machine(&world, setup)?;
            let b = b.cuda(m.cuda).nccl(Arc::new(m.nccl));
            (b, Some((m.gpus, simulated::why(&e))))
        }
    };
    let (b, waiting_for) = rendezvous::id_source(b, &world, setup.timeout)?;
    let built = watch::watched(world, &waiting_for, || b.build());
    let channel = built.map_err(|e| report(&e))?.ok_or("no world")?;
    let line = describe(&channel, sim.as_ref().map(|(_, why)| why.as_str()))?;
    let sim = sim.map(|(gpus, _)| gpus);
    Ok(RankChannel { channel, line, sim })
}

/// The rank's first line: where it runs, which NCCL, where the unique id came from; on a
/// simulated device (`simulated`: why there is no driver, or nothing), says so.
fn describe(channel: &Channel, simulated: Option<&str>) -> Result<String, String> {
    let (comm, dev) = (channel.comm(), channel.comm().context().device());
    let uuid = dev.uuid().map_err(|e| report(&e))?;
    let (rank, size, ordinal) = (comm.rank(), comm.size(), dev.ordinal());
    let (version, origin) = (comm.nccl().version(), channel.id_origin());
    Ok(match simulated {
        None => format!(
            "rank {rank}/{size} on GPU {ordinal} ({uuid}), NCCL {version}, unique id: {origin}"
        ),
        Some(why) => format!(
            "rank {rank}/{size} on simulated GPU {ordinal} ({uuid}), simulated NCCL {version} \
             across processes, unique id: {origin} (no CUDA driver{why})"
        ),
    })
}
