//! [`DeviceView`] and [`DeviceViewMut`]: ranges of device memory, borrowed from a buffer
//! (or any [`DeviceSlice`]) and used wherever the whole buffer could be, under the same
//! lifetime rules: work on a view is noted on the memory it belongs to.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use cuda_sys::CUdeviceptr;

use crate::{Context, DeviceRepr, DeviceSlice, DeviceSliceMut, Error, KeepAlive, Result, Stream};

/// What a view's memory belongs to.
#[derive(Clone, Copy)]
enum Base<'a, T: DeviceRepr> {
    /// A buffer or another crate's memory: uses are noted there.
    Slice(&'a dyn DeviceSlice<Elem = T>),
    /// An address from `from_raw_parts`: the caller keeps the memory alive.
    Raw(&'a Context),
}

impl<'a, T: DeviceRepr> Base<'a, T> {
    #[inline]
    fn context(&self) -> &'a Context {
        match *self {
            Base::Slice(s) => s.context(),
            Base::Raw(c) => c,
        }
    }

    #[inline]
    fn used_on(&self, stream: &Stream) -> Result<()> {
        match self {
            Base::Slice(s) => s.used_on(stream),
            Base::Raw(_) => Ok(()),
        }
    }

    #[inline]
    fn enqueued_on(&self, stream: &Stream) {
        if let Base::Slice(s) = self {
            s.enqueued_on(stream);
        }
    }

    #[inline]
    fn used_synchronously(&self) -> Result<()> {
        match self {
            Base::Slice(s) => s.used_synchronously(),
            Base::Raw(_) => Ok(()),
        }
    }

    fn keep_alive(&self) -> Option<KeepAlive> {
        match self {
            Base::Slice(s) => s.keep_alive(),
            Base::Raw(_) => None,
        }
    }
}

/// `[start, end)` of a range over `len` elements, or why it does not fit.
fn bounds(
    what: &'static str,
    range: impl RangeBounds<usize>,
    len: usize,
) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        (s, e) => Err(Error::OutOfRange {
            what,
            start: s.unwrap_or(usize::MAX),
            end: e.unwrap_or(usize::MAX),
            len,
        }),
    }
}

fn chunk_size(what: &'static str, size: usize) -> Result<usize> {
    if size == 0 {
        return Err(Error::InvalidArgument {
            what,
            problem: "the chunk size must be at least 1".into(),
        });
    }
    Ok(size)
}

#[inline]
fn advance<T>(ptr: CUdeviceptr, elems: usize) -> CUdeviceptr {
    // In bounds of one allocation, so no overflow: checked by the callers.
    ptr + (elems * size_of::<T>()) as CUdeviceptr
}

/// A shared view of `len` elements of device memory: a range of a
/// [`DeviceBuffer`](crate::DeviceBuffer) or of any [`DeviceSlice`]. `Copy`, like `&[T]`.
///
/// Accepted wherever device memory is read (copies, kernel arguments, the send side of
/// collectives). Work on a view is noted on the memory it belongs to, so dropping the
/// buffer still waits for that work, and captures and groups keep the whole allocation
/// alive.
///
/// ```
/// # let (cuda, _) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// use cuda_hal::DeviceBuffer;
/// let buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2, 3, 4, 5])?;
/// let (head, tail) = buf.split_at(2)?;
/// assert_eq!(head.to_vec()?, [1, 2]);
/// assert_eq!(tail.slice(1..)?.to_vec()?, [4, 5]);
/// let sums: Vec<i32> = buf
///     .chunks(2)?
///     .map(|c| c.to_vec().map(|v| v.iter().sum()))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(sums, [3, 7, 5]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct DeviceView<'a, T: DeviceRepr> {
    base: Base<'a, T>,
    ptr: CUdeviceptr,
    len: usize,
}

/// An exclusive view of `len` elements of device memory: a range of a mutably borrowed
/// [`DeviceBuffer`](crate::DeviceBuffer) or of any [`DeviceSliceMut`]. Like `&mut [T]`:
/// [`split_at_mut`](Self::split_at_mut) and [`chunks_mut`](Self::chunks_mut) give
/// disjoint views, [`reborrow`](Self::reborrow) a shorter one.
///
/// Accepted wherever device memory is written (copies, fills, kernel arguments, the
/// receive side and in-place forms of collectives), under the same rules as
/// [`DeviceView`].
///
/// ```
/// # let (cuda, _) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// use cuda_hal::DeviceBuffer;
/// let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 6)?;
/// for (i, mut chunk) in buf.chunks_mut(2)?.enumerate() {
///     chunk.fill(i as u32 + 1)?;
/// }
/// let (left, mut right) = buf.split_at_mut(3)?;
/// right.reborrow().slice_mut(..1)?.copy_from(&left.into_view().slice(..1)?)?;
/// assert_eq!(buf.to_vec()?, [1, 1, 2, 1, 3, 3]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct DeviceViewMut<'a, T: DeviceRepr> {
    base: Base<'a, T>,
    ptr: CUdeviceptr,
    len: usize,
    _exclusive: PhantomData<&'a mut [T]>,
}

