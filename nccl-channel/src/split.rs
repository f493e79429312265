//! Splits and shrinks: one rank's ([`Communicator::split`], [`Communicator::shrink`]) and
//! several local ranks' from one thread in one NCCL group ([`Communicator::split_all`],
//! [`Communicator::shrink_all`]).
//!
//! NCCL writes the new communicator into the caller's `newcomm` only when the split has
//! completed: at the end of the call for a blocking parent, at the end of the group for a
//! split inside a group, and in the background for a non-blocking parent (whose async
//! error says `ncclInProgress` until then). So the slots NCCL writes live on the heap
//! until then, and are read only after: after the call or group returned, after polling
//! each non-blocking parent to success, or after aborting a parent whose wait failed
//! (NCCL's abort joins the parent's pending split, so nothing is written later).

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Instant;

use cuda_hal::DeferScope;
use nccl_sys::{NCCL_SPLIT_NOCOLOR, Nccl, ncclComm, ncclComm_t, ncclResult_t};

use crate::backoff::Backoff;
use crate::notice::{self, Deadline, Notice};
use crate::reliability::poll;
use crate::{CommConfig, Communicator, Error, ParentsProblem, Result, check};

const SPLIT_ALL: &str = "Communicator::split_all";
const SHRINK_ALL: &str = "Communicator::shrink_all";

/// Splits and shrinks inside an open group would give their new communicator only after
/// the group ends (NCCL's rule): refused, pointing to the grouped API.
pub(crate) fn refuse_in_group(what: &'static str, instead: &'static str) -> Result<()> {
    if DeferScope::is_open() {
        return Err(Error::SplitInGroup { what, instead });
    }
    Ok(())
}

/// A split or shrink, for a wait notice: "ncclCommSplit of rank 1 of 2 on device 1".
fn split_of(call: &str, parent: &Communicator) -> String {
    let (rank, size) = (parent.rank(), parent.size());
    let device = parent.device().ordinal();
    format!("{call} of rank {rank} of {size} on device {device}")
}

/// NCCL's color: `None` is `NCCL_SPLIT_NOCOLOR`.
fn color_arg(color: Option<u32>) -> Result<c_int> {
    match color {
        None => Ok(NCCL_SPLIT_NOCOLOR),
        Some(c) => c_int::try_from(c).map_err(|_| Error::InvalidArgument {
            what: "color",
            problem: format!("{c} does not fit NCCL's int"),
        }),
    }
}

/// Whether NCCL leaves the communicator usable after this status (as
/// [`Communicator::check`] decides): usage errors do, every other failure aborts it.
fn survivable(e: &Error) -> bool {
    match e {
        Error::Nccl { code, .. } => matches!(
            *code,
            ncclResult_t::ncclInvalidArgument | ncclResult_t::ncclInvalidUsage
        ),
        _ => true,
    }
}

/// Checks that `parents` can split together in one group from this thread, and that
/// each is live (performing a requested abort, as every call does). `what` is the
/// grouped API called.
pub(crate) fn check_parents(what: &'static str, parents: &[&Communicator]) -> Result<()> {
    let bad = |problem| Err(Error::GroupedParents { what, problem });
    let Some(first) = parents.first() else {
        return bad(ParentsProblem::Empty);
    };
    refuse_in_group(what, what)?;
    for (i, p) in parents.iter().enumerate() {
        if !Arc::ptr_eq(p.nccl(), first.nccl()) {
            return bad(ParentsProblem::MixedLibraries { first: 0, other: i });
        }
        if p.config().is_blocking() != first.config().is_blocking() {
            return bad(ParentsProblem::MixedModes {
                first: 0,
                first_blocking: first.config().is_blocking(),
                other: i,
            });
        }
        if let Some(j) = parents[..i].iter().position(|q| q.as_raw() == p.as_raw()) {
            return bad(ParentsProblem::Duplicate { first: j, again: i });
        }
        p.handle().map_err(|e| match e {
            Error::GroupedElsewhere { .. } => Error::GroupedElsewhere { what },
            e => e,
        })?;
    }
    Ok(())
}

