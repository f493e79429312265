//! The core of registered memory: what NCCL may find by address on one communicator
//! (its registrations and windows, the releases that wait for the owner's thread, and the
//! pooled buffers not registered yet), and how each of them lets go, on whatever thread
//! its last holder drops it.
//!
//! Of the crate it imports only the lock helper. The communicator's shared state holds
//! the [`Registry`] and implements [`CommState`], the one way back to the communicator.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use cuda_hal::{Dependency, KeepAlive, Stream, StreamLog};

use crate::sync::lock;

/// What registered memory needs of its communicator's shared state, from any thread.
/// Registrations and pooled buffers hold it: the communicator, and with it NCCL's record
/// of their memory, lives as long as they do (NCCL releases registrations with the
/// communicator, and only then may their memory go). When they let go they reach the
/// registry through it.
pub(crate) trait CommState: Send + Sync {
    /// The communicator's registry.
    fn registry(&self) -> &Registry;

    /// Whether the NCCL handle was freed (aborted or destroyed), which released every
    /// registration with it.
    fn is_dead(&self) -> bool;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Local,
    Window,
}

/// What a release still has to do: the NCCL handle, the memory it must outlive, and the
/// streams whose work must be done first.
pub(super) struct Pending {
    pub(super) kind: Kind,
    pub(super) handle: usize,
    /// Held, never read: the memory outlives the registration (with, for a registration
    /// NCCL handed out again, the memory of the ones it was handed out for).
    pub(super) memory: Vec<KeepAlive>,
    pub(super) uses: StreamLog,
}

/// One registration, shared by its handle, by captures and groups whose work may use it,
/// and (weakly) by its communicator's registry.
pub(crate) struct RegShared {
    pub(super) comm: Arc<dyn CommState>,
    pub(super) start: u64,
    pub(super) bytes: usize,
    /// A window registered with `NCCL_WIN_COLL_SYMMETRIC`.
    pub(super) symmetric: bool,
    /// Its number among the communicator's windows (0: a buffer registration).
    pub(super) place: u64,
    pub(super) pending: Mutex<Option<Pending>>,
}

impl RegShared {
    /// Whether its communicator is still alive (a dead one released it).
    pub(crate) fn is_live(&self) -> bool {
        !self.comm.is_dead()
    }

    /// The registered address.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// The registered size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether NCCL gave a handle (it declines a window where it has no symmetric
    /// support) that is not released yet.
    pub(crate) fn is_active(&self) -> bool {
        lock(&self.pending).as_ref().is_some_and(|p| p.handle != 0)
    }

    /// NCCL's handle, while it is active.
    pub(crate) fn handle(&self) -> Option<usize> {
        lock(&self.pending)
            .as_ref()
            .map(|p| p.handle)
            .filter(|h| *h != 0)
    }

    /// Whether it is an active window that holds all of `[ptr, ptr + bytes)`.
    pub(crate) fn is_window_holding(&self, ptr: u64, bytes: usize) -> bool {
        let end = self.start.saturating_add(self.bytes as u64);
        lock(&self.pending)
            .as_ref()
            .is_some_and(|p| p.kind == Kind::Window && p.handle != 0)
            && self.start <= ptr
            && ptr.saturating_add(bytes as u64) <= end
    }

    fn note(&self, stream: &Stream) {
        if let Some(p) = &*lock(&self.pending) {
            p.uses.note(stream);
        }
    }
}

impl Dependency for RegShared {
    /// A graph launch on `stream` uses the registration again.
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        self.note(stream);
        Ok(())
    }
}

impl Drop for RegShared {
    /// The last holder was not its owner's thread (a graph or a group let go): the
    /// communicator releases it at its owner's next call, or with itself. Queued before it
    /// leaves the registry's list: NCCL finds it for collectives on its pages until
    /// `ncclCommDeregister` returns, so later work must be noted on it. Between the last
    /// strong reference's end and the removal below, a collective that meets its entry
    /// cannot upgrade it: `Registry::used` then waits for the removal and finds the
    /// queued release instead.
    fn drop(&mut self) {
        let registry = self.comm.registry();
        if let Some(p) = lock(&self.pending).take() {
            let range = registry.range_of(self);
            registry.defer(p, range.unwrap_or_else(|| pages(self.start, self.bytes)));
        }
        registry.remove_ptr(self);
    }
}

