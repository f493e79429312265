//! The memory model's types, which name one another and so share this file: a stream
//! (its handle, and the state a capture or a group records on it), what enqueued work
//! depends on ([`Dependency`], held through [`KeepAlive`]), and a capture's record. What
//! they do lives in the sibling files and in the crate's `stream.rs`; this file holds
//! only the types and their own accessors.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use cuda_sys::CUstream;

use crate::hold::lock::lock;
use crate::{Context, Result};

pub(crate) struct Inner {
    pub(crate) ctx: Context,
    pub(crate) raw: CUstream,
    pub(crate) owned: bool,
    /// Made by another library (`from_raw`, `from_owner`): it may capture the stream
    /// behind this crate's back, so holds ask the driver.
    pub(crate) foreign: bool,
    /// Keeps a borrowed stream alive (another crate's stream object); dropped after it.
    pub(crate) _owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Set while a capture begun through [`Stream::begin_capture`] (or joined through
    /// [`Stream::wait_event`]) records this stream's work; `capture` then holds its log.
    pub(crate) capturing: AtomicBool,
    pub(crate) capture: Mutex<Option<Arc<CaptureLog>>>,
    /// Shared while work is noted and enqueued; exclusive while a capture begins, ends or
    /// is joined, so that no work slips into a capture between its noting and its enqueue.
    pub(crate) order: RwLock<()>,
    /// What the open groups that recorded work on this stream hold (until each has
    /// launched and settled): a capture begun meanwhile copies it.
    pub(crate) groups: Mutex<Vec<std::sync::Weak<Mutex<Vec<KeepAlive>>>>>,
    /// How many of the user's handles exist (the [`Stream`] values a user can end a
    /// capture through); the memory model's own references are not counted.
    pub(crate) users: AtomicUsize,
}

impl Inner {
    pub(crate) fn new(ctx: &Context, raw: CUstream, owned: bool) -> Inner {
        Inner {
            ctx: ctx.clone(),
            raw,
            owned,
            foreign: false,
            _owner: None,
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
            order: RwLock::new(()),
            groups: Mutex::new(Vec::new()),
            users: AtomicUsize::new(1),
        }
    }
}

// SAFETY: stream handles are usable from any thread; the driver serialises access.
unsafe impl Send for Inner {}
// SAFETY: as above for the handle. The rest is shared state made for threads: the
// capture flag and the user count are atomics, the capture log and the group holds sit
// behind mutexes and the order lock is an `RwLock`; the context is `Sync`, `owned` and
// `foreign` are never written after construction, and the owner is `Send + Sync`.
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
///
/// Work on one stream runs in order; across streams, an [`Event`](crate::Event) orders it:
///
/// ```
/// use cuda_hal::{DeviceBuffer, Event, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let (producer, consumer) = (Stream::non_blocking(&ctx)?, Stream::non_blocking(&ctx)?);
/// let mut a = DeviceBuffer::<u32>::zeroed(&ctx, 4)?;
/// let mut b = DeviceBuffer::<u32>::zeroed(&ctx, 4)?;
/// a.fill_async(7, &producer)?;
/// let filled = Event::without_timing(&ctx)?;
/// producer.record(&filled)?;
/// consumer.wait_event(&filled)?; // the copy below runs after the fill
/// b.copy_from_async(&a, &consumer)?;
/// consumer.synchronize()?;
/// assert!(consumer.is_idle()?);
/// assert_eq!(b.to_vec()?, [7; 4]);
/// assert_eq!(consumer.device_ordinal()?, 0);
/// assert!(world.violations().is_empty());
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct Stream {
    pub(crate) inner: Arc<Inner>,
    /// A user's handle (counted in `users`), or one of the memory model's own references
    /// ([`held`](Self::held)): use logs, groups, a buffer's home stream.
    pub(crate) user: bool,
}

impl Clone for Stream {
    /// Another user's handle to the same stream.
    fn clone(&self) -> Stream {
        self.inner.users.fetch_add(1, Ordering::Relaxed);
        Stream {
            inner: self.inner.clone(),
            user: true,
        }
    }
}

impl Drop for Stream {
    /// The last user's handle going while a capture begun through it records: nothing
    /// can end that capture any more, so it is abandoned (see `stream.rs`).
    fn drop(&mut self) {
        if self.user && self.inner.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.abandon_capture();
        }
    }
}

static_assertions::assert_impl_all!(Stream: Send, Sync, Clone, std::fmt::Debug);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.inner.ctx.device().ordinal())
            .field("raw", &self.inner.raw)
            .finish()
    }
}

/// The state the memory model keeps on a stream (its operations are in `stream.rs`).
impl Stream {
    /// A reference the memory model keeps to the stream behind `inner`.
    pub(crate) fn held_from(inner: Arc<Inner>) -> Stream {
        Stream { inner, user: false }
    }

