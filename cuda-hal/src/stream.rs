//! Streams: ordered queues of device work. The [`Stream`] type and the state the memory
//! model keeps on it are defined in `hold/core.rs`; its operations are here.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use cuda_sys::{CUresult, CUstream, CUstream_flags};

use crate::hold::core::{Inner, KeepAlive, Stream};
use crate::hold::group::DeferScope;
use crate::hold::lock::lock;
use crate::hold::{after_enqueue, foreign_capture, queued};

/// The driver's errors after which a context can run nothing more ("the context cannot
/// be used, so it must be destroyed"): its pending work never runs.
const STICKY: [CUresult; 11] = [
    CUresult::CUDA_ERROR_DEINITIALIZED,
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
    CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
];
use crate::{Context, Error, Result};

/// Held while work is noted and enqueued on a stream ([`Stream::enqueue_lock`]).
///
/// How code that enqueues work on a buffer's raw address itself keeps the crate's
/// promises: under the lock, note the memory used on the stream, then enqueue.
///
/// ```
/// use cuda_hal::{DeviceBuffer, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// let buf = DeviceBuffer::<u8>::zeroed(&ctx, 64)?;
/// {
///     let _order = stream.enqueue_lock();
///     // Its free now waits for the memset, and a capture would hold the memory.
///     buf.used_on(&stream)?;
///     let f = cuda.fns().cuMemsetD8Async;
///     // SAFETY: 64 bytes of live device memory of the stream's context, noted as used.
///     let rc = unsafe { f(buf.as_raw(), 0xab, 64, stream.as_raw()) };
///     cuda.check(rc, "cuMemsetD8Async")?;
/// }
/// stream.synchronize()?;
/// assert_eq!(buf.to_vec()?, [0xab; 64]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[must_use = "the lock orders captures only while it is held"]
pub struct EnqueueLock<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    /// The stream's key for a lock taken with [`Stream::enqueue_lock`] (its drop runs the
    /// stream's [`after_enqueue`](Stream::after_enqueue) hooks); 0 for this crate's
    /// internal ones, which run none.
    key: usize,
}

impl<'a> EnqueueLock<'a> {
    #[inline]
    fn new(guard: RwLockReadGuard<'a, ()>, key: usize) -> Self {
        after_enqueue::enter(key);
        EnqueueLock { _guard: guard, key }
    }
}

impl Drop for EnqueueLock<'_> {
    /// The work is enqueued (or failed to be): the hooks registered under this lock run,
    /// before the lock is released.
    #[inline]
    fn drop(&mut self) {
        after_enqueue::leave(self.key);
    }
}

/// A stream's order lock held exclusively ([`Stream::capture_lock`]).
pub(crate) struct CaptureGuard<'a>(ManuallyDrop<RwLockWriteGuard<'a, ()>>);

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        drop(unsafe { ManuallyDrop::take(&mut self.0) });
        after_enqueue::leave(0);
        // The releases this lock made wait can finish now (or wait in the queue for the
        // next chance, as this stream's capture may have just begun).
        queued::lock_let_go();
    }
}