/// A release waiting for its owner's thread. Until `ncclCommDeregister` has returned,
/// NCCL still matches collectives on its pages to it: the registry keeps it in view, each
/// such collective notes its stream here (the release waits for that work too), and an
/// open capture or group holds it (it is not released while they may launch the work).
pub(super) struct Queued {
    range: (u64, u64),
    pending: Mutex<Option<Pending>>,
}

impl Queued {
    fn note(&self, stream: &Stream) {
        if let Some(p) = &*lock(&self.pending) {
            p.uses.note(stream);
        }
    }

    /// The release, taken out (the caller releases it or puts it back).
    pub(super) fn take(&self) -> Option<Pending> {
        lock(&self.pending).take()
    }

    /// A release that failed and is tried again later.
    pub(super) fn put_back(&self, p: Pending) {
        *lock(&self.pending) = Some(p);
    }
}

impl Dependency for Queued {
    /// A graph launch on `stream` uses the registration again.
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        self.note(stream);
        Ok(())
    }
}

/// NCCL finds a local registration for any buffer within the host pages it covers
/// (`ncclRegFind` rounds both out to pages), and hands out an existing registration again
/// for a range it covers. The registry tracks whole pages of the largest host page size
/// CUDA runs with, which covers every smaller one.
const PAGE: u64 = 64 << 10;

/// The range whose collectives may use a registration of `[start, start + bytes)`.
pub(super) fn pages(start: u64, bytes: usize) -> (u64, u64) {
    let end = start.saturating_add(bytes as u64);
    let end = end.checked_next_multiple_of(PAGE).unwrap_or(u64::MAX);
    (start & !(PAGE - 1), end)
}

/// One registration in the registry: the range collectives may use it for, NCCL's
/// handle of a local registration (shared by the registrations NCCL handed out again),
/// and the registration.
type Entry = (u64, u64, Option<usize>, Weak<RegShared>);

/// The registrations of one communicator, by address range.
#[derive(Default)]
pub(crate) struct Registry {
    /// How many registrations the list holds (read without its lock, and by a test).
    pub(crate) count: AtomicUsize,
    list: RwLock<Vec<Entry>>,
    /// Releases handed over by other threads, done by the owner; in view of collectives
    /// until done.
    deferred: Mutex<Vec<Arc<Queued>>>,
    /// Pooled buffers that a collective may register.
    slots: Slots,
    has_deferred: AtomicBool,
    /// How many windows NCCL made on this communicator: a window's number among them is
    /// the same on every rank (windows are registered by every rank, in one order).
    windows: std::sync::atomic::AtomicU64,
}

