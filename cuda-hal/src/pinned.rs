//! [`PinnedBuffer`]: page-locked host memory, for fast and truly asynchronous copies.

use std::ops::{Deref, DerefMut};

use crate::{Context, DeviceRepr, Error, Result};

/// `len` elements of `T` in page-locked host memory, zero-initialised. Derefs to a slice.
///
/// The host side of copies that overlap with other work: an `*_async` copy returns at
/// once, and the pinned buffer is the memory the caller keeps unchanged meanwhile.
///
/// ```
/// use cuda_hal::{DeviceBuffer, PinnedBuffer, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// let mut host = PinnedBuffer::<u32>::zeroed(&ctx, 4)?;
/// assert_eq!(*host, [0; 4]);
/// host.copy_from_slice(&[1, 2, 3, 4]);
/// let mut dev = DeviceBuffer::<u32>::zeroed(&ctx, 4)?;
/// // SAFETY: `host` is neither changed nor dropped before the stream is synchronised.
/// unsafe { dev.copy_from_host_async(&host, &stream) }?;
/// stream.synchronize()?;
/// assert_eq!(dev.to_vec()?, [1, 2, 3, 4]);
/// drop(host);
/// assert_eq!(world.live().host_allocations, 0);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct PinnedBuffer<T: DeviceRepr> {
    ctx: Context,
    ptr: *mut T,
    len: usize,
}

// SAFETY: it owns its memory like a Box<[T]>.
unsafe impl<T: DeviceRepr> Send for PinnedBuffer<T> {}
// SAFETY: shared access only reads.
unsafe impl<T: DeviceRepr> Sync for PinnedBuffer<T> {}

impl<T: DeviceRepr> PinnedBuffer<T> {
    /// Allocates `len` zeroed elements.
    #[doc(alias = "cuMemAllocHost")]
    pub fn zeroed(ctx: &Context, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or(Error::SizeOverflow {
            count: len,
            size: size_of::<T>(),
        })?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let _g = ctx.bind()?;
        // SAFETY: valid out-pointer; a context is current. At least one byte so the
        // pointer is never dangling.
        unsafe { call!(ctx.cuda(), cuMemAllocHost(&mut p, bytes.max(1))) }?;
        // The driver promises a page (4 KiB), not `T`'s alignment: slices of a type aligned
        // to more would be misaligned.
        if !(p as usize).is_multiple_of(align_of::<T>()) {
            // SAFETY: allocated just above by cuMemAllocHost, freed once, never handed out.
            let _ = unsafe { (ctx.cuda().fns().cuMemFreeHost)(p) };
            return Err(Error::InvalidArgument {
                what: "PinnedBuffer::zeroed",
                problem: format!(
                    "the driver's page-locked memory at {p:p} is not aligned to the {} bytes \
                     the element type needs",
                    align_of::<T>()
                ),
            });
        }
        // SAFETY: `p` points at `bytes` writable bytes, aligned for `T` (checked above);
        // zero is a valid T (DeviceRepr).
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        Ok(PinnedBuffer {
            ctx: ctx.clone(),
            ptr: p.cast(),
            len,
        })
    }
}

impl<T: DeviceRepr> Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is aligned for `T` (checked when allocated) and holds `len`
        // initialised elements, which live as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: DeviceRepr> DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: DeviceRepr> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        let Ok(_g) = self.ctx.bind() else { return };
        // SAFETY: allocated by cuMemAllocHost and freed once.
        let _ = unsafe { (self.ctx.cuda().fns().cuMemFreeHost)(self.ptr.cast()) };
    }
}

impl<T: DeviceRepr> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .finish()
    }
}
