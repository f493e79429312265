//! Groups: work recorded while a [`DeferScope`] is open on a thread is launched only when
//! the outermost scope closes (NCCL's `ncclGroupStart`/`ncclGroupEnd`), so everything it
//! uses is held until then. Per thread, like NCCL's group state, and `!Send` for the same
//! reason.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::Result;
use crate::hold::core::{GroupHolds, KeepAlive, Stream};
use crate::hold::hooks::{Hook, run_all};
use crate::hold::lock::lock;

#[derive(Default)]
struct Deferred {
    held: GroupHolds,
    streams: Vec<Stream>,
    /// [`Stream::after_enqueue`] hooks of work the group deferred: run once it settled.
    after: Vec<Hook>,
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
                d.streams.push(stream.held());
                stream.note_group(Arc::downgrade(&d.held));
            }
        });
        if held.is_err() {
            std::mem::forget(what.clone());
            std::mem::forget(stream.held());
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
                run_all(ManuallyDrop::into_inner(after));
                drop(ManuallyDrop::into_inner(each));
                drop(ManuallyDrop::into_inner(held));
                drop(ManuallyDrop::into_inner(streams));
            }
        }
    }
}

/// Keeps `f` for the end of this thread's open group ([`crate::Stream::after_enqueue`]
/// inside a group); `Err` once the thread's storage is torn down.
pub(crate) fn after_group(f: Hook) -> std::result::Result<(), ()> {
    DEFERRED
        .try_with(|d| d.borrow_mut().after.push(f))
        .map_err(|_| ())
}

static_assertions::assert_not_impl_any!(DeferScope: Send, Sync);
static_assertions::assert_impl_all!(DeferScope: std::fmt::Debug);
