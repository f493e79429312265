//! CUDA graphs: capture a stream's work once, replay it with one launch.
//!
//! A graph names the device memory (and communicators) of the work it recorded, and can
//! be launched long after the capture. So everything noted during the capture
//! ([`Stream::hold`]) is owned by the graph: dropping a buffer that a graph uses only
//! drops the buffer's handle, and the memory is freed once the graph is gone and its
//! launches are done.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::{CUgraph, CUgraphExec, CUstreamCaptureMode, CUstreamCaptureStatus};

use crate::hold::core::{CaptureLog, Dependency, Forbids, KeepAlive, gated};
use crate::hold::host_waits::{forbidding_capture, note_strict};
use crate::hold::lock::lock;
use crate::{Context, Error, Result, Stream};

/// How a capture treats unsafe calls from other threads (`CUstreamCaptureMode`).
///
/// Non-exhaustive: CUDA may add modes.
///
/// ```
/// use cuda_hal::{CaptureMode, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// for mode in [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
///     stream.begin_capture(mode)?;
///     assert_eq!(stream.end_capture()?.dependencies(), 0, "nothing was recorded");
/// }
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CaptureMode {
    /// Unsafe calls from any thread fail while any capture is running.
    Global,
    /// Only this thread's unsafe calls fail (use this when several threads capture).
    ThreadLocal,
    /// Nothing is checked.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> CUstreamCaptureMode {
        match self {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

impl Stream {
    /// Starts recording the work enqueued on this stream instead of running it. What the
    /// recorded work uses is kept alive by the graph [`end_capture`](Self::end_capture)
    /// returns.
    ///
    /// ```
    /// use cuda_hal::{CaptureMode, DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::non_blocking(&ctx)?;
    /// let input = DeviceBuffer::from_slice(&ctx, &[1u32, 2, 3])?;
    /// let mut output = DeviceBuffer::<u32>::zeroed(&ctx, 3)?;
    /// stream.begin_capture(CaptureMode::ThreadLocal)?;
    /// assert!(stream.is_capturing()?);
    /// output.copy_from_async(&input, &stream)?;
    /// let graph = stream.end_capture()?;
    /// assert_eq!(graph.dependencies(), 2, "both buffers");
    /// assert_eq!(output.to_vec()?, [0, 0, 0], "captured, not run");
    /// let exec = graph.instantiate()?;
    /// drop((graph, input)); // the executable graph keeps the input's memory
    /// exec.launch(&stream)?;
    /// stream.synchronize()?;
    /// assert_eq!(output.to_vec()?, [1, 2, 3]);
    /// assert_eq!(world.live().device_allocations, 2);
    /// drop(exec);
    /// assert_eq!(world.live().device_allocations, 1, "the input went with the graph");
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuStreamBeginCapture")]
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        if crate::DeferScope::is_open() {
            // The group launches its recorded work at its end, into this capture, while
            // what that work uses is held by the group alone: the graph would hold nothing.
            return Err(Error::InvalidArgument {
                what: "begin_capture",
                problem: "called inside an open group (DeferScope) on this thread: the work \
                          the group launches at its end would be captured without what it uses; \
                          end the group first, or begin the capture before the group"
                    .into(),
            });
        }
        let _excl = self.capture_lock();
        if self.capture_log().is_some() {
            return Err(Error::Capturing {
                what: "begin_capture",
            });
        }
        // Before the driver call: a thread whose work the driver records must see it.
        // Another thread's open group that recorded work here launches it into this
        // capture: the graph holds what that group holds.
        let forbids = match mode {
            CaptureMode::Global => Some(Forbids::Everyone),
            CaptureMode::ThreadLocal => Some(Forbids::Thread(std::thread::current().id())),
            CaptureMode::Relaxed => None,
        };
        let log = CaptureLog {
            forbids,
            origin: self.key(),
            began_on: Some(std::thread::current().id()),
            origin_stream: Arc::downgrade(&self.inner),
            driver: self.context().cuda().key(),
            ..CaptureLog::default()
        };
        *lock(&log.held) = self.group_holds();
        let _g = self.bind_if_legacy()?;
        let log = Arc::new(log);
        self.set_capture(Some(log.clone()));
        // Noted before the driver call too: a host wait another thread makes once the
        // driver has begun is refused here first (the driver would refuse it and spoil the
        // capture), and a release that meets the refusal finds the capture.
        note_strict(&log);
        // SAFETY: a valid stream; the mode is a documented value.
        let r = unsafe {
            call!(
                self.context().cuda(),
                cuStreamBeginCapture(self.as_raw(), mode.raw())
            )
        };
        if r.is_err() {
            log.ended.store(true, std::sync::atomic::Ordering::Release);
            self.set_capture(None);
        }
        r
    }

    /// Stops recording and returns the captured work as a graph. Fails without a driver
    /// call when the capture was not begun with [`begin_capture`](Self::begin_capture).
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end_capture(&self) -> Result<Graph> {
        let (r, raw, log) = {
            let _excl = self.capture_lock();
            let Some(log) = self.capture_log() else {
                return Err(Error::ForeignCapture {
                    what: "end_capture",
                });
            };
            let cuda = self.context().cuda();
            let mut raw: CUgraph = std::ptr::null_mut();
            // SAFETY: a valid stream and out-pointer.
            let r = unsafe { call!(cuda, cuStreamEndCapture(self.as_raw(), &mut raw)) };
            // The capture is over unless the driver says it still runs (a joined stream
            // asked).
            if r.is_ok() || !self.is_capturing().unwrap_or(false) {
                log.ended.store(true, std::sync::atomic::Ordering::Release);
                self.set_capture(None);
            }
            (r, raw, log)
        };
        // Outside the lock: a failed capture's holds may be the last owners of memory,
        // whose free takes stream locks.
        let held = std::mem::take(&mut *lock(&log.held));
        if let Err(e) = r {
            // The capture failed (or was spoilt): its work never runs. Once over, its
            // holds go here, not with the record's last reference, wherever that drops.
            if log.is_ended() {
                drop(held);
            } else {
                *lock(&log.held) = held;
            }
            return Err(e);
        }
        Ok(Graph {
            ctx: self.context().clone(),
            raw,
            held: held.into(),
        })
    }

    /// The stream's last user handle is gone while a capture begun through it records.
    /// Nothing can end that capture any more, so the work it recorded never runs: the
    /// driver's capture is ended and its graph destroyed, and the record lets go of what
    /// it holds (which may hold this very stream, through the use log of memory it keeps:
    /// a cycle otherwise, and the thread's host waits refused for good). CUDA ends a strict
    /// (global or thread-local) capture only on the thread that began it: one whose last
    /// handle goes on another thread stays, with what it holds (a whole leak).
    #[cold]
    pub(crate) fn abandon_capture(&self) {
        let Some(log) = self.capture_log() else {
            return;
        };
        let here = Some(std::thread::current().id());
        if log.origin != self.key() {
            return;
        }
        if log.forbids.is_some() && log.began_on != here {
            // Ends only on the thread that began it: done there, at its next look at the
            // captures that forbid it host waits (`strict_capture_here`).
            return;
        }
        let held = {
            let Some(_excl) = self.try_capture_lock() else {
                return;
            };
            if !self.capture_log().is_some_and(|l| Arc::ptr_eq(&l, &log)) {
                return;
            }
            let cuda = self.context().cuda();
            let mut raw: CUgraph = std::ptr::null_mut();
            // SAFETY: a valid stream (a captured one is never the legacy stream) and
            // out-pointer.
            let r = unsafe { (cuda.fns().cuStreamEndCapture)(self.as_raw(), &mut raw) };
            // Written only on success.
            if !raw.is_null() {
                // SAFETY: the graph just made, never instantiated, destroyed once: the
                // work it recorded never runs.
                let _ = unsafe { (cuda.fns().cuGraphDestroy)(raw) };
            }
            if r.0 != 0 && self.is_capturing().unwrap_or(true) {
                return;
            }
            log.ended.store(true, std::sync::atomic::Ordering::Release);
            self.set_capture(None);
            std::mem::take(&mut *lock(&log.held))
        };
        // Outside the lock: these may be the last owners of memory, whose free takes it.
        drop(held);
    }

    /// A capture begun through this crate that forbids this thread host waits (see
    /// `host_waits`), once those of them begun here whose stream has no user handle left
    /// are abandoned: only this thread can end them.
    pub(crate) fn strict_capture_here(cuda: &crate::Cuda) -> Option<Arc<CaptureLog>> {
        loop {
            let log = forbidding_capture(cuda.key())?;
            // Begun here, and no user handle left (it went on another thread, or its
            // abandonment could not finish then): abandon it now.
            if log.began_on != Some(std::thread::current().id()) {
                return Some(log);
            }
            let Some(inner) = log.origin_stream.upgrade() else {
                return Some(log);
            };
            let origin = Stream::held_from(inner);
            if origin
                .inner
                .users
                .load(std::sync::atomic::Ordering::Acquire)
                != 0
            {
                return Some(log);
            }
            origin.abandon_capture();
            if !log.is_ended() {
                return Some(log);
            }
        }
    }

    /// Whether a capture begun through this crate forbids this thread host waits for
    /// this stream's driver now: one this thread began in [`CaptureMode::ThreadLocal`]
    /// mode, or a [`CaptureMode::Global`] one of any thread. While one does, a
    /// synchronisation, a copy through host memory or an allocation on this thread fails;
    /// a library that would wait for its own work on the side can ask first, and refuse
    /// before it starts. Captures of another driver (another simulated machine) forbid
    /// nothing here.
    ///
    /// ```
    /// use cuda_hal::{CaptureMode, Cuda, Stream};
    /// use cuda_mock::MockDriver;
    /// let (cuda, _machine) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let (s, other) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// assert!(!other.host_waits_forbidden());
    /// s.begin_capture(CaptureMode::ThreadLocal)?;
    /// assert!(other.host_waits_forbidden());
    /// drop(s.end_capture()?);
    /// assert!(!other.host_waits_forbidden());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[must_use]
    pub fn host_waits_forbidden(&self) -> bool {
        crate::hold::host_waits::forbidding_capture(self.context().cuda().key()).is_some()
    }

    /// Whether the driver is capturing the stream.
    #[doc(alias = "cuStreamIsCapturing")]
    pub fn is_capturing(&self) -> Result<bool> {
        let _g = self.bind_if_legacy()?;
        let mut st = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a valid stream and out-pointer.
        unsafe {
            call!(
                self.context().cuda(),
                cuStreamIsCapturing(self.as_raw(), &mut st)
            )
        }?;
        Ok(st == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
    }
}

/// A captured graph. It owns what its work uses (see [`Stream::begin_capture`] for a
/// whole capture).
///
/// One capture at a time per stream, and only this crate's captures can end here:
///
/// ```
/// use cuda_hal::{CaptureMode, Error, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// assert_eq!(stream.end_capture().unwrap_err(), Error::ForeignCapture { what: "end_capture" });
/// stream.begin_capture(CaptureMode::ThreadLocal)?;
/// let twice = stream.begin_capture(CaptureMode::ThreadLocal);
/// assert_eq!(twice, Err(Error::Capturing { what: "begin_capture" }));
/// let graph = stream.end_capture()?;
/// let (a, b) = (graph.instantiate()?, graph.instantiate()?); // any number of them
/// a.launch(&stream)?;
/// b.launch(&stream)?;
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct Graph {
    ctx: Context,
    raw: CUgraph,
    held: Arc<[KeepAlive]>,
}

// SAFETY: graph handles are usable from any thread, one call at a time (`&mut`-free API;
// instantiation only reads the graph); what it holds is `Send + Sync`.
unsafe impl Send for Graph {}

static_assertions::assert_impl_all!(Graph: Send, std::fmt::Debug);

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.ctx.device().ordinal())
            .field("holds", &self.held.len())
            .finish()
    }
}

