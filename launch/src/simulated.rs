//! A rank's simulated machine, for a machine without a CUDA driver: the programs then
//! still run end to end (a smoke test, not a figure), their data moving between the
//! processes over loopback.

use cuda_hal::Cuda;
use cuda_mock::{MockDriver, MockWorld};
use nccl_channel::World;
use nccl_mock::MockNccl;
use nccl_sys::Nccl;

use crate::machine::{no_driver_reason, short};
use crate::setup::RankSetup;
use crate::{parse_decimal, report};

/// The most simulated devices a rank's machine gets for a `--device` ordinal beyond its
/// world (a real node has a handful; the simulated ones are cheap, but not free).
const MAX_SIMULATED: usize = 64;

/// A rank's simulated driver and NCCL.
pub(crate) struct Simulated {
    pub(crate) cuda: Cuda,
    pub(crate) nccl: Nccl,
    /// The simulated devices: their sanitizer's reports are checked when the rank closes.
    pub(crate) gpus: MockWorld,
}

/// A simulated machine with a device per rank of a one-node job (and for the ordinal
/// `--device` names), whose NCCL reaches the other processes over loopback.
pub(crate) fn machine(world: &World, setup: &RankSetup) -> Result<Simulated, String> {
    let driver = MockDriver::with_devices(devices(world, setup.device.as_deref()));
    let driver = match setup.sim_driver {
        Some(f) => f(driver),
        None => driver,
    };
    let (cuda, gpus) = driver
        .build_with(Cuda::from_driver)
        .map_err(|e| report(&e))?;
    let mut nccl = MockNccl::new(&gpus).multi_process(true);
    if let Some(t) = setup.timeout {
        nccl = nccl.timeout(t);
    }
    if let Some(v) = setup.sim_version {
        nccl = nccl.version(v);
    }
    let (nccl, _) = nccl.build().map_err(|e| report(&e))?;
    Ok(Simulated { cuda, nccl, gpus })
}

/// Enough devices for every rank of a one-node job and for the ordinal `device` names, up
/// to a machine's worth: a larger ordinal then matches no device and the selector's error
/// lists the ones there are (sizing the machine after any ordinal would take memory
/// without bound).
fn devices(world: &World, device: Option<&str>) -> usize {
    let wanted = device
        .and_then(|d| d.strip_prefix("cuda://"))
        .and_then(parse_decimal::<usize>)
        .map_or(0, |d| d.saturating_add(1));
    let n = world.size.max(world.default_device().saturating_add(1));
    if wanted <= MAX_SIMULATED.max(n) {
        n.max(wanted)
    } else {
        n
    }
}

/// What the rank's line adds after "no CUDA driver": nothing under our launcher, whose
/// first line already said why; a rank started alone says it briefly.
pub(crate) fn why(e: &cuda_hal::Error) -> String {
    match std::env::var_os("NCCL_CHANNEL_PROCID") {
        Some(_) => String::new(),
        None => format!(": {}", short(&no_driver_reason(e))),
    }
}
