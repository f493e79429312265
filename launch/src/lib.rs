//! The launcher that nccl-channel's examples (`allgather`, `data_parallel`) and the
//! benchmark (`bench/`) share, so that each program is about its collectives and not
//! about starting processes.
//!
//! * [`rank_channel`](fn@rank_channel): one rank configured by its launcher's environment
//!   (ours, IREE's, torchrun, Slurm, Open MPI, PMI): the GPU it was given, or with no CUDA
//!   driver a simulated device whose NCCL reaches the other processes over loopback.
//! * [`processes`](fn@processes): `--nprocs N`, the one-machine shortcut: starts this
//!   executable `N` times, one rank per GPU (or simulated device), as torchrun would. Their
//!   rendezvous is authenticated by a secret made per launch, in a file only the launching
//!   user can read (`NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE`, unless the caller sets it), removed
//!   when the launch ends.
//! * [`machine`](fn@machine): whether those ranks get GPUs or simulated devices, said
//!   before they start.
//! * [`processes_replacing`](fn@processes_replacing) and [`rank_device`](fn@rank_device):
//!   elastic runs, where a killed rank's replacement is started on its device and a rank
//!   makes its communicators itself (several, or a grown one it joins).
//!
//! * [`dropin`]: host twins for a program's kernels when the driver is the drop-in
//!   simulator (cudarc and the safe crates on `libsimgpu.so`).
//!
//! A crate of the repository, never published: the examples that use it are not shipped
//! in nccl-channel's package either.

mod args;
mod device;
mod dispatch;
pub mod dropin;
mod elastic;
mod machine;
mod processes;
mod rank;
mod relay;
mod rendezvous;
mod report;
mod secret;
mod setup;
mod simulated;
mod watch;

pub use args::{parse_decimal, positive, seconds};
pub use device::{RankDevice, rank_device};
pub use dispatch::dispatch;
pub use elastic::{Replacement, processes_replacing};
pub use machine::{Machine, device_memory, machine};
pub use processes::{nprocs_in_a_world, processes};
pub use rank::{RankChannel, rank_channel};
pub use relay::Output;
pub use report::report;
pub use setup::RankSetup;
