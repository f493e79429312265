//! What keeps device memory (and whatever else enqueued work needs) alive until the GPU
//! can no longer touch it: the memory model of the crate docs' "Safety" section.
//!
//! * [`UseLog`]: the streams whose work used an allocation; its free is ordered after them.
//! * [`KeepAlive`]: a shared owner handed to work that has not been enqueued yet (an open
//!   NCCL group, see [`DeferScope`]) or that can be enqueued again later (a captured graph).
//! * [`DeferScope`]: per thread, like NCCL's group state, and `!Send` for the same reason.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Result, Stream};

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
/// use std::sync::atomic::{AtomicBool, Ordering};
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

/// The streams whose enqueued work used one allocation.
///
/// The common case, the same stream again, costs one relaxed load and a compare. A stream
/// in the log is kept alive by it, so its key (the address of its shared state) is not
/// reused while it is there, and `last` only ever holds a key that is in the log.
#[derive(Default)]
pub(crate) struct UseLog {
    last: AtomicUsize,
    streams: Mutex<Vec<Stream>>,
}

impl UseLog {
    /// Notes `stream`. The first time it is seen, `first` runs (under the log's lock, and
    /// before the stream counts as noted, so a concurrent user of the same stream waits for
    /// it); its error leaves the stream un-noted.
    #[inline]
    pub(crate) fn note(&self, stream: &Stream, first: impl FnOnce() -> Result<()>) -> Result<()> {
        let key = stream.key();
        if self.last.load(Ordering::Acquire) == key {
            return Ok(());
        }
        self.note_new(stream, key, first)
    }

    #[cold]
    fn note_new(
        &self,
        stream: &Stream,
        key: usize,
        first: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut v = lock(&self.streams);
        if !v.iter().any(|s| s.key() == key) {
            first()?;
            v.push(stream.clone());
        }
        self.last.store(key, Ordering::Release);
        Ok(())
    }

    /// The streams noted so far (the log is left empty).
    pub(crate) fn take(&mut self) -> Vec<Stream> {
        self.last.store(0, Ordering::Relaxed);
        std::mem::take(self.streams.get_mut().unwrap_or_else(|e| e.into_inner()))
    }

    /// The streams noted so far (the log keeps them).
    pub(crate) fn streams(&self) -> Vec<Stream> {
        lock(&self.streams).clone()
    }

    /// Waits for the work enqueued so far on every noted stream; refused (`what` names
    /// the caller) while one of them is being captured: the wait would spoil the capture.
    pub(crate) fn synchronize(&self, what: &'static str) -> Result<()> {
        for s in self.streams() {
            s.refuse_host_wait(what)?;
            s.synchronize()?;
        }
        Ok(())
    }

    /// A log that starts with `streams`.
    pub(crate) fn with(streams: Vec<Stream>) -> UseLog {
        UseLog {
            last: AtomicUsize::new(0),
            streams: Mutex::new(streams),
        }
    }
}

/// A mutex whose data stays consistent across a panic elsewhere (plain lists).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What an open group holds, shared (weakly) with every stream it noted: a capture that
/// another thread begins on one of them before the group's work is launched and settled
/// records that work when the group launches it, so its graph copies these holds.
pub(crate) type GroupHolds = Arc<Mutex<Vec<KeepAlive>>>;

#[derive(Default)]
struct Deferred {
    held: GroupHolds,
    streams: Vec<Stream>,
    /// [`Stream::after_enqueue`] hooks of work the group deferred: run once it settled.
    after: Vec<Box<dyn FnOnce()>>,
}

impl Drop for Deferred {
    /// The thread's storage is torn down. Anything still held belongs to a scope still
    /// open (the outermost close takes it all): a group kept in another thread-local,
    /// whose destructor runs later and only then ends the group. Its work is not launched
    /// yet, so what it holds must outlive it: leaked, never freed.
    fn drop(&mut self) {
        std::mem::forget(std::mem::take(&mut self.held));
        std::mem::forget(std::mem::take(&mut self.streams));
        std::mem::forget(std::mem::take(&mut self.after));
    }
}

