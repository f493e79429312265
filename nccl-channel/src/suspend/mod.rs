//! Suspending a communicator (NCCL ≥ 2.29.7): NCCL releases its dynamic GPU memory while
//! the communicator is idle.
//!
//! * state.rs: whether a communicator is suspended and what may still run on it (below
//!   the communicator, which keeps one).
//! * calls.rs: [`Communicator::suspend`](crate::Communicator::suspend),
//!   [`resume`](crate::Communicator::resume) and the memory statistics.

pub(crate) mod calls;
pub(crate) mod state;
