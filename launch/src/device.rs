//! One rank's device and NCCL without a communicator: for programs that make their
//! communicators themselves (several, or a grown one that a new process joins).

use std::sync::Arc;

use cuda_hal::{Context, Cuda};
use cuda_mock::MockWorld;
use nccl_channel::World;
use nccl_sys::Nccl;

use crate::setup::RankSetup;
use crate::{report, simulated};

/// A rank's device context and NCCL: the GPU `--device` names (else the local rank's)
/// and the NCCL library, or, without a CUDA driver, a simulated device whose NCCL reaches
/// the other processes over loopback (as [`rank_channel`](crate::rank_channel)).
pub struct RankDevice {
    /// The device's primary context.
    pub ctx: Context,
    /// The NCCL the rank's communicators use.
    pub nccl: Arc<Nccl>,
    /// `rank R/N on GPU I (uuid), NCCL V`, or the simulated equivalent.
    pub line: String,
    sim: Option<MockWorld>,
}

impl RankDevice {
    /// Whether the rank runs on a simulated device.
    pub fn simulated(&self) -> bool {
        self.sim.is_some()
    }

    /// On simulated devices, fails if the sanitizer saw an invalid access; call once the
    /// rank's communicators are closed.
    pub fn check(&self) -> Result<(), String> {
        match &self.sim {
            Some(gpus) if !gpus.violations().is_empty() => Err(format!(
                "the simulated driver's sanitizer reported:\n{}",
                gpus.violations().join("\n")
            )),
            _ => Ok(()),
        }
    }
}

/// The device and NCCL of rank `world.rank`, as [`RankDevice`] says.
pub fn rank_device(world: &World, setup: &RankSetup) -> Result<RankDevice, String> {
    let (cuda, nccl, sim) = match Cuda::load() {
        Ok(cuda) => {
            let nccl = nccl_channel::nccl().map_err(|e| report(&e))?;
            (cuda, nccl, None)
        }
        Err(e) => {
            let m = simulated::machine(world, setup)?;
            (m.cuda, Arc::new(m.nccl), Some((m.gpus, simulated::why(&e))))
        }
    };
    let selector = setup
        .device
        .clone()
        .unwrap_or_else(|| format!("cuda://{}", world.default_device()));
    let device = cuda.select(&selector).map_err(|e| report(&e))?;
    let ctx = device.primary_context().map_err(|e| report(&e))?;
    let uuid = device.uuid().map_err(|e| report(&e))?;
    let (rank, size, ordinal, version) = (world.rank, world.size, device.ordinal(), nccl.version());
    let line = match &sim {
        None => format!("rank {rank}/{size} on GPU {ordinal} ({uuid}), NCCL {version}"),
        Some((_, why)) => format!(
            "rank {rank}/{size} on simulated GPU {ordinal} ({uuid}), simulated NCCL {version} \
             across processes (no CUDA driver{why})"
        ),
    };
    Ok(RankDevice {
        ctx,
        nccl,
        line,
        sim: sim.map(|(gpus, _)| gpus),
    })
}