static_assertions::assert_impl_all!(DeviceView<'static, f32>: Send, Sync, Copy, std::fmt::Debug);
static_assertions::assert_impl_all!(DeviceViewMut<'static, f32>: Send, Sync, std::fmt::Debug);
static_assertions::assert_not_impl_any!(DeviceViewMut<'static, f32>: Clone);

impl<T: DeviceRepr> Clone for DeviceView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: DeviceRepr> Copy for DeviceView<'_, T> {}

impl<T: DeviceRepr> fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceView")
            .field("device", &self.base.context().device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<T: DeviceRepr> fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("device", &self.base.context().device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<'a, T: DeviceRepr> DeviceView<'a, T> {
    /// A view of all of `memory`.
    pub fn new<S: DeviceSlice<Elem = T>>(memory: &'a S) -> Self {
        DeviceView {
            base: Base::Slice(memory),
            // The base of a range, checked and kept; enqueued work takes its address
            // through `Enqueuing`.
            #[allow(clippy::disallowed_methods)]
            ptr: memory.device_ptr(),
            len: memory.len(),
        }
    }

    /// A view of `len` elements at `ptr` in `ctx`, for memory that only has an address
    /// (another library's allocation). Nothing of it is tracked: the caller keeps it alive.
    ///
    /// # Safety
    /// For `'a`, `[ptr, ptr + len * size_of::<T>())` is readable device memory of `ctx`;
    /// and it stays allocated until all work enqueued with this view (or views made of it)
    /// has run, including the launches of graphs captured with it and work deferred by a
    /// group, which may run after `'a` (see [`DeviceSlice`]'s Safety section).
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, DeviceView};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// // Memory another library allocated and keeps, known only by its address.
    /// let theirs = DeviceBuffer::from_slice(&ctx, &[4i32, 5, 6])?;
    /// let ptr = theirs.as_raw();
    /// // SAFETY: 3 readable `i32`s of `ctx` at `ptr`, allocated until `theirs` goes,
    /// // after every use of the view below (all synchronous).
    /// let view = unsafe { DeviceView::<i32>::from_raw_parts(&ctx, ptr, 3) };
    /// let mut mine = DeviceBuffer::<i32>::zeroed(&ctx, 2)?;
    /// mine.copy_from(&view.slice(1..)?)?;
    /// assert_eq!(mine.to_vec()?, [5, 6]);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[must_use]
    pub unsafe fn from_raw_parts(ctx: &'a Context, ptr: CUdeviceptr, len: usize) -> Self {
        DeviceView {
            base: Base::Raw(ctx),
            ptr,
            len,
        }
    }

    /// Elements `range` of this view (`Error::OutOfRange` if it does not fit).
    pub fn slice(self, range: impl RangeBounds<usize>) -> Result<Self> {
        let (s, e) = bounds("DeviceView::slice", range, self.len)?;
        Ok(DeviceView {
            base: self.base,
            ptr: advance::<T>(self.ptr, s),
            len: e - s,
        })
    }

    /// `[0, mid)` and `[mid, len)`.
    pub fn split_at(self, mid: usize) -> Result<(Self, Self)> {
        let (_, m) = bounds("DeviceView::split_at", ..mid, self.len)?;
        Ok((
            DeviceView { len: m, ..self },
            DeviceView {
                base: self.base,
                ptr: advance::<T>(self.ptr, m),
                len: self.len - m,
            },
        ))
    }

    /// Consecutive views of `size` elements (the last may be shorter); `size` 0 is an
    /// error.
    pub fn chunks(self, size: usize) -> Result<Chunks<'a, T>> {
        Ok(Chunks {
            rest: self,
            size: chunk_size("DeviceView::chunks", size)?,
        })
    }

    pub(crate) fn base_used_synchronously(&self) -> Result<()> {
        crate::Stream::refuse_synchronous_use(self.context())?;
        self.base.used_synchronously()
    }
}

impl<'a, T: DeviceRepr> DeviceViewMut<'a, T> {
    /// An exclusive view of all of `memory`.
    pub fn new<S: DeviceSliceMut<Elem = T>>(memory: &'a mut S) -> Self {
        let memory: &'a S = memory;
        DeviceViewMut {
            base: Base::Slice(memory),
            // The base of a range, checked and kept; enqueued work takes its address
            // through `Enqueuing`.
            #[allow(clippy::disallowed_methods)]
            ptr: memory.device_ptr(),
            len: memory.len(),
            _exclusive: PhantomData,
        }
    }

    /// An exclusive view of `len` elements at `ptr` in `ctx` (see
    /// [`DeviceView::from_raw_parts`]).
    ///
    /// # Safety
    /// As for [`DeviceView::from_raw_parts`], and the memory is writable, and nothing
    /// else writes or reads it through the host for `'a` without ordering against the
    /// work enqueued with this view.
    #[must_use]
    pub unsafe fn from_raw_parts(ctx: &'a Context, ptr: CUdeviceptr, len: usize) -> Self {
        DeviceViewMut {
            base: Base::Raw(ctx),
            ptr,
            len,
            _exclusive: PhantomData,
        }
    }

    /// A shared view of the same elements, for as long as this one is borrowed.
    #[must_use]
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            base: self.base,
            ptr: self.ptr,
            len: self.len,
        }
    }

    /// Turns this view into a shared one for the rest of `'a`.
    #[must_use]
    pub fn into_view(self) -> DeviceView<'a, T> {
        DeviceView {
            base: self.base,
            ptr: self.ptr,
            len: self.len,
        }
    }

    /// A shorter-lived exclusive view of the same elements (to slice without giving this
    /// one up).
    pub fn reborrow(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            base: self.base,
            ptr: self.ptr,
            len: self.len,
            _exclusive: PhantomData,
        }
    }

    /// Elements `range` of this view (`Error::OutOfRange` if it does not fit).
    pub fn slice_mut(self, range: impl RangeBounds<usize>) -> Result<Self> {
        let (s, e) = bounds("DeviceViewMut::slice_mut", range, self.len)?;
        Ok(DeviceViewMut {
            base: self.base,
            ptr: advance::<T>(self.ptr, s),
            len: e - s,
            _exclusive: PhantomData,
        })
    }

    /// `[0, mid)` and `[mid, len)`, both exclusive.
    pub fn split_at_mut(self, mid: usize) -> Result<(Self, Self)> {
        let (_, m) = bounds("DeviceViewMut::split_at_mut", ..mid, self.len)?;
        Ok((
            DeviceViewMut {
                base: self.base,
                ptr: self.ptr,
                len: m,
                _exclusive: PhantomData,
            },
            DeviceViewMut {
                base: self.base,
                ptr: advance::<T>(self.ptr, m),
                len: self.len - m,
                _exclusive: PhantomData,
            },
        ))
    }

    /// Consecutive exclusive views of `size` elements (the last may be shorter); `size` 0
    /// is an error.
    pub fn chunks_mut(self, size: usize) -> Result<ChunksMut<'a, T>> {
        Ok(ChunksMut {
            rest: Some(self),
            size: chunk_size("DeviceViewMut::chunks_mut", size)?,
        })
    }

    pub(crate) fn base_used_synchronously(&self) -> Result<()> {
        crate::Stream::refuse_synchronous_use(self.context())?;
        self.base.used_synchronously()
    }
}

