//! What a rank started by a launcher gets besides its environment: below both the rank's
//! setup (rank.rs) and the simulated machine (simulated.rs), which each read it.

use std::time::Duration;

use cuda_mock::MockDriver;
use nccl_channel::CommConfig;
use nccl_sys::NcclVersion;

/// How a rank configured by the environment is set up.
#[derive(Clone, Debug, Default)]
pub struct RankSetup {
    /// `--device`: the GPU (else the local rank's).
    pub device: Option<String>,
    /// The communicator's configuration.
    pub config: Option<CommConfig>,
    /// How long a rank waits for the others: for the unique id from a launcher's
    /// rendezvous (unless `NCCL_CHANNEL_RENDEZVOUS_TIMEOUT` says), and without a driver in
    /// the simulated NCCL.
    pub timeout: Option<Duration>,
    /// Without a driver: the version the simulated NCCL reports.
    pub sim_version: Option<NcclVersion>,
    /// Without a driver: what the simulated driver gets besides its devices (kernels).
    pub sim_driver: Option<fn(MockDriver) -> MockDriver>,
}
