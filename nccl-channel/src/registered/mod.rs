//! Registered memory: buffer registrations (`ncclCommRegister`, NCCL ≥ 2.19), windows
//! (`ncclCommWindowRegister`, NCCL ≥ 2.27) and the pool of NCCL memory that registers
//! itself: memory NCCL may map into its peers and use directly, instead of copying
//! through its own buffers. Its whole lifetime is here, from the adoption of what NCCL
//! made to the release through NCCL, on whatever thread its last holder lets go.
//!
//! The memory outlives its registration (the registration holds a shared owner of it,
//! [`DeviceSlice::keep_alive`](cuda_hal::DeviceSlice::keep_alive)) and the registration
//! holds its communicator. NCCL finds a registration by address (whole pages) when a
//! collective is enqueued, so every collective of the communicator notes, on each
//! registration whose pages its buffers overlap, the stream it runs on, and an open
//! capture or group holds the registration: a registration is released only after the
//! work that may use it is done, and never while a graph that recorded such work can
//! still be launched.
//!
//! Each file imports only those above it in this list, and none imports the
//! communicator, which depends on this module one way and comes in through two traits:
//!
//! * registry.rs: the core, what NCCL may find by address (registrations, releases
//!   queued for the owner's thread, pooled buffers not registered yet) and how each lets
//!   go on any thread; the communicator's shared state as [`CommState`].
//! * release.rs: adopting and releasing on the owner's thread, the communicator as
//!   [`CommOwner`].
//! * policy.rs: the table of which collectives and sizes register, [`PoolPolicy`]
//!   (imports nothing of these).
//! * pool.rs: the free buffers of [`Communicator::buffer`](crate::Communicator::buffer)
//!   and the [`PooledBuffer`]s it lends.
//!
//! The doors (`Communicator::register`, `register_window`, `buffer`, ...) are in
//! registration.rs and buffer.rs, on top of the communicator.

mod policy;
mod pool;
mod registry;
mod release;

pub use policy::{POOL_POLICY_ENV, PoolMemory, PoolPolicy};
pub(crate) use pool::Pool;
pub use pool::PooledBuffer;
pub(crate) use registry::{CommState, Kind, RegShared, Registry, Slot};
pub(crate) use release::{CommOwner, adopt, release_deferred, release_registration};
