//! Suspending a communicator (`ncclCommSuspend`, `ncclCommResume`, `ncclCommMemStats`,
//! NCCL ≥ 2.29.7): NCCL releases its dynamic GPU memory while the communicator is idle.
//!
//! A suspended communicator's memory is gone, so nothing may run on it: a suspend is
//! refused ([`Error::InFlight`]) while work that may use it is not done (on a stream the
//! communicator enqueued on, in an open group, in a graph that captured it), and while it
//! is suspended its collectives are refused ([`Error::Suspended`]) and graphs that
//! captured it refuse to launch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuda_hal::{DeferScope, Dependency, KeepAlive, Stream};
use nccl_sys::ncclCommMemStat_t;

use crate::comm::CommShared;
use crate::sync::lock;
use crate::{Communicator, Error, Result};

/// What `ncclCommSuspend` releases (its `flags`).
///
/// ```
/// use nccl_channel::SuspendFlags;
/// assert_eq!(SuspendFlags::MEM.bits(), 1); // NCCL_SUSPEND_MEM
/// assert!(SuspendFlags::MEM.contains(SuspendFlags::MEM));
/// assert!(!SuspendFlags::NONE.contains(SuspendFlags::MEM));
/// assert_eq!(SuspendFlags::NONE | SuspendFlags::MEM, SuspendFlags::MEM);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SuspendFlags(i32);

impl SuspendFlags {
    /// Nothing: NCCL suspends nothing (the communicator stays usable).
    pub const NONE: SuspendFlags = SuspendFlags(0);
    /// `NCCL_SUSPEND_MEM`: release the communicator's dynamic GPU memory.
    pub const MEM: SuspendFlags = SuspendFlags(nccl_sys::NCCL_SUSPEND_MEM as i32);

    /// The raw flags NCCL takes.
    #[must_use]
    pub const fn bits(self) -> i32 {
        self.0
    }

    /// Flags from raw bits (bits this crate does not name are passed to NCCL as they are).
    #[must_use]
    pub const fn from_bits(bits: i32) -> SuspendFlags {
        SuspendFlags(bits)
    }

    /// Whether every flag of `other` is set.
    #[must_use]
    pub const fn contains(self, other: SuspendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SuspendFlags {
    type Output = SuspendFlags;
    fn bitor(self, rhs: SuspendFlags) -> SuspendFlags {
        SuspendFlags(self.0 | rhs.0)
    }
}

/// A communicator's GPU memory as NCCL accounts it (`ncclCommMemStats`), in bytes.
///
/// NCCL counts what it manages whether released or not: the byte counts stay the same
/// while suspended, and [`suspended`](Self::suspended) says whether the suspendable part
/// is released. See [`Communicator::mem_stats`] for an example.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemStats {
    /// Memory a suspend releases (`ncclStatGpuMemSuspend`).
    pub suspendable: u64,
    /// Whether that memory is released now (`ncclStatGpuMemSuspended`).
    pub suspended: bool,
    /// Memory kept for the communicator's life (`ncclStatGpuMemPersist`).
    pub persistent: u64,
    /// All memory NCCL tracks for it (`ncclStatGpuMemTotal`).
    pub total: u64,
}

/// A communicator's suspension, and the streams its work went to.
#[derive(Default)]
pub(crate) struct SuspendState {
    suspended: AtomicBool,
    /// The stream noted last (its key), so that noting it again is one load.
    last: AtomicUsize,
    /// Streams the communicator enqueued on, whose work may not be done.
    streams: Mutex<Vec<Stream>>,
    /// One clone per live hold of a capture or group ([`held`]).
    holds: Arc<()>,
}

impl SuspendState {
    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
    }

    /// [`Error::Suspended`] while suspended.
    pub(crate) fn refuse(&self, what: &'static str) -> Result<()> {
        if self.is_suspended() {
            return Err(Error::Suspended { what });
        }
        Ok(())
    }

