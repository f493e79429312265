//! Making communicators: [`Communicator::init_rank`], [`init_rank_with`] and [`init_all`],
//! and the checks and the wait every init shares (split, grow and the scalable init too).
//!
//! [`init_rank_with`]: Communicator::init_rank_with
//! [`init_all`]: Communicator::init_all

use std::cell::OnceCell;
use std::ffi::c_int;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

use cuda_hal::Context;
use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

use super::Communicator;
use super::private::refuse_in_group;
use super::shared::CommShared;
use crate::config::CommConfig;
use crate::notice::{self, Deadline};
use crate::registered::pool::Pool;
use crate::registered::registry::Registry;
use crate::reliability::{AbortHandle, poll};
use crate::{Error, Result, UniqueId, check};

fn to_c_int(what: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::InvalidArgument {
        what,
        problem: format!("{v} does not fit NCCL's int"),
    })
}

/// An init, for a wait notice: "init of rank 1 of 2 on device 0 (ncclCommInitRank)".
fn init_of(rank: usize, size: usize, ctx: &Context, call: &str) -> String {
    let device = ctx.device().ordinal();
    format!("init of rank {rank} of {size} on device {device} ({call})")
}

/// Checks a size and rank for init and converts them to NCCL's ints.
pub(crate) fn world_args(what: &'static str, size: usize, rank: usize) -> Result<(c_int, c_int)> {
    if size == 0 || rank >= size {
        return Err(Error::InvalidRank { what, rank, size });
    }
    Ok((to_c_int("size", size)?, to_c_int("rank", rank)?))
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `size`, on `ctx`'s device (blocking until
    /// every rank has joined).
    ///
    /// Every rank passes the same id, which rank 0 made with [`UniqueId::generate`] and
    /// shared (as bytes, hex, a file or a [`Rendezvous`](crate::Rendezvous)). Each rank
    /// calls it from its own thread or process: the call returns once all have come.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let joined = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl) = (&cuda, &nccl);
    ///             s.spawn(move || -> nccl_channel::Result<(usize, usize)> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 3, rank)?;
    ///                 Ok((comm.rank(), comm.size()))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(joined, [(0, 3), (1, 3), (2, 3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitRank")]
    pub fn init_rank(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        size: usize,
        rank: usize,
    ) -> Result<Communicator> {
        with_channel(Self::join_rank(nccl, ctx, id, size, rank)?)
    }

    /// [`init_rank`](Self::init_rank) without the private channel.
    fn join_rank(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        size: usize,
        rank: usize,
    ) -> Result<Communicator> {
        let (n, r) = world_args("Communicator::init_rank", size, rank)?;
        refuse_in_group("Communicator::init_rank")?;
        let _g = ctx.bind()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // NCCL blocks in the call until every rank came: the watchdog says so if it lasts.
        let watch = notice::watch(Deadline::Blocking, || {
            init_of(rank, size, ctx, "ncclCommInitRank")
        });
        // SAFETY: valid out-pointer; the context of the device NCCL should use is current.
        let rc = unsafe { nccl_call!(nccl, ncclCommInitRank(&mut raw, n, id.to_raw(), r)) };
        drop(watch);
        rc?;
        // SAFETY: `raw` was just created by NCCL on `ctx`'s device and is ours.
        unsafe { Self::adopt(nccl, ctx, raw, CommConfig::default()) }
    }

    /// Joins with a [`CommConfig`]: through `ncclCommInitRankConfig` when it is
    /// non-blocking or sets any NCCL field (else `ncclCommInitRank`). A field newer than
    /// the loaded NCCL is [`Error::Unsupported`] and a value NCCL cannot take is
    /// [`Error::InvalidArgument`], both before anything is created. Non-blocking: waits
    /// for the other ranks at most the config's timeout, then aborts and returns
    /// [`Error::Timeout`] (a peer that never joins is an error, not a hang).
    ///
    /// Rank 1 never comes:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use std::time::Duration;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{CommConfig, Communicator, Error, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let id = UniqueId::generate(&nccl)?;
    /// let config = CommConfig::non_blocking(Duration::from_millis(200));
    /// let e = Communicator::init_rank_with(&nccl, &ctx, &id, 2, 0, &config).unwrap_err();
    /// assert_eq!(
    ///     e,
    ///     Error::Timeout { what: "ncclCommInitRankConfig".into(), after: Duration::from_millis(200) }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn init_rank_with(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<Communicator> {
        config.check_timeout()?;
        refuse_in_group("Communicator::init_rank_with")?;
        if config.is_blocking() && !config.sets_nccl_fields() {
            let c = Self::join_rank(nccl, ctx, id, size, rank)?;
            return with_channel(c.with_config(config.clone()));
        }
        let (n, r) = world_args("Communicator::init_rank_with", size, rank)?;
        let f = nccl.fns().ncclCommInitRankConfig;
        init_via(
            nccl,
            ctx,
            (size, rank),
            config,
            "ncclCommInitRankConfig",
            // SAFETY: valid out-pointer and config (`init_via` keeps it alive until the
            // communicator is ready); the device's context is current there.
            |raw, cfg| unsafe { f(raw, n, id.to_raw(), r, cfg) },
        )
    }

    /// One communicator per context, all in this process (`ncclCommInitAll`); rank `i`
    /// uses `contexts[i]`. Drive them from one thread with [`crate::group`] (a collective
    /// of every rank in one group), and split or shrink them together with
    /// [`split_all`](Self::split_all) and [`shrink_all`](Self::shrink_all), which make
    /// their own group: [`split`](Self::split) of one rank would wait for the others.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::Communicator;
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(4).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// // Devices 3 and 1, in that order: rank i is on contexts[i]'s device.
    /// let ctxs = [cuda.device(3)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// let ranks: Vec<_> = comms.iter().map(|c| (c.rank(), c.size())).collect();
    /// assert_eq!(ranks, [(0, 2), (1, 2)]);
    /// assert!(comms[0].context() == &ctxs[0] && comms[1].context() == &ctxs[1]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitAll")]
    pub fn init_all(nccl: &Arc<Nccl>, contexts: &[Context]) -> Result<Vec<Communicator>> {
        if contexts.is_empty() {
            return Err(Error::InvalidArgument {
                what: "Communicator::init_all",
                problem: "no device given".into(),
            });
        }
        let n = to_c_int("devices", contexts.len())?;
        refuse_in_group("Communicator::init_all")?;
        let devs: Vec<c_int> = contexts.iter().map(|c| c.device().ordinal()).collect();
        let mut raws: Vec<ncclComm_t> = vec![std::ptr::null_mut(); contexts.len()];
        // SAFETY: room for `n` handles and `n` device ordinals.
        unsafe { nccl_call!(nccl, ncclCommInitAll(raws.as_mut_ptr(), n, devs.as_ptr())) }?;
        let parts: Vec<(&Context, ncclComm_t)> = contexts.iter().zip(raws).collect();
        // SAFETY: NCCL created these handles for their contexts' devices (checked in
        // adopt), and nobody else owns them.
        let comms = unsafe { adopt_all(nccl, &parts) }?;
        super::private::attach(comms, true)
    }

    /// Takes ownership of a raw, blocking communicator of `ctx`'s device. Checks its
    /// device, reads its rank and size, and makes its private channel (the crate's own
    /// exchanges travel there, out of the program's reach): **collective**, as an init is,
    /// every rank of the communicator calls it, one rank per thread or process. On error
    /// the handle is aborted.
    ///
    /// For a handle made through the raw table ([`nccl_sys`]) or handed over by other code:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::Communicator;
    /// use nccl_sys::{ncclComm_t, ncclResult_t};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let mut raw: ncclComm_t = std::ptr::null_mut();
    /// let devices = [0];
    /// // SAFETY: room for one handle and one device ordinal.
    /// let rc = unsafe { (nccl.fns().ncclCommInitAll)(&mut raw, 1, devices.as_ptr()) };
    /// assert_eq!(rc, ncclResult_t::ncclSuccess);
    /// // SAFETY: a live, initialised communicator of device 0 (`ctx`'s), made by `nccl`;
    /// // nothing else owns it (`comm` destroys it).
    /// let comm = unsafe { Communicator::from_raw(&nccl, &ctx, raw) }?;
    /// assert_eq!((comm.rank(), comm.size()), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// `raw` must be a live, initialised communicator made by `nccl`, owned by nobody else.
    pub unsafe fn from_raw(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        raw: ncclComm_t,
    ) -> Result<Communicator> {
        // SAFETY: the caller's contract.
        with_channel(unsafe { Self::adopt(nccl, ctx, raw, CommConfig::default()) }?)
    }

    /// [`from_raw`](Self::from_raw) for several ranks driven from this thread (`parts[i]`
    /// is rank handle and its device's context), their private channels made in one NCCL
    /// group, as [`init_all`](Self::init_all) does. On error every handle is aborted.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::Communicator;
    /// use nccl_sys::{ncclComm_t, ncclResult_t};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let mut raws: [ncclComm_t; 2] = [std::ptr::null_mut(); 2];
    /// let devices = [0, 1];
    /// // SAFETY: room for two handles and two device ordinals.
    /// let rc = unsafe { (nccl.fns().ncclCommInitAll)(raws.as_mut_ptr(), 2, devices.as_ptr()) };
    /// assert_eq!(rc, ncclResult_t::ncclSuccess);
    /// // SAFETY: live, initialised communicators of devices 0 and 1, made by `nccl`; nothing
    /// // else owns them.
    /// let comms = unsafe { Communicator::from_raw_all(&nccl, &[(&ctxs[0], raws[0]), (&ctxs[1], raws[1])]) }?;
    /// assert_eq!((comms[1].rank(), comms[1].size()), (1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// As for `from_raw`, for every handle.
    pub unsafe fn from_raw_all(
        nccl: &Arc<Nccl>,
        parts: &[(&Context, ncclComm_t)],
    ) -> Result<Vec<Communicator>> {
        // SAFETY: the caller's contract.
        let comms = unsafe { adopt_all(nccl, parts) }?;
        super::private::attach(comms, true)
    }

    /// As [`from_raw`](Self::from_raw), with the configuration the handle was made with.
    ///
    /// # Safety
    /// As for `from_raw`.
    pub(crate) unsafe fn adopt(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        raw: ncclComm_t,
        config: CommConfig,
    ) -> Result<Communicator> {
        let mut shared = CommShared {
            nccl: nccl.clone(),
            raw,
            ctx: ctx.clone(),
            rank: 0,
            size: 0,
            config,
            abort: AbortHandle::default(),
            dead: AtomicBool::new(false),
            gate: RwLock::new(()),
            grouped: AtomicUsize::new(0),
            group_thread: Mutex::new(None),
            registry: Registry::default(),
            suspend: Default::default(),
            exchanges: std::sync::atomic::AtomicU64::new(0),
            checks_calls: false,
            private: std::sync::OnceLock::new(),
        };
        let (mut rank, mut size, mut dev) = (0, 0, 0);
        // SAFETY: a live communicator and valid out-pointers. On error `shared` drops and
        // releases the handle.
        unsafe {
            nccl_call!(nccl, ncclCommUserRank(raw, &mut rank))?;
            nccl_call!(nccl, ncclCommCount(raw, &mut size))?;
            nccl_call!(nccl, ncclCommCuDevice(raw, &mut dev))?;
        }
        if dev != ctx.device().ordinal() {
            return Err(Error::WrongDevice {
                what: "Communicator::from_raw",
                object: "communicator",
                expected: ctx.device().ordinal(),
                found: dev,
            });
        }
        shared.checks_calls = match shared.config.get_check_calls() {
            Some(on) => on,
            None => crate::call_check::setting::from_env()?,
        };
        shared.rank = usize::try_from(rank).unwrap_or(0);
        shared.size = usize::try_from(size).unwrap_or(0);
        if shared.size == 0 || shared.rank >= shared.size {
            return Err(Error::InvalidRank {
                what: "Communicator::from_raw",
                rank: shared.rank,
                size: shared.size,
            });
        }
        Ok(Communicator {
            private: None,
            shared: Arc::new(shared),
            scratch: OnceCell::new(),
            kit: Default::default(),
            pool: Pool::default(),
            _not_sync: PhantomData,
        })
    }

    pub(crate) fn with_config(self, config: CommConfig) -> Communicator {
        match Arc::try_unwrap(self.shared) {
            Ok(mut s) => {
                s.checks_calls = config.get_check_calls().unwrap_or(s.checks_calls);
                s.config = config;
                Communicator {
                    private: self.private,
                    shared: Arc::new(s),
                    scratch: self.scratch,
                    kit: self.kit,
                    pool: self.pool,
                    _not_sync: PhantomData,
                }
            }
            Err(shared) => Communicator {
                private: self.private,
                shared,
                scratch: self.scratch,
                kit: self.kit,
                pool: self.pool,
                _not_sync: PhantomData,
            },
        }
    }
}

