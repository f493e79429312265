//! The crate's own exchanges between the ranks, all on the private channel
//! (comm/private.rs): each rank all-gathers one record and reads every rank's.
//!
//! Both users send records of one shape: the agreements (agreement.rs) and the checked
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

use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use cuda_hal::{DeviceBuffer, PinnedBuffer, Stream};

use crate::{Communicator, Error, Result};

/// What a rank says in an exchange.
pub(crate) const PAYLOAD: usize = 7;

/// What a rank says in an exchange: its caller's words.
pub(crate) type Payload = [u64; PAYLOAD];

/// The record's mark: "nccl-channel exchange" in ASCII, 16 bytes.
const MARK: [u64; 2] = [
    u64::from_be_bytes(*b"nccl-cha"),
    u64::from_be_bytes(*b"nnel-xch"),
];

/// A record's words: the mark (two), the exchange's number, the payload.
pub(crate) const WORDS: usize = 3 + PAYLOAD;

/// How long a wait for an exchange spins before it sleeps between polls.
const SPIN: Duration = Duration::from_micros(200);

/// What a communicator keeps for its exchanges: made at the first, reused after. The
/// page-locked buffers are read and written by the stream's copies: they are freed only
/// once the stream is idle (a failed wait leaks the kit whole; a drop that finds the
/// stream busy leaks them).
pub(crate) struct Kit {
    stream: Stream,
    send: DeviceBuffer<u64>,
    recv: DeviceBuffer<u64>,
    up: ManuallyDrop<PinnedBuffer<u64>>,
    down: ManuallyDrop<PinnedBuffer<u64>>,
}

impl Drop for Kit {
    fn drop(&mut self) {
        if self.stream.is_idle().unwrap_or(false) {
            // SAFETY: dropped once, here; no copy of the stream uses them any more.
            unsafe {
                ManuallyDrop::drop(&mut self.up);
                ManuallyDrop::drop(&mut self.down);
            }
        }
    }
}

impl Kit {
    fn new(comm: &Communicator) -> Result<Kit> {
        let ctx = comm.context();
        Ok(Kit {
            stream: Stream::non_blocking(ctx)?,
            send: DeviceBuffer::zeroed(ctx, WORDS)?,
            recv: DeviceBuffer::zeroed(ctx, WORDS * comm.size())?,
            up: ManuallyDrop::new(PinnedBuffer::zeroed(ctx, WORDS)?),
            down: ManuallyDrop::new(PinnedBuffer::zeroed(ctx, WORDS * comm.size())?),
        })
    }

    /// Enqueues the record's upload.
    fn upload(&mut self, record: &[u64; WORDS]) -> Result<()> {
        self.up.copy_from_slice(record);
        // SAFETY: `up` is page-locked memory of the kit, which is dropped only once the
        // stream is done (a failed wait leaks the kit), and not written again before the
        // next exchange, which waits for this one first.
        unsafe { self.send.copy_from_host_async(&self.up, &self.stream) }?;
        Ok(())
    }

    /// Enqueues the download of every rank's record.
    fn download(&mut self) -> Result<()> {
        // SAFETY: as for `upload`; `down` is read only after the stream is done.
        unsafe { self.recv.copy_to_host_async(&mut self.down, &self.stream) }?;
        Ok(())
    }
}

/// One rank's record.
fn record(seq: u64, payload: &Payload) -> [u64; WORDS] {
    let mut r = [0; WORDS];
    r[..2].copy_from_slice(&MARK);
    r[2] = seq;
    r[3..].copy_from_slice(payload);
    r
}

/// Every rank's payload from the records in `got`, when each is a record of exchange
/// `seq`; else which rank's is not.
fn payloads(seq: u64, got: &[u64], ranks: usize) -> std::result::Result<Vec<Payload>, String> {
    if got.len() != WORDS * ranks {
        return Err(format!(
            "{} words came back, not {}",
            got.len(),
            WORDS * ranks
        ));
    }
    got.chunks_exact(WORDS)
        .enumerate()
        .map(|(rank, r)| {
            if r[..2] != MARK || r[2] != seq {
                return Err(format!(
                    "rank {rank}'s record is not of exchange {seq}: the ranks' exchanges are \
                     out of step"
                ));
            }
            let mut p = [0; PAYLOAD];
            p.copy_from_slice(&r[3..]);
            Ok(p)
        })
        .collect()
}

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
    for (c, _) in ranks {
        c.private_channel()?;
        let slot = c.kit.try_borrow_mut().map_err(|_| Error::InvalidArgument {
            what,
            problem: "called while this communicator makes another exchange".into(),
        })?;
        slots.push(slot);
    }
    for ((c, _), slot) in ranks.iter().zip(&mut slots) {
        if slot.is_none() {
            **slot = Some(Kit::new(c)?);
        }
    }
    // Numbered when issued: a rank that fails before issuing keeps its number, as its
    // peers keep theirs.
    let mut seqs = Vec::with_capacity(ranks.len());
    for ((c, payload), slot) in ranks.iter().zip(&mut slots) {
        let kit = slot.as_mut().ok_or(Error::Aborted)?;
        let seq = c.exchanges_issued();
        kit.upload(&record(seq, payload))?;
        seqs.push(seq);
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
        let got = slot.as_ref().map_or(&[][..], |k| &k.down[..]);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn records_of_one_exchange_give_every_ranks_payload() {
        let a = record(3, &[1, 2, 3, 4, 5, 6, 7]);
        let b = record(3, &[7; PAYLOAD]);
        let got = [a, b].concat();
        assert_eq!(
            payloads(3, &got, 2).unwrap(),
            [[1, 2, 3, 4, 5, 6, 7], [7; PAYLOAD]]
        );
    }

    #[test]
    fn a_record_of_another_exchange_or_of_nothing_is_refused() {
        let a = record(3, &[0; PAYLOAD]);
        for (w, v) in [(0, 0), (1, 1), (2, 2), (2, 4)] {
            let mut b = a;
            b[w] = v;
            let e = payloads(3, &[a, b].concat(), 2).unwrap_err();
            assert!(e.starts_with("rank 1's record is not of exchange 3"), "{e}");
        }
        assert!(payloads(3, &a, 2).is_err());
        assert!(payloads(3, &[a, a].concat(), 1).is_err());
    }
}
