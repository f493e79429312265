//! Buffer registrations (`ncclCommRegister`, NCCL ≥ 2.19) and windows
//! (`ncclCommWindowRegister`, NCCL ≥ 2.27): memory NCCL may map into its peers and use
//! directly, instead of copying through its own buffers.
//!
//! Both are typed so that the memory outlives its registration (the registration holds
//! a shared owner of it, [`DeviceSlice::keep_alive`]) and the registration does not
//! outlive its communicator (it borrows it). NCCL finds a registration by address (whole
//! pages) when a collective is enqueued, so every collective of the communicator notes,
//! on each registration whose pages its buffers overlap, the stream it runs on, and an
//! open capture or group holds the registration: a registration is released only after
//! the work that may use it is done, and never while a graph that recorded such work can
//! still be launched.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use cuda_hal::{Dependency, DeviceSlice, KeepAlive, Stream, StreamLog};
use nccl_sys::ncclWindow_t;

use crate::comm::CommShared;
use crate::sync::lock;
use crate::{Communicator, Error, Result};

/// Flags of a window (`NCCL_WIN_*`), combined with `|`.
///
/// ```
/// use nccl_channel::WindowFlags;
/// let flags = WindowFlags::COLL_SYMMETRIC | WindowFlags::STRICT_ORDERING;
/// assert_eq!(flags.0, nccl_sys::NCCL_WIN_COLL_SYMMETRIC as i32 | nccl_sys::NCCL_WIN_STRICT_ORDERING as i32);
/// assert_eq!(WindowFlags::default(), WindowFlags::DEFAULT);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct WindowFlags(pub i32);

impl WindowFlags {
    /// `NCCL_WIN_DEFAULT`: a window for NCCL's RMA and device APIs.
    pub const DEFAULT: WindowFlags = WindowFlags(nccl_sys::NCCL_WIN_DEFAULT as i32);
    /// `NCCL_WIN_COLL_SYMMETRIC`: the same offsets on every rank, so collectives may use
    /// NCCL's symmetric kernels (NCCL ≥ 2.27; lowest latency for small messages).
    pub const COLL_SYMMETRIC: WindowFlags = WindowFlags(nccl_sys::NCCL_WIN_COLL_SYMMETRIC as i32);
    /// `NCCL_WIN_STRICT_ORDERING` (NCCL ≥ 2.29): one-sided operations complete in order.
    pub const STRICT_ORDERING: WindowFlags = WindowFlags(nccl_sys::NCCL_WIN_STRICT_ORDERING as i32);
}

