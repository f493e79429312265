//! Primary contexts, retained and released by RAII, and the guard that makes one current.

use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::CUcontext;

use crate::{Cuda, Device, Result};

struct Inner {
    device: Device,
    raw: CUcontext,
    /// What keeps the context alive: a primary context's retain, or another owner's value.
    hold: Hold,
}

enum Hold {
    /// One retain of the device's primary context, released on drop.
    Primary,
    /// A value that keeps the context alive (a cudarc context, a green context's owner).
    Owner(#[allow(dead_code)] Box<dyn std::any::Any + Send + Sync>),
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Everything that lives in the context holds a clone, so this runs after they are
        // gone. A failure cannot be reported from a drop; the driver keeps nothing leaked.
        // An owner is dropped with the fields, after this.
        if let Hold::Primary = self.hold {
            // SAFETY: this retain is released exactly once.
            let _ = unsafe {
                (self.device.cuda().fns().cuDevicePrimaryCtxRelease)(self.device.as_raw())
            };
        }
    }
}

/// A device's primary context. Clones share one retain; the last drop releases it.
///
/// Everything made in a context (memory, streams, events, modules) holds it, so it is
/// released only after them:
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, DeviceBuffer};
///
/// let (cuda, world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let gpu = cuda.device(0)?;
/// let ctx = gpu.primary_context()?;
/// assert_eq!(gpu.primary_context()?, ctx, "one primary context per device");
/// assert_eq!(ctx.device(), &gpu);
/// let buf = DeviceBuffer::from_slice(&ctx, &[7u8; 16])?;
/// ctx.synchronize()?;
/// drop(ctx);
/// assert_eq!(world.live().context_retains, 1, "the buffer still holds it");
/// assert_eq!(buf.to_vec()?, [7; 16]);
/// drop(buf);
/// assert_eq!(world.live().context_retains, 0);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

// SAFETY: a context handle is usable from any thread (the driver is thread-safe); `Inner`
// holds the handle, the device and an owner that is itself `Send + Sync`.
unsafe impl Send for Inner {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Inner {}

static_assertions::assert_impl_all!(Context: Send, Sync, Clone, std::fmt::Debug);

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
    /// `Ok` when `other` (the `object` passed to `what`) is this context; else
    /// [`Error::WrongDevice`](crate::Error) with both devices, or, when both are on the
    /// same device (a context of another `Cuda` instance),
    /// [`Error::WrongContext`](crate::Error).
    pub(crate) fn expect_same(
        &self,
        other: &Context,
        what: &'static str,
        object: &'static str,
    ) -> Result<()> {
        if self == other {
            return Ok(());
        }
        let (expected, found) = (self.device().ordinal(), other.device().ordinal());
        if expected == found {
            return Err(crate::Error::WrongContext {
                what,
                object,
                device: found,
            });
        }
        Err(crate::Error::WrongDevice {
            what,
            object,
            expected,
            found,
        })
    }

    pub(crate) fn retain_primary(device: &Device) -> Result<Context> {
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe {
            call!(
                device.cuda(),
                cuDevicePrimaryCtxRetain(&mut raw, device.as_raw())
            )
        }?;
        Ok(Context {
            inner: Arc::new(Inner {
                device: device.clone(),
                raw,
                hold: Hold::Primary,
            }),
        })
    }

