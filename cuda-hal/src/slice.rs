//! [`DeviceSlice`]: "device memory holding `len` values of `T` in this context", the one
//! thing every copy, fill, kernel argument and collective takes, implemented by this
//! crate's buffers and views and by other crates for theirs.

use cuda_sys::CUdeviceptr;

use crate::{Context, Device, DeviceRepr, KeepAlive, Result, Stream};

/// Device memory holding [`len`](Self::len) values of [`Elem`](Self::Elem) in one
/// context, borrowed for as long as the value is.
///
/// Implemented by [`DeviceBuffer`](crate::DeviceBuffer), [`DeviceView`](crate::DeviceView),
/// [`DeviceViewMut`](crate::DeviceViewMut) and a module's [`Global`](crate::Global); other crates implement it for their own
/// buffers (a framework's tensor, another CUDA crate's slice) so that this crate and
/// `nccl-channel` can use that memory without owning it. [`DeviceView::new`](crate::DeviceView::new) and
/// [`DeviceViewMut::new`](crate::DeviceViewMut::new) then give ranges of it.
///
/// ```
/// use cuda_hal::{Context, DeviceBuffer, DeviceSlice, Result, Stream};
/// use cuda_hal::cuda_sys::CUdeviceptr;
///
/// /// Another crate's buffer, which keeps its memory in a `DeviceBuffer` here; a real one
/// /// would keep its own allocation and its own record of the streams that used it.
/// struct Tensor {
///     data: DeviceBuffer<f32>,
///     shape: Vec<usize>,
/// }
///
/// // SAFETY: every method forwards to the `DeviceBuffer`, which keeps the promises.
/// unsafe impl DeviceSlice for Tensor {
///     type Elem = f32;
///     fn device_ptr(&self) -> CUdeviceptr {
///         self.data.as_raw()
///     }
///     fn len(&self) -> usize {
///         self.data.len()
///     }
///     fn context(&self) -> &Context {
///         self.data.context()
///     }
///     fn used_on(&self, stream: &Stream) -> Result<()> {
///         self.data.used_on(stream)
///     }
///     fn used_synchronously(&self) -> Result<()> {
///         DeviceSlice::used_synchronously(&self.data)
///     }
/// }
/// // SAFETY: the memory is writable, and `&mut Tensor` is its only writer.
/// unsafe impl cuda_hal::DeviceSliceMut for Tensor {}
///
/// # let (cuda, _) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let mut t = Tensor { data: DeviceBuffer::zeroed(&ctx, 6)?, shape: vec![2, 3] };
/// let src = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0])?;
/// // Row 1 of the tensor, as a view; the copy takes any DeviceSlice.
/// let mut rows = cuda_hal::DeviceViewMut::new(&mut t).split_at_mut(3)?;
/// rows.1.copy_from(&src)?;
/// assert_eq!(t.data.to_vec()?, [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
///
/// # Safety
/// Implementors promise, for as long as the value is borrowed:
/// * `[device_ptr(), device_ptr() + len() * size_of::<Elem>())` is device memory of
///   [`context`](Self::context), readable from it, and the three values do not change.
///   (Any bit pattern is a valid `Elem`, so the contents may be anything.)
/// * Work that this crate or a crate built on it enqueues on a stream after
///   [`used_on`](Self::used_on) returned `Ok` for that stream may use the memory after
///   the borrow has ended: the memory stays allocated, and is not reused, until that
///   work has run. That includes work recorded by a capture of the stream, which runs
///   whenever its graph is launched for as long as the graph lives, and work deferred by
///   an open group, which is enqueued when the group ends: [`Stream::hold`] is how an
///   implementation learns of those (as [`DeviceBuffer::used_on`](crate::DeviceBuffer::used_on)
///   does). Memory that outlives every such graph and stream (a static pool) meets this
///   trivially.
/// * An owner that orders its own next use and its free after this crate's work with
///   events (cudarc does) learns when that work is really enqueued:
///   [`Stream::after_enqueue`] (registered in `used_on`) runs once the enqueueing call has
///   returned, or once an open group has ended; [`Dependency::launched`](crate::Dependency::launched)
///   after each launch of a graph that holds it. Memory that cannot be held (only
///   borrowed) refuses deferred work with [`Stream::expect_immediate`].
/// * [`used_synchronously`](Self::used_synchronously) returning `Ok` means synchronous
///   calls (which run on the context's legacy default stream and wait for it) may use the
///   memory now.
pub unsafe trait DeviceSlice: Sync {
    /// The element type.
    type Elem: DeviceRepr;

    /// The device address of the first element (any value when `len()` is 0).
    fn device_ptr(&self) -> CUdeviceptr;

    /// Number of elements.
    fn len(&self) -> usize;

    /// The context the memory belongs to.
    fn context(&self) -> &Context;

    /// Work about to be enqueued on `stream` uses this memory: keep it allocated until
    /// that work has run (see the trait's Safety section). Called with the stream's
    /// [`enqueue_lock`](Stream::enqueue_lock) held, before the work is enqueued; an `Err`
    /// means nothing is enqueued.
    fn used_on(&self, stream: &Stream) -> Result<()>;

    /// The work [`used_on`](Self::used_on) announced for `stream` has been enqueued (or
    /// its enqueueing call failed): called by every enqueueing call of this crate and
    /// nccl-channel right after the driver or NCCL call, while the value is still
    /// borrowed. An owner that orders its own next use after this crate's work with events
    /// (cudarc does) records them here. Inside an NCCL group the work is only enqueued at
    /// the group's end: for that, use [`Stream::after_enqueue`] with data of your own, or
    /// refuse groups ([`Stream::expect_immediate`]). The default does nothing.
    fn enqueued_on(&self, stream: &Stream) {
        let _ = stream;
    }

