//! Copies and fills on views: the one implementation behind
//! [`DeviceBuffer`](crate::DeviceBuffer)'s copies too.
//!
//! Synchronous copies and fills are complete, for every stream, when they return (they
//! wait for the context's legacy default stream). The `*_on` copies are ordered on a
//! stream and wait for it before returning, so the host memory they borrow is never used
//! after the borrow ends; the `unsafe` `*_async` host copies do not wait. Device-only
//! work on a stream (`copy_from_async`, `fill_async`) is safe: the memory is noted as used
//! there.

use std::mem::size_of;

use crate::{Context, DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut, Error, Result, Stream};

/// `Ok` when the `buffer` given holds `got` elements, the `expected` of the memory it is
/// copied to or from.
fn check_len(what: &'static str, buffer: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what,
            buffer,
            expected,
            got,
        })
    }
}

/// Waits for the legacy default stream of `ctx` (bound by the caller): the "synchronous"
/// copies and memsets run there and may still be in flight when the call returns.
fn finish(ctx: &Context) -> Result<()> {
    // SAFETY: the null stream with our context current (callers hold the guard).
    unsafe { call!(ctx.cuda(), cuStreamSynchronize(std::ptr::null_mut())) }
}

/// `value`'s bytes, when they are one byte, two or four repeated (a memset can write them).
enum Pattern {
    D8(u8),
    D16(u16),
    D32(u32),
    Other,
}

fn pattern<T: DeviceRepr>(value: T) -> Pattern {
    let size = size_of::<T>();
    if size == 0 {
        // Zero-sized elements have no bytes to set.
        return Pattern::D8(0);
    }
    if size > 16 {
        return Pattern::Other;
    }
    let mut bytes = [0u8; 16];
    // SAFETY: `value` is `size` bytes of plain data (DeviceRepr: no padding).
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), bytes.as_mut_ptr(), size)
    };
    let p = &bytes[..size];
    let repeats = |n: usize| size.is_multiple_of(n) && p.chunks(n).all(|c| c == &p[..n]);
    if repeats(1) {
        Pattern::D8(p[0])
    } else if repeats(2) {
        Pattern::D16(u16::from_ne_bytes([p[0], p[1]]))
    } else if repeats(4) {
        Pattern::D32(u32::from_ne_bytes([p[0], p[1], p[2], p[3]]))
    } else {
        Pattern::Other
    }
}

impl<T: DeviceRepr> DeviceView<'_, T> {
    /// Size in bytes.
    #[inline]
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.len() * size_of::<T>()
    }

    /// Downloads into `dst` (same length).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        check_len("copy_to_host", "host", self.len(), dst.len())?;
        // SAFETY: `dst` is `len` initialised elements, so also `len` writable slots.
        unsafe { self.download(dst.as_mut_ptr()) }
    }

    /// Downloads into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(self.len());
        // SAFETY: the spare capacity holds `len` slots; no reference to them is made
        // before they are written.
        unsafe { self.download(v.as_mut_ptr()) }?;
        // SAFETY: the copy wrote all `len` elements, and T is DeviceRepr: any bit
        // pattern is a valid T.
        unsafe { v.set_len(self.len()) };
        Ok(v)
    }

    /// Downloads into `dst`, which must have room for `len` elements (initialised or
    /// not): any bit pattern the copy writes is a valid `T`.
    ///
    /// # Safety
    /// `dst` is valid for writes of `len` elements.
    unsafe fn download(&self, dst: *mut T) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.base_used_synchronously()?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        // SAFETY: the caller's `dst` holds `size_bytes()` writable bytes; the source is
        // the view's memory.
        unsafe {
            call!(
                ctx.cuda(),
                cuMemcpyDtoH(dst.cast(), self.as_raw(), self.size_bytes())
            )
        }
    }

    /// Downloads into `dst` on `stream`, in stream order, and waits for the stream.
    /// Refused while the stream is captured; no capture can begin until the wait is over.
    pub fn copy_to_host_on(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        let _order = stream.enqueue_lock();
        stream.refuse_host_wait("copy_to_host_on")?;
        // SAFETY: we wait for the stream before `dst`'s borrow ends (also when the wait
        // fails: `synchronize_for_borrow` returns only once no copy into `dst` can run),
        // holding the stream's order lock throughout, so no capture records the host
        // address.
        unsafe { self.download_locked(dst, stream) }?;
        stream.synchronize_for_borrow()
    }

    /// Enqueues a download into `dst` on `stream` and returns at once.
    ///
    /// # Safety
    /// `dst` must stay alive and unread until the stream has done the copy; if the stream
    /// is being captured, for as long as the graph can be launched.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub unsafe fn copy_to_host_async(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        let _order = stream.enqueue_lock();
        // SAFETY: the caller's contract.
        unsafe { self.download_locked(dst, stream) }
    }

    /// The download, with the stream's order lock held by the caller.
    ///
    /// # Safety
    /// As for [`copy_to_host_async`](Self::copy_to_host_async).
    unsafe fn download_locked(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        check_len("copy_to_host_async", "host", self.len(), dst.len())?;
        stream.same_context(self.context(), "copy_to_host_async")?;
        if self.is_empty() {
            return Ok(());
        }
        let from = crate::Enqueuing::begin(self, stream)?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        // SAFETY: ranges as for the synchronous copy; the caller keeps `dst` alive.
        unsafe {
            call!(
                ctx.cuda(),
                cuMemcpyDtoHAsync(
                    dst.as_mut_ptr().cast(),
                    from.ptr(),
                    self.size_bytes(),
                    stream.as_raw()
                )
            )
        }
    }
}