    /// Adopts a context made elsewhere (another crate's, a non-primary or green
    /// context), kept alive by `owner`, which is dropped after the last of everything made
    /// in it through this crate (memory, streams, events, modules hold the context).
    ///
    /// # Safety
    /// `raw` must be a context of `device` that stays valid while `owner` lives (pass `()`
    /// for a context that lives as long as the process).
    ///
    /// ```
    /// use cuda_hal::{Context, DeviceBuffer};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// let gpu = cuda.device(0)?;
    /// let primary = gpu.primary_context()?;
    /// // SAFETY: the primary context's handle, kept alive by the retain `primary` holds.
    /// let ctx = unsafe { Context::from_raw(&gpu, primary.as_raw(), primary.clone()) };
    /// assert_eq!(ctx, primary, "the same context");
    /// let buf = DeviceBuffer::from_slice(&ctx, &[1u8, 2])?;
    /// assert_eq!(buf.to_vec()?, [1, 2]);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub unsafe fn from_raw(
        device: &Device,
        raw: CUcontext,
        owner: impl Send + Sync + 'static,
    ) -> Context {
        Context {
            inner: Arc::new(Inner {
                device: device.clone(),
                raw,
                hold: Hold::Owner(Box::new(owner)),
            }),
        }
    }

    /// The context current on this thread, if it is a device's primary context (then
    /// retained like [`Device::primary_context`]); `Ok(None)` when none is current.
    ///
    /// Another crate's non-primary context cannot be held safely from its handle alone
    /// (nothing keeps it alive): that is [`Error::ForeignContext`](crate::Error::ForeignContext);
    /// adopt it with [`from_raw`](Self::from_raw) (or, with the `cudarc` feature, from
    /// cudarc's context).
    ///
    /// ```
    /// use cuda_hal::Context;
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(2).build_with(cuda_hal::Cuda::from_driver)?;
    /// let ctx = cuda.device(1)?.primary_context()?;
    /// assert_eq!(Context::current(&cuda)?, None);
    /// let _current = ctx.bind()?;
    /// assert_eq!(Context::current(&cuda)?, Some(ctx.clone()));
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuCtxGetCurrent")]
    pub fn current(cuda: &crate::Cuda) -> Result<Option<Context>> {
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { call!(cuda, cuCtxGetCurrent(&mut raw)) }?;
        if raw.is_null() {
            return Ok(None);
        }
        let mut dev = 0;
        // SAFETY: valid out-pointer; `raw` is current.
        unsafe { call!(cuda, cuCtxGetDevice(&mut dev)) }?;
        let primary = cuda
            .device(usize::try_from(dev).unwrap_or(usize::MAX))?
            .primary_context()?;
        if primary.as_raw() != raw {
            return Err(crate::Error::ForeignContext {
                what: "Context::current",
                device: dev,
            });
        }
        Ok(Some(primary))
    }

    /// The device the context belongs to.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The driver.
    #[inline]
    #[must_use]
    pub fn cuda(&self) -> &Cuda {
        self.inner.device.cuda()
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> CUcontext {
        self.inner.raw
    }

    /// Makes this context current on the calling thread until the guard drops, when the
    /// one current before is current again. Cheap when it is already current (one driver
    /// call, and nothing to undo); otherwise it is pushed on the thread's context stack
    /// and popped by the guard, so the guard never names a context it does not own.
    ///
    /// For calls made through the raw table, which act on the current context:
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::Cuda;
    ///
    /// let (cuda, _world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let (c0, c1) = (cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?);
    /// let current = || {
    ///     let mut ctx = std::ptr::null_mut();
    ///     // SAFETY: a valid out-pointer.
    ///     cuda.check(unsafe { (cuda.fns().cuCtxGetCurrent)(&mut ctx) }, "cuCtxGetCurrent")
    ///         .map(|()| ctx)
    /// };
    /// {
    ///     let _on0 = c0.bind()?;
    ///     assert_eq!(current()?, c0.as_raw());
    ///     {
    ///         let on1 = c1.bind()?;
    ///         assert_eq!(on1.context(), &c1);
    ///         assert_eq!(current()?, c1.as_raw());
    ///     }
    ///     assert_eq!(current()?, c0.as_raw(), "the guard restored the one before");
    /// }
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuCtxPushCurrent")]
    #[doc(alias = "cuCtxPopCurrent")]
    pub fn bind(&self) -> Result<CurrentGuard<'_>> {
        let mut cur: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { call!(self.cuda(), cuCtxGetCurrent(&mut cur)) }?;
        let pushed = cur != self.inner.raw;
        if pushed {
            // SAFETY: our context is retained for as long as `self` lives, which the guard
            // borrows.
            unsafe { call!(self.cuda(), cuCtxPushCurrent(self.inner.raw)) }?;
        }
        Ok(CurrentGuard {
            ctx: self,
            pushed,
            _not_send: PhantomData,
        })
    }

    /// Free and total device memory, as the driver sees them now.
    #[doc(alias = "cuMemGetInfo")]
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        let _g = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the context is current.
        unsafe { call!(self.cuda(), cuMemGetInfo(&mut free, &mut total)) }?;
        Ok(MemoryInfo { free, total })
    }
}

/// A device's memory in bytes ([`Context::memory_info`]), named so that free and total
/// cannot be swapped.
///
/// ```
/// use cuda_hal::{DeviceBuffer, MemoryInfo};
/// # let (cuda, _machine) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let before = ctx.memory_info()?;
/// let buf = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20)?;
/// let MemoryInfo { free, total } = ctx.memory_info()?;
/// assert_eq!(total, before.total);
/// assert_eq!(free, before.free - (1 << 20)); // the simulated device has no other user
/// drop(buf);
/// assert_eq!(ctx.memory_info()?, before);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[doc(alias = "cuMemGetInfo")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free now (other processes and contexts allocate from the same memory).
    pub free: usize,
    /// The device's memory.
    pub total: usize,
}

/// Keeps a context current on this thread; the previous one is current again on drop. Not
/// `Send`: "current" is a property of the thread. Guards dropped out of order leave the
/// right context current once all are gone; this crate's own calls never rely on a guard
/// they did not make. See [`Context::bind`] for an example.
///
/// ```compile_fail
/// # let (cuda, _world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let guard = ctx.bind()?;
/// // "Current" belongs to this thread: the guard cannot be sent to another.
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard));
/// });
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[must_use = "the context is current only while the guard lives"]
pub struct CurrentGuard<'a> {
    ctx: &'a Context,
    pushed: bool,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for CurrentGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentGuard")
            .field("device", &self.ctx.device().ordinal())
            .field("pushed", &self.pushed)
            .finish()
    }
}

static_assertions::assert_not_impl_any!(CurrentGuard<'static>: Send, Sync);
static_assertions::assert_impl_all!(CurrentGuard<'static>: std::fmt::Debug);

impl CurrentGuard<'_> {
    /// The context this guard keeps current.
    #[must_use]
    pub fn context(&self) -> &Context {
        self.ctx
    }
}

impl Drop for CurrentGuard<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: pops one entry of this thread's stack (the guard is not Send): the one
            // `bind` pushed, or, when guards are dropped out of order, another guard's, which
            // that guard then leaves in place; every entry is a context some guard retains
            // until its own drop, and nothing is named here, so nothing stale is made current.
            let _ = unsafe { (self.ctx.cuda().fns().cuCtxPopCurrent)(&mut popped) };
        }
    }
}

/// A device's primary context.
impl Device {
    /// Retains the device's primary context (released when the last clone drops).
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn primary_context(&self) -> Result<Context> {
        Context::retain_primary(self)
    }
}