/// Where NCCL writes the new communicators: heap slots that do not move, written by NCCL
/// (from its own thread for a non-blocking parent) until the splits complete.
struct Slots(Box<[AtomicPtr<ncclComm>]>);

impl Slots {
    fn new(n: usize) -> Slots {
        Slots((0..n).map(|_| AtomicPtr::default()).collect())
    }

    /// The pointer to hand NCCL as `newcomm`.
    fn out(&self, i: usize) -> *mut ncclComm_t {
        self.0.get(i).map_or(std::ptr::null_mut(), |s| s.as_ptr())
    }

    /// What NCCL wrote into slot `i` so far.
    fn get(&self, i: usize) -> ncclComm_t {
        self.0
            .get(i)
            .map_or(std::ptr::null_mut(), |s| s.load(Ordering::Acquire))
    }

    /// What NCCL wrote; read only once it will write no more.
    fn take(&self) -> Vec<ncclComm_t> {
        self.0.iter().map(|s| s.load(Ordering::Acquire)).collect()
    }
}

/// Aborts handles NCCL made for us that nobody will own.
fn abort_all(nccl: &Nccl, raws: impl IntoIterator<Item = ncclComm_t>) {
    for raw in raws.into_iter().filter(|r| !r.is_null()) {
        // SAFETY: NCCL made this child for us and handed it over; nobody else has it;
        // aborting frees it, once.
        unsafe { (nccl.fns().ncclCommAbort)(raw) };
    }
}

/// How the children of [`make_children`] are made.
pub(crate) struct Plan<'a> {
    /// The NCCL function, for errors.
    pub(crate) call: &'static str,
    /// Inside one group of their own.
    pub(crate) grouped: bool,
    /// Which parents get a child (a split's NOCOLOR ranks do not).
    pub(crate) expect: &'a [bool],
    /// The children's configuration when NCCL was given one (else each has its
    /// parent's, NCCL's NULL config); it has the parents' blocking mode.
    pub(crate) config: Option<&'a CommConfig>,
    /// Each child gets its private channel (comm/private.rs) before it is handed out:
    /// every child but a private channel itself.
    pub(crate) channel: bool,
}

/// Creates the children of `parents`, one NCCL call each (`issue(i, parent, newcomm)`).
/// Reads them only when NCCL is done with the slots; on any failure every child made is
/// aborted and the first error returned, and parents are aborted as
/// [`Communicator::check`] would (and always when a wait for them failed, to stop their
/// split). The parents were checked by the caller.
pub(crate) fn make_children(
    parents: &[&Communicator],
    plan: Plan<'_>,
    issue: &mut dyn FnMut(usize, ncclComm_t, *mut ncclComm_t) -> ncclResult_t,
) -> Result<Vec<Option<Communicator>>> {
    let Some(mut making) = Making::start(parents, plan)? else {
        return Ok(Vec::new());
    };
    // A local of this function, lent to the phases, never moved into `Making`: NCCL may
    // write it from the first issue on, and only here, once every wait is over, is it
    // decided whether it may ever be freed.
    let slots = Slots::new(parents.len());
    making.issue(&slots, issue)?;
    making.wait_parents();
    making.wait_slots(&slots);
    // NCCL writes no more: every split completed, or its parent was aborted; except where
    // a wait left it unsettled, or a child is missing (its split has not completed).
    let raws = slots.take();
    let missing = making.find_missing(&raws);
    if making.unsettled || missing {
        // NCCL may still write them: they must outlive it.
        std::mem::forget(slots);
    }
    let (channel, grouped) = (making.plan.channel, making.plan.grouped);
    let children = match making.error.take() {
        Some(e) => Err(making.unwind(raws, e)),
        None => making.adopt(raws),
    }?;
    if !channel {
        return Ok(children);
    }
    // Several children made from one thread in one group get their channels so too.
    let present: Vec<bool> = children.iter().map(Option::is_some).collect();
    let with = crate::comm::private::attach(children.into_iter().flatten().collect(), grouped)?;
    let mut with = with.into_iter();
    Ok(present
        .into_iter()
        .map(|p| if p { with.next() } else { None })
        .collect())
}