thread_local! {
    /// How many scopes are open on this thread. A `const` cell without a destructor: it
    /// stays readable while the thread's storage is torn down, after `DEFERRED` is gone.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static DEFERRED: RefCell<Deferred> = RefCell::new(Deferred::default());
}

/// The number of open scopes on this thread (0 if its storage can no longer be read,
/// which a `const` cell without destructor never is on the platforms std supports).
#[inline]
fn depth() -> usize {
    DEPTH.try_with(Cell::get).unwrap_or(0)
}

/// While one is open on a thread, work "enqueued" on that thread is only recorded, to be
/// launched when the last scope closes: NCCL's groups (`ncclGroupStart`/`ncclGroupEnd`).
/// Everything noted meanwhile ([`Stream::hold`], [`DeviceBuffer::used_on`](crate::DeviceBuffer::used_on))
/// is kept alive until then, so memory, streams and communicators dropped inside the
/// group outlive the launch.
///
/// Scopes nest like NCCL's group calls (a counter): what is held is released when the
/// outermost one closes. Open it right after the library's group start succeeded and
/// drop it right after the group end, on the same thread: it is not `Send`. A scope that
/// is leaked (`mem::forget`) keeps what it holds alive for the life of the thread.
///
/// ```
/// use cuda_hal::{DeferScope, DeviceBuffer, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::non_blocking(&ctx)?;
/// {
///     let _group = DeferScope::open(); // right after ncclGroupStart
///     assert!(DeferScope::is_open());
///     let mut tmp = DeviceBuffer::<u8>::zeroed(&ctx, 16)?;
///     // Enqueued here; NCCL's grouped calls are only recorded until the group ends.
///     tmp.fill_async(1, &stream)?;
///     drop(tmp);
///     assert_eq!(world.live().device_allocations, 1, "held for the group");
/// } // right after ncclGroupEnd
/// assert!(!DeferScope::is_open());
/// assert_eq!(world.live().device_allocations, 0);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[must_use = "the scope defers releases only while it is alive"]
pub struct DeferScope {
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for DeferScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferScope")
            .field("open", &DeferScope::is_open())
            .finish()
    }
}

impl DeferScope {
    /// Opens a scope on this thread.
    ///
    /// Late in the thread's teardown, once the scope's storage is gone, what is held in
    /// it is leaked (never freed); [`try_open`](Self::try_open) refuses then instead.
    pub fn open() -> DeferScope {
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        DeferScope {
            _not_send: PhantomData,
        }
    }

    /// Opens a scope on this thread, or refuses ([`Error::InvalidArgument`](crate::Error::InvalidArgument))
    /// when the thread's storage is being torn down (called from a thread-local's
    /// destructor): a scope opened then could not hold what its work uses.
    ///
    /// ```
    /// use cuda_hal::DeferScope;
    /// let scope = DeferScope::try_open()?;
    /// assert!(DeferScope::is_open());
    /// drop(scope);
    /// assert!(!DeferScope::is_open());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn try_open() -> Result<DeferScope> {
        // Touches the storage (initialising it if needed): fails only once it is destroyed.
        if DEFERRED.try_with(|_| ()).is_err() {
            return Err(crate::Error::InvalidArgument {
                what: "DeferScope::try_open",
                problem: "the thread's storage is being torn down (a thread-local's destructor): \
                          a group opened now could not keep what its work uses alive"
                    .into(),
            });
        }
        Ok(DeferScope::open())
    }

    /// Whether a scope is open on this thread.
    #[inline]
    #[must_use]
    pub fn is_open() -> bool {
        depth() > 0
    }

    /// Holds `what` (and `stream`) until the outermost scope of this thread closes. Once
    /// the thread's storage is gone (its teardown), they are leaked instead: the group's
    /// work may still run, and what it uses must never be freed.
    pub(crate) fn hold(what: KeepAlive, stream: &Stream) {
        let held = DEFERRED.try_with(|d| {
            let mut d = d.borrow_mut();
            lock(&d.held).push(what.clone());
            if !d.streams.iter().any(|s| s.key() == stream.key()) {
                d.streams.push(stream.clone());
                stream.note_group(Arc::downgrade(&d.held));
            }
        });
        if held.is_err() {
            std::mem::forget(what.clone());
            std::mem::forget(stream.clone());
        }
        // Outside the borrow: the dependency's code may look at the scope itself.
        what.dependency().deferred();
    }
}

