//! Splits and shrinks of one rank ([`Communicator::split`], [`Communicator::shrink`]).
//!
//! NCCL writes the new communicator into the caller's `newcomm` only when the split has
//! completed: at the end of the call for a blocking parent, at the end of the group for a
//! split inside a group, and in the background for a non-blocking parent (whose async
//! error says `ncclInProgress` until then). So the slots NCCL writes live on the heap
//! until then, and are read only after: after the call or group returned, after polling
//! each non-blocking parent to success, or after aborting a parent whose wait failed
//! (NCCL's abort joins the parent's pending split, so nothing is written later).

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Instant;

use cuda_hal::DeferScope;
use nccl_sys::{NCCL_SPLIT_NOCOLOR, Nccl, ncclComm, ncclComm_t, ncclResult_t};

use crate::reliability::poll;
use crate::{Communicator, Error, Result, check};

/// Splits and shrinks inside an open group give their new communicator only after the
/// group ends (NCCL's rule): not supported yet, so refused.
fn refuse_in_group(what: &'static str) -> Result<()> {
    if DeferScope::is_open() {
        return Err(Error::InvalidArgument {
            what,
            problem: "inside an open group, where NCCL gives the new communicator only \
                      after the group ends; call it outside the group"
                .into(),
        });
    }
    Ok(())
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
struct Plan<'a> {
    /// The NCCL function, for errors.
    call: &'static str,
    /// Inside one group of their own.
    grouped: bool,
    /// Which parents get a child (a split's NOCOLOR ranks do not).
    expect: &'a [bool],
}

/// Creates the children of `parents`, one NCCL call each (`issue(i, parent, newcomm)`).
/// Reads them only when NCCL is done with the slots; on any failure every child made is
/// aborted and the first error returned, and parents are aborted as
/// [`Communicator::check`] would (and always when a wait for them failed, to stop their
/// split). The parents were checked by the caller.
fn make_children(
    parents: &[&Communicator],
    plan: Plan<'_>,
    issue: &mut dyn FnMut(usize, ncclComm_t, *mut ncclComm_t) -> ncclResult_t,
) -> Result<Vec<Option<Communicator>>> {
    let Plan {
        call,
        grouped,
        expect,
    } = plan;
    let Some(first) = parents.first() else {
        return Ok(Vec::new());
    };
    let nccl: &Nccl = first.nccl();
    let slots = Slots::new(parents.len());
    if grouped {
        // SAFETY: no preconditions; ended below on every path.
        unsafe { nccl_call!(nccl, ncclGroupStart()) }?;
    }
    let mut error: Option<Error> = None;
    let mut status = ncclResult_t::ncclSuccess;
    for (i, p) in parents.iter().enumerate() {
        let raw = p.as_raw();
        let bound = p.context().bind();
        let rc = match bound {
            Ok(_) => issue(i, raw, slots.out(i)),
            Err(e) => {
                error = Some(e.into());
                break;
            }
        };
        match rc {
            ncclResult_t::ncclSuccess => {}
            ncclResult_t::ncclInProgress => status = rc,
            rc => {
                error = check(nccl, rc, call, Some(raw)).err();
                break;
            }
        }
    }
    if grouped {
        // SAFETY: ends the group started above.
        let (rc, end) = unsafe { nccl_raw_call!(nccl, ncclGroupEnd()) };
        status = rc;
        if rc != ncclResult_t::ncclInProgress
            && let Err(e) = check(nccl, rc, end, None)
        {
            error.get_or_insert(e);
        }
    }
    // Non-blocking parents complete their splits in the background: wait for each, within
    // its deadline; a failed wait aborts that parent, which stops (joins) its split.
    let mut unsettled = false;
    if status == ncclResult_t::ncclInProgress {
        let start = Instant::now();
        for p in parents {
            let c = p.config();
            let r = poll(
                nccl,
                p.as_raw(),
                call,
                start + c.timeout,
                c.timeout,
                p.abort_flag(),
            );
            if let Err(e) = r {
                p.abort_now();
                // Not aborted only while a group of another thread holds it (through a
                // `keep_alive`): then NCCL may still write, and the slots must outlive it.
                unsettled |= !p.is_aborted();
                error.get_or_insert(e);
            }
        }
    }
    // NCCL writes no more: every split completed, or its parent was aborted.
    let raws = slots.take();
    let missing = error.is_none()
        && raws
            .iter()
            .zip(expect)
            .any(|(raw, &expected)| expected && raw.is_null());
    if unsettled || missing {
        // NCCL may still write them: they must outlive it.
        std::mem::forget(slots);
    }
    if missing {
        // A group opened through the raw table on this thread defers the split past our
        // group's end, so it has not completed.
        error = Some(Error::InvalidArgument {
            what: call,
            problem: "NCCL gave no new communicator after the group ended; is an NCCL \
                      group opened through the raw table still open on this thread?"
                .into(),
        });
    }
    if let Some(e) = error {
        abort_all(nccl, raws);
        if !survivable(&e) {
            for p in parents {
                p.abort_now();
            }
        }
        return Err(e);
    }
    adopt_children(parents, raws, call)
}