impl Graph {
    /// Makes an executable graph of it; the executable graph owns what the work uses too.
    #[doc(alias = "cuGraphInstantiateWithFlags")]
    pub fn instantiate(&self) -> Result<GraphExec> {
        let mut raw: CUgraphExec = std::ptr::null_mut();
        let _g = self.ctx.bind()?;
        // SAFETY: a valid graph and out-pointer; flags 0.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuGraphInstantiateWithFlags(&mut raw, self.raw, 0)
            )
        }?;
        Ok(GraphExec {
            inner: Arc::new(ExecInner {
                ctx: self.ctx.clone(),
                raw,
                held: self.held.clone(),
            }),
            _not_sync: PhantomData,
        })
    }

    /// How many buffers, communicators and other dependencies the graph keeps alive.
    #[must_use]
    pub fn dependencies(&self) -> usize {
        self.held.len()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamEndCapture and destroyed once.
        let _ = unsafe { (self.ctx.cuda().fns().cuGraphDestroy)(self.raw) };
    }
}

struct ExecInner {
    ctx: Context,
    raw: CUgraphExec,
    held: Arc<[KeepAlive]>,
}

// SAFETY: as for `Graph`: the handle may be used from any thread, one call at a time.
unsafe impl Send for ExecInner {}
// SAFETY: shared only to keep it alive (`KeepAlive` in an outer capture's log, which only
// drops it); the one call made through it, `cuGraphLaunch`, goes through `GraphExec`,
// which is not `Sync`, so calls on the handle never overlap.
unsafe impl Sync for ExecInner {}

