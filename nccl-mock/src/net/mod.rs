//! The multi-process mode ([`MockNccl::multi_process`](crate::MockNccl::multi_process)):
//! ranks in separate processes, each with its own simulated driver and NCCL, form one
//! communicator over loopback TCP.
//!
//! As NCCL's bootstrap root does, a *hub* coordinates one communicator: it is started by
//! `ncclGetUniqueId` (listening on `127.0.0.1:0`, its address in the id) or, with
//! `NCCL_COMM_ID=host:port`, by rank 0's init on that address. Every rank connects to it
//! ([`Link`](link::Link)), ships the bytes its parts read of its send buffers, and writes
//! what the hub computed into its receive buffers; the hub runs each collective with the
//! same code as one process does (`parts::move_data`), so both modes give the same
//! results. A rank's init joins its hub in `rendezvous` (`join`, `new_hub_id`).
//!
//! - [`wire`]: the messages and their framing.
//! - [`hub`]: rank 0's coordinator.
//! - [`link`]: a rank's connection to it.
//! - [`shrink`]: a shrink's survivors meeting at a new hub.
//! - [`split`]: the ranks of each color of a split meeting at a new hub.
//! - [`thread`]: the count of the mode's threads.
//! - [`exit`]: what a process's end does: its links leave, a hub's process waits for its
//!   ranks.

mod exit;
pub(crate) mod hub;
pub(crate) mod link;
pub(crate) mod shrink;
pub(crate) mod split;
mod thread;
mod wire;

pub use thread::network_threads;
