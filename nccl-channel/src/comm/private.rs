//! The private channel: a communicator of the same ranks, split from each communicator
//! inside the call that makes it, before the program holds the handle, that carries the
//! crate's own exchanges and nothing else (the agreements of agreement/, the checked
//! mode's comparisons; exchange/).
//!
//! NCCL pairs a communicator's operations by their order alone, so an exchange made on the
//! program's own communicator can be answered by any collective of the program that comes
//! at that point, by accident or with a copied record. No program can issue an operation
//! on the private channel: its handle never leaves the crate, and every collective of the
//! program (a `split`, `grow` or `shrink` included) is one of the program's communicator,
//! never of this one. It is split with one CTA; NCCL shares the parent's resources with it
//! only when the parent itself was made with `splitShare` (NCCL reads the parent's
//! setting, not the child's), and then, from NCCL 2.29.7, refuses to suspend the parent's
//! memory (`ncclInvalidUsage`). It shares the parent's [`AbortHandle`](crate::AbortHandle): an abort of
//! either is an abort of both. Its handle is torn down with the parent's, first, whenever
//! that happens (after an open group that holds the parent has ended).

use nccl_sys::ncclResult_t;

use super::Communicator;
use crate::children::{Plan, make_children};
use crate::{CommConfig, Error, Result};

/// The private channel's configuration: the parent's blocking mode and deadline, one CTA.
fn channel_config(parent: &Communicator) -> CommConfig {
    let p = parent.config();
    CommConfig::new()
        .blocking(p.is_blocking())
        .timeout(p.get_timeout())
        .check_calls(false)
        .max_ctas(1)
}

impl Communicator {
    /// The private channel, where the crate's own exchanges travel.
    pub(crate) fn private_channel(&self) -> Result<&Communicator> {
        self.private.as_deref().ok_or(Error::InvalidArgument {
            what: "the crate's exchange",
            problem: "this communicator has no private channel".into(),
        })
    }
}

/// A communicator is not made inside an open group: its private channel is split from it
/// before it is handed out, and an open group would defer that split to its end.
pub(crate) fn refuse_in_group(what: &'static str) -> Result<()> {
    if cuda_hal::DeferScope::is_open() {
        return Err(Error::InvalidArgument {
            what,
            problem: "called inside an open group: a communicator is made with its private \
                      channel, split from it at once, which a group would defer to its end"
                .into(),
        });
    }
    Ok(())
}

/// [`make_children`] of the program's communicators: each child made gets its private
/// channel before it is handed out (several made from one thread in one group get theirs
/// so too).
pub(crate) fn with_channels(
    parents: &[&Communicator],
    plan: Plan<'_>,
    issue: &mut dyn FnMut(usize, nccl_sys::ncclComm_t, *mut nccl_sys::ncclComm_t) -> ncclResult_t,
) -> Result<Vec<Option<Communicator>>> {
    let grouped = plan.grouped;
    let children = make_children(parents, plan, issue)?;
    let present: Vec<bool> = children.iter().map(Option::is_some).collect();
    let with = attach(children.into_iter().flatten().collect(), grouped)?;
    let mut with = with.into_iter();
    Ok(present
        .into_iter()
        .map(|p| if p { with.next() } else { None })
        .collect())
}

/// Gives each of `comms`, just made and not yet handed out, its private channel: one split
/// each, in one NCCL group when `grouped` (one thread making several ranks, whose splits
/// wait for each other). On failure every communicator goes (aborted, as a failed init
/// leaves nothing) and the error is returned.
pub(crate) fn attach(mut comms: Vec<Communicator>, grouped: bool) -> Result<Vec<Communicator>> {
    if comms.is_empty() {
        return Ok(comms);
    }
    if let Err(e) = refuse_in_group("the private channel's split") {
        comms.iter().for_each(Communicator::abort_now);
        return Err(e);
    }
    let children = {
        let parents: Vec<&Communicator> = comms.iter().collect();
        split_channels(&parents, grouped)
    };
    let children = match children {
        Ok(c) => c,
        Err(e) => {
            for c in &comms {
                c.abort_now();
            }
            return Err(e);
        }
    };
    // Every parent got a child, or make_children failed (NCCL gave none: no channel, and
    // the crate's exchanges on this communicator are refused).
    for (comm, child) in comms.iter_mut().zip(children) {
        if let Some(mut child) = child {
            child.share_abort(comm.abort_flag().clone());
            let _ = comm.shared().private.set(child.shared().clone());
            comm.private = Some(Box::new(child));
        }
    }
    Ok(comms)
}

/// One split per parent into a communicator of the same ranks, in the same order.
fn split_channels(parents: &[&Communicator], grouped: bool) -> Result<Vec<Option<Communicator>>> {
    let Some(first) = parents.first() else {
        return Ok(Vec::new());
    };
    let config = channel_config(first);
    let nccl = first.nccl().clone();
    let mut raw = config.to_raw(nccl.version())?;
    let config_ptr = raw.as_mut_ptr();
    let expect = vec![true; parents.len()];
    let plan = Plan {
        call: "ncclCommSplit",
        grouped,
        expect: &expect,
        config: Some(&config),
    };
    let keys: Vec<i32> = parents
        .iter()
        .map(|p| i32::try_from(p.rank()).unwrap_or(i32::MAX))
        .collect();
    let children = make_children(parents, plan, &mut |i, raw, out| {
        let Some(&key) = keys.get(i) else {
            return ncclResult_t::ncclInvalidArgument;
        };
        // SAFETY: a live communicator; `out` stays valid and unread until the split
        // completed (make_children); the config is lowered above and alive until after
        // make_children.
        unsafe { (nccl.fns().ncclCommSplit)(raw, 0, key, out, config_ptr) }
    });
    drop(raw);
    children
}