/// One run of [`make_children`], phase by phase: what the parents' splits have come to.
struct Making<'a> {
    parents: &'a [&'a Communicator],
    plan: Plan<'a>,
    nccl: &'a Nccl,
    /// Which parents' splits NCCL took: it may write their slots.
    issued: Vec<bool>,
    /// `ncclInProgress` while splits complete in the background.
    status: ncclResult_t,
    /// The group ran none of its splits: NCCL writes no slot.
    group_failed: bool,
    /// NCCL may still write a slot after the waits.
    unsettled: bool,
    /// The first failure; the later phases still run, so that NCCL is left nothing to
    /// write.
    error: Option<Error>,
}

impl<'a> Making<'a> {
    /// Every context must be usable before the first split is issued: a failure between
    /// the splits of one group would leave the issued ones waiting for ranks that never
    /// come (a hang with blocking parents). `None` without parents.
    fn start(parents: &'a [&'a Communicator], plan: Plan<'a>) -> Result<Option<Making<'a>>> {
        let Some(first) = parents.first() else {
            return Ok(None);
        };
        for p in parents {
            drop(p.context().bind()?);
        }
        Ok(Some(Making {
            parents,
            plan,
            nccl: first.nccl(),
            issued: vec![false; parents.len()],
            status: ncclResult_t::ncclSuccess,
            group_failed: false,
            unsettled: false,
            error: None,
        }))
    }

    /// One split per parent, up to the first that NCCL refuses; in one group of their own
    /// when planned (one thread splitting several ranks, whose splits wait for each
    /// other). From here on NCCL may write the slots of those it took.
    fn issue(
        &mut self,
        slots: &Slots,
        issue: &mut dyn FnMut(usize, ncclComm_t, *mut ncclComm_t) -> ncclResult_t,
    ) -> Result<()> {
        let nccl = self.nccl;
        if self.plan.grouped {
            // SAFETY: no preconditions; ended below on every path.
            unsafe { nccl_call!(nccl, ncclGroupStart()) }?;
        }
        for (i, p) in self.parents.iter().enumerate() {
            let raw = p.as_raw();
            // NCCL sets the parent's device itself; binding (checked in `start`) is for
            // the mock and for tidiness.
            let _bound = p.context().bind().ok();
            // A blocking parent's split outside a group blocks in NCCL until its peers
            // split too: watched.
            let call = self.plan.call;
            let watch = (!self.plan.grouped && p.config().is_blocking())
                .then(|| notice::watch(Deadline::Blocking, || split_of(call, p)));
            let rc = issue(i, raw, slots.out(i));
            drop(watch);
            match rc {
                ncclResult_t::ncclSuccess => self.issued[i] = true,
                ncclResult_t::ncclInProgress => {
                    (self.status, self.issued[i]) = (ncclResult_t::ncclInProgress, true)
                }
                rc => {
                    self.error = check(nccl, rc, self.plan.call, Some(raw)).err();
                    break;
                }
            }
        }
        if self.plan.grouped {
            let call = self.plan.call;
            let watch = self
                .parents
                .first()
                .filter(|p| p.config().is_blocking())
                .map(|p| {
                    notice::watch(Deadline::Blocking, || {
                        format!("{} (the group's end)", split_of(call, p))
                    })
                });
            // SAFETY: ends the group started above.
            let (rc, end) = unsafe { nccl_raw_call!(nccl, ncclGroupEnd()) };
            drop(watch);
            self.status = rc;
            if rc != ncclResult_t::ncclInProgress
                && let Err(e) = check(nccl, rc, end, None)
            {
                // The group ran none of its splits: NCCL writes no slot.
                self.group_failed = true;
                self.error.get_or_insert(e);
            }
        }
        Ok(())
    }