/// Creates one rank's communicator through `issue(newcomm, config)` (an NCCL init taking
/// a config), then waits for it as [`Communicator::init_rank_with`] does: a blocking
/// config blocks in the call (watched), a non-blocking one is polled within its
/// deadline and aborted when the wait fails.
pub(crate) fn init_via(
    nccl: &Arc<Nccl>,
    ctx: &Context,
    (size, rank): (usize, usize),
    config: &CommConfig,
    call: &'static str,
    issue: impl FnOnce(*mut ncclComm_t, *mut nccl_sys::ncclConfig_t) -> ncclResult_t,
) -> Result<Communicator> {
    // Checked and lowered before anything is created; it (and the names it points to)
    // lives until the communicator is ready, past NCCL's reading of it.
    refuse_in_group(call)?;
    let mut cfg = config.to_raw(nccl.version())?;
    let _g = ctx.bind()?;
    let mut raw: ncclComm_t = std::ptr::null_mut();
    let watch = config
        .is_blocking()
        .then(|| notice::watch(Deadline::Blocking, || init_of(rank, size, ctx, call)));
    let rc = issue(&mut raw, cfg.as_mut_ptr());
    drop(watch);
    if rc != ncclResult_t::ncclInProgress
        && let Err(e) = check(nccl, rc, call, None)
    {
        if !raw.is_null() {
            // NCCL handed out a communicator that failed (a grow writes it early):
            // nobody will own it.
            // SAFETY: NCCL made `raw` for us; aborting frees it, once.
            unsafe { (nccl.fns().ncclCommAbort)(raw) };
        }
        return Err(e);
    }
    if !config.is_blocking() || rc == ncclResult_t::ncclInProgress {
        let abort = AbortHandle::default();
        let timeout = config.get_timeout();
        if let Err(e) = poll(
            nccl,
            raw,
            call,
            crate::backoff::deadline_after(timeout),
            timeout,
            &abort,
            || init_of(rank, size, ctx, call),
        ) {
            // SAFETY: NCCL made `raw`; aborting frees it, once.
            unsafe { (nccl.fns().ncclCommAbort)(raw) };
            return Err(e);
        }
    }
    // SAFETY: initialised by NCCL for `ctx`'s device; owned here.
    let c = unsafe { Communicator::adopt(nccl, ctx, raw, CommConfig::default()) }?;
    drop(cfg);
    with_channel(c.with_config(config.clone()))
}

