//! Safe CUDA driver layer over [`cuda_sys`]'s run-time-loaded function table.
//!
//! * [`Cuda`]: the driver, loaded once, initialised, shared and cheap to clone.
//! * [`Device`]: by ordinal, by UUID ([`DeviceUuid`], printed as `nvidia-smi -L` does), by
//!   PCI bus id, or by a selector string such as `cuda://0` or `cuda://GPU-<uuid>`
//!   ([`DeviceSelector`]).
//! * [`Context`]: the device's primary context, retained by RAII; [`Context::bind`] makes
//!   it current on the calling thread, so one thread can drive several devices.
//! * [`Stream`], [`Event`], [`DeviceBuffer`], [`PinnedBuffer`].
//!
//! Every fallible call returns [`Error`], which keeps the driver's `CUresult`, its name
//! and its message. Drops never panic, and memory, streams and events hold their context,
//! so they are released before it.
//!
//! ```no_run
//! use cuda_hal::{Cuda, DeviceBuffer};
//! let cuda = Cuda::load()?;
//! let gpu = cuda.select("cuda://0")?;
//! let ctx = gpu.primary_context()?;
//! let buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2, 3])?;
//! assert_eq!(buf.to_vec()?, [1, 2, 3]);
//! # Ok::<(), cuda_hal::Error>(())
//! ```
//!
//! With the `mock` feature, [`Cuda::mock`] builds the same API over a simulated driver
//! ([`mock`]), for tests on machines without a GPU.

mod context;
mod cuda;
mod device;
mod error;
mod event;
mod graph;
mod memory;
mod pinned;
mod repr;
mod selector;
mod stream;

pub use context::{Context, CurrentGuard};
pub use cuda::Cuda;
pub use cuda_sys;
pub use device::Device;
pub use error::{Error, Result};
pub use event::Event;
pub use graph::{CaptureMode, Graph, GraphExec};
pub use memory::DeviceBuffer;
pub use pinned::PinnedBuffer;
pub use repr::DeviceRepr;
pub use selector::{DeviceSelector, DeviceUuid, PciBusId};
pub use stream::Stream;

/// The simulated driver (feature `mock`), re-exported from [`cuda_sys::mock`].
#[cfg(feature = "mock")]
pub mod mock {
    pub use cuda_sys::mock::*;
}