    /// Non-blocking parents complete their splits in the background: wait for each,
    /// within its deadline; a failed wait aborts that parent, which stops (joins) its
    /// split.
    fn wait_parents(&mut self) {
        if self.status != ncclResult_t::ncclInProgress {
            return;
        }
        let start = Instant::now();
        for p in self.parents {
            let timeout = p.config().get_timeout();
            let r = poll(
                self.nccl,
                p.as_raw(),
                self.plan.call,
                crate::backoff::deadline_from(start, timeout),
                timeout,
                p.abort_flag(),
                || split_of(self.plan.call, p),
            );
            if let Err(e) = r {
                p.abort_now();
                // Not aborted only while a group of another thread holds it (through a
                // `keep_alive`): then NCCL may still write, and the slots must outlive it.
                self.unsettled |= !p.is_aborted();
                self.error.get_or_insert(e);
            }
        }
    }

    /// A parent can read "done" before NCCL has stored its child: wait for the slots
    /// themselves, so that nothing is stored after they are gone.
    fn wait_slots(&mut self, slots: &Slots) {
        if self.group_failed {
            return;
        }
        // NCCL's background job stores each new communicator as its last step, and a
        // parent's state can read "success" before that store (seen through this crate
        // with NCCL 2.28 for splits outside a group, one rank per thread; not reproduced
        // by a C probe): wait for the slots themselves, within the deadlines, also when
        // another parent failed. A parent whose wait fails is aborted (which joins its
        // split). A NOCOLOR rank's job stores NULL, which cannot be told from "not yet":
        // its slot is left to NCCL (never freed).
        let start = Instant::now();
        for (i, p) in self.parents.iter().enumerate() {
            if !self.issued[i] || p.config().is_blocking() || p.is_aborted() {
                continue;
            }
            if !self.plan.expect.get(i).copied().unwrap_or(false) {
                self.unsettled = true;
                continue;
            }
            let timeout = p.config().get_timeout();
            let deadline = crate::backoff::deadline_from(start, timeout);
            let mut backoff = Backoff::poll();
            let call = self.plan.call;
            let mut notice = Notice::new(start, Deadline::Config(timeout), || {
                format!("the new communicator of {}", split_of(call, p))
            });
            while slots.get(i).is_null() {
                let now = Instant::now();
                if now >= deadline || p.abort_flag().is_requested() {
                    p.abort_now();
                    self.unsettled |= !p.is_aborted();
                    self.error.get_or_insert(Error::Timeout {
                        what: self.plan.call.to_string(),
                        after: timeout,
                    });
                    break;
                }
                notice.tick(now);
                std::thread::sleep(backoff.pause_until(deadline));
            }
        }
    }

    /// Whether a split NCCL took and that should give a child gave none, with nothing
    /// failed to explain it: then the error says why. A group opened through the raw
    /// table on this thread defers the split past our group's end, so it has not
    /// completed.
    fn find_missing(&mut self, raws: &[ncclComm_t]) -> bool {
        let missing = self.error.is_none()
            && raws
                .iter()
                .zip(self.plan.expect)
                .zip(&self.issued)
                .any(|((raw, &expected), &issued)| issued && expected && raw.is_null());
        if missing {
            self.error = Some(Error::InvalidArgument {
                what: self.plan.call,
                problem: "NCCL gave no new communicator after the group ended; is an NCCL \
                          group opened through the raw table still open on this thread?"
                    .into(),
            });
        }
        missing
    }

    /// After a failure no child is handed out: those NCCL made are aborted (nobody will
    /// own them), and so are the parents unless NCCL leaves them usable after `e`.
    fn unwind(&self, raws: Vec<ncclComm_t>, e: Error) -> Error {
        abort_all(self.nccl, raws);
        if !survivable(&e) {
            for p in self.parents {
                p.abort_now();
            }
        }
        e
    }