impl Registry {
    /// The number of the window NCCL just made on this communicator (from 1).
    pub(super) fn next_window(&self) -> u64 {
        self.windows.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Adds `r`; `shared` is NCCL's handle of a local registration. When NCCL handed out
    /// a live registration again, it keeps that one's range (which covers `r`'s) even
    /// after the first holder releases it: so does the registry.
    /// Returns the live registrations NCCL handed out as `r`.
    pub(super) fn add(&self, r: &Arc<RegShared>, shared: Option<usize>) -> Vec<Arc<RegShared>> {
        let (mut start, mut end) = pages(r.start, r.bytes);
        let mut same = Vec::new();
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        for (s, e, h, w) in l.iter() {
            if shared.is_some() && *h == shared {
                start = start.min(*s);
                end = end.max(*e);
                same.extend(w.upgrade());
            }
        }
        l.push((start, end, shared, Arc::downgrade(r)));
        self.count.store(l.len(), Ordering::Release);
        // Returned, not dropped here: the last owner's drop takes the list's lock.
        same
    }

    /// The range collectives may use `me` for, while it is in the list.
    pub(super) fn range_of(&self, me: *const RegShared) -> Option<(u64, u64)> {
        let l = self.list.read().unwrap_or_else(|e| e.into_inner());
        l.iter()
            .find(|(_, _, _, w)| w.as_ptr() == me)
            .map(|(s, e, _, _)| (*s, *e))
    }

    fn remove_ptr(&self, me: *const RegShared) {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        l.retain(|(_, _, _, w)| w.as_ptr() != me);
        self.count.store(l.len(), Ordering::Release);
    }

    /// Work on `stream` touches `[ptr, ptr + bytes)`: every registration it overlaps
    /// notes the stream, and an open capture or group holds it.
    #[inline]
    pub(crate) fn used(&self, ptr: u64, bytes: usize, stream: &Stream) {
        if bytes == 0 || (self.count.load(Ordering::Acquire) == 0 && !self.has_deferred()) {
            return;
        }
        self.used_slow(ptr, bytes, stream);
    }

    #[cold]
    fn used_slow(&self, ptr: u64, bytes: usize, stream: &Stream) {
        let end = ptr.saturating_add(bytes as u64);
        // Collected first: the last owner of one may let go meanwhile (a pooled buffer
        // dropped on another thread), and its drop takes the list's write lock.
        let hits: Vec<Arc<RegShared>> = loop {
            let (hits, dying) = {
                let l = self.list.read().unwrap_or_else(|e| e.into_inner());
                let mut dying = false;
                let hits: Vec<_> = l
                    .iter()
                    .filter(|(s, e, _, _)| ptr < *e && *s < end)
                    .filter_map(|(_, _, _, w)| {
                        let r = w.upgrade();
                        dying |= r.is_none();
                        r
                    })
                    .collect();
                (hits, dying)
            };
            if !dying {
                break hits;
            }
            // Its last holder is dropping it on another thread: its release is queued
            // (below) before it leaves the list. Until then it is in neither place, yet
            // NCCL still has it: wait for it to move, then look again.
            drop(hits);
            std::thread::yield_now();
        };
        for r in hits {
            r.note(stream);
            stream.hold(|| KeepAlive::new(r.clone()));
        }
        if !self.has_deferred() {
            return;
        }
        let queued: Vec<Arc<Queued>> = lock(&self.deferred)
            .iter()
            .filter(|q| ptr < q.range.1 && q.range.0 < end)
            .cloned()
            .collect();
        for q in queued {
            q.note(stream);
            stream.hold(|| KeepAlive::new(q.clone()));
        }
    }

    /// Whether an active window of the communicator holds all of `[ptr, ptr + bytes)`.
    /// Where `[ptr, ptr + bytes)` lies in an active symmetric window of this communicator:
    /// the window's number among the communicator's windows and the offset from its start,
    /// in bytes; `None` when it lies in none.
    pub(crate) fn symmetric_offset(&self, ptr: u64, bytes: usize) -> Option<(u64, u64)> {
        let live: Vec<Arc<RegShared>> = {
            let l = self.list.read().unwrap_or_else(|e| e.into_inner());
            l.iter().filter_map(|(_, _, _, w)| w.upgrade()).collect()
        };
        live.iter()
            .find(|r| r.symmetric && r.is_window_holding(ptr, bytes))
            .map(|r| (r.place, ptr - r.start))
    }

    pub(crate) fn in_window(&self, ptr: u64, bytes: usize) -> bool {
        // Upgraded under the lock, looked at (and let go) after it: the last owner's drop
        // takes the list's write lock.
        let live: Vec<Arc<RegShared>> = {
            let l = self.list.read().unwrap_or_else(|e| e.into_inner());
            l.iter().filter_map(|(_, _, _, w)| w.upgrade()).collect()
        };
        live.iter().any(|r| r.is_window_holding(ptr, bytes))
    }

    fn add_slot(&self, s: &Arc<Slot>) {
        self.slots.add(s);
    }

    pub(crate) fn forget_slot(&self, s: *const Slot) {
        self.slots.forget(s);
    }

    #[inline]
    pub(crate) fn has_slots(&self) -> bool {
        self.slots.any()
    }

    pub(crate) fn slot_of(&self, ptr: u64, bytes: usize) -> Option<Arc<Slot>> {
        self.slots.find(ptr, bytes)
    }

    /// Queues the release of a registration of `range` (see [`Queued`]).
    pub(super) fn defer(&self, p: Pending, range: (u64, u64)) {
        self.requeue(Arc::new(Queued {
            range,
            pending: Mutex::new(Some(p)),
        }));
    }

    /// Queues a release again (it failed, or is not due yet).
    pub(super) fn requeue(&self, q: Arc<Queued>) {
        lock(&self.deferred).push(q);
        self.has_deferred.store(true, Ordering::Release);
    }

    /// Whether releases wait for the owner.
    #[inline]
    pub(crate) fn has_deferred(&self) -> bool {
        self.has_deferred.load(Ordering::Acquire)
    }

    /// Takes the queued releases that nothing else holds (a graph or an open group that
    /// holds one may still launch work on it: it stays queued, and in view).
    pub(super) fn take_deferred(&self) -> Vec<Arc<Queued>> {
        let mut d = lock(&self.deferred);
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut *d)
            .into_iter()
            .partition(|q| Arc::strong_count(q) == 1);
        *d = held;
        self.has_deferred.store(!d.is_empty(), Ordering::Release);
        due
    }
}