impl Drop for DeferScope {
    fn drop(&mut self) {
        let depth = DEPTH.try_with(|d| {
            let n = d.get().saturating_sub(1);
            d.set(n);
            n
        });
        if depth != Ok(0) {
            return;
        }
        let released = DEFERRED
            .try_with(|d| {
                let mut d = d.borrow_mut();
                (
                    std::mem::take(&mut d.held),
                    std::mem::take(&mut d.streams),
                    std::mem::take(&mut d.after),
                )
            })
            .ok();
        // Outside the borrow: settling and releasing call the libraries, which may open
        // scopes of their own.
        if let Some((held, streams, after)) = released {
            // Leaked unless every hold settles: a panic in a `settle` unwinds past them,
            // and grouped work may still be enqueued; what it uses must live on. Until
            // then the holds stay shared with the streams (a capture beginning there now
            // still copies them); settled, the group's work is launched and they go.
            let held = ManuallyDrop::new(held);
            let streams = ManuallyDrop::new(streams);
            let after = ManuallyDrop::new(after);
            // A copy to settle: a user's `settle` may begin a capture, which reads `held`.
            let each = ManuallyDrop::new(lock(&held).clone());
            let mut settled = true;
            for k in each.iter() {
                settled &= k.dependency().settle();
            }
            if settled {
                // The group's work is enqueued: its owners may order themselves after it
                // (unsettled, they never run: what they would order stays held).
                after::run_all(ManuallyDrop::into_inner(after));
                drop(ManuallyDrop::into_inner(each));
                drop(ManuallyDrop::into_inner(held));
                drop(ManuallyDrop::into_inner(streams));
            }
        }
    }
}

static_assertions::assert_not_impl_any!(DeferScope: Send, Sync);
static_assertions::assert_impl_all!(DeferScope: std::fmt::Debug);
static_assertions::assert_impl_all!(KeepAlive: Send, Sync, Clone, std::fmt::Debug);

/// What a stream being captured has recorded so far, and so must keep alive: moved into
/// the graph when the capture ends.
#[derive(Default)]
pub(crate) struct CaptureLog {
    pub(crate) held: Mutex<Vec<KeepAlive>>,
    pub(crate) ended: std::sync::atomic::AtomicBool,
    /// Which threads the capture forbids host synchronisations (CUDA's "potentially
    /// unsafe" calls): `None` for a relaxed capture.
    pub(crate) forbids: Option<Forbids>,
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
}

thread_local! {
    /// The thread-local-mode captures this thread began (live while not ended).
    static STRICT_HERE: RefCell<Vec<std::sync::Weak<CaptureLog>>> = const { RefCell::new(Vec::new()) };
}
/// The global-mode captures of any thread.
static STRICT_GLOBAL: Mutex<Vec<std::sync::Weak<CaptureLog>>> = Mutex::new(Vec::new());

/// Notes a capture just begun in global or thread-local mode: until it ends, host
/// synchronisations from this thread (global: from every thread) fail on a real device
/// and spoil it, so this crate refuses them first ([`forbidding_capture`]).
pub(crate) fn note_strict(log: &Arc<CaptureLog>) {
    match log.forbids {
        None => {}
        Some(Forbids::Everyone) => {
            let mut g = lock(&STRICT_GLOBAL);
            g.retain(|w| w.upgrade().is_some_and(|l| !l.is_ended()));
            g.push(Arc::downgrade(log));
        }
        Some(Forbids::Thread(_)) => {
            let _ = STRICT_HERE.try_with(|v| {
                let mut v = v.borrow_mut();
                v.retain(|w| w.upgrade().is_some_and(|l| !l.is_ended()));
                v.push(Arc::downgrade(log));
            });
        }
    }
}