/// Held by an outer capture that recorded a launch of this graph: launching the outer
/// graph runs this one's work, so it notes, gates and holds for what this one holds.
impl Dependency for ExecInner {
    fn gated(&self) -> bool {
        self.held.iter().any(|k| k.dependency().gated())
    }

    fn while_usable(&self, launch: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let gates: Vec<KeepAlive> = self
            .held
            .iter()
            .filter(|k| k.dependency().gated())
            .cloned()
            .collect();
        gated(&gates, launch)
    }

    fn used_on(&self, stream: &Stream) -> Result<()> {
        for k in self.held.iter() {
            k.dependency().used_on(stream)?;
        }
        Ok(())
    }

    fn launched(&self, stream: &Stream) {
        for k in self.held.iter() {
            k.dependency().launched(stream);
        }
    }
}

impl Drop for ExecInner {
    fn drop(&mut self) {
        // SAFETY: created by instantiate and destroyed once; launches already enqueued
        // complete (the driver defers the release), and `held` is dropped after this.
        let _ = unsafe { (self.ctx.cuda().fns().cuGraphExecDestroy)(self.raw) };
    }
}

/// An executable graph: replays the captured work. It owns what the work uses. Not
/// `Sync`: the driver does not serialise calls on one graph object.
///
/// Each launch replays the work with the memory it was captured with, so a graph is
/// fed by updating its inputs in place:
///
/// ```
/// use cuda_hal::{CaptureMode, DeviceBuffer, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// let mut input = DeviceBuffer::<u32>::zeroed(&ctx, 2)?;
/// let mut total = DeviceBuffer::<u32>::zeroed(&ctx, 4)?;
/// stream.begin_capture(CaptureMode::ThreadLocal)?;
/// total.slice_mut(..2)?.copy_from_async(&input, &stream)?;
/// total.slice_mut(2..)?.fill_async(9, &stream)?;
/// let exec = stream.end_capture()?.instantiate()?;
/// for step in 1..=3 {
///     input.copy_from_host(&[step, step * 10])?;
///     exec.launch(&stream)?;
///     stream.synchronize()?;
/// }
/// assert_eq!(total.to_vec()?, [3, 30, 9, 9]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct GraphExec {
    inner: Arc<ExecInner>,
    _not_sync: PhantomData<Cell<()>>,
}