impl std::ops::BitOr for WindowFlags {
    type Output = WindowFlags;
    fn bitor(self, rhs: WindowFlags) -> WindowFlags {
        WindowFlags(self.0 | rhs.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Local,
    Window,
}

/// What a release still has to do: the NCCL handle, the memory it must outlive, and the
/// streams whose work must be done first.
pub(crate) struct Pending {
    kind: Kind,
    handle: usize,
    /// Held, never read: the memory outlives the registration (with, for a registration
    /// NCCL handed out again, the memory of the ones it was handed out for).
    memory: Vec<KeepAlive>,
    uses: StreamLog,
}

/// One registration, shared by its handle, by captures and groups whose work may use it,
/// and (weakly) by its communicator's registry.
pub(crate) struct RegShared {
    comm: Arc<CommShared>,
    start: u64,
    bytes: usize,
    pending: Mutex<Option<Pending>>,
}

impl RegShared {
    /// Whether its communicator is still alive (a dead one released it).
    pub(crate) fn is_live(&self) -> bool {
        !self.comm.is_dead()
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
        if let Some(p) = lock(&self.pending).take() {
            let range = self.comm.registry.range_of(self);
            self.comm
                .defer_release(p, range.unwrap_or_else(|| pages(self.start, self.bytes)));
        }
        self.comm.registry.remove_ptr(self);
    }
}

/// A release waiting for its owner's thread. Until `ncclCommDeregister` has returned,
/// NCCL still matches collectives on its pages to it: the registry keeps it in view, each
/// such collective notes its stream here (the release waits for that work too), and an
/// open capture or group holds it (it is not released while they may launch the work).
pub(crate) struct Queued {
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
    pub(crate) fn take(&self) -> Option<Pending> {
        lock(&self.pending).take()
    }

    /// A release that failed and is tried again later.
    pub(crate) fn put_back(&self, p: Pending) {
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
fn pages(start: u64, bytes: usize) -> (u64, u64) {
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
    count: AtomicUsize,
    list: RwLock<Vec<Entry>>,
    /// Releases handed over by other threads, done by the owner; in view of collectives
    /// until done.
    deferred: Mutex<Vec<Arc<Queued>>>,
    /// Pooled buffers that a collective may register.
    slots: crate::pool::Slots,
    has_deferred: AtomicBool,
}

impl Registry {
    /// Adds `r`; `shared` is NCCL's handle of a local registration. When NCCL handed out
    /// a live registration again, it keeps that one's range (which covers `r`'s) even
    /// after the first holder releases it: so does the registry.
    /// Returns the live registrations NCCL handed out as `r`.
    fn add(&self, r: &Arc<RegShared>, shared: Option<usize>) -> Vec<Arc<RegShared>> {
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
    fn range_of(&self, me: *const RegShared) -> Option<(u64, u64)> {
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

    pub(crate) fn add_slot(&self, s: &Arc<crate::pool::Slot>) {
        self.slots.add(s);
    }

    pub(crate) fn forget_slot(&self, s: *const crate::pool::Slot) {
        self.slots.forget(s);
    }

    #[inline]
    pub(crate) fn has_slots(&self) -> bool {
        self.slots.any()
    }

    pub(crate) fn slot_of(&self, ptr: u64, bytes: usize) -> Option<Arc<crate::pool::Slot>> {
        self.slots.find(ptr, bytes)
    }

    /// Queues the release of a registration of `range` (see [`Queued`]).
    pub(crate) fn defer(&self, p: Pending, range: (u64, u64)) {
        self.requeue(Arc::new(Queued {
            range,
            pending: Mutex::new(Some(p)),
        }));
    }

    /// Queues a release again (it failed, or is not due yet).
    pub(crate) fn requeue(&self, q: Arc<Queued>) {
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
    pub(crate) fn take_deferred(&self) -> Vec<Arc<Queued>> {
        let mut d = lock(&self.deferred);
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut *d)
            .into_iter()
            .partition(|q| Arc::strong_count(q) == 1);
        *d = held;
        self.has_deferred.store(!d.is_empty(), Ordering::Release);
        due
    }
}

/// NCCL (2.28 and later) writes a window's handle at the outermost `ncclGroupEnd`: inside
/// an open group the handle would be read before it is written (a window never released)
/// and written later into memory that is gone. Refused.
fn refuse_window_in_group(what: &'static str) -> Result<()> {
    if cuda_hal::DeferScope::is_open() {
        return Err(Error::InvalidArgument {
            what,
            problem: "called inside an open group: NCCL gives the window only when the \
                      group ends; register windows outside groups (register_windows makes \
                      its own)"
                .into(),
        });
    }
    Ok(())
}

/// A window registration whose wait failed while the communicator could not be aborted
/// (another thread's open group holds it): NCCL may still write the handle's slot and
/// map the memory later. Both are leaked, never freed (the documented leak on failure).
fn leak_unsettled(slot: Box<ncclWindow_t>, memory: KeepAlive) {
    Box::leak(slot);
    std::mem::forget(memory);
}

/// What to register: the checks shared by both kinds.
fn target<S: DeviceSlice + ?Sized>(
    comm: &Communicator,
    what: &'static str,
    mem: &S,
) -> Result<(u64, usize, KeepAlive)> {
    comm.same_context(what, "memory", mem.context())?;
    if mem.is_empty() {
        return Err(Error::InvalidArgument {
            what,
            problem: "the memory is empty: there is nothing to register".into(),
        });
    }
    let memory = mem.keep_alive().ok_or_else(|| Error::InvalidArgument {
        what,
        problem: "this memory cannot be held past its borrow (DeviceSlice::keep_alive is \
                  None), so a registration could outlive it"
            .into(),
    })?;
    mem.used_synchronously()?;
    Ok((mem.device_ptr(), mem.size_bytes(), memory))
}

impl Communicator {
    /// Registers `mem` with this communicator (`ncclCommRegister`, NCCL ≥ 2.19): NCCL may
    /// then use it directly in collectives (zero-copy through NVLink, fewer channels),
    /// most of all when it comes from [`alloc_nccl`](Self::alloc_nccl). Local: no other
    /// rank takes part.
    ///
    /// The registration keeps the memory allocated (the buffer may still be used and
    /// dropped as usual) and is released on drop, after the work that may use it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::{Cuda, mock::MockDriver};
    /// # use nccl_sys::mock::MockNccl;
    /// use nccl_channel::{Communicator, ReduceOp};
    /// # let (cuda, world) = Cuda::mock(MockDriver::with_devices(1))?;
    /// # let (nccl, _) = MockNccl::new(&world).build()?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), &[ctx.clone()])?.remove(0);
    /// let mut grads = comm.alloc_nccl::<f32>(1024)?;
    /// let reg = comm.register(&grads)?;
    /// let stream = cuda_hal::Stream::new(&ctx)?;
    /// comm.all_reduce_in_place(&mut grads, ReduceOp::Sum, &stream)?;
    /// drop(reg); // waits for the all-reduce, then ncclCommDeregister
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommRegister")]
    #[doc(alias = "ncclCommDeregister")]
    pub fn register<S: DeviceSlice + ?Sized>(&self, mem: &S) -> Result<Registration<'_>> {
        let what = "Communicator::register";
        optional!(self.nccl(), ncclCommRegister)?;
        let (ptr, bytes, memory) = target(self, what, mem)?;
        self.register_range(ptr, bytes, memory)
    }

    /// `ncclCommRegister` of `bytes` at `ptr`, which `memory` keeps allocated.
    pub(crate) fn register_range(
        &self,
        ptr: u64,
        bytes: usize,
        memory: KeepAlive,
    ) -> Result<Registration<'_>> {
        let (f, call) = optional!(self.nccl(), ncclCommRegister)?;
        let raw = self.handle()?;
        let _g = self.context().bind()?;
        // On the heap: kept (leaked) below when NCCL may still write it.
        let mut handle: Box<*mut c_void> = Box::new(std::ptr::null_mut());
        // SAFETY: a live communicator; `ptr` is `bytes` bytes of device memory of its
        // device, kept allocated by `memory` until the registration is released; `handle`
        // outlives the call and, if NCCL answered "in progress" and the poll in `check`
        // failed without an abort (another thread's group holds the communicator), it and
        // the memory are leaked below, never freed.
        let rc = unsafe {
            f(
                raw,
                std::ptr::with_exposed_provenance_mut(ptr as usize),
                bytes,
                &mut *handle,
            )
        };
        if let Err(e) = self.check(rc, call) {
            if rc == nccl_sys::ncclResult_t::ncclInProgress && !self.is_aborted() {
                Box::leak(handle);
                std::mem::forget(memory);
            }
            return Err(e);
        }
        Ok(self.adopt_registration(Kind::Local, handle.expose_provenance(), ptr, bytes, memory))
    }

    /// Registers `mem` as a window of this communicator (`ncclCommWindowRegister`, NCCL ≥
    /// 2.27): **collective**, every rank registers its window of the same size in the
    /// same order (from one thread driving several ranks, use
    /// [`register_windows`](Self::register_windows)). With [`WindowFlags::COLL_SYMMETRIC`]
    /// collectives on it may use NCCL's symmetric kernels. NCCL needs memory from
    /// [`alloc_nccl`](Self::alloc_nccl) (or another cuMem allocation) at a 4096-byte
    /// aligned offset; it reports other memory as an error. Refused inside an open
    /// group, where NCCL would give the window only at the group's end.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::{Cuda, mock::MockDriver};
    /// use nccl_channel::{Communicator, WindowFlags};
    /// use nccl_sys::mock::MockNccl;
    ///
    /// let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(1))?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))?.remove(0);
    /// let buf = comm.alloc_nccl::<u8>(8192)?;
    /// let window = comm.register_window(&buf.slice(4096..)?, WindowFlags::COLL_SYMMETRIC)?;
    /// assert!(window.is_active());
    /// assert_eq!((window.device_ptr(), window.size_bytes()), (buf.as_raw() + 4096, 4096));
    /// window.deregister()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommWindowRegister")]
    #[doc(alias = "ncclCommWindowDeregister")]
    pub fn register_window<S: DeviceSlice + ?Sized>(
        &self,
        mem: &S,
        flags: WindowFlags,
    ) -> Result<Window<'_>> {
        let what = "Communicator::register_window";
        let (f, call) = optional!(self.nccl(), ncclCommWindowRegister)?;
        optional!(self.nccl(), ncclCommWindowDeregister)?;
        refuse_window_in_group(what)?;
        let (ptr, bytes, memory) = target(self, what, mem)?;
        let raw = self.handle()?;
        let _g = self.context().bind()?;
        // On the heap: kept (leaked) below when NCCL may still write it.
        let mut win: Box<ncclWindow_t> = Box::new(std::ptr::null_mut());
        // SAFETY: a live communicator; `ptr` is `bytes` bytes of its device's memory, kept
        // allocated by `memory` until the window is released; no group is open on this
        // thread (checked above), so NCCL writes `win` before it returns (non-blocking:
        // before the poll in `check` ends successfully). If that poll fails and the
        // communicator is not aborted (another thread's group holds it), NCCL may still
        // write `win` and use the memory later: both are leaked below, never freed.
        let rc = unsafe {
            f(
                raw,
                std::ptr::with_exposed_provenance_mut(ptr as usize),
                bytes,
                &mut *win,
                flags.0 as c_int,
            )
        };
        if let Err(e) = self.check(rc, call) {
            // Refused at once (`rc` is the error): NCCL wrote nothing and keeps nothing.
            if rc == nccl_sys::ncclResult_t::ncclInProgress && !self.is_aborted() {
                leak_unsettled(win, memory);
            }
            return Err(e);
        }
        Ok(Window(self.adopt_registration(
            Kind::Window,
            win.expose_provenance(),
            ptr,
            bytes,
            memory,
        )))
    }

    /// Registers one window per rank, for one thread driving several ranks (a window
    /// registration waits for every rank): all calls in one NCCL group, handles read
    /// after it ended. `ranks[i]` is a communicator and its memory. Refused inside an
    /// open group (the handles would come only at its end).
    #[doc(alias = "ncclCommWindowRegister")]
    pub fn register_windows<'c, S: DeviceSlice + ?Sized>(
        ranks: &[(&'c Communicator, &S)],
        flags: WindowFlags,
    ) -> Result<Vec<Window<'c>>> {
        let what = "Communicator::register_windows";
        let Some((first, _)) = ranks.first() else {
            return Ok(Vec::new());
        };
        let (f, call) = optional!(first.nccl(), ncclCommWindowRegister)?;
        optional!(first.nccl(), ncclCommWindowDeregister)?;
        refuse_window_in_group(what)?;
        let mut targets = Vec::with_capacity(ranks.len());
        for (c, m) in ranks {
            if !Arc::ptr_eq(c.nccl(), first.nccl()) {
                return Err(Error::InvalidArgument {
                    what,
                    problem: "the communicators come from different NCCL libraries".into(),
                });
            }
            targets.push((c.handle()?, target(c, what, *m)?));
        }
        // On the heap, and leaked below where NCCL may still write.
        let mut wins: Box<[ncclWindow_t]> = vec![std::ptr::null_mut(); ranks.len()].into();
        let group = crate::group::Group::start(first.nccl())?;
        let mut issued = Result::Ok(());
        for (i, ((raw, (ptr, bytes, _)), (c, _))) in targets.iter().zip(ranks).enumerate() {
            let r = c.context().bind().map_err(Error::from).and_then(|_g| {
                // SAFETY: a live communicator; the memory is kept allocated (`targets`
                // holds it) and `wins[i]` outlives the group (NCCL writes it at its end).
                let rc = unsafe {
                    f(
                        *raw,
                        std::ptr::with_exposed_provenance_mut(*ptr as usize),
                        *bytes,
                        &mut wins[i],
                        flags.0 as c_int,
                    )
                };
                crate::check(c.nccl(), rc, call, Some(*raw))
            });
            if r.is_err() {
                issued = r;
                break;
            }
        }
        let ended = group.end();
        // Every rank is waited for, whatever fails: the windows NCCL made are adopted
        // below and released on failure (a wait that fails aborts its rank, which
        // releases that rank's window with it).
        let mut waited = Result::Ok(());
        for (c, _) in ranks {
            if !c.config().is_blocking()
                && let Err(e) = c.wait_async(call)
                && waited.is_ok()
            {
                waited = Err(e);
            }
        }
        // A failed wait whose abort did not happen (another thread's group holds the
        // communicator): NCCL may still write that rank's slot and use its memory later.
        if ranks.iter().any(|(c, _)| c.is_unsettled()) {
            let values = wins.to_vec();
            let mut kept = Vec::with_capacity(ranks.len());
            for ((_, (ptr, bytes, memory)), (c, win)) in targets
                .into_iter()
                .zip(ranks.iter().map(|r| r.0).zip(values))
            {
                if c.is_unsettled() {
                    std::mem::forget(memory);
                } else {
                    kept.push(Window(c.adopt_registration(
                        Kind::Window,
                        win.expose_provenance(),
                        ptr,
                        bytes,
                        memory,
                    )));
                }
            }
            std::mem::forget(wins);
            // The windows of the settled ranks are released with `kept`.
            drop(kept);
            issued?;
            ended?;
            return Err(waited.err().unwrap_or(Error::Aborted));
        }
        let mut out = Vec::with_capacity(ranks.len());
        for ((_, (ptr, bytes, memory)), (c, win)) in
            targets.into_iter().zip(ranks.iter().map(|r| r.0).zip(wins))
        {
            out.push(Window(c.adopt_registration(
                Kind::Window,
                win.expose_provenance(),
                ptr,
                bytes,
                memory,
            )));
        }
        // On failure the windows made so far are released with `out`.
        issued?;
        ended?;
        waited?;
        Ok(out)
    }

    fn adopt_registration(
        &self,
        kind: Kind,
        handle: usize,
        start: u64,
        bytes: usize,
        memory: KeepAlive,
    ) -> Registration<'_> {
        let shared = Arc::new(RegShared {
            comm: self.shared().clone(),
            start,
            bytes,
            pending: Mutex::new(Some(Pending {
                kind,
                handle,
                memory: vec![memory],
                uses: StreamLog::new(),
            })),
        });
        let nccl_shared = (kind == Kind::Local && handle != 0).then_some(handle);
        let same = self.shared().registry.add(&shared, nccl_shared);
        // NCCL keeps the first registration's memory registered until the last one it
        // handed out is released: so must its memory stay.
        let held: Vec<KeepAlive> = same
            .iter()
            .flat_map(|r| match &*lock(&r.pending) {
                Some(p) => p.memory.clone(),
                None => Vec::new(),
            })
            .collect();
        if let Some(p) = &mut *lock(&shared.pending) {
            p.memory.extend(held);
        }
        drop(same);
        Registration {
            shared: ManuallyDrop::new(shared),
            comm: self,
        }
    }

    /// Releases a registration now when nothing but its handle holds it: after the work
    /// that used it, through NCCL (unless the communicator is gone, which released it).
    pub(crate) fn release_registration(&self, shared: Arc<RegShared>) -> Result<()> {
        if Arc::strong_count(&shared) > 1 {
            // A graph or an open group holds it: released when they let go. Until then
            // NCCL still resolves it for any collective on its memory, so it stays in the
            // registry (its drop removes it) and later work is noted on it too.
            return Ok(());
        }
        // Nobody else holds it: its drop, at the end, takes it out of the registry (no
        // collective of this communicator can run meanwhile: this is its thread).
        let Some(p) = lock(&shared.pending).take() else {
            return Ok(());
        };
        self.release_pending(p).map_err(|(e, back)| {
            if let Some(p) = back {
                // Not released yet: the communicator tries again later (or goes first).
                let range = self.shared().registry.range_of(&*shared);
                let range = range.unwrap_or_else(|| pages(shared.start, shared.bytes));
                self.shared().registry.defer(p, range);
            }
            e
        })
    }

    /// Releases one registration on the owner's thread. On failure: the error, and the
    /// registration back when trying again later makes sense (`None`: NCCL refused the
    /// release, so it keeps the memory, which is leaked, unless the communicator was
    /// aborted for it, which released the registration).
    #[allow(clippy::result_large_err)] // cold path; the pending release must come back
    pub(crate) fn release_pending(
        &self,
        p: Pending,
    ) -> std::result::Result<(), (Error, Option<Pending>)> {
        if self.is_aborted() {
            // NCCL released it with the communicator; the memory may go.
            return Ok(());
        }
        if self.shared().grouped_elsewhere_pub() {
            // Another thread's open group holds the handle (NCCL allows one thread at a
            // time): released by the owner's first call after that group.
            let e = Error::GroupedElsewhere {
                what: "Communicator",
            };
            return Err((e, Some(p)));
        }
        if let Err(e) = p.uses.synchronize() {
            return Err((e.into(), Some(p)));
        }
        let Some(raw) = self.live_handle() else {
            return Ok(());
        };
        if p.handle == 0 {
            // A window NCCL declined: nothing to release.
            return Ok(());
        }
        let _g = match self.context().bind() {
            Ok(g) => g,
            Err(e) => return Err((e.into(), Some(p))),
        };
        let handle: *mut c_void = std::ptr::with_exposed_provenance_mut(p.handle);
        let (rc, call) = match p.kind {
            Kind::Local => match self.nccl().fns().ncclCommDeregister {
                // SAFETY: a handle from ncclCommRegister on this live communicator,
                // released once (taken out of its `pending`), after the work that used it.
                Some(f) => (unsafe { f(raw, handle) }, "ncclCommDeregister"),
                None => return Ok(()),
            },
            Kind::Window => match self.nccl().fns().ncclCommWindowDeregister {
                // SAFETY: a window of this live communicator, released once, after the
                // work that used it.
                Some(f) => (unsafe { f(raw, handle.cast()) }, "ncclCommWindowDeregister"),
                None => return Ok(()),
            },
        };
        self.check(rc, call).map_err(|e| {
            if !self.is_aborted() {
                // NCCL may still hold the memory: never free it.
                std::mem::forget(p);
            }
            // Otherwise the abort that followed released it with the communicator: the
            // memory may go (after its own work, as always).
            (e, None)
        })
    }
}

/// A buffer registration of one communicator ([`Communicator::register`]): deregistered
/// on drop, once the work that may use it is done (later, if a graph or an open group
/// still holds it). It holds the memory allocated until then.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, mock::MockDriver};
/// use nccl_channel::Communicator;
/// use nccl_sys::mock::MockNccl;
///
/// let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(1))?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
/// let buf = comm.alloc_nccl::<u32>(64)?;
/// let reg = comm.register(&buf.slice(16..32)?)?; // a part of a buffer, too
/// assert_eq!((reg.device_ptr(), reg.size_bytes()), (buf.as_raw() + 64, 64));
/// drop(buf); // the registration keeps the memory...
/// assert_eq!(world.calls("ncclMemFree"), 0);
/// reg.deregister()?; // ...until it is released
/// assert_eq!((world.calls("ncclCommDeregister"), world.calls("ncclMemFree")), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping it deregisters the memory at once"]
pub struct Registration<'c> {
    /// Taken exactly once: by `drop` or by `into_shared`.
    shared: ManuallyDrop<Arc<RegShared>>,
    comm: &'c Communicator,
}

// Released through the communicator, on its thread: neither may leave it.
static_assertions::assert_not_impl_any!(Registration<'static>: Send, Sync);
static_assertions::assert_impl_all!(Registration<'static>: std::fmt::Debug);
static_assertions::assert_not_impl_any!(Window<'static>: Send, Sync);
static_assertions::assert_impl_all!(Window<'static>: std::fmt::Debug);
static_assertions::assert_impl_all!(WindowFlags: Send, Sync, Copy, std::fmt::Debug);

impl std::fmt::Debug for Registration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("ptr", &format_args!("{:#x}", self.shared.start))
            .field("bytes", &self.shared.bytes)
            .field("rank", &self.comm.rank())
            .finish()
    }
}

impl Registration<'_> {
    /// The registered address.
    #[must_use]
    pub fn device_ptr(&self) -> u64 {
        self.shared.start
    }

    /// The registered size in bytes.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.shared.bytes
    }

    /// Releases it now, reporting errors a drop would swallow (including a wait that a
    /// capture in progress refuses: it is then released later).
    pub fn deregister(self) -> Result<()> {
        let comm = self.comm;
        comm.release_registration(self.into_shared())
    }

    /// The shared registration, without releasing it.
    pub(crate) fn into_shared(self) -> Arc<RegShared> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so this is the one take of `shared`.
        unsafe { ManuallyDrop::take(&mut me.shared) }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        // SAFETY: the one take of `shared` (`into_shared` does not run this drop).
        let shared = unsafe { ManuallyDrop::take(&mut self.shared) };
        let _ = self.comm.release_registration(shared);
    }
}

