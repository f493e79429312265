//! Primary contexts, retained and released by RAII, and the guard that makes one current.

use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::CUcontext;

use crate::{Cuda, Device, Result};

struct Inner {
    device: Device,
    raw: CUcontext,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Everything that lives in the context holds a clone, so this runs after they are
        // gone. A failure cannot be reported from a drop; the driver keeps nothing leaked.
        // SAFETY: this retain is released exactly once.
        let _ =
            unsafe { (self.device.cuda().fns().cuDevicePrimaryCtxRelease)(self.device.as_raw()) };
    }
}

/// A device's primary context. Clones share one retain; the last drop releases it.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

// SAFETY: a primary context handle is usable from any thread (the driver is thread-safe);
// `Inner` only holds the handle and the device.
unsafe impl Send for Inner {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Inner {}

static_assertions::assert_impl_all!(Context: Send, Sync, Clone);

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.device.ordinal())
            .finish()
    }
}

impl PartialEq for Context {
    fn eq(&self, other: &Self) -> bool {
        self.inner.raw == other.inner.raw
    }
}
impl Eq for Context {}

impl Context {
    pub(crate) fn retain_primary(device: &Device) -> Result<Context> {
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc =
            unsafe { (device.cuda().fns().cuDevicePrimaryCtxRetain)(&mut raw, device.as_raw()) };
        device.cuda().check(rc, "cuDevicePrimaryCtxRetain")?;
        Ok(Context {
            inner: Arc::new(Inner {
                device: device.clone(),
                raw,
            }),
        })
    }

    /// The device the context belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The driver.
    #[inline]
    pub fn cuda(&self) -> &Cuda {
        self.inner.device.cuda()
    }

    /// The raw handle.
    pub fn as_raw(&self) -> CUcontext {
        self.inner.raw
    }

    /// Makes this context current on the calling thread until the guard drops, when the
    /// previous one is restored. Cheap when it is already current (one driver call).
    #[doc(alias = "cuCtxSetCurrent")]
    pub fn bind(&self) -> Result<CurrentGuard<'_>> {
        let fns = self.cuda().fns();
        let mut prev: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (fns.cuCtxGetCurrent)(&mut prev) };
        self.cuda().check(rc, "cuCtxGetCurrent")?;
        if prev != self.inner.raw {
            // SAFETY: our context is retained for as long as `self` lives.
            let rc = unsafe { (fns.cuCtxSetCurrent)(self.inner.raw) };
            self.cuda().check(rc, "cuCtxSetCurrent")?;
        }
        Ok(CurrentGuard {
            ctx: self,
            prev,
            _not_send: PhantomData,
        })
    }

    /// Free and total device memory in bytes, as the driver sees them now.
    #[doc(alias = "cuMemGetInfo")]
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let _g = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the context is current.
        let rc = unsafe { (self.cuda().fns().cuMemGetInfo)(&mut free, &mut total) };
        self.cuda().check(rc, "cuMemGetInfo")?;
        Ok((free, total))
    }

    /// Waits for all work in the context.
    #[doc(alias = "cuCtxSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: a context is current.
        let rc = unsafe { (self.cuda().fns().cuCtxSynchronize)() };
        self.cuda().check(rc, "cuCtxSynchronize")
    }
}

/// Keeps a context current on this thread; restores the previous one on drop. Not `Send`:
/// "current" is a property of the thread.
pub struct CurrentGuard<'a> {
    ctx: &'a Context,
    prev: CUcontext,
    _not_send: PhantomData<*const ()>,
}

impl CurrentGuard<'_> {
    /// The context this guard keeps current.
    pub fn context(&self) -> &Context {
        self.ctx
    }
}

impl Drop for CurrentGuard<'_> {
    fn drop(&mut self) {
        if self.prev != self.ctx.inner.raw {
            // SAFETY: restoring what was current before (possibly null, which unbinds).
            let _ = unsafe { (self.ctx.cuda().fns().cuCtxSetCurrent)(self.prev) };
        }
    }
}