/// Adopts every `(context, handle)` of `parts` (without private channels); on error the
/// handles not adopted yet are aborted (those adopted go with their communicators).
///
/// # Safety
/// As for [`Communicator::from_raw`], for every handle.
unsafe fn adopt_all(
    nccl: &Arc<Nccl>,
    parts: &[(&Context, ncclComm_t)],
) -> Result<Vec<Communicator>> {
    let mut comms = Vec::with_capacity(parts.len());
    let mut rest = parts.iter();
    for (ctx, raw) in rest.by_ref() {
        // SAFETY: the caller's contract.
        match unsafe { Communicator::adopt(nccl, ctx, *raw, CommConfig::default()) } {
            Ok(c) => comms.push(c),
            Err(e) => {
                for (_, raw) in rest {
                    // SAFETY: the caller's: live handles owned by nobody else; aborted once.
                    unsafe { (nccl.fns().ncclCommAbort)(*raw) };
                }
                return Err(e);
            }
        }
    }
    Ok(comms)
}

/// `c`, just made, with its private channel (comm/private.rs); aborted on failure.
fn with_channel(c: Communicator) -> Result<Communicator> {
    let mut one = super::private::attach(vec![c], false)?;
    one.pop().ok_or(Error::InvalidArgument {
        what: "ncclCommSplit",
        problem: "NCCL gave no private channel".into(),
    })
}