    /// A user's handle to a new stream.
    pub(crate) fn from_inner(inner: Inner) -> Stream {
        Stream {
            inner: Arc::new(inner),
            user: true,
        }
    }

    /// A reference the memory model keeps (a use log's, a group's, a buffer's home): it
    /// keeps the stream alive, but is no user's handle, so it does not keep a capture
    /// nobody can end any more from being abandoned (which would be a cycle: the
    /// capture's record holds memory whose use log holds the stream).
    #[inline]
    pub(crate) fn held(&self) -> Stream {
        Stream {
            inner: self.inner.clone(),
            user: false,
        }
    }

    /// Identifies the shared stream value (clones have the same key); never 0.
    #[inline]
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.inner).addr()
    }

    /// An open group recorded work on this stream: `holds` is what it holds until it has
    /// launched and settled (dead after that).
    pub(crate) fn note_group(&self, holds: std::sync::Weak<Mutex<Vec<KeepAlive>>>) {
        let mut groups = lock(&self.inner.groups);
        groups.retain(|g| g.strong_count() > 0);
        groups.push(holds);
    }

    /// What the open groups that recorded work on this stream hold: a capture beginning
    /// now records that work when they launch it, so its graph must hold this too.
    pub(crate) fn group_holds(&self) -> Vec<KeepAlive> {
        let mut groups = lock(&self.inner.groups);
        groups.retain(|g| g.strong_count() > 0);
        groups
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .flat_map(|g| lock(&g).clone())
            .collect()
    }

    /// The log of the capture recording this stream's work, if one is open.
    pub(crate) fn capture_log(&self) -> Option<Arc<CaptureLog>> {
        if !self.inner.capturing.load(Ordering::Acquire) {
            return None;
        }
        let mut slot = lock(&self.inner.capture);
        let old = match &*slot {
            Some(log) if !log.is_ended() => return Some(log.clone()),
            _ => slot.take(),
        };
        self.inner.capturing.store(false, Ordering::Release);
        drop(slot);
        // After the slot's lock: the last reference to an ended record may hold memory
        // whose release looks at this very slot.
        drop(old);
        None
    }

    /// Starts recording into `log` (set before the driver call, so that any thread whose
    /// work the driver captures sees it).
    pub(crate) fn set_capture(&self, log: Option<Arc<CaptureLog>>) {
        let mut slot = lock(&self.inner.capture);
        self.inner.capturing.store(log.is_some(), Ordering::Release);
        let old = std::mem::replace(&mut *slot, log);
        drop(slot);
        // After the slot's lock, as in `capture_log`.
        drop(old);
    }
}

/// Something enqueued, captured or deferred work depends on: device memory, a
/// communicator, a registration. Held through [`KeepAlive`].
///
/// The methods are called while this crate holds a stream's order lock or a thread's
/// group state: they must not call back into this crate's stream, event, graph or group
/// functions (that could deadlock), and should return quickly.
///
/// A handle another library can revoke (as an NCCL communicator can be aborted), held by
/// a graph that captured work using it; the graph refuses to launch once it is gone:
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
/// use cuda_hal::{CaptureMode, Dependency, DeviceBuffer, Error, KeepAlive, Result, Stream};
///
/// #[derive(Default)]
/// struct Revocable {
///     revoked: AtomicBool,
/// }
/// impl Dependency for Revocable {
///     fn gated(&self) -> bool {
///         true
///     }
///     fn while_usable(&self, launch: &mut dyn FnMut() -> Result<()>) -> Result<()> {
///         // A real one also keeps the handle from going until `launch` returns.
///         if self.revoked.load(Ordering::Acquire) {
///             return Err(Error::Unusable { what: "the handle was revoked".into() });
///         }
///         launch()
///     }
/// }
///
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let handle = Arc::new(Revocable::default());
/// let stream = Stream::non_blocking(&ctx)?;
/// let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 4)?;
/// stream.begin_capture(CaptureMode::ThreadLocal)?;
/// {
///     // What a library does as it enqueues work that uses its handle.
///     let _order = stream.enqueue_lock();
///     stream.hold(|| KeepAlive::new(handle.clone()));
/// }
/// buf.fill_async(1, &stream)?;
/// let exec = stream.end_capture()?.instantiate()?;
/// exec.launch(&stream)?;
/// handle.revoked.store(true, Ordering::Release);
/// let refused = exec.launch(&stream);
/// assert_eq!(refused, Err(Error::Unusable { what: "the handle was revoked".into() }));
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub trait Dependency: Send + Sync + 'static {
    /// Whether [`while_usable`](Self::while_usable) can refuse (a communicator that was
    /// aborted): graphs ask only those before each launch.
    fn gated(&self) -> bool {
        false
    }

    /// Runs `launch` while this dependency is guaranteed to stay usable, or returns the
    /// error saying why it is not. The default runs it.
    fn while_usable(&self, launch: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        launch()
    }

    /// Work that uses this dependency is about to be enqueued on `stream` (a graph
    /// launch): memory orders its free after it.
    fn used_on(&self, stream: &Stream) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// A graph launch that runs work using this dependency was just enqueued on `stream`
    /// (after [`used_on`](Self::used_on) and the driver's launch): an owner that orders
    /// its own next use with events records them here. Not called for a launch that a
    /// capture records (the outer graph's launches call it). The default does nothing.
    fn launched(&self, stream: &Stream) {
        let _ = stream;
    }

    /// Called when an open group holds this dependency for work it deferred (once per
    /// hold); [`settle`](Self::settle) follows once per hold when the group has ended.
    fn deferred(&self) {}

    /// Called when the group that deferred work on this dependency has ended, before the
    /// group lets go of it: a library that enqueues grouped work in the background (NCCL's
    /// non-blocking communicators) waits here until it has. `false` means the work may
    /// still be enqueued later: then the group never lets go of what it holds (a leak,
    /// never a free under running work). The default returns `true` at once.
    fn settle(&self) -> bool {
        true
    }
}

