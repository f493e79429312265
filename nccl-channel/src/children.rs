//! Making the children of communicators ([`make_children`]): the part every split, shrink
//! and grow shares, below them and below the private channel's split.
//!
//! NCCL writes the new communicator into the caller's `newcomm` only when the split has
//! completed: at the end of the call for a blocking parent, at the end of the group for a
//! split inside a group, and in the background for a non-blocking parent (whose async
//! error says `ncclInProgress` until then). So the slots NCCL writes live on the heap
//! until then, and are read only after: after the call or group returned, after polling
//! each non-blocking parent to success, or after aborting a parent whose wait failed
//! (NCCL's abort joins the parent's pending split, so nothing is written later).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Instant;

use nccl_sys::{Nccl, ncclComm, ncclComm_t, ncclResult_t};

use crate::backoff::Backoff;
use crate::notice::{self, Deadline, Notice};
use crate::reliability::poll;
use crate::{CommConfig, Communicator, Error, Result, check};

/// A split or shrink, for a wait notice: "ncclCommSplit of rank 1 of 2 on device 1".
pub(crate) fn split_of(call: &str, parent: &Communicator) -> String {
    let (rank, size) = (parent.rank(), parent.size());
    let device = parent.device().ordinal();
    format!("{call} of rank {rank} of {size} on device {device}")
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
    match making.error.take() {
        Some(e) => Err(making.unwind(raws, e)),
        None => making.adopt(raws),
    }
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