/// Where a pooled buffer's registration stands.
pub(super) enum SlotReg {
    /// Not registered yet (no use that gains so far).
    No,
    Yes(Arc<RegShared>),
    /// NCCL refused it, or cannot register: never tried again.
    Never,
}

/// One pooled allocation: its range, a shared owner of its memory (for the registration)
/// and its registration. Known to the communicator's registry (weakly) so that a
/// collective can register it.
pub(crate) struct Slot {
    comm: Arc<dyn CommState>,
    start: u64,
    bytes: usize,
    memory: KeepAlive,
    pub(super) reg: Mutex<SlotReg>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.comm.registry().forget_slot(self);
    }
}

impl Slot {
    /// A pooled allocation of `bytes` at `start`, which `memory` keeps allocated; known to
    /// `comm`'s registry while it `may_register` (never registered otherwise).
    pub(super) fn new(
        comm: Arc<dyn CommState>,
        start: u64,
        bytes: usize,
        memory: KeepAlive,
        may_register: bool,
    ) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            comm,
            start,
            bytes,
            memory,
            reg: Mutex::new(if may_register {
                SlotReg::No
            } else {
                SlotReg::Never
            }),
        });
        if matches!(*lock(&slot.reg), SlotReg::No) {
            slot.comm.registry().add_slot(&slot);
        }
        slot
    }

    pub(super) fn registration(&self) -> Option<Arc<RegShared>> {
        match &*lock(&self.reg) {
            SlotReg::Yes(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Whether it is not registered yet, and may be.
    pub(crate) fn may_register(&self) -> bool {
        matches!(*lock(&self.reg), SlotReg::No)
    }

    /// What to register: its address, size, and a shared owner of its memory.
    pub(crate) fn target(&self) -> (u64, usize, KeepAlive) {
        (self.start, self.bytes, self.memory.clone())
    }

    /// Records the outcome of its registration: the registration, or `None` when NCCL
    /// refused it or cannot register (never tried again).
    pub(crate) fn settle(&self, reg: Option<Arc<RegShared>>) {
        *lock(&self.reg) = match reg {
            Some(r) => SlotReg::Yes(r),
            None => SlotReg::Never,
        };
    }

    fn range(&self) -> (u64, u64) {
        (self.start, self.start + self.bytes as u64)
    }
}

/// The registry's weak list of pooled buffers not registered yet.
#[derive(Default)]
struct Slots {
    list: Mutex<Vec<Weak<Slot>>>,
    count: std::sync::atomic::AtomicUsize,
}

impl Slots {
    fn add(&self, s: &Arc<Slot>) {
        let mut l = lock(&self.list);
        l.push(Arc::downgrade(s));
        self.count
            .store(l.len(), std::sync::atomic::Ordering::Release);
    }

    /// Removes `s`'s entry: every slot is forgotten as it drops (or once registered), so
    /// the list holds no entry of a slot that is gone.
    fn forget(&self, s: *const Slot) {
        let mut l = lock(&self.list);
        l.retain(|w| w.as_ptr() != s);
        self.count
            .store(l.len(), std::sync::atomic::Ordering::Release);
    }

    #[inline]
    fn any(&self) -> bool {
        self.count.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// The unregistered pooled buffer holding all of `[ptr, ptr + bytes)`.
    fn find(&self, ptr: u64, bytes: usize) -> Option<Arc<Slot>> {
        let end = ptr.checked_add(bytes as u64)?;
        // Upgraded outside the lock: a slot whose last owner lets go meanwhile drops
        // here, and its drop takes the lock.
        let weak: Vec<Weak<Slot>> = lock(&self.list).clone();
        weak.iter().filter_map(Weak::upgrade).find(|s| {
            let (a, b) = s.range();
            a <= ptr && end <= b
        })
    }
}