/// The views of [`DeviceView::chunks`].
///
/// ```
/// use cuda_hal::DeviceBuffer;
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let buf = DeviceBuffer::from_slice(&ctx, &[1u8, 2, 3, 4, 5, 6, 7])?;
/// let chunks = buf.chunks(3)?;
/// assert_eq!(chunks.len(), 3);
/// let lens: Vec<usize> = chunks.map(|c| c.len()).collect();
/// assert_eq!(lens, [3, 3, 1]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Chunks<'a, T: DeviceRepr> {
    rest: DeviceView<'a, T>,
    size: usize,
}

impl<'a, T: DeviceRepr> Iterator for Chunks<'a, T> {
    type Item = DeviceView<'a, T>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len == 0 {
            return None;
        }
        let n = self.size.min(self.rest.len);
        let head = DeviceView {
            len: n,
            ..self.rest
        };
        self.rest = DeviceView {
            base: self.rest.base,
            ptr: advance::<T>(self.rest.ptr, n),
            len: self.rest.len - n,
        };
        Some(head)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.len.div_ceil(self.size);
        (n, Some(n))
    }
}

impl<T: DeviceRepr> ExactSizeIterator for Chunks<'_, T> {}

/// The views of [`DeviceViewMut::chunks_mut`]: disjoint, so each can be written on its
/// own stream.
///
/// ```
/// use cuda_hal::{DeviceBuffer, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let streams = [Stream::non_blocking(&ctx)?, Stream::non_blocking(&ctx)?];
/// let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 6)?;
/// for (i, mut part) in buf.chunks_mut(3)?.enumerate() {
///     part.fill_async(10 + i as u32, &streams[i])?;
/// }
/// buf.synchronize_uses()?;
/// assert_eq!(buf.to_vec()?, [10, 10, 10, 11, 11, 11]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Debug)]
pub struct ChunksMut<'a, T: DeviceRepr> {
    rest: Option<DeviceViewMut<'a, T>>,
    size: usize,
}