/// A window of one communicator ([`Communicator::register_window`]); released on drop
/// like a [`Registration`]. NCCL may decline a window (no symmetric memory support on
/// this machine): then it is [`is_active`](Self::is_active)`() == false` and collectives
/// simply run as without it.
///
/// Registering a window is collective; one thread driving several ranks registers all of
/// theirs at once with [`Communicator::register_windows`]:
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, Stream, mock::MockDriver};
/// use nccl_channel::{Communicator, ReduceOp, WindowFlags, group};
/// use nccl_sys::mock::MockNccl;
///
/// let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(2))?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
/// let comms = Communicator::init_all(&nccl, &ctxs)?;
/// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
/// // Windows need NCCL memory (or another cuMem allocation).
/// let mut bufs = [comms[0].alloc_nccl::<f32>(1024)?, comms[1].alloc_nccl::<f32>(1024)?];
/// bufs[0].fill(1.0)?;
/// bufs[1].fill(2.0)?;
/// let windows = Communicator::register_windows(
///     &[(&comms[0], &bufs[0]), (&comms[1], &bufs[1])],
///     WindowFlags::COLL_SYMMETRIC,
/// )?;
/// assert!(windows.iter().all(|w| w.is_active()));
/// group(&nccl, || {
///     for r in 0..2 {
///         comms[r].all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])?;
///     }
///     Ok(())
/// })?;
/// streams[0].synchronize()?;
/// assert_eq!(bufs[0].to_vec()?, vec![3.0; 1024]);
/// for w in windows {
///     w.deregister()?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping it deregisters the window at once"]
pub struct Window<'c>(Registration<'c>);