impl<T: DeviceRepr> DeviceViewMut<'_, T> {
    /// Size in bytes.
    #[inline]
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.len() * size_of::<T>()
    }

    /// Downloads into `dst` (same length).
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.as_view().copy_to_host(dst)
    }

    /// Downloads into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_view().to_vec()
    }

    /// Uploads `src` (same length).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        check_len("copy_from_host", "host", self.len(), src.len())?;
        if self.is_empty() {
            return Ok(());
        }
        self.base_used_synchronously()?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        // SAFETY: `src` holds `size_bytes()` readable bytes; the destination is the
        // view's memory.
        unsafe {
            call!(
                ctx.cuda(),
                cuMemcpyHtoD(self.as_raw(), src.as_ptr().cast(), self.size_bytes())
            )
        }?;
        finish(ctx)
    }

    /// Copies `src` (same length) into this memory; across devices through
    /// `cuMemcpyPeer`.
    #[doc(alias = "cuMemcpyDtoD")]
    pub fn copy_from<S: DeviceSlice<Elem = T> + ?Sized>(&mut self, src: &S) -> Result<()> {
        check_len("copy_from", "source", self.len(), src.len())?;
        if self.is_empty() {
            return Ok(());
        }
        self.base_used_synchronously()?;
        src.used_synchronously()?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        // A synchronous copy (no stream, nothing left enqueued): its memory was made ready by
        // `used_synchronously` above.
        #[allow(clippy::disallowed_methods)]
        let from = src.device_ptr();
        if src.context() == ctx {
            // SAFETY: both ranges are device memory of `size_bytes()` (DeviceSlice).
            unsafe {
                call!(
                    ctx.cuda(),
                    cuMemcpyDtoD(self.as_raw(), from, self.size_bytes())
                )
            }?;
        } else {
            // SAFETY: as above, with each side's context.
            unsafe {
                call!(
                    ctx.cuda(),
                    cuMemcpyPeer(
                        self.as_raw(),
                        ctx.as_raw(),
                        from,
                        src.context().as_raw(),
                        self.size_bytes(),
                    )
                )
            }?;
        }
        finish(ctx)
    }

    /// Uploads `src` on `stream`, in stream order, and waits for the stream. Refused
    /// while the stream is captured; no capture can begin until the wait is over.
    pub fn copy_from_host_on(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        let _order = stream.enqueue_lock();
        stream.refuse_host_wait("copy_from_host_on")?;
        // SAFETY: we wait for the stream before `src`'s borrow ends (also when the wait
        // fails: `synchronize_for_borrow` returns only once no copy from `src` can run),
        // holding the stream's order lock throughout, so no capture records the host
        // address.
        unsafe { self.upload_locked(src, stream) }?;
        stream.synchronize_for_borrow()
    }

    /// Enqueues an upload of `src` on `stream` and returns at once.
    ///
    /// # Safety
    /// `src` must stay alive and unchanged until the stream has done the copy (synchronise
    /// the stream or an event recorded after it); if the stream is being captured, for as
    /// long as the graph can be launched.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub unsafe fn copy_from_host_async(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        let _order = stream.enqueue_lock();
        // SAFETY: the caller's contract.
        unsafe { self.upload_locked(src, stream) }
    }

    /// The upload, with the stream's order lock held by the caller.
    ///
    /// # Safety
    /// As for [`copy_from_host_async`](Self::copy_from_host_async).
    unsafe fn upload_locked(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        check_len("copy_from_host_async", "host", self.len(), src.len())?;
        stream.same_context(self.context(), "copy_from_host_async")?;
        if self.is_empty() {
            return Ok(());
        }
        let to = crate::Enqueuing::begin(&*self, stream)?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        // SAFETY: ranges as for the synchronous copy; the caller keeps `src` alive.
        unsafe {
            call!(
                ctx.cuda(),
                cuMemcpyHtoDAsync(
                    to.ptr(),
                    src.as_ptr().cast(),
                    self.size_bytes(),
                    stream.as_raw()
                )
            )
        }
    }

    /// Enqueues a device-to-device copy of `src` on `stream` and waits.
    pub fn copy_from_on<S: DeviceSlice<Elem = T> + ?Sized>(
        &mut self,
        src: &S,
        stream: &Stream,
    ) -> Result<()> {
        // Refused before anything is enqueued: a capture would record the copy, and the
        // wait after it would fail.
        stream.refuse_host_wait("copy_from_on")?;
        self.copy_from_async(src, stream)?;
        stream.synchronize()
    }

    /// Enqueues a device-to-device copy of `src` on `stream` and returns at once (also
    /// inside a graph capture). Safe, unlike the host copies: both sides are noted as used
    /// on `stream`, so dropping either waits for the copy, and a capture keeps both alive
    /// for the graph.
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub fn copy_from_async<S: DeviceSlice<Elem = T> + ?Sized>(
        &mut self,
        src: &S,
        stream: &Stream,
    ) -> Result<()> {
        check_len("copy_from_async", "source", self.len(), src.len())?;
        let ctx = self.context();
        stream.same_context(ctx, "copy_from_async")?;
        if self.is_empty() {
            return Ok(());
        }
        let _order = stream.enqueue_lock();
        let to = crate::Enqueuing::begin(&*self, stream)?;
        let from = crate::Enqueuing::begin(src, stream)?;
        let _g = ctx.bind()?;
        if src.context() == ctx {
            // SAFETY: both ranges are live device memory of `size_bytes()`, kept so for
            // the copy by `used_on`.
            unsafe {
                call!(
                    ctx.cuda(),
                    cuMemcpyDtoDAsync(to.ptr(), from.ptr(), self.size_bytes(), stream.as_raw())
                )
            }
        } else {
            // SAFETY: as above, with each side's context.
            unsafe {
                call!(
                    ctx.cuda(),
                    cuMemcpyPeerAsync(
                        to.ptr(),
                        ctx.as_raw(),
                        from.ptr(),
                        src.context().as_raw(),
                        self.size_bytes(),
                        stream.as_raw(),
                    )
                )
            }
        }
    }

    /// Sets every byte to `byte`.
    #[doc(alias = "cuMemsetD8")]
    pub fn memset_bytes(&mut self, byte: u8) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.base_used_synchronously()?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        // SAFETY: the range is the view's memory.
        unsafe {
            call!(
                ctx.cuda(),
                cuMemsetD8(self.as_raw(), byte, self.size_bytes())
            )
        }?;
        finish(ctx)
    }

    /// Sets every element to `value` (a memset for 1-, 2- and 4-byte patterns, an upload
    /// otherwise).
    pub fn fill(&mut self, value: T) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let n = self.size_bytes();
        self.base_used_synchronously()?;
        let ctx = self.context();
        let _g = ctx.bind()?;
        let (cuda, p) = (ctx.cuda(), self.as_raw());
        match pattern(value) {
            // SAFETY: the range is the view's `n` bytes, a multiple of the pattern's width
            // (a whole number of `T`s of that repeated pattern); the same in the arms below.
            Pattern::D8(v) => unsafe { call!(cuda, cuMemsetD8(p, v, n)) }?,
            // SAFETY: as above.
            Pattern::D16(v) => unsafe { call!(cuda, cuMemsetD16(p, v, n / 2)) }?,
            // SAFETY: as above.
            Pattern::D32(v) => unsafe { call!(cuda, cuMemsetD32(p, v, n / 4)) }?,
            Pattern::Other => {
                drop(_g);
                return self.fill_by_upload(value);
            }
        }
        finish(ctx)
    }

    /// Fills by uploading a host block of at most 1 MiB of `value`s, range by range (a
    /// whole-buffer host copy could be as large as the device memory).
    fn fill_by_upload(&mut self, value: T) -> Result<()> {
        let per = ((1 << 20) / size_of::<T>().max(1)).max(1);
        let block = vec![value; per.min(self.len())];
        for mut part in self.reborrow().chunks_mut(per)? {
            let n = part.len();
            part.copy_from_host(&block[..n])?;
        }
        Ok(())
    }

    /// Enqueues setting every element to `value` on `stream` and returns at once (also
    /// inside a graph capture). Values whose bytes are not one byte, two or four repeated
    /// (most 8-byte values other than 0) are refused with [`Error::InvalidArgument`]:
    /// the driver has no memset for them.
    #[doc(alias = "cuMemsetD32Async")]
    pub fn fill_async(&mut self, value: T, stream: &Stream) -> Result<()> {
        let ctx = self.context();
        stream.same_context(ctx, "fill_async")?;
        let pattern = pattern(value);
        if let Pattern::Other = pattern {
            return Err(Error::InvalidArgument {
                what: "fill_async",
                problem: format!(
                    "a {}-byte value whose bytes are not a repeated 1-, 2- or 4-byte pattern \
                     cannot be set by a memset; use fill or copy_from_async",
                    size_of::<T>()
                ),
            });
        }
        if self.is_empty() {
            return Ok(());
        }
        let n = self.size_bytes();
        let _order = stream.enqueue_lock();
        let to = crate::Enqueuing::begin(&*self, stream)?;
        let _g = ctx.bind()?;
        let (cuda, p, s) = (ctx.cuda(), to.ptr(), stream.as_raw());
        match pattern {
            // SAFETY: the range is the view's `n` bytes, noted as used on `stream`, a
            // multiple of the pattern's width; the same in the arms below.
            Pattern::D8(v) => unsafe { call!(cuda, cuMemsetD8Async(p, v, n, s)) },
            // SAFETY: as above.
            Pattern::D16(v) => unsafe { call!(cuda, cuMemsetD16Async(p, v, n / 2, s)) },
            // SAFETY: as above.
            Pattern::D32(v) => unsafe { call!(cuda, cuMemsetD32Async(p, v, n / 4, s)) },
            Pattern::Other => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pattern, pattern};

    #[test]
    fn patterns_pick_the_widest_memset_that_fits() {
        assert!(matches!(pattern(7u8), Pattern::D8(7)));
        assert!(matches!(pattern(0u64), Pattern::D8(0)));
        assert!(matches!(pattern(0x0101u16), Pattern::D8(1)));
        assert!(matches!(pattern(0x0102u16), Pattern::D16(v) if v == 0x0102));
        assert!(matches!(pattern(0x0102_0102u32), Pattern::D16(v) if v == 0x0102));
        assert!(matches!(pattern(1.5f32), Pattern::D32(v) if v == 1.5f32.to_bits()));
        assert!(matches!(pattern(0x0000_0001_0000_0001u64), Pattern::D32(1)));
        assert!(matches!(pattern(1.5f64), Pattern::Other));
    }

    /// Four repeated `u32`s: 16 bytes, the widest value that is still looked at.
    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Quad([u32; 4]);
    // SAFETY: four u32, no padding; every bit pattern is a valid value.
    unsafe impl crate::DeviceRepr for Quad {}

    /// Two `Quad`s: 32 bytes, too wide to be looked at.
    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Octet([Quad; 2]);
    // SAFETY: as for Quad.
    unsafe impl crate::DeviceRepr for Octet {}

    #[test]
    fn sixteen_byte_values_are_still_patterns() {
        assert!(matches!(pattern(Quad([0; 4])), Pattern::D8(0)));
        assert!(matches!(
            pattern(Quad([0x0102_0304; 4])),
            Pattern::D32(0x0102_0304)
        ));
        assert!(matches!(pattern(Octet([Quad([0; 4]); 2])), Pattern::Other));
    }
}