    /// Takes ownership of the children: each is polled to readiness (non-blocking)
    /// within its parent's deadline, then adopted with the plan's configuration, or its
    /// parent's. On failure the children taken so far are dropped and the rest aborted.
    fn adopt(&self, raws: Vec<ncclComm_t>) -> Result<Vec<Option<Communicator>>> {
        let call = self.plan.call;
        let mut out = Vec::with_capacity(raws.len());
        let mut rest = raws.into_iter();
        for p in self.parents {
            let Some(raw) = rest.next() else { break };
            if raw.is_null() {
                out.push(None);
                continue;
            }
            let nccl = p.nccl();
            let c = self.plan.config.unwrap_or(p.config()).clone();
            let ready = if c.is_blocking() {
                Ok(())
            } else {
                let timeout = c.get_timeout();
                poll(
                    nccl,
                    raw,
                    call,
                    crate::backoff::deadline_after(timeout),
                    timeout,
                    p.abort_flag(),
                    || format!("the new communicator of {}", split_of(call, p)),
                )
            };
            if let Err(e) = ready {
                abort_all(nccl, std::iter::once(raw).chain(rest));
                return Err(e);
            }
            // SAFETY: NCCL made `raw` for this parent's device and handed it over, and it
            // is initialised (the split completed and the child is ready); owned here. On
            // error `Communicator::adopt` releases it.
            match unsafe { Communicator::adopt(nccl, p.context(), raw, c) } {
                Ok(child) => out.push(Some(child)),
                Err(e) => {
                    abort_all(nccl, rest);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }
}

impl Communicator {
    /// Splits into sub-communicators: ranks with the same `color` form one, ordered by
    /// `key` then by rank; `None` opts out (returns `Ok(None)`). Collective over all ranks.
    /// The child has this communicator's configuration (NCCL's NULL config: it inherits
    /// the parent's; [`split_with`](Self::split_with) gives it one of its own), and a
    /// non-blocking split waits for it within the deadline (a failed wait aborts this
    /// communicator, which stops the split).
    ///
    /// One rank per call: in one process per rank, or with one thread per rank. Several
    /// local ranks driven from one thread split together with
    /// [`split_all`](Self::split_all); inside an open group this returns
    /// [`Error::SplitInGroup`].
    ///
    /// Ranks 0 and 1 of three form a communicator of their own; rank 2 opts out:
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
    /// let children = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl) = (&cuda, &nccl);
    ///             s.spawn(move || -> nccl_channel::Result<Option<(usize, usize)>> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 3, rank)?;
    ///                 let color = (rank < 2).then_some(7);
    ///                 let child = comm.split(color, 0)?;
    ///                 Ok(child.map(|c| (c.rank(), c.size())))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(children, [Some((0, 2)), Some((1, 2)), None]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSplit")]
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.split_one(color, key, None)
    }

    /// As [`split`](Self::split), with the child's own [`CommConfig`] (NCCL's `config`
    /// argument) instead of this communicator's: e.g. a name or CTA limits of its own.
    /// It must keep this communicator's blocking mode (else [`Error::InvalidArgument`]):
    /// NCCL completes a split as its parent's work. Its fields are checked against the
    /// loaded NCCL as [`init_rank_with`](Self::init_rank_with) does, before the split.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{CommConfig, Communicator};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// let (nccl, world) = MockNccl::new(&gpus).build()?;
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
    /// let config = CommConfig::new().comm_name("experts").max_ctas(4);
    /// let child = comm.split_with(Some(0), 0, &config)?.expect("a color was given");
    /// assert_eq!(child.config().get_comm_name(), Some("experts"));
    /// let seen = world.config_of(child.as_raw()).expect("split with a config");
    /// assert_eq!((seen.comm_name.as_deref(), seen.raw.maxCTAs), (Some("experts"), 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSplit")]
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Communicator>> {
        if config.is_blocking() != self.config().is_blocking() {
            return Err(Error::InvalidArgument {
                what: "Communicator::split_with",
                problem: format!(
                    "the child's configuration is {}blocking and this communicator is not; \
                     a child keeps its parent's blocking mode",
                    if config.is_blocking() { "" } else { "non-" }
                ),
            });
        }
        self.split_one(color, key, Some(config))
    }

    /// One rank's split, with NCCL's NULL config (`None`: the child inherits ours) or
    /// `config`.
    fn split_one(
        &self,
        color: Option<u32>,
        key: i32,
        config: Option<&CommConfig>,
    ) -> Result<Option<Communicator>> {
        let color = color_arg(color)?;
        self.handle()?;
        refuse_in_group("split", SPLIT_ALL)?;
        // Lowered before the split; it and its names outlive make_children, which returns
        // only once NCCL is done with the split.
        let mut raw_config = config
            .map(|c| c.to_raw(self.nccl().version()))
            .transpose()?;
        let config_ptr = raw_config
            .as_mut()
            .map_or(std::ptr::null_mut(), |c| c.as_mut_ptr());
        let plan = Plan {
            call: "ncclCommSplit",
            grouped: false,
            expect: &[color != NCCL_SPLIT_NOCOLOR],
            config,
            channel: true,
        };
        let mut children = make_children(&[self], plan, &mut |_, raw, out| {
            // SAFETY: a live communicator; `out` stays valid and unread until the split
            // completed (make_children); the config is NULL (inherit ours) or lowered
            // above and alive until after make_children.
            unsafe { (self.nccl().fns().ncclCommSplit)(raw, color, key, out, config_ptr) }
        })?;
        drop(raw_config);
        Ok(children.pop().flatten())
    }

    /// Splits several local ranks from this thread at once, NCCL's pattern for one thread
    /// driving several devices: every `(parent, color, key)` is split in one NCCL group,
    /// and the new communicators are read only after the group ended (and, for
    /// non-blocking parents, after each parent's split completed within its deadline).
    /// Returns one entry per parent, in order, `None` where the color was `None`. Each
    /// child has its parent's configuration, as with [`split`](Self::split).
    ///
    /// Every rank of a parent communicator takes part in its split: the local ranks here,
    /// and any others from their own threads or processes (with `split` or `split_all`).
    ///
    /// Errors: an empty list, parents of different NCCL libraries or blocking modes, or
    /// the same parent twice are [`Error::GroupedParents`]; a call inside an open group is
    /// [`Error::SplitInGroup`]; a parent held by an open group of another thread is
    /// [`Error::GroupedElsewhere`]. If a call or the group fails, every child made is
    /// aborted (none leaks) and the error names the failing call; parents are aborted as
    /// after any failed call (not for usage errors), and always when waiting for them failed.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use nccl_channel::{Communicator, ReduceOp};
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_mock::MockNccl;
    /// // Four simulated GPUs, one communicator each, all driven from this thread.
    /// let (cuda, gpus) = MockDriver::with_devices(4).build_with(Cuda::from_driver)?;
    /// let (nccl, _world) = MockNccl::new(&gpus).build()?;
    /// let nccl = Arc::new(nccl);
    /// let ctxs = (0..4)
    ///     .map(|d| cuda.device(d)?.primary_context())
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// // Even and odd ranks form two communicators, each ordered by descending rank.
    /// let parts: Vec<_> = comms
    ///     .iter()
    ///     .map(|c| (c, Some(c.rank() as u32 % 2), -(c.rank() as i32)))
    ///     .collect();
    /// let halves = Communicator::split_all(&parts)?;
    /// let halves: Vec<Communicator> = halves.into_iter().flatten().collect();
    /// let ranks: Vec<_> = halves.iter().map(|h| (h.rank(), h.size())).collect();
    /// assert_eq!(ranks, [(1, 2), (1, 2), (0, 2), (0, 2)]);
    /// // Each half sums its ranks' values: 1 + 3 and 2 + 4.
    /// let streams = ctxs.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let mut bufs = (0..4)
    ///     .map(|r| DeviceBuffer::from_slice(&ctxs[r], &[r as i32 + 1]))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// nccl_channel::group(&nccl, || {
    ///     for ((h, b), s) in halves.iter().zip(&mut bufs).zip(&streams) {
    ///         h.all_reduce_in_place(b, ReduceOp::Sum, s)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// let mut sums = Vec::new();
    /// for (b, s) in bufs.iter().zip(&streams) {
    ///     s.synchronize()?;
    ///     sums.extend(b.to_vec()?);
    /// }
    /// assert_eq!(sums, [4, 6, 4, 6]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSplit")]
    #[doc(alias = "ncclGroupStart")]
    pub fn split_all(
        parts: &[(&Communicator, Option<u32>, i32)],
    ) -> Result<Vec<Option<Communicator>>> {
        let parents: Vec<&Communicator> = parts.iter().map(|p| p.0).collect();
        check_parents(SPLIT_ALL, &parents)?;
        let args = parts
            .iter()
            .map(|&(_, color, key)| Ok((color_arg(color)?, key)))
            .collect::<Result<Vec<_>>>()?;
        let nccl = parents[0].nccl().clone();
        let expect: Vec<bool> = args.iter().map(|a| a.0 != NCCL_SPLIT_NOCOLOR).collect();
        let plan = Plan {
            call: "ncclCommSplit",
            grouped: true,
            expect: &expect,
            config: None,
            channel: true,
        };
        make_children(&parents, plan, &mut |i, raw, out| {
            let Some(&(color, key)) = args.get(i) else {
                return ncclResult_t::ncclInvalidArgument;
            };
            // SAFETY: a live communicator; `out` stays valid and unread until the group's
            // splits completed (make_children); NULL config inherits the parent's.
            unsafe { (nccl.fns().ncclCommSplit)(raw, color, key, out, std::ptr::null_mut()) }
        })
    }

    /// A new communicator of the ranks not in `exclude` (NCCL ≥ 2.27), e.g. after a peer
    /// died. Every remaining rank calls it with the same list; ranks keep their order. A
    /// non-blocking shrink waits as [`split`](Self::split) does. Several local ranks
    /// driven from one thread shrink together with [`shrink_all`](Self::shrink_all);
    /// inside an open group this returns [`Error::SplitInGroup`].
    ///
    /// Rank 1 of three dies; the others carry on as ranks 0 and 1 of two:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, ReduceOp, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let survivors = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl) = (&cuda, &nccl);
    ///             s.spawn(move || -> nccl_channel::Result<Option<(usize, usize, Vec<i32>)>> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 3, rank)?;
    ///                 if rank == 1 {
    ///                     comm.abort()?; // lost
    ///                     return Ok(None);
    ///                 }
    ///                 let small = comm.shrink(&[1])?;
    ///                 let stream = Stream::new(&ctx)?;
    ///                 let mut buf = DeviceBuffer::from_slice(&ctx, &[rank as i32])?;
    ///                 small.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    ///                 stream.synchronize()?;
    ///                 Ok(Some((small.rank(), small.size(), buf.to_vec()?)))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// // Old ranks 0 and 2 are ranks 0 and 1 now, and sum 0 + 2.
    /// assert_eq!(survivors, [Some((0, 2, vec![2])), None, Some((1, 2, vec![2]))]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommShrink")]
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        self.handle()?;
        refuse_in_group("shrink", SHRINK_ALL)?;
        let mut children = shrink_each(&[self], exclude, "shrink", false)?;
        children.pop().ok_or_else(no_child)
    }

    /// Shrinks several local ranks from this thread at once (NCCL ≥ 2.27): every parent
    /// is shrunk to the ranks not in `exclude`, in one NCCL group, and the new
    /// communicators are read only after the group ended, as with
    /// [`split_all`](Self::split_all) (same errors, plus [`ParentsProblem::ExcludesItself`]
    /// for a parent whose own rank is excluded). Returns one communicator per parent.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use nccl_channel::Communicator;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_mock::MockNccl;
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let (nccl, _world) = MockNccl::new(&gpus).build()?;
    /// let ctxs = (0..3)
    ///     .map(|d| cuda.device(d)?.primary_context())
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut comms = Communicator::init_all(&Arc::new(nccl), &ctxs)?;
    /// comms.remove(1).abort()?; // rank 1 is lost
    /// let small = Communicator::shrink_all(&[&comms[0], &comms[1]], &[1])?;
    /// let ranks: Vec<_> = small.iter().map(|c| (c.rank(), c.size())).collect();
    /// assert_eq!(ranks, [(0, 2), (1, 2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommShrink")]
    pub fn shrink_all(parents: &[&Communicator], exclude: &[usize]) -> Result<Vec<Communicator>> {
        check_parents(SHRINK_ALL, parents)?;
        shrink_each(parents, exclude, SHRINK_ALL, true)
    }
}

/// The shrinks of `parents` (checked by the caller), one NCCL group of their own when
/// `grouped`; every parent gets a child.
fn shrink_each(
    parents: &[&Communicator],
    exclude: &[usize],
    what: &'static str,
    grouped: bool,
) -> Result<Vec<Communicator>> {
    let Some(first) = parents.first() else {
        return Ok(Vec::new());
    };
    let (f, call) = optional!(first.nccl(), ncclCommShrink)?;
    let list = exclude_list(what, exclude, parents, grouped)?;
    let expect = vec![true; parents.len()];
    let plan = Plan {
        call,
        grouped,
        expect: &expect,
        config: None,
        channel: true,
    };
    let children = make_children(parents, plan, &mut |_, raw, out| {
        let mut list = list.clone();
        // SAFETY: a live communicator, a list of valid ranks (NCCL may sort it in place),
        // `out` valid and unread until the shrink completed (the group ended, or NCCL
        // stored it), NULL config (inherit: the child gets its parent's blocking mode) and
        // NCCL_SHRINK_DEFAULT.
        unsafe {
            f(
                raw,
                list.as_mut_ptr(),
                list.len() as c_int,
                out,
                std::ptr::null_mut(),
                0,
            )
        }
    })?;
    children
        .into_iter()
        .map(|c| c.ok_or_else(no_child))
        .collect()
}

fn no_child() -> Error {
    Error::InvalidArgument {
        what: "shrink",
        problem: "NCCL returned no communicator for this rank".into(),
    }
}

/// Checks a shrink's exclusion list against its parents (in range, not a parent's own
/// rank, not empty: NCCL needs one) and converts it to NCCL's ints.
fn exclude_list(
    what: &'static str,
    exclude: &[usize],
    parents: &[&Communicator],
    grouped: bool,
) -> Result<Vec<c_int>> {
    if exclude.is_empty() {
        return Err(Error::InvalidArgument {
            what,
            problem: "no rank to exclude (NCCL needs at least one; keep the communicator)".into(),
        });
    }
    let mut sorted = exclude.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        // NCCL counts the list's length, not its distinct ranks: a repeat shrinks the
        // survivors' size wrongly (or fails on some ranks only).
        return Err(Error::InvalidArgument {
            what,
            problem: format!("rank {} is excluded twice", w[0]),
        });
    }
    for (index, p) in parents.iter().enumerate() {
        for &r in exclude {
            if r >= p.size() {
                return Err(Error::InvalidRank {
                    what,
                    rank: r,
                    size: p.size(),
                });
            }
            if r == p.rank() && grouped {
                return Err(Error::GroupedParents {
                    what,
                    problem: ParentsProblem::ExcludesItself { index, rank: r },
                });
            }
            if r == p.rank() {
                return Err(Error::InvalidArgument {
                    what,
                    problem: format!(
                        "rank {r} is this communicator's own rank; excluded ranks do not \
                         call shrink"
                    ),
                });
            }
        }
    }
    Ok(exclude.iter().map(|&r| r as c_int).collect())
}