impl std::fmt::Debug for EnqueueLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnqueueLock")
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
        unsafe { call!(ctx.cuda(), cuStreamCreate(&mut raw, flags)) }?;
        Ok(Stream::from_inner(Inner::new(ctx, raw, true)))
    }

    /// The context's legacy default stream (the null handle; never destroyed).
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let legacy = Stream::legacy_default(&ctx);
    /// assert!(legacy.as_raw().is_null());
    /// let mut buf = DeviceBuffer::<u16>::zeroed(&ctx, 3)?;
    /// buf.fill_async(9, &legacy)?;
    /// legacy.synchronize()?;
    /// assert_eq!(buf.to_vec()?, [9; 3]);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[must_use]
    pub fn legacy_default(ctx: &Context) -> Stream {
        Stream::from_inner(Inner::new(ctx, std::ptr::null_mut(), false))
    }

    /// Wraps a raw stream of `ctx`.
    ///
    /// # Safety
    /// `raw` must be a stream of `ctx` (or null) that stays valid for the life of the
    /// returned value; if `owned`, nothing else destroys it. It must not be captured into
    /// a graph except through [`Stream::begin_capture`] on the returned value or its
    /// clones (or joined to such a capture with [`Stream::wait_event`]): work this crate
    /// enqueues on a stream captured behind its back is not kept alive for the graph (see
    /// the crate's Safety section).
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let mut raw = std::ptr::null_mut();
    /// {
    ///     let _current = ctx.bind()?;
    ///     // SAFETY: a valid out-pointer, with `ctx` current.
    ///     let rc = unsafe { (cuda.fns().cuStreamCreate)(&mut raw, 0) };
    ///     cuda.check(rc, "cuStreamCreate")?;
    /// }
    /// // SAFETY: a stream of `ctx`, destroyed by nothing else (owned), and captured only
    /// // through the returned value.
    /// let stream = unsafe { Stream::from_raw(&ctx, raw, true) };
    /// let mut buf = DeviceBuffer::<i32>::zeroed(&ctx, 2)?;
    /// buf.fill_async(-1, &stream)?;
    /// stream.synchronize()?;
    /// assert_eq!(buf.to_vec()?, [-1, -1]);
    /// drop((buf, stream)); // the buffer's use log holds the stream too
    /// assert_eq!(world.live().streams, 0, "owned: destroyed with the value");
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub unsafe fn from_raw(ctx: &Context, raw: CUstream, owned: bool) -> Stream {
        let mut inner = Inner::new(ctx, raw, owned);
        inner.foreign = true;
        Stream::from_inner(inner)
    }

    /// Wraps another library's stream of `ctx`, kept alive by `owner` (that library's
    /// stream object), which is dropped after the last clone of the returned value and
    /// after every buffer whose use log holds it. Work this crate enqueues on it while
    /// that library captures it (a capture this crate cannot see) keeps what it uses
    /// alive for as long as that library's graph, or an instance of it, lives (a CUDA
    /// user object the graph owns). A capture that library begins or ends on another
    /// thread while this crate enqueues there is a race the caller must avoid, as with any
    /// two libraries sharing a stream: work enqueued just as a capture begins may be
    /// recorded without what it uses being held.
    ///
    /// # Safety
    /// `raw` must be a stream of `ctx` (or null, the legacy default stream) that stays
    /// valid while `owner` lives, and whose owner does not begin or end a capture of it on
    /// another thread while work is being enqueued on it through this crate.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// /// Another crate's stream, destroyed when its last handle goes.
    /// let theirs = Arc::new(Stream::non_blocking(&ctx)?);
    /// // SAFETY: `theirs` keeps its stream, of `ctx`, alive.
    /// let stream = unsafe { Stream::from_owner(&ctx, theirs.as_raw(), theirs.clone()) };
    /// let mut buf = DeviceBuffer::<u16>::zeroed(&ctx, 4)?;
    /// buf.fill_async(3, &stream)?;
    /// drop((theirs, stream));
    /// assert_eq!(world.live().streams, 1, "the buffer's use log still holds it");
    /// assert_eq!(buf.to_vec()?, [3; 4]);
    /// drop(buf);
    /// assert_eq!(world.live().streams, 0);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub unsafe fn from_owner(
        ctx: &Context,
        raw: CUstream,
        owner: impl Send + Sync + 'static,
    ) -> Stream {
        let mut inner = Inner::new(ctx, raw, false);
        inner.foreign = true;
        inner._owner = Some(Box::new(owner));
        Stream::from_inner(inner)
    }

    /// Held from before work is noted ([`hold`](Self::hold),
    /// [`DeviceBuffer::used_on`](crate::DeviceBuffer::used_on)) until it is enqueued: no
    /// capture of this stream begins or ends in between, so captured work is always held.
    /// Every enqueueing call of this crate and of nccl-channel takes it; do not take it
    /// twice on one thread (it is not re-entrant).
    pub fn enqueue_lock(&self) -> EnqueueLock<'_> {
        let guard = self.inner.order.read().unwrap_or_else(|e| e.into_inner());
        EnqueueLock::new(guard, self.key())
    }

    /// Exclusive: a capture begins, ends or is joined. Releases that queued themselves
    /// meanwhile are retried when it is let go.
    pub(crate) fn capture_lock(&self) -> CaptureGuard<'_> {
        let guard = self.inner.order.write().unwrap_or_else(|e| e.into_inner());
        after_enqueue::enter(0);
        CaptureGuard(ManuallyDrop::new(guard))
    }

    /// The capture lock if it can be had soon (a few short retries), for a stream's last
    /// user handle going: `None` rather than wait on a lock this thread may hold.
    pub(crate) fn try_capture_lock(&self) -> Option<CaptureGuard<'_>> {
        for _ in 0..100u32 {
            match self.inner.order.try_write() {
                Ok(guard) => {
                    after_enqueue::enter(0);
                    return Some(CaptureGuard(ManuallyDrop::new(guard)));
                }
                Err(std::sync::TryLockError::Poisoned(e)) => {
                    after_enqueue::enter(0);
                    return Some(CaptureGuard(ManuallyDrop::new(e.into_inner())));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
        None
    }

    /// Keeps what `what` returns alive for work just enqueued on this stream that has not
    /// really been enqueued: work recorded by an open capture (until the graph made of it
    /// is dropped) or deferred by an open group on this thread ([`DeferScope`], until
    /// the group ends). Call it *before* the call that enqueues the work, with
    /// [`enqueue_lock`](Self::enqueue_lock) held across both. Otherwise it
    /// does nothing, and `what` is not called: one relaxed load and a thread-local read.
    #[inline]
    pub fn hold(&self, what: impl FnOnce() -> KeepAlive) {
        if self.inner.capturing.load(Ordering::Relaxed)
            || DeferScope::is_open()
            || self.inner.foreign
        {
            self.hold_now(what());
        }
    }

    #[cold]
    fn hold_now(&self, what: KeepAlive) {
        if let Some(log) = self.capture_log() {
            lock(&log.held).push(what.clone());
        } else if self.inner.foreign && self.is_capturing().unwrap_or(true) {
            // Another library captures this stream: the graph it makes may launch this
            // work at any time, for as long as it lives. That graph keeps what the work
            // uses (a user object it owns), released once it and its instances are gone.
            let hold = Box::new(what.clone());
            let ctx = &self.inner.ctx;
            if let Err(e) = foreign_capture::give_to_capturing_graph(ctx, self.as_raw(), hold) {
                eprintln!(
                    "cuda-hal: work is being enqueued on stream {:?}, which another library \
                     is capturing into a graph, and its graph could not be made to keep what \
                     that work uses ({e}): it is kept for the rest of the process",
                    self.inner.raw
                );
            }
        }
        if DeferScope::is_open() {
            DeferScope::hold(what, self);
        }
    }

    /// `Ok` when work enqueued on this stream now is enqueued for real before the
    /// enqueueing call returns: no capture records the stream (this crate's or another
    /// library's) and no group ([`DeferScope`]) is open on this thread. Memory that is
    /// only borrowed (it cannot be held by a [`KeepAlive`]) asks this in its
    /// [`DeviceSlice::used_on`](crate::DeviceSlice::used_on); otherwise
    /// [`Error::Deferred`].
    ///
    /// ```
    /// use cuda_hal::{CaptureMode, DeferScope, Error, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::non_blocking(&ctx)?;
    /// stream.expect_immediate("my op")?;
    /// {
    ///     let _group = DeferScope::open();
    ///     assert!(matches!(stream.expect_immediate("my op"), Err(Error::Deferred { .. })));
    /// }
    /// stream.begin_capture(CaptureMode::ThreadLocal)?;
    /// assert!(matches!(stream.expect_immediate("my op"), Err(Error::Deferred { .. })));
    /// stream.end_capture()?;
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn expect_immediate(&self, what: &'static str) -> Result<()> {
        if DeferScope::is_open() {
            return Err(Error::Deferred {
                what,
                why: "an NCCL group (a DeferScope) is open on this thread",
            });
        }
        if self.capture_log().is_some() || self.is_capturing()? {
            return Err(Error::Deferred {
                what,
                why: "the stream is being captured",
            });
        }
        Ok(())
    }

    /// Runs `f` once the work being enqueued on this stream under this thread's
    /// [`enqueue_lock`](Self::enqueue_lock) is really enqueued: when that lock is released
    /// (the enqueueing call has returned from the driver or NCCL, successfully or not), or,
    /// inside an open group, right after the group has ended and settled. For owners that
    /// order their own next use after this crate's work (recording their event on
    /// `stream`): call it from [`DeviceSlice::used_on`](crate::DeviceSlice::used_on).
    ///
    /// Refused ([`Error::Deferred`]) while the stream is captured (the work runs at each
    /// launch instead), and ([`Error::InvalidArgument`]) when this thread does not hold the
    /// stream's enqueue lock (nothing would say when the work is enqueued).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use cuda_hal::Stream;
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::non_blocking(&ctx)?;
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// {
    ///     let _order = stream.enqueue_lock();
    ///     let l = log.clone();
    ///     stream.after_enqueue(move || l.lock().unwrap().push("after"))?;
    ///     log.lock().unwrap().push("enqueue"); // the driver call would be here
    /// }
    /// assert_eq!(*log.lock().unwrap(), ["enqueue", "after"]);
    /// assert!(stream.after_enqueue(|| ()).is_err(), "not under the lock");
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn after_enqueue(&self, f: impl FnOnce() + 'static) -> Result<()> {
        if !after_enqueue::holds(self.key()) {
            return Err(Error::InvalidArgument {
                what: "Stream::after_enqueue",
                problem: "called without this stream's enqueue_lock held on this thread".into(),
            });
        }
        if self.capture_log().is_some() || self.is_capturing()? {
            return Err(Error::Deferred {
                what: "Stream::after_enqueue",
                why: "the stream is being captured",
            });
        }
        after_enqueue::push(self.key(), Box::new(f))
    }

    /// The order lock if it can be had without waiting for a capture to begin or end
    /// (with a few short retries): for the orderings that enqueue on streams they do not
    /// otherwise lock, where blocking could deadlock (the caller may hold a lock already).
    /// `None` means: do not enqueue.
    pub(crate) fn try_enqueue_lock(&self) -> Option<EnqueueLock<'_>> {
        for i in 0..2000u32 {
            if let Some(g) = self.try_enqueue_lock_now() {
                return Some(g);
            }
            if i < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        None
    }

    /// The order lock if no capture holds it or waits for it now (one attempt): for
    /// releases, which queue themselves when it cannot be had.
    pub(crate) fn try_enqueue_lock_now(&self) -> Option<EnqueueLock<'_>> {
        match self.inner.order.try_read() {
            Ok(g) => Some(EnqueueLock::new(g, 0)),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(EnqueueLock::new(e.into_inner(), 0)),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether the order lock is held, or waited for, exclusively (a capture beginning,
    /// ending or being joined).
    #[cfg(test)]
    pub(crate) fn capture_waiting(&self) -> bool {
        self.inner.order.try_read().is_err()
    }

    /// `Err` when a capture begun here records this stream: for the calls that must wait
    /// for the stream (waiting is not allowed while capturing, and the host memory they
    /// borrow must not end up in a graph).
    pub(crate) fn refuse_capture(&self, what: &'static str) -> Result<()> {
        if self.capture_log().is_some() {
            return Err(Error::Capturing { what });
        }
        Ok(())
    }

    /// `Err` before a host wait for this stream that would fail on a real device and spoil
    /// a capture: this stream is captured, or a capture begun through this crate in global
    /// or thread-local mode forbids this thread host synchronisations.
    pub(crate) fn refuse_host_wait(&self, what: &'static str) -> Result<()> {
        self.refuse_capture(what)?;
        if Stream::strict_capture_here(self.inner.ctx.cuda()).is_some() {
            return Err(Error::Capturing { what });
        }
        Ok(())
    }

    /// `Err` before a synchronous copy or memset of `ctx`'s memory (they run on the legacy
    /// stream and the host waits for them) while a capture begun through this crate
    /// forbids this thread host waits: the driver would refuse it and spoil that capture.
    pub(crate) fn refuse_synchronous_use(ctx: &Context) -> Result<()> {
        if Stream::strict_capture_here(ctx.cuda()).is_some() {
            return Err(Error::Capturing {
                what: "a synchronous copy or memset (inside a capture, use the stream-ordered \
                       forms)",
            });
        }
        Ok(())
    }

    /// The raw handle (to pass to other CUDA libraries, e.g. NCCL).
    #[inline]
    #[must_use]
    pub fn as_raw(&self) -> CUstream {
        self.inner.raw
    }

    /// The stream's context.
    #[inline]
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Blocks until all work on the stream is done.
    ///
    /// [`Error::Capturing`] while a capture begun through this crate forbids the wait
    /// (a global-mode capture, or a thread-local one of this thread, as CUDA's
    /// `CUstreamCaptureMode` says), before any driver call: the driver would refuse it and
    /// spoil that capture. A relaxed capture forbids nothing.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        if Stream::strict_capture_here(self.inner.ctx.cuda()).is_some() {
            return Err(Error::Capturing {
                what: "Stream::synchronize",
            });
        }
        let _g = self.bind_if_legacy()?;
        // SAFETY: a valid stream (the legacy one with its context current).
        unsafe { call!(self.inner.ctx.cuda(), cuStreamSynchronize(self.inner.raw)) }
    }

    /// Waits for the stream before a borrow of host memory its work uses ends (the `_on`
    /// copies), and returns the wait's error. A failed wait does not end the borrow
    /// early: the stream is then queried until it has no pending work, or until the
    /// driver says the context is lost (a sticky error: the driver runs none of its work
    /// again). Any other answer (not ready, a capture elsewhere refusing the question, an
    /// unexpected error) is asked again: this blocks rather than end the borrow while a
    /// copy into or from it might still run.
    pub(crate) fn synchronize_for_borrow(&self) -> Result<()> {
        let r = self.synchronize();
        if let Err(e) = &r {
            // A cold path (the wait failed): a fixed short pause between questions, and a
            // word on stderr once the wait gets long.
            let start = std::time::Instant::now();
            let mut said = false;
            while !self.idle_or_lost() {
                if !said && start.elapsed() > std::time::Duration::from_secs(5) {
                    eprintln!(
                        "cuda-hal: a blocking copy's wait failed ({e}); the stream still has \
                         work, and the copy's host memory stays borrowed until it is done"
                    );
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        r
    }

    /// Whether the stream has no pending work, or its context is lost for good.
    fn idle_or_lost(&self) -> bool {
        match self.is_idle() {
            Ok(idle) => idle,
            Err(Error::Driver { code, .. }) => STICKY.contains(&code),
            Err(_) => false,
        }
    }

    /// Whether all work on the stream is done, without blocking.
    #[doc(alias = "cuStreamQuery")]
    pub fn is_idle(&self) -> Result<bool> {
        let _g = self.bind_if_legacy()?;
        // SAFETY: a valid stream (the legacy one with its context current).
        let (rc, name) = unsafe { raw_call!(self.inner.ctx.cuda(), cuStreamQuery(self.inner.raw)) };
        if rc == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.inner.ctx.cuda().check(rc, name)?;
        Ok(true)
    }

    /// The device of the stream (driver ≥ 12.8 asks the driver; the context tells before).
    #[doc(alias = "cuStreamGetDevice")]
    pub fn device_ordinal(&self) -> Result<i32> {
        let mut dev = 0;
        let _g = self.inner.ctx.bind()?;
        // SAFETY: valid stream and out-pointer.
        unsafe {
            call_opt!(
                self.inner.ctx.cuda(),
                cuStreamGetDevice(self.inner.raw, &mut dev)
            )
        }?;
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

    /// `Ok` when the stream belongs to `ctx` (the context `what` needs); else the
    /// stream is the object of the wrong device or context.
    pub(crate) fn same_context(&self, ctx: &Context, what: &'static str) -> Result<()> {
        ctx.expect_same(&self.inner.ctx, what, "stream")
    }
}

/// Waiting for a whole context, under the same rules as waiting for a stream.
impl Context {
    /// Waits for all work in the context ([`Error::Capturing`](crate::Error::Capturing)
    /// while a strict capture forbids it, as for [`Stream::synchronize`](crate::Stream::synchronize)).
    #[doc(alias = "cuCtxSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        if Stream::strict_capture_here(self.cuda()).is_some() {
            return Err(crate::Error::Capturing {
                what: "Context::synchronize",
            });
        }
        let _g = self.bind()?;
        // SAFETY: a context is current.
        unsafe { call!(self.cuda(), cuCtxSynchronize()) }
    }
}