impl<'a, T: DeviceRepr> Iterator for ChunksMut<'a, T> {
    type Item = DeviceViewMut<'a, T>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest.take()?;
        if rest.len == 0 {
            return None;
        }
        let n = self.size.min(rest.len);
        let (head, tail) = (
            DeviceViewMut {
                base: rest.base,
                ptr: rest.ptr,
                len: n,
                _exclusive: PhantomData,
            },
            DeviceViewMut {
                base: rest.base,
                ptr: advance::<T>(rest.ptr, n),
                len: rest.len - n,
                _exclusive: PhantomData,
            },
        );
        self.rest = Some(tail);
        Some(head)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.as_ref().map_or(0, |r| r.len.div_ceil(self.size));
        (n, Some(n))
    }
}

impl<T: DeviceRepr> ExactSizeIterator for ChunksMut<'_, T> {}

/// The accessors both view types have.
macro_rules! view_accessors {
    ($view:ident) => {
        impl<'a, T: DeviceRepr> $view<'a, T> {
            /// Number of elements.
            #[inline]
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether it holds no element.
            #[inline]
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The device address of the first element.
            #[inline]
            pub fn as_raw(&self) -> CUdeviceptr {
                self.ptr
            }

            /// The context the memory belongs to.
            #[inline]
            pub fn context(&self) -> &'a Context {
                self.base.context()
            }
        }
    };
}
view_accessors!(DeviceView);
view_accessors!(DeviceViewMut);

/// `DeviceSlice` for both view types: the range's own address and length, everything
/// else from the memory it was taken of.
macro_rules! view_slice {
    ($view:ident) => {
        // SAFETY: a range inside memory that the base promises for 'a (checked by
        // `bounds`), or raw memory the caller of `from_raw_parts` vouched for; uses are
        // noted on the base.
        unsafe impl<T: DeviceRepr> DeviceSlice for $view<'_, T> {
            type Elem = T;
            #[inline]
            fn device_ptr(&self) -> CUdeviceptr {
                self.ptr
            }
            #[inline]
            fn len(&self) -> usize {
                self.len
            }
            #[inline]
            fn context(&self) -> &Context {
                self.base.context()
            }
            #[inline]
            fn used_on(&self, stream: &Stream) -> Result<()> {
                self.base.used_on(stream)
            }
            #[inline]
            fn enqueued_on(&self, stream: &Stream) {
                self.base.enqueued_on(stream)
            }
            #[inline]
            fn used_synchronously(&self) -> Result<()> {
                self.base.used_synchronously()
            }
            fn keep_alive(&self) -> Option<KeepAlive> {
                self.base.keep_alive()
            }
        }
    };
}
view_slice!(DeviceView);
view_slice!(DeviceViewMut);

// SAFETY: made from `&mut` of writable memory (or raw memory vouched writable), and the
// ranges handed out by splitting are disjoint.
unsafe impl<T: DeviceRepr> DeviceSliceMut for DeviceViewMut<'_, T> {}

#[cfg(test)]
mod tests {
    use super::bounds;

    #[test]
    fn bounds_follow_slice_rules() {
        assert_eq!(bounds("t", .., 5).ok(), Some((0, 5)));
        assert_eq!(bounds("t", 1..3, 5).ok(), Some((1, 3)));
        assert_eq!(bounds("t", 1..=3, 5).ok(), Some((1, 4)));
        assert_eq!(bounds("t", 5.., 5).ok(), Some((5, 5)));
        assert_eq!(
            bounds(
                "t",
                (std::ops::Bound::Excluded(1), std::ops::Bound::Unbounded),
                5
            )
            .ok(),
            Some((2, 5))
        );
        let e = bounds("t", 3..6, 5).unwrap_err();
        assert_eq!(
            e,
            crate::Error::OutOfRange {
                what: "t",
                start: 3,
                end: 6,
                len: 5
            }
        );
        assert_eq!(
            bounds(
                "t",
                (std::ops::Bound::Included(4), std::ops::Bound::Excluded(2)),
                5
            ),
            Err(crate::Error::OutOfRange {
                what: "t",
                start: 4,
                end: 2,
                len: 5
            })
        );
        assert_eq!(
            bounds("t", ..=usize::MAX, 5),
            Err(crate::Error::OutOfRange {
                what: "t",
                start: 0,
                end: usize::MAX,
                len: 5
            })
        );
    }
}