/// A running capture begun through this crate that forbids this thread host
/// synchronisations (one this thread began in thread-local mode, or any global one).
pub(crate) fn forbidding_capture() -> Option<Arc<CaptureLog>> {
    let live = |w: &std::sync::Weak<CaptureLog>| w.upgrade().filter(|l| !l.is_ended());
    STRICT_HERE
        .try_with(|v| v.borrow().iter().find_map(live))
        .ok()
        .flatten()
        .or_else(|| lock(&STRICT_GLOBAL).iter().find_map(live))
}

/// The streams whose work used something another crate owns (an NCCL registration, a
/// framework's handle), so that its release can wait for exactly that work. The same
/// log this crate keeps for each allocation; noting the stream noted last is one load.
///
/// ```
/// use cuda_hal::{Stream, StreamLog};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let (s1, s2) = (Stream::non_blocking(&ctx)?, Stream::non_blocking(&ctx)?);
/// let log = StreamLog::new();
/// for s in [&s1, &s2, &s1] {
///     log.note(s); // before each enqueue that uses the thing
/// }
/// assert_eq!(log.streams().len(), 2);
/// log.synchronize()?; // before releasing it
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Default)]
pub struct StreamLog(UseLog);

impl std::fmt::Debug for StreamLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLog")
            .field("streams", &self.0.streams().len())
            .finish()
    }
}

impl StreamLog {
    /// An empty log.
    #[must_use]
    pub fn new() -> StreamLog {
        StreamLog::default()
    }

    /// Notes that work about to be enqueued on `stream` uses the thing.
    #[inline]
    pub fn note(&self, stream: &Stream) {
        let _ = self.0.note(stream, || Ok(()));
    }

    /// The streams noted so far.
    pub fn streams(&self) -> Vec<Stream> {
        self.0.streams()
    }

    /// Waits until the work enqueued so far on every noted stream is done (refused while
    /// one of them is being captured: the wait would spoil the capture).
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize("StreamLog::synchronize")
    }
}

/// The hooks of [`Stream::after_enqueue`]: per thread, keyed by the stream whose
/// [`EnqueueLock`](crate::EnqueueLock) they wait for.
pub(crate) mod after {
    use std::cell::{Cell, RefCell};

    type Hook = Box<dyn FnOnce()>;

    /// How many order locks a thread's record keeps by key; more nested ones are counted
    /// only (`holds` says no for them: `after_enqueue` is then refused, never wrongly
    /// accepted).
    const SLOTS: usize = 8;

    /// The order locks this thread holds, oldest first: a stream's key for an
    /// [`EnqueueLock`](crate::EnqueueLock) taken with `Stream::enqueue_lock`, 0 for this
    /// crate's own (a free's, a capture's), which run no hooks. Each guard removes its own
    /// entry, so guards dropped in any order leave it exact. Cells without a destructor:
    /// readable for the whole life of the thread, one thread-local access per lock.
    struct Held {
        /// Locks held, also those past `SLOTS`.
        n: Cell<usize>,
        keys: [Cell<usize>; SLOTS],
    }

    thread_local! {
        static HELD: Held = const {
            Held {
                n: Cell::new(0),
                keys: [const { Cell::new(0) }; SLOTS],
            }
        };
        /// Whether `HOOKS` may hold anything: the lock's drop reads only this.
        static PENDING: Cell<bool> = const { Cell::new(false) };
        static HOOKS: RefCell<Vec<(usize, Hook)>> = const { RefCell::new(Vec::new()) };
    }

    /// A lock of `key` (0: one of this crate's own) is taken by this thread.
    #[inline]
    pub(crate) fn enter(key: usize) {
        HELD.with(|h| {
            let n = h.n.get();
            if let Some(slot) = h.keys.get(n) {
                slot.set(key);
            }
            h.n.set(n + 1);
        });
    }

    /// Whether this thread holds the enqueue lock of `key` (never 0).
    pub(crate) fn holds(key: usize) -> bool {
        key != 0
            && HELD.with(|h| {
                let kept = h.n.get().min(SLOTS);
                h.keys[..kept].iter().any(|k| k.get() == key)
            })
    }