    /// Work is about to be enqueued on `stream`: kept (a clone, so the stream lives as long
    /// as the communicator or until a suspend finds its work done).
    #[inline]
    pub(crate) fn note(&self, stream: &Stream) {
        let key = Arc::as_ptr(&self.holds).addr() ^ stream.as_raw().addr();
        if self.last.load(Ordering::Relaxed) != key {
            self.note_new(stream, key);
        }
    }

    #[cold]
    fn note_new(&self, stream: &Stream, key: usize) {
        // No query here: work may be being captured, and a query of a capturing stream
        // spoils its capture. The list is pruned by `busy`.
        let mut v = lock(&self.streams);
        if !v.iter().any(|s| s.as_raw() == stream.as_raw()) {
            v.push(stream.clone());
        }
        self.last.store(key, Ordering::Relaxed);
    }

    /// Why work may still use the communicator, if it may.
    fn busy(&self) -> Option<String> {
        if Arc::strong_count(&self.holds) > 1 {
            return Some(
                "an open group or a captured graph holds work that uses the communicator: end \
                 the group or drop the graph first"
                    .into(),
            );
        }
        let mut v = lock(&self.streams);
        // A capturing stream is not queried (that would spoil its capture): busy.
        v.retain(|s| s.is_capturing().unwrap_or(true) || !matches!(s.is_idle(), Ok(true)));
        self.last.store(0, Ordering::Relaxed);
        v.first().map(|s| {
            format!(
                "work it enqueued on stream {:?} is not done: synchronize the stream (or \
                 Communicator::wait) first",
                s.as_raw()
            )
        })
    }
}

/// What a capture or group holds of a communicator for work it recorded: the communicator,
/// counted, so that a suspend can see that work may still run.
struct Held {
    shared: Arc<CommShared>,
    _count: Arc<()>,
}

impl Dependency for Held {
    fn gated(&self) -> bool {
        self.shared.gated()
    }
    fn while_usable(
        &self,
        launch: &mut dyn FnMut() -> cuda_hal::Result<()>,
    ) -> cuda_hal::Result<()> {
        self.shared.while_usable(launch)
    }
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        self.shared.used_on(stream)
    }
    fn launched(&self, stream: &Stream) {
        self.shared.launched(stream);
    }
    fn deferred(&self) {
        self.shared.deferred();
    }
    fn settle(&self) -> bool {
        self.shared.settle()
    }
}

/// A counted hold of `shared` for a capture or group.
pub(crate) fn held(shared: &Arc<CommShared>) -> KeepAlive {
    KeepAlive::new(Arc::new(Held {
        shared: shared.clone(),
        _count: shared.suspend.holds.clone(),
    }))
}