    /// A synchronous call is about to use this memory (e.g. an allocation made in stream
    /// order must be complete first). The default: nothing to do.
    fn used_synchronously(&self) -> Result<()> {
        Ok(())
    }

    /// A shared owner of the memory, for what must outlive the borrow without owning the
    /// value: an NCCL registration, which must be released before the memory is. `None`
    /// (the default): the memory cannot be held that way, and such users refuse it.
    fn keep_alive(&self) -> Option<KeepAlive> {
        None
    }

    /// Whether it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes (`len() * size_of::<Elem>()`, saturating).
    fn size_bytes(&self) -> usize {
        self.len().saturating_mul(size_of::<Self::Elem>())
    }

    /// The device the memory lives on.
    fn device(&self) -> &Device {
        self.context().device()
    }
}

/// [`DeviceSlice`] memory that may be written through `&mut self`: the output of copies,
/// fills, collectives and kernels that are given it mutably.
///
/// # Safety
/// The memory is writable device memory (not a read-only mapping), and whoever holds
/// `&mut` of the value may have the device write it.
///
/// Generic code that writes device memory takes it (see [`DeviceSlice`] for an
/// implementation):
///
/// ```
/// use cuda_hal::{DeviceBuffer, DeviceSliceMut, DeviceViewMut, Result};
///
/// /// Clears whatever device memory of `u32`s it is given.
/// fn clear<S: DeviceSliceMut<Elem = u32>>(memory: &mut S) -> Result<()> {
///     DeviceViewMut::new(memory).fill(0)
/// }
/// # let (cuda, _world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let mut buf = DeviceBuffer::from_slice(&ctx, &[1u32, 2, 3, 4])?;
/// clear(&mut buf.slice_mut(1..3)?)?;
/// assert_eq!(buf.to_vec()?, [1, 0, 0, 4]);
/// clear(&mut buf)?;
/// assert_eq!(buf.to_vec()?, [0; 4]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub unsafe trait DeviceSliceMut: DeviceSlice {}

/// Calls [`DeviceSlice::enqueued_on`] when dropped: made right after
/// [`used_on`](DeviceSlice::used_on) succeeded and kept until the enqueueing call is done,
/// so that the owner hears of the work on every path out of the call (an error, a panic).
///
/// ```
/// use cuda_hal::{DeviceBuffer, DeviceSlice, Enqueuing, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// let buf = DeviceBuffer::<u8>::zeroed(&ctx, 64)?;
/// {
///     let _order = stream.enqueue_lock();
///     buf.used_on(&stream)?;
///     let _enqueuing = Enqueuing::new(&buf, &stream);
///     let f = cuda.fns().cuMemsetD8Async;
///     // SAFETY: 64 bytes of live device memory of the stream's context, noted as used.
///     cuda.check(unsafe { f(buf.as_raw(), 7, 64, stream.as_raw()) }, "cuMemsetD8Async")?;
/// } // `buf.enqueued_on(&stream)`, then the lock's release
/// assert_eq!(buf.to_vec()?, [7; 64]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[must_use = "the owner hears of the work when this is dropped"]
pub struct Enqueuing<'a, S: DeviceSlice + ?Sized> {
    slice: &'a S,
    stream: &'a Stream,
}

impl<'a, S: DeviceSlice + ?Sized> Enqueuing<'a, S> {
    /// For `slice`, whose work on `stream` is about to be enqueued (its use already
    /// noted with [`used_on`](DeviceSlice::used_on)).
    #[inline]
    pub fn new(slice: &'a S, stream: &'a Stream) -> Self {
        Enqueuing { slice, stream }
    }

    /// Notes that work about to be enqueued on `stream` uses `slice`
    /// ([`used_on`](DeviceSlice::used_on)) and returns the guard that reports the enqueue:
    /// the one step a raw call takes before [`ptr`](Self::ptr) gives it the address, so
    /// that the use is noted before the pointer exists (cudarc's `device_ptr(&stream)`).
    ///
    /// # Errors
    /// What [`used_on`](DeviceSlice::used_on) refuses: work on `stream` that could outlive
    /// the memory (a capture or group it cannot be held for).
    #[inline]
    pub fn begin(slice: &'a S, stream: &'a Stream) -> Result<Self> {
        slice.used_on(stream)?;
        Ok(Enqueuing { slice, stream })
    }

    /// The slice's device address, for the one enqueueing call this guard covers.
    #[inline]
    pub fn ptr(&self) -> CUdeviceptr {
        // The one place an address for enqueued work is read: its use is noted already.
        #[allow(clippy::disallowed_methods)]
        self.slice.device_ptr()
    }

    /// The address, with the report of the enqueue left to the caller, who makes it
    /// itself once the work is enqueued (a kernel argument's `enqueued`, after the launch).
    #[inline]
    pub(crate) fn reported_by_caller(self) -> CUdeviceptr {
        let this = std::mem::ManuallyDrop::new(self);
        this.ptr()
    }

    /// The slice's length in elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// The slice's size in bytes.
    #[inline]
    pub fn size_bytes(&self) -> usize {
        self.slice.size_bytes()
    }

    /// Whether the slice holds no element.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

impl<S: DeviceSlice + ?Sized> Drop for Enqueuing<'_, S> {
    #[inline]
    fn drop(&mut self) {
        self.slice.enqueued_on(self.stream);
    }
}

impl<S: DeviceSlice + ?Sized> std::fmt::Debug for Enqueuing<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enqueuing")
            .field("len", &self.slice.len())
            .finish()
    }
}
