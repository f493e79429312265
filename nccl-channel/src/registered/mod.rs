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
//! The files below the communicator (it depends on them one way, and they see it only
//! through two traits); each imports only those above it in this list:
//!
//! * registry.rs: the core, what NCCL may find by address (registrations, releases
//!   queued for the owner's thread, pooled buffers not registered yet) and how each lets
//!   go on any thread; the communicator's shared state as `CommState`.
//! * release.rs: adopting and releasing on the owner's thread, the communicator as
//!   `CommOwner`.
//! * policy.rs: the table of which collectives and sizes register, [`PoolPolicy`](crate::PoolPolicy)
//!   (imports nothing of these).
//! * pool.rs: the free buffers of [`Communicator::buffer`](crate::Communicator::buffer)
//!   and the [`PooledBuffer`](crate::PooledBuffer)s it lends.
//!
//! The communicator's methods that make them, on top of the communicator:
//!
//! * register.rs: [`Communicator::register`](crate::Communicator::register) and
//!   [`register_window`](crate::Communicator::register_window).
//! * pool_methods.rs: the pool's methods on the communicator,
//!   [`Communicator::buffer`](crate::Communicator::buffer) first.
//! * nccl_memory.rs: [`alloc_nccl`](crate::alloc_nccl), NCCL's own memory
//!   (`ncclMemAlloc`).
//! * symmetric.rs: [`Communicator::symmetric`](crate::Communicator::symmetric), NCCL
//!   memory every rank allocates together as a symmetric window.

pub(crate) mod nccl_memory;
pub(crate) mod policy;
pub(crate) mod pool;
pub(crate) mod pool_methods;
pub(crate) mod register;
pub(crate) mod registry;
pub(crate) mod release;
pub(crate) mod symmetric;
