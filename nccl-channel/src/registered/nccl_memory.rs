//! NCCL's own device memory (`ncclMemAlloc`, NCCL ≥ 2.19): memory NCCL can map into its
//! peers, which registrations and windows need to reach their fastest paths. It is an
//! ordinary [`DeviceBuffer`] (views, copies, kernels, every collective) whose release
//! calls `ncclMemFree`, under the same rule as all memory here: only after every stream
//! that used it is done and no graph or open group can touch it again.

use std::ffi::c_void;
use std::sync::Arc;

use cuda_hal::{Context, DeviceBuffer, DeviceRepr};
use cuda_sys::CUdeviceptr;
use nccl_sys::Nccl;

use crate::{Communicator, Error, Result};

/// Allocates `len` elements of `T` with `ncclMemAlloc` on `ctx`'s device.
///
/// [`Error::Unsupported`] below NCCL 2.19; an empty buffer allocates nothing. The memory
/// is uninitialised.
///
/// ```
/// use std::sync::Arc;
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_mock::MockNccl;
///
/// let (cuda, world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let (nccl, _) = MockNccl::new(&world).build()?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let mut buf = nccl_channel::alloc_nccl::<f32>(&Arc::new(nccl), &ctx, 4)?;
/// buf.copy_from_host(&[1.0, 2.0, 3.0, 4.0])?;
/// assert_eq!(buf.to_vec()?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(alias = "ncclMemAlloc")]
#[doc(alias = "ncclMemFree")]
pub fn alloc_nccl<T: DeviceRepr>(
    nccl: &Arc<Nccl>,
    ctx: &Context,
    len: usize,
) -> Result<DeviceBuffer<T>> {
    let (alloc, _) = optional!(nccl, ncclMemAlloc)?;
    let (free, _) = optional!(nccl, ncclMemFree)?;
    let bytes = len
        .checked_mul(size_of::<T>())
        .ok_or_else(|| Error::InvalidArgument {
            what: "alloc_nccl",
            problem: format!("{len} elements of {} bytes overflow", size_of::<T>()),
        })?;
    if bytes == 0 {
        return Ok(DeviceBuffer::alloc(ctx, len)?);
    }
    let _g = ctx.bind()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the device's context is current (NCCL allocates on
    // the current device).
    crate::check(nccl, unsafe { alloc(&mut p, bytes) }, "ncclMemAlloc", None)?;
    let ptr = p.expose_provenance() as CUdeviceptr;
    let owner = nccl.clone();
    let release = move |ptr: CUdeviceptr| {
        // SAFETY: allocated by this NCCL's ncclMemAlloc above and released once, after
        // all work on it is done (DeviceBuffer::from_raw_with's contract).
        unsafe { free(std::ptr::with_exposed_provenance_mut(ptr as usize)) };
        drop(owner);
    };
    // SAFETY: `bytes` bytes of device memory of `ctx`'s device, owned by nobody else,
    // released by exactly `ncclMemFree` of that address.
    Ok(unsafe { DeviceBuffer::from_raw_with(ctx, ptr, len, release) })
}

impl Communicator {
    /// NCCL memory ([`alloc_nccl`]) on this communicator's device: the memory that
    /// [`register`](Self::register) and [`register_window`](Self::register_window) serve
    /// best.
    #[doc(alias = "ncclMemAlloc")]
    pub fn alloc_nccl<T: DeviceRepr>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        alloc_nccl(self.nccl(), self.context(), len)
    }
}
