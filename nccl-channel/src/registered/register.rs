//! Buffer registrations (`ncclCommRegister`, NCCL ≥ 2.19) and windows
//! (`ncclCommWindowRegister`, NCCL ≥ 2.27): memory NCCL may map into its peers and use
//! directly, instead of copying through its own buffers.
//!
//! Both are typed so that the memory outlives its registration (the registration holds
//! a shared owner of it, [`DeviceSlice::keep_alive`]) and the registration does not
//! outlive its communicator (it borrows it). This file has the methods that make them;
//! how a registration is kept, noted by collectives and released is in the sibling files.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cuda_hal::{DeviceSlice, KeepAlive};
use nccl_sys::ncclWindow_t;

use crate::registered::registry::{Kind, RegShared};
use crate::registered::release::{adopt, release_registration};
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

impl WindowFlags {
    /// Whether it has [`COLL_SYMMETRIC`](Self::COLL_SYMMETRIC).
    pub(crate) fn is_symmetric(self) -> bool {
        self.0 & Self::COLL_SYMMETRIC.0 != 0
    }
}

impl std::ops::BitOr for WindowFlags {
    type Output = WindowFlags;
    fn bitor(self, rhs: WindowFlags) -> WindowFlags {
        WindowFlags(self.0 | rhs.0)
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
    // No stream work: the registration is a host call, the memory held by `memory` (and
    // its synchronous use noted above) for as long as the registration lives.
    #[allow(clippy::disallowed_methods)]
    let ptr = mem.device_ptr();
    Ok((ptr, mem.size_bytes(), memory))
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
    /// # use cuda_hal::Cuda;
    /// # use cuda_mock::MockDriver;
    /// # use nccl_mock::MockNccl;
    /// use nccl_channel::{Communicator, ReduceOp};
    /// # let (cuda, world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
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
        Ok(self.adopt_registration(
            Kind::Local,
            handle.expose_provenance(),
            ptr,
            bytes,
            memory,
            false,
        ))
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
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, WindowFlags};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
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
        self.shared().suspend.refuse(what)?;
        crate::agreement::before_registration(what, &[self])?;
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
        let reg = self.adopt_registration(
            Kind::Window,
            win.expose_provenance(),
            ptr,
            bytes,
            memory,
            flags.is_symmetric(),
        );
        // Registered (released with `reg` if the agreement fails).
        let smallest = smallest_window(what, &[(self, bytes)])?[0];
        Ok(Window(reg, smallest))
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
            let raw = c.handle()?;
            c.shared().suspend.refuse(what)?;
            targets.push((raw, target(c, what, *m)?));
        }
        let comms: Vec<&Communicator> = ranks.iter().map(|r| r.0).collect();
        crate::agreement::before_registration(what, &comms)?;
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
                    kept.push(c.adopt_registration(
                        Kind::Window,
                        win.expose_provenance(),
                        ptr,
                        bytes,
                        memory,
                        flags.is_symmetric(),
                    ));
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
            out.push((
                c,
                bytes,
                c.adopt_registration(
                    Kind::Window,
                    win.expose_provenance(),
                    ptr,
                    bytes,
                    memory,
                    flags.is_symmetric(),
                ),
            ));
        }
        // On failure the windows made so far are released with `out`.
        issued?;
        ended?;
        waited?;
        let sizes: Vec<(&Communicator, usize)> = out.iter().map(|(c, b, _)| (*c, *b)).collect();
        let smallest = smallest_window(what, &sizes)?;
        Ok(out
            .into_iter()
            .zip(smallest)
            .map(|((_, _, reg), min)| Window(reg, min))
            .collect())
    }

    fn adopt_registration(
        &self,
        kind: Kind,
        handle: usize,
        start: u64,
        bytes: usize,
        memory: KeepAlive,
        symmetric: bool,
    ) -> Registration<'_> {
        Registration {
            shared: ManuallyDrop::new(adopt(self, kind, handle, start, bytes, memory, symmetric)),
            comm: self,
        }
    }
}

/// A buffer registration of one communicator ([`Communicator::register`]): deregistered
/// on drop, once the work that may use it is done (later, if a graph or an open group
/// still holds it). It holds the memory allocated until then.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_channel::Communicator;
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
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
            .field("ptr", &format_args!("{:#x}", self.shared.start()))
            .field("bytes", &self.shared.bytes())
            .field("rank", &self.comm.rank())
            .finish()
    }
}

impl Registration<'_> {
    /// The registered address.
    #[must_use]
    pub fn device_ptr(&self) -> u64 {
        self.shared.start()
    }

    /// The registered size in bytes.
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.shared.bytes()
    }

    /// Releases it now, reporting errors a drop would swallow (including a wait that a
    /// capture in progress refuses: it is then released later).
    pub fn deregister(self) -> Result<()> {
        let comm = self.comm;
        release_registration(comm, self.into_shared())
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
        let _ = release_registration(self.comm, shared);
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
/// use cuda_hal::{Cuda, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, ReduceOp, WindowFlags, group};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
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
pub struct Window<'c>(Registration<'c>, usize);

impl std::fmt::Debug for Window<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("ptr", &format_args!("{:#x}", self.0.shared.start()))
            .field("bytes", &self.0.shared.bytes())
            .field("active", &self.is_active())
            .finish()
    }
}

impl<'c> Window<'c> {
    /// The shared registration, without releasing it: the last holder of the
    /// registration releases it (on the communicator's thread, at its next call when that
    /// holder is elsewhere).
    pub(crate) fn into_shared(self) -> Arc<RegShared> {
        self.0.into_shared()
    }

    /// The smallest size of this window among the communicator's ranks, in bytes: NCCL
    /// lets ranks register windows of different sizes, and a put must fit the peer's.
    pub(crate) fn peer_bytes(&self) -> usize {
        self.1
    }

    /// Its communicator.
    pub(crate) fn comm(&self) -> &'c Communicator {
        self.0.comm
    }

    /// NCCL's handle, while the window is active.
    pub(crate) fn raw(&self) -> Option<ncclWindow_t> {
        self.0
            .shared
            .handle()
            .map(std::ptr::with_exposed_provenance_mut::<nccl_sys::ncclWindow_vidmem>)
    }

    /// Whether NCCL made a window (it returns none where it has no symmetric support).
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.0.shared.is_active()
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

/// The smallest of every rank's size for the window being registered, agreed between the
/// ranks over each given communicator (in one group when several ranks are driven from
/// this thread): every rank calls window registration, so every rank reaches this too.
/// NCCL accepts windows of different sizes on different ranks and does not check that a
/// put fits the peer's, so puts are bounded by this.
fn smallest_window(what: &'static str, ranks: &[(&Communicator, usize)]) -> Result<Vec<usize>> {
    let values: Vec<(&Communicator, u64)> = ranks.iter().map(|(c, b)| (*c, *b as u64)).collect();
    let smallest =
        crate::agreement::smallest_of(what, crate::agreement::Topic::WindowSize, &values)?;
    Ok(smallest
        .into_iter()
        .map(|v| usize::try_from(v).unwrap_or(usize::MAX))
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use cuda_hal::{CaptureMode, Cuda, Stream};
    use cuda_mock::MockDriver;
    use nccl_mock::MockNccl;

    use crate::{Communicator, ReduceOp};

    /// Collectives look registrations up only while the registry holds some: it holds
    /// exactly the live ones, and flags exactly the releases waiting for the owner.
    #[test]
    fn the_registry_holds_exactly_the_live_registrations_and_waiting_releases() {
        let (cuda, gpus) = MockDriver::with_devices(1)
            .build_with(Cuda::from_driver)
            .unwrap();
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
