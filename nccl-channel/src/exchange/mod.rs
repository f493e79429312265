//! The crate's own exchanges between the ranks, all on the private channel
//! (comm/private.rs): each rank all-gathers one record and reads every rank's.
//!
//! Both users send records of one shape: the agreements (agreement/) and the checked
//! mode's comparisons (call_check/). Any two exchanges that meet on the channel (a rank
//! allocating symmetric memory while its peer checks an all-reduce) are then the same NCCL
//! call, and what they say tells them apart, never NCCL mismatching their sizes. A
//! record is a mark, the number of the exchange among the communicator's exchanges, and
//! a [`Payload`] of the user's choosing.
//!
//! The record goes up from page-locked memory, the all-gather runs, every record comes
//! back down into page-locked memory, all on the exchange's own stream; the host then
//! waits once, spinning for the first moments (an exchange on one GPU takes a few
//! microseconds, a sleep at least fifty) and polling the communicator's state within its
//! deadline after.

pub(crate) mod kit;
mod record;

use std::time::{Duration, Instant};

use cuda_hal::Stream;

pub(crate) use kit::Kit;
pub(crate) use record::{PAYLOAD, Payload};

/// The record an exchange numbered `seq` sends for `payload`, as a program could copy it
/// (for the tests that show it never reaches an exchange).
#[cfg(test)]
pub(crate) fn forged_record(seq: u64, payload: &Payload) -> [u64; record::WORDS] {
    record(seq, payload)
}
use record::{payloads, record};

use crate::{Communicator, Error, Result};

/// How long a wait for an exchange spins before it sleeps between polls.
const SPIN: Duration = Duration::from_micros(200);

/// Every rank's payload, in rank order, as each of `ranks` received them (one communicator
/// per rank this thread drives, in one group when several), on their private channels.
/// Every rank of each communicator calls it at the same point of the crate's exchanges:
/// a rank that does not leaves the others waiting until their deadline, which aborts them.
/// A failed exchange aborts the communicator (it is out of step with its peers).
pub(crate) fn exchange(
    what: &'static str,
    ranks: &[(&Communicator, Payload)],
) -> Result<Vec<Vec<Payload>>> {
    let mut slots = Vec::with_capacity(ranks.len());
    let mut seqs = Vec::with_capacity(ranks.len());
    for (c, payload) in ranks {
        // The program's communicator: live, and not suspended (the exchange is for a call
        // of it, which a suspended communicator refuses).
        c.handle()?;
        c.shared().suspend.refuse(what)?;
        c.private_channel()?;
        let mut slot = c.kit.try_borrow_mut().map_err(|_| Error::InvalidArgument {
            what,
            problem: "called while this communicator makes another exchange".into(),
        })?;
        let kit = match &mut *slot {
            Some(kit) => kit,
            none => none.insert(Kit::new(c.context(), c.size())?),
        };
        // Numbered when issued: a rank that fails before issuing keeps its number, as its
        // peers keep theirs.
        let seq = c.exchanges_issued();
        kit.upload(&record(seq, payload))?;
        seqs.push(seq);
        slots.push(slot);
    }
    let gather = |slots: &mut Vec<std::cell::RefMut<'_, Option<Kit>>>| -> Result<()> {
        for ((c, _), slot) in ranks.iter().zip(slots.iter_mut()) {
            let kit = slot.as_mut().ok_or(Error::Aborted)?;
            c.private_channel()?
                .all_gather_unchecked(&kit.send, &mut kit.recv, &kit.stream)?;
            c.exchange_issued();
        }
        Ok(())
    };
    match ranks.first() {
        Some((c, _)) if ranks.len() > 1 => {
            let nccl = c.nccl().clone();
            crate::group::group(&nccl, || gather(&mut slots))?;
        }
        _ => gather(&mut slots)?,
    }
    let mut out = Vec::with_capacity(ranks.len());
    let mut problem = None;
    for (((c, _), slot), seq) in ranks.iter().zip(&mut slots).zip(seqs) {
        let waited = match slot.as_mut() {
            Some(kit) => kit.download().and_then(|()| wait(c, &kit.stream)),
            None => Err(Error::Aborted),
        };
        if let Err(e) = waited {
            // The stream may still copy into the kit's page-locked memory: it stays.
            if let Some(kit) = slot.take() {
                std::mem::forget(kit);
            }
            c.abort_now();
            return Err(e);
        }
        let got = slot.as_ref().map_or(&[][..], Kit::down);
        match payloads(seq, got, c.size()) {
            Ok(p) => out.push(p),
            Err(p) => {
                c.abort_now();
                problem.get_or_insert(p);
            }
        }
    }
    match problem {
        None => Ok(out),
        Some(problem) => Err(Error::Disagreement {
            what,
            topic: "the crate's exchanges",
            problem,
        }),
    }
}

/// Waits for the exchange on `stream`: spinning at first, then as
/// [`Communicator::wait`] does, within the communicator's deadline.
fn wait(comm: &Communicator, stream: &Stream) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < SPIN {
        if stream.is_idle()? {
            return Ok(());
        }
        std::hint::spin_loop();
    }
    comm.private_channel()?.wait_for_exchange(stream)
}