/// Takes ownership of the children: each is polled to readiness (non-blocking) within its
/// parent's deadline, then adopted with its parent's configuration. On failure the
/// children taken so far are dropped and the rest aborted.
fn adopt_children(
    parents: &[&Communicator],
    raws: Vec<ncclComm_t>,
    call: &'static str,
) -> Result<Vec<Option<Communicator>>> {
    let mut out = Vec::with_capacity(raws.len());
    let mut rest = raws.into_iter();
    for p in parents {
        let Some(raw) = rest.next() else { break };
        if raw.is_null() {
            out.push(None);
            continue;
        }
        let nccl = p.nccl();
        let c = *p.config();
        let ready = if c.blocking {
            Ok(())
        } else {
            let deadline = Instant::now() + c.timeout;
            poll(nccl, raw, call, deadline, c.timeout, p.abort_flag())
        };
        if let Err(e) = ready {
            abort_all(nccl, std::iter::once(raw).chain(rest));
            return Err(e);
        }
        // SAFETY: NCCL made `raw` for this parent's device and handed it over, and it is
        // initialised (the split completed and the child is ready); owned here. On error
        // `adopt` releases it.
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

impl Communicator {
    /// Splits into sub-communicators: ranks with the same `color` form one, ordered by
    /// `key` then by rank; `None` opts out (returns `Ok(None)`). Collective over all ranks.
    /// The child has this communicator's configuration (NCCL gives it the parent's
    /// blocking mode), and a non-blocking split waits for it within the deadline (a failed
    /// wait aborts this communicator, which stops the split).
    #[doc(alias = "ncclCommSplit")]
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let color = color_arg(color)?;
        self.handle()?;
        refuse_in_group("split")?;
        let plan = Plan {
            call: "ncclCommSplit",
            grouped: false,
            expect: &[color != NCCL_SPLIT_NOCOLOR],
        };
        let mut children = make_children(&[self], plan, &mut |_, raw, out| {
            // SAFETY: a live communicator; `out` stays valid and unread until the split
            // completed (make_children); NULL config inherits ours.
            unsafe { (self.nccl().fns().ncclCommSplit)(raw, color, key, out, std::ptr::null_mut()) }
        })?;
        Ok(children.pop().flatten())
    }

    /// A new communicator of the ranks not in `exclude` (NCCL ≥ 2.27), e.g. after a peer
    /// died. Every remaining rank calls it with the same list; ranks keep their order. A
    /// non-blocking shrink waits as [`split`](Self::split) does.
    #[doc(alias = "ncclCommShrink")]
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        self.handle()?;
        refuse_in_group("shrink")?;
        let (f, call) = optional!(self.nccl(), ncclCommShrink)?;
        let list = exclude_list("shrink", exclude, &[self])?;
        let plan = Plan {
            call,
            grouped: false,
            expect: &[true],
        };
        let mut children = make_children(&[self], plan, &mut |_, raw, out| {
            let mut list = list.clone();
            // SAFETY: a live communicator, a list of valid ranks (NCCL may sort it in
            // place), `out` valid and unread until the shrink completed, NULL config
            // (inherit: the child gets our blocking mode) and NCCL_SHRINK_DEFAULT.
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
        children.pop().flatten().ok_or_else(no_child)
    }
}

fn no_child() -> Error {
    Error::InvalidArgument {
        what: "shrink",
        problem: "NCCL returned no communicator for this rank".into(),
    }
}

/// Checks a shrink's exclusion list against the parent (in range, not its own rank, not
/// empty: NCCL needs one) and converts it to NCCL's ints.
fn exclude_list(
    what: &'static str,
    exclude: &[usize],
    parents: &[&Communicator],
) -> Result<Vec<c_int>> {
    if exclude.is_empty() {
        return Err(Error::InvalidArgument {
            what,
            problem: "no rank to exclude (NCCL needs at least one; keep the communicator)".into(),
        });
    }
    for p in parents {
        for &r in exclude {
            if r >= p.size() {
                return Err(Error::InvalidRank {
                    what,
                    rank: r,
                    size: p.size(),
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