impl Communicator {
    /// Suspends the communicator (`ncclCommSuspend`, NCCL ≥ 2.29.7): with
    /// [`SuspendFlags::MEM`], NCCL releases its dynamic GPU memory until
    /// [`resume`](Self::resume); meanwhile its collectives return [`Error::Suspended`] and
    /// graphs that captured it refuse to launch. Without `MEM` NCCL releases nothing and the
    /// communicator stays usable.
    ///
    /// Refused with [`Error::InFlight`] while work may still use it: enqueued on a stream
    /// and not done (synchronize it first), deferred by an open group, or held by a graph
    /// that captured it; with [`Error::Suspended`] when it is suspended already. Every rank
    /// suspends its own communicator (the call does not wait for the others).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use nccl_channel::{Communicator, Error, ReduceOp, SuspendFlags};
    /// # let (cuda, gpus) = cuda_mock::MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// # let (nccl, _sim) = nccl_mock::MockNccl::new(&gpus).build()?;
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
    /// let stream = Stream::new(&ctx)?;
    /// let mut buf = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0])?;
    /// comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    /// stream.synchronize()?; // nothing of it may still run
    /// comm.suspend(SuspendFlags::MEM)?;
    /// assert!(comm.is_suspended());
    /// let refused = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream);
    /// assert_eq!(refused, Err(Error::Suspended { what: "all_reduce_in_place" }));
    /// comm.resume()?;
    /// comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSuspend")]
    pub fn suspend(&self, flags: SuspendFlags) -> Result<()> {
        const WHAT: &str = "Communicator::suspend";
        let raw = self.handle()?;
        let (f, call) = optional!(self.nccl(), ncclCommSuspend)?;
        let shared = self.shared();
        shared.suspend.refuse(WHAT)?;
        let busy = if DeferScope::is_open() || shared.in_group() {
            Some(
                "a group is open: NCCL would suspend only at its end; suspend outside groups"
                    .into(),
            )
        } else {
            shared.suspend.busy()
        };
        if let Some(problem) = busy {
            return Err(Error::InFlight {
                what: WHAT,
                problem,
            });
        }
        let _ctx = self.context().bind()?;
        // No graph launch starts while the state changes.
        let _excl = shared.exclusive();
        // SAFETY: a live communicator with no work that may still run on it.
        let rc = unsafe { f(raw, flags.bits()) };
        self.check(rc, call)?;
        if flags.contains(SuspendFlags::MEM) {
            shared.suspend.suspended.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Resumes a suspended communicator (`ncclCommResume`, NCCL ≥ 2.29.7): NCCL restores
    /// its memory and it takes work again. One that is not suspended is refused with
    /// [`Error::InvalidArgument`] (see [`suspend`](Self::suspend) for an example).
    #[doc(alias = "ncclCommResume")]
    pub fn resume(&self) -> Result<()> {
        let raw = self.handle()?;
        let (f, call) = optional!(self.nccl(), ncclCommResume)?;
        let shared = self.shared();
        if !shared.suspend.is_suspended() {
            return Err(Error::InvalidArgument {
                what: "Communicator::resume",
                problem: "the communicator is not suspended".into(),
            });
        }
        let _ctx = self.context().bind()?;
        let _excl = shared.exclusive();
        // SAFETY: a live, suspended communicator.
        let rc = unsafe { f(raw) };
        self.check(rc, call)?;
        shared.suspend.suspended.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether the communicator is suspended ([`suspend`](Self::suspend)).
    #[must_use]
    pub fn is_suspended(&self) -> bool {
        self.shared().suspend.is_suspended()
    }

    /// The communicator's GPU memory as NCCL accounts it (`ncclCommMemStats`, NCCL ≥
    /// 2.29.7).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use nccl_channel::{Communicator, SuspendFlags};
    /// # let (cuda, gpus) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let (nccl, _sim) = nccl_mock::MockNccl::new(&gpus).build()?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
    /// let active = comm.mem_stats()?;
    /// assert!(!active.suspended);
    /// assert_eq!(active.total, active.persistent + active.suspendable);
    /// comm.suspend(SuspendFlags::MEM)?;
    /// let asleep = comm.mem_stats()?;
    /// assert!(asleep.suspended);
    /// assert_eq!(asleep.total, active.total); // NCCL counts released memory too
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommMemStats")]
    pub fn mem_stats(&self) -> Result<MemStats> {
        let raw = self.handle()?;
        let (f, call) = optional!(self.nccl(), ncclCommMemStats)?;
        let get = |stat| {
            let mut v = 0u64;
            // SAFETY: a live communicator and a valid out-pointer.
            let rc = unsafe { f(raw, stat, &mut v) };
            self.check(rc, call).map(|()| v)
        };
        Ok(MemStats {
            suspendable: get(ncclCommMemStat_t::ncclStatGpuMemSuspend)?,
            suspended: get(ncclCommMemStat_t::ncclStatGpuMemSuspended)? != 0,
            persistent: get(ncclCommMemStat_t::ncclStatGpuMemPersist)?,
            total: get(ncclCommMemStat_t::ncclStatGpuMemTotal)?,
        })
    }
}
