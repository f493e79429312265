//! Streams: ordered queues of device work.

use std::sync::Arc;

use cuda_sys::{CUresult, CUstream, CUstream_flags};

use crate::{Context, Error, Event, Result};

struct Inner {
    ctx: Context,
    raw: CUstream,
    owned: bool,
}

// SAFETY: stream handles are usable from any thread; the driver serialises access.
unsafe impl Send for Inner {}
// SAFETY: as above; `Inner` has no interior mutability.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Ok(_g) = self.ctx.bind() {
            // SAFETY: we created the stream and destroy it once; pending work still
            // completes (the driver defers the release).
            let _ = unsafe { (self.ctx.cuda().fns().cuStreamDestroy)(self.raw) };
        }
    }
}

/// A CUDA stream in a context. Clones share the stream; the last drop destroys it.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<Inner>,
}

static_assertions::assert_impl_all!(Stream: Send, Sync, Clone);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.inner.ctx.device().ordinal())
            .field("raw", &self.inner.raw)
            .finish()
    }
}

impl Stream {
    /// A new stream that synchronises with the legacy default stream.
    #[doc(alias = "cuStreamCreate")]
    pub fn new(ctx: &Context) -> Result<Stream> {
        Self::create(ctx, CUstream_flags::CU_STREAM_DEFAULT.0)
    }

    /// A new stream that does not synchronise with the legacy default stream.
    pub fn non_blocking(ctx: &Context) -> Result<Stream> {
        Self::create(ctx, CUstream_flags::CU_STREAM_NON_BLOCKING.0)
    }

    fn create(ctx: &Context, flags: u32) -> Result<Stream> {
        let _g = ctx.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        let rc = unsafe { (ctx.cuda().fns().cuStreamCreate)(&mut raw, flags) };
        ctx.cuda().check(rc, "cuStreamCreate")?;
        Ok(Stream {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                raw,
                owned: true,
            }),
        })
    }

    /// The context's legacy default stream (the null handle; never destroyed).
    pub fn legacy_default(ctx: &Context) -> Stream {
        Stream {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                raw: std::ptr::null_mut(),
                owned: false,
            }),
        }
    }

    /// Wraps a raw stream of `ctx`.
    ///
    /// # Safety
    /// `raw` must be a stream of `ctx` (or null) that stays valid for the life of the
    /// returned value; if `owned`, nothing else destroys it.
    pub unsafe fn from_raw(ctx: &Context, raw: CUstream, owned: bool) -> Stream {
        Stream {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                raw,
                owned,
            }),
        }
    }

    /// The raw handle (to pass to other CUDA libraries, e.g. NCCL).
    #[inline]
    pub fn as_raw(&self) -> CUstream {
        self.inner.raw
    }

    /// The stream's context.
    #[inline]
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Blocks until all work on the stream is done.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        let _g = self.bind_if_legacy()?;
        // SAFETY: a valid stream (the legacy one with its context current).
        let rc = unsafe { (self.inner.ctx.cuda().fns().cuStreamSynchronize)(self.inner.raw) };
        self.inner.ctx.cuda().check(rc, "cuStreamSynchronize")
    }

    /// Whether all work on the stream is done, without blocking.
    #[doc(alias = "cuStreamQuery")]
    pub fn is_idle(&self) -> Result<bool> {
        let _g = self.bind_if_legacy()?;
        // SAFETY: a valid stream (the legacy one with its context current).
        let rc = unsafe { (self.inner.ctx.cuda().fns().cuStreamQuery)(self.inner.raw) };
        if rc == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.inner.ctx.cuda().check(rc, "cuStreamQuery")?;
        Ok(true)
    }

    /// Makes later work on this stream wait for `event` (which may be of another device).
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let _g = self.bind_if_legacy()?;
        // SAFETY: valid stream and event handles.
        let rc = unsafe {
            (self.inner.ctx.cuda().fns().cuStreamWaitEvent)(self.inner.raw, event.as_raw(), 0)
        };
        self.inner.ctx.cuda().check(rc, "cuStreamWaitEvent")
    }

    /// Records `event` at this point of the stream. The event must be of the same context.
    #[doc(alias = "cuEventRecord")]
    pub fn record(&self, event: &Event) -> Result<()> {
        event.record(self)
    }

    /// The device of the stream (driver ≥ 12.8 asks the driver; the context tells before).
    #[doc(alias = "cuStreamGetDevice")]
    pub fn device_ordinal(&self) -> Result<i32> {
        let cuda = self.inner.ctx.cuda();
        let f = cuda.require(cuda.fns().cuStreamGetDevice, "cuStreamGetDevice")?;
        let mut dev = 0;
        let _g = self.inner.ctx.bind()?;
        // SAFETY: valid stream and out-pointer.
        let rc = unsafe { f(self.inner.raw, &mut dev) };
        cuda.check(rc, "cuStreamGetDevice")?;
        Ok(dev)
    }

    /// A created stream carries its context, so stream calls need no current context
    /// (and pay no context switch); the legacy default stream means "the current
    /// context's", so it binds.
    #[inline]
    pub(crate) fn bind_if_legacy(&self) -> Result<Option<crate::CurrentGuard<'_>>> {
        if self.inner.raw.is_null() {
            self.inner.ctx.bind().map(Some)
        } else {
            Ok(None)
        }
    }

    pub(crate) fn same_context(&self, ctx: &Context, what: &'static str) -> Result<()> {
        if self.inner.ctx == *ctx {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what,
                expected: ctx.device().ordinal(),
                found: self.inner.ctx.device().ordinal(),
            })
        }
    }
}