/// A shared owner of a [`Dependency`]: while one exists, the memory or handle it names is
/// not released. Cheap to clone.
///
/// Any [`DeviceSlice`](crate::DeviceSlice) that can be held gives one; a view's holds its
/// whole allocation:
///
/// ```
/// use cuda_hal::{DeviceBuffer, DeviceSlice};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let buf = DeviceBuffer::<u8>::zeroed(&ctx, 64)?;
/// let held = buf.slice(..8)?.keep_alive().expect("a buffer's memory can be held");
/// drop(buf);
/// assert_eq!(world.used_memory(0), 64);
/// drop(held);
/// assert_eq!(world.used_memory(0), 0);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone)]
pub struct KeepAlive(Arc<dyn Dependency>);

impl KeepAlive {
    /// Wraps a shared dependency.
    pub fn new(dependency: Arc<dyn Dependency>) -> KeepAlive {
        KeepAlive(dependency)
    }

    pub(crate) fn dependency(&self) -> &dyn Dependency {
        &*self.0
    }
}

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("gated", &self.0.gated())
            .finish()
    }
}

/// Runs `launch` inside every gated dependency's [`Dependency::while_usable`].
pub(crate) fn gated(deps: &[KeepAlive], launch: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    match deps.split_first() {
        None => launch(),
        Some((first, rest)) => first.0.while_usable(&mut || gated(rest, launch)),
    }
}

static_assertions::assert_impl_all!(KeepAlive: Send, Sync, Clone, std::fmt::Debug);

/// What an open group holds, shared (weakly) with every stream it noted: a capture that
/// another thread begins on one of them before the group's work is launched and settled
/// records that work when the group launches it, so its graph copies these holds.
pub(crate) type GroupHolds = Arc<Mutex<Vec<KeepAlive>>>;

/// What a stream being captured has recorded so far, and so must keep alive: moved into
/// the graph when the capture ends.
#[derive(Default)]
pub(crate) struct CaptureLog {
    pub(crate) held: Mutex<Vec<KeepAlive>>,
    pub(crate) ended: std::sync::atomic::AtomicBool,
    /// Which threads the capture forbids host synchronisations (CUDA's "potentially
    /// unsafe" calls): `None` for a relaxed capture.
    pub(crate) forbids: Option<Forbids>,
    /// The stream that began it (its key): only there can it end.
    pub(crate) origin: usize,
    /// The thread that began it: a strict (global or thread-local) capture ends only there.
    pub(crate) began_on: Option<std::thread::ThreadId>,
    /// The stream that began it (not kept alive by it): a strict capture whose stream's
    /// last user handle went on another thread is abandoned at its thread's next look.
    pub(crate) origin_stream: std::sync::Weak<Inner>,
    /// The driver it runs in ([`Cuda::key`](crate::Cuda)): a capture forbids host waits
    /// for that driver's work only (a process has one real driver; each simulated driver
    /// is a machine of its own).
    pub(crate) driver: usize,
}

/// The threads a capture forbids host synchronisations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forbids {
    /// Every thread (global mode).
    Everyone,
    /// The thread that began it (thread-local mode).
    Thread(std::thread::ThreadId),
}

impl CaptureLog {
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Keeps `what` for the graph this capture makes; handed back when the capture ended
    /// since it was found (its graph took its holds already), to go as if no capture had
    /// recorded its work (drop it after this returns: its release may look at captures).
    #[must_use = "what is handed back must be dropped, outside any capture lock"]
    pub(crate) fn keep(&self, what: KeepAlive) -> Option<KeepAlive> {
        let mut held = lock(&self.held);
        if self.is_ended() {
            return Some(what);
        }
        held.push(what);
        None
    }
}
