//! Suspending a communicator (`ncclCommSuspend`, `ncclCommResume`, `ncclCommMemStats`,
//! NCCL ≥ 2.29.7): NCCL releases its dynamic GPU memory while the communicator is idle.
//!
//! A suspended communicator's memory is gone, so nothing may run on it: a suspend is
//! refused ([`Error::InFlight`]) while work that may use it is not done (on a stream the
//! communicator enqueued on, in an open group, in a graph that captured it), and while it
//! is suspended its collectives are refused ([`Error::Suspended`]) and graphs that
//! captured it refuse to launch.

use cuda_hal::DeferScope;
use nccl_sys::ncclCommMemStat_t;

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
            shared.suspend.set(true);
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
        shared.suspend.set(false);
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