impl std::fmt::Debug for Window<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("ptr", &format_args!("{:#x}", self.0.shared.start))
            .field("bytes", &self.0.shared.bytes)
            .field("active", &self.is_active())
            .finish()
    }
}

impl Window<'_> {
    /// Whether NCCL made a window (it returns none where it has no symmetric support).
    #[must_use]
    pub fn is_active(&self) -> bool {
        lock(&self.0.shared.pending)
            .as_ref()
            .is_some_and(|p| p.handle != 0)
    }

    /// The registered address.
    #[must_use]
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }

    /// The registered size in bytes.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.0.size_bytes()
    }

    /// Releases it now, reporting errors a drop would swallow.
    #[doc(alias = "ncclCommWindowDeregister")]
    pub fn deregister(self) -> Result<()> {
        self.0.deregister()
    }
}

#[cfg(all(test, feature = "mock"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use cuda_hal::{CaptureMode, Cuda, Stream, mock::MockDriver};
    use nccl_sys::mock::MockNccl;

    use crate::{Communicator, ReduceOp};

    /// Collectives look registrations up only while the registry holds some: it holds
    /// exactly the live ones, and flags exactly the releases waiting for the owner.
    #[test]
    fn the_registry_holds_exactly_the_live_registrations_and_waiting_releases() {
        let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(1)).unwrap();
        let (nccl, world) = MockNccl::new(&gpus).build().unwrap();
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))
            .unwrap()
            .remove(0);
        let registry = &comm.shared().registry;
        let count = || registry.count.load(Ordering::Acquire);
        assert_eq!((count(), registry.has_deferred()), (0, false));
        let mut a = comm.alloc_nccl::<f32>(16).unwrap();
        let b = comm.alloc_nccl::<f32>(16).unwrap();
        let reg_a = comm.register(&a).unwrap();
        let reg_b = comm.register(&b).unwrap();
        assert_eq!(count(), 2);
        drop(reg_b);
        assert_eq!(count(), 1);

        // A graph dropped on another thread hands the release to the owner.
        let stream = Stream::new(&ctx).unwrap();
        stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        comm.all_reduce_in_place(&mut a, ReduceOp::Sum, &stream)
            .unwrap();
        let graph = stream.end_capture().unwrap().instantiate().unwrap();
        drop(reg_a);
        assert_eq!((count(), registry.has_deferred()), (1, false));
        std::thread::spawn(move || drop(graph)).join().unwrap();
        assert_eq!((count(), registry.has_deferred()), (0, true));
        comm.async_error().unwrap();
        assert!(!registry.has_deferred());
        assert_eq!(world.calls("ncclCommDeregister"), 2);
        drop((a, b, stream));
    }
}