static_assertions::assert_impl_all!(GraphExec: Send, std::fmt::Debug);
static_assertions::assert_not_impl_any!(GraphExec: Sync);

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("device", &self.inner.ctx.device().ordinal())
            .field("holds", &self.inner.held.len())
            .finish()
    }
}

impl GraphExec {
    /// Enqueues one replay on `stream`. Every dependency that can become unusable (a
    /// communicator that was aborted or destroyed) is checked, and stays usable while
    /// the launch is enqueued; the memory the work uses is then freed only after this
    /// launch is done.
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let inner = &self.inner;
        stream.same_context(&inner.ctx, "GraphExec::launch")?;
        let _order = stream.enqueue_lock();
        for k in inner.held.iter() {
            k.dependency().used_on(stream)?;
        }
        // A launch recorded by another capture (or deferred) needs this graph too.
        stream.hold(|| KeepAlive::new(inner.clone() as Arc<dyn Dependency>));
        let gates: Vec<KeepAlive> = inner
            .held
            .iter()
            .filter(|k| k.dependency().gated())
            .cloned()
            .collect();
        let _g = stream.bind_if_legacy()?;
        gated(&gates, &mut || {
            // SAFETY: a valid executable graph and stream; what its work uses is owned by
            // `inner` and, through the use logs noted above, freed after this launch.
            unsafe { call!(inner.ctx.cuda(), cuGraphLaunch(inner.raw, stream.as_raw())) }
        })?;
        // Enqueued for real (unless a capture recorded it: its graph's launches tell).
        if stream.capture_log().is_none() {
            for k in inner.held.iter() {
                k.dependency().launched(stream);
            }
        }
        Ok(())
    }
}