    /// Keeps `f` for the release of `key`'s lock, or for the end of the open group.
    pub(crate) fn push(key: usize, f: Hook) -> crate::Result<()> {
        let torn = || crate::Error::Deferred {
            what: "Stream::after_enqueue",
            why: "the thread's storage is being torn down",
        };
        if super::DeferScope::is_open() {
            return super::DEFERRED
                .try_with(|d| d.borrow_mut().after.push(f))
                .map_err(|_| torn());
        }
        HOOKS
            .try_with(|h| h.borrow_mut().push((key, f)))
            .map_err(|_| torn())?;
        let _ = PENDING.try_with(|p| p.set(true));
        Ok(())
    }

    /// A lock of `key` taken by [`enter`] is released: its entry goes (the newest of that
    /// key), and the hooks waiting for `key`'s release run.
    #[inline]
    pub(crate) fn leave(key: usize) {
        HELD.with(|h| {
            let n = h.n.get();
            match n {
                0 => {}
                _ if n <= SLOTS && h.keys[n - 1].get() == key => h.n.set(n - 1),
                _ => remove(h, key),
            }
        });
        if key != 0 && PENDING.try_with(Cell::get).unwrap_or(false) {
            run(key);
        }
    }

    /// Removes `key`'s newest entry from below the top (locks released out of order), or,
    /// when it is not kept (a lock past `SLOTS`), one of the locks counted only.
    #[cold]
    fn remove(h: &Held, key: usize) {
        let n = h.n.get();
        let kept = n.min(SLOTS);
        if let Some(i) = h.keys[..kept].iter().rposition(|k| k.get() == key) {
            for j in i..kept - 1 {
                h.keys[j].set(h.keys[j + 1].get());
            }
            // The slot freed at the top stood for a lock counted only: unknown (0).
            h.keys[kept - 1].set(0);
        }
        h.n.set(n - 1);
    }

    #[cold]
    fn run(key: usize) {
        let mine: Vec<Hook> = HOOKS
            .try_with(|h| {
                let mut h = h.borrow_mut();
                let (mine, rest): (Vec<_>, Vec<_>) = h.drain(..).partition(|(k, _)| *k == key);
                *h = rest;
                let _ = PENDING.try_with(|p| p.set(!h.is_empty()));
                mine.into_iter().map(|(_, f)| f).collect()
            })
            .unwrap_or_default();
        // Outside the borrow: a hook may enqueue (record an event) and take locks.
        run_all(mine);
    }

    /// Runs every hook, even when one panics (the others order owners' memory after
    /// work already enqueued). Hooks run from drops (a lock's release, a group's end),
    /// which never panic: a hook's panic is said on stderr instead.
    pub(crate) fn run_all(hooks: Vec<Hook>) {
        for f in hooks {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                eprintln!("cuda-hal: a Stream::after_enqueue hook panicked; the others ran");
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::{SLOTS, enter, holds, leave};

        #[test]
        fn each_lock_leaves_its_own_entry_in_any_order_beyond_the_slots_too() {
            let keys: Vec<usize> = (1..=SLOTS + 3).map(|k| k * 16).collect();
            for &k in &keys {
                enter(k);
            }
            // Kept by key up to SLOTS; the rest only counted (refused, never wrongly held).
            assert!(keys[..SLOTS].iter().all(|&k| holds(k)));
            assert!(keys[SLOTS..].iter().all(|&k| !holds(k)));
            // Out of order: the second, then the newest, then the first.
            leave(keys[1]);
            assert!(!holds(keys[1]) && holds(keys[0]) && holds(keys[2]));
            leave(keys[SLOTS + 2]);
            leave(keys[0]);
            assert!(!holds(keys[0]) && holds(keys[2]));
            for &k in keys[2..].iter().rev().skip(1) {
                leave(k);
            }
            assert!(keys.iter().all(|&k| !holds(k)));
            assert!(!holds(0), "0 is never a stream's lock");
            // Empty again: a new lock is kept and found.
            enter(7);
            assert!(holds(7));
            leave(7);
            assert!(!holds(7));
        }
    }
}
