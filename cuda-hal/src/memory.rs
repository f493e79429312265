//! [`DeviceBuffer`]: typed device memory, freed by RAII before its context is released.

use std::marker::PhantomData;
use std::mem::size_of;

use cuda_sys::CUdeviceptr;

use crate::{Context, Device, DeviceRepr, Error, Result, Stream};

/// `len` elements of `T` in device memory of one context.
///
/// Synchronous copies and fills are complete, for every stream, when they return (they
/// wait for the context's legacy default stream). A download sees the work of other
/// streams only once those are synchronised. The `*_on` copies are ordered on a stream and wait
/// for that stream before returning, so the host memory they read or write is never used
/// after the borrow ends; the `unsafe` `*_async` copies do not wait.
pub struct DeviceBuffer<T: DeviceRepr> {
    ctx: Context,
    ptr: CUdeviceptr,
    len: usize,
    /// Set when allocated stream-ordered: freed on the same stream.
    stream: Option<Stream>,
    _t: PhantomData<T>,
}

static_assertions::assert_impl_all!(DeviceBuffer<f32>: Send, Sync);

impl<T: DeviceRepr> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.ctx.device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

fn bytes_of<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or(Error::SizeOverflow {
        count: len,
        size: size_of::<T>(),
    })
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Allocates `len` elements; the contents are whatever the memory held.
    #[doc(alias = "cuMemAlloc")]
    pub fn alloc(ctx: &Context, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            let _g = ctx.bind()?;
            // SAFETY: valid out-pointer; a context is current.
            let rc = unsafe { (ctx.cuda().fns().cuMemAlloc)(&mut ptr, bytes) };
            ctx.cuda().check(rc, "cuMemAlloc")?;
        }
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            stream: None,
            _t: PhantomData,
        })
    }

    /// Allocates `len` elements in stream order on `stream` (freed on it too).
    #[doc(alias = "cuMemAllocAsync")]
    pub fn alloc_on(stream: &Stream, len: usize) -> Result<Self> {
        let ctx = stream.context();
        let bytes = bytes_of::<T>(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            let _g = ctx.bind()?;
            // SAFETY: valid out-pointer and stream.
            let rc =
                unsafe { (ctx.cuda().fns().cuMemAllocAsync)(&mut ptr, bytes, stream.as_raw()) };
            ctx.cuda().check(rc, "cuMemAllocAsync")?;
        }
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            stream: Some(stream.clone()),
            _t: PhantomData,
        })
    }

    /// Allocates and zeroes `len` elements.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<Self> {
        let b = Self::alloc(ctx, len)?;
        b.memset_bytes(0)?;
        Ok(b)
    }

    /// Allocates and uploads `data`.
    pub fn from_slice(ctx: &Context, data: &[T]) -> Result<Self> {
        let mut b = Self::alloc(ctx, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// Takes ownership of `len` elements at `ptr`, allocated with `cuMemAlloc` in `ctx`
    /// (freed with `cuMemFree` on drop), to use memory from other CUDA code.
    ///
    /// # Safety
    /// `ptr` must be a live `cuMemAlloc` allocation of `ctx` of at least `len * size_of::<T>()`
    /// bytes (or 0 with `len == 0`), owned by nobody else.
    pub unsafe fn from_raw(ctx: &Context, ptr: CUdeviceptr, len: usize) -> Self {
        DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            stream: None,
            _t: PhantomData,
        }
    }

    /// Gives up ownership: returns the address and length; the memory is no longer freed
    /// by this value (free it with `cuMemFree`, or `cuMemFreeAsync` if it was allocated
    /// stream-ordered).
    pub fn into_raw(self) -> (CUdeviceptr, usize) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: read the fields we still own out once; no Drop follows.
        unsafe {
            drop(std::ptr::read(&this.ctx));
            drop(std::ptr::read(&this.stream));
        }
        (this.ptr, this.len)
    }

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

    /// Size in bytes.
    #[inline]
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The raw device address (0 for an empty buffer).
    #[inline]
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The context the memory lives in.
    #[inline]
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The device the memory lives on.
    #[inline]
    pub fn device(&self) -> &Device {
        self.ctx.device()
    }

    /// Waits for the legacy default stream of the (current) context: the "synchronous"
    /// copies and memsets run there and may still be in flight when the call returns
    /// (memsets always, uploads from pageable memory in part), and work on other streams,
    /// non-blocking ones above all, does not wait for them.
    fn finish(&self) -> Result<()> {
        // SAFETY: the null stream with our context current (callers hold the guard).
        let rc = unsafe { (self.ctx.cuda().fns().cuStreamSynchronize)(std::ptr::null_mut()) };
        self.ctx.cuda().check(rc, "cuStreamSynchronize")
    }

    fn check_len(&self, what: &'static str, other: usize) -> Result<()> {
        if other == self.len {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                what,
                expected: self.len,
                got: other,
            })
        }
    }

    /// Uploads `src` (same length).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        // SAFETY: `src` holds `size_bytes()` readable bytes; the destination is ours.
        let rc = unsafe {
            (self.ctx.cuda().fns().cuMemcpyHtoD)(self.ptr, src.as_ptr().cast(), self.size_bytes())
        };
        self.ctx.cuda().check(rc, "cuMemcpyHtoD")?;
        self.finish()
    }

    /// Downloads into `dst` (same length).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        // SAFETY: `dst` holds `size_bytes()` writable bytes and any bit pattern is a valid T.
        let rc = unsafe {
            (self.ctx.cuda().fns().cuMemcpyDtoH)(
                dst.as_mut_ptr().cast(),
                self.ptr,
                self.size_bytes(),
            )
        };
        self.ctx.cuda().check(rc, "cuMemcpyDtoH")
    }

    /// Downloads into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(self.len);
        // SAFETY: T is DeviceRepr: every bit pattern is valid; the copy overwrites all of it
        // and on failure the Vec is dropped without reading it.
        let spare = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr(), self.len) };
        self.copy_to_host(spare)?;
        // SAFETY: all `len` elements were written by the copy.
        unsafe { v.set_len(self.len) };
        Ok(v)
    }

    /// Copies `src` (same length) into this buffer; across devices through `cuMemcpyPeer`.
    #[doc(alias = "cuMemcpyDtoD")]
    pub fn copy_from(&mut self, src: &DeviceBuffer<T>) -> Result<()> {
        self.check_len("copy_from", src.len)?;
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        let fns = self.ctx.cuda().fns();
        let (rc, call) = if src.ctx == self.ctx {
            // SAFETY: both ranges are ours and `size_bytes()` long.
            let rc = unsafe { (fns.cuMemcpyDtoD)(self.ptr, src.ptr, self.size_bytes()) };
            (rc, "cuMemcpyDtoD")
        } else {
            // SAFETY: as above, with each side's context.
            let rc = unsafe {
                (fns.cuMemcpyPeer)(
                    self.ptr,
                    self.ctx.as_raw(),
                    src.ptr,
                    src.ctx.as_raw(),
                    self.size_bytes(),
                )
            };
            (rc, "cuMemcpyPeer")
        };
        self.ctx.cuda().check(rc, call)?;
        self.finish()
    }

    /// Uploads `src` on `stream`, in stream order, and waits for the stream.
    pub fn copy_from_host_on(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        // SAFETY: we synchronise before `src`'s borrow ends.
        unsafe { self.copy_from_host_async(src, stream) }?;
        stream.synchronize()
    }

    /// Downloads into `dst` on `stream`, in stream order, and waits for the stream.
    pub fn copy_to_host_on(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        // SAFETY: we synchronise before `dst`'s borrow ends.
        unsafe { self.copy_to_host_async(dst, stream) }?;
        stream.synchronize()
    }

    /// Enqueues an upload of `src` on `stream` and returns at once.
    ///
    /// # Safety
    /// `src` must stay alive and unchanged until the stream has done the copy (synchronise
    /// the stream or an event recorded after it).
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub unsafe fn copy_from_host_async(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        self.check_len("copy_from_host_async", src.len())?;
        stream.same_context(&self.ctx, "copy_from_host_async")?;
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        // SAFETY: ranges as for the synchronous copy; the caller keeps `src` alive.
        let rc = unsafe {
            (self.ctx.cuda().fns().cuMemcpyHtoDAsync)(
                self.ptr,
                src.as_ptr().cast(),
                self.size_bytes(),
                stream.as_raw(),
            )
        };
        self.ctx.cuda().check(rc, "cuMemcpyHtoDAsync")
    }

    /// Enqueues a download into `dst` on `stream` and returns at once.
    ///
    /// # Safety
    /// `dst` must stay alive and unread until the stream has done the copy.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub unsafe fn copy_to_host_async(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        self.check_len("copy_to_host_async", dst.len())?;
        stream.same_context(&self.ctx, "copy_to_host_async")?;
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        // SAFETY: ranges as for the synchronous copy; the caller keeps `dst` alive.
        let rc = unsafe {
            (self.ctx.cuda().fns().cuMemcpyDtoHAsync)(
                dst.as_mut_ptr().cast(),
                self.ptr,
                self.size_bytes(),
                stream.as_raw(),
            )
        };
        self.ctx.cuda().check(rc, "cuMemcpyDtoHAsync")
    }

    /// Enqueues a device-to-device copy of `src` on `stream` (same context) and waits.
    pub fn copy_from_on(&mut self, src: &DeviceBuffer<T>, stream: &Stream) -> Result<()> {
        // SAFETY: we synchronise before either borrow ends.
        unsafe { self.copy_from_async(src, stream) }?;
        stream.synchronize()
    }

    /// Enqueues a device-to-device copy of `src` on `stream` and returns at once (also
    /// inside a graph capture).
    ///
    /// # Safety
    /// Neither buffer may be freed before the stream has done the copy.
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub unsafe fn copy_from_async(&mut self, src: &DeviceBuffer<T>, stream: &Stream) -> Result<()> {
        self.check_len("copy_from_on", src.len)?;
        stream.same_context(&self.ctx, "copy_from_on")?;
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        let fns = self.ctx.cuda().fns();
        // SAFETY: both ranges are live device memory of `size_bytes()`.
        let (rc, call) = unsafe {
            if src.ctx == self.ctx {
                let rc =
                    (fns.cuMemcpyDtoDAsync)(self.ptr, src.ptr, self.size_bytes(), stream.as_raw());
                (rc, "cuMemcpyDtoDAsync")
            } else {
                let rc = (fns.cuMemcpyPeerAsync)(
                    self.ptr,
                    self.ctx.as_raw(),
                    src.ptr,
                    src.ctx.as_raw(),
                    self.size_bytes(),
                    stream.as_raw(),
                );
                (rc, "cuMemcpyPeerAsync")
            }
        };
        self.ctx.cuda().check(rc, call)
    }

    /// Sets every byte to `byte`.
    #[doc(alias = "cuMemsetD8")]
    pub fn memset_bytes(&self, byte: u8) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let _g = self.ctx.bind()?;
        // SAFETY: the range is ours.
        let rc = unsafe { (self.ctx.cuda().fns().cuMemsetD8)(self.ptr, byte, self.size_bytes()) };
        self.ctx.cuda().check(rc, "cuMemsetD8")?;
        self.finish()
    }

    /// Sets every element to `value` (a memset for 1-, 2- and 4-byte patterns, an upload
    /// otherwise).
    pub fn fill(&mut self, value: T) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let size = size_of::<T>();
        let mut bytes = [0u8; 16];
        if size <= 16 {
            // SAFETY: `value` is `size` bytes of plain data (DeviceRepr: no padding).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&raw const value).cast::<u8>(),
                    bytes.as_mut_ptr(),
                    size,
                )
            };
        }
        let pattern = &bytes[..size.min(16)];
        let _g = self.ctx.bind()?;
        let fns = self.ctx.cuda().fns();
        let repeats = |n: usize| {
            size.is_multiple_of(n) && size <= 16 && pattern.chunks(n).all(|c| c == &pattern[..n])
        };
        let n = self.size_bytes();
        let (rc, call) = if repeats(1) {
            // SAFETY: the range is ours and `n` bytes long.
            let rc = unsafe { (fns.cuMemsetD8)(self.ptr, pattern[0], n) };
            (rc, "cuMemsetD8")
        } else if repeats(2) {
            let v = u16::from_ne_bytes([pattern[0], pattern[1]]);
            // SAFETY: the range is ours, `n` bytes long, and `n` is a multiple of 2.
            let rc = unsafe { (fns.cuMemsetD16)(self.ptr, v, n / 2) };
            (rc, "cuMemsetD16")
        } else if repeats(4) {
            let v = u32::from_ne_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]);
            // SAFETY: the range is ours, `n` bytes long, and `n` is a multiple of 4.
            let rc = unsafe { (fns.cuMemsetD32)(self.ptr, v, n / 4) };
            (rc, "cuMemsetD32")
        } else {
            drop(_g);
            return self.copy_from_host(&vec![value; self.len]);
        };
        self.ctx.cuda().check(rc, call)?;
        self.finish()
    }
}

impl<T: DeviceRepr> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let Ok(_g) = self.ctx.bind() else { return };
        let fns = self.ctx.cuda().fns();
        // SAFETY: allocated by us and freed once, on the stream it was allocated on if any;
        // the context is still retained (we hold a clone).
        let _ = unsafe {
            match &self.stream {
                Some(s) => (fns.cuMemFreeAsync)(self.ptr, s.as_raw()),
                None => (fns.cuMemFree)(self.ptr),
            }
        };
    }
}
