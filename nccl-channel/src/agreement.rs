//! Values the ranks agree on by the crate's own exchange (the smallest size of a window;
//! a symmetric allocation's size and outcome), which a user's collective must never be
//! able to answer.
//!
//! NCCL pairs a communicator's collectives by their order alone. A rank whose program
//! issues its own collective where another rank is in the crate's exchange pairs the two:
//! each side then reads the other's data. So the exchange is an all-gather of a record
//! (a mark, the topic, the number of this exchange among the crate's exchanges on this
//! communicator, the value) that every rank checks, every rank's record word for word:
//! anything else in its place (a user's data, another topic, another exchange of the
//! sequence) is [`Error::Disagreement`] on the rank that received it, and never yields a
//! value. The rank whose user collective took the exchange's place gets its error at its
//! own exchange, which pairs with the other rank's user collective in turn.

use cuda_hal::{DeviceBuffer, Stream};

use crate::{Communicator, Error, Result};

/// The record's mark: "nccl-channel agreement" in ASCII, 16 bytes.
const MARK: [u64; 2] = [
    u64::from_be_bytes(*b"nccl-cha"),
    u64::from_be_bytes(*b"nnel-agr"),
];

/// What an exchange agrees on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topic {
    /// The smallest size, in bytes, of the window each rank registers.
    WindowSize = 1,
    /// The bytes each rank allocated for a symmetric buffer (or that it could not).
    SymmetricSize = 2,
    /// Whether each rank's NCCL made the symmetric buffer's window.
    SymmetricWindow = 3,
}

impl Topic {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Topic::WindowSize => "a window's size",
            Topic::SymmetricSize => "a symmetric buffer's size",
            Topic::SymmetricWindow => "a symmetric buffer's window",
        }
    }
}

/// A record's words: the mark (two), the topic, the sequence number, the value.
const WORDS: usize = 5;

/// One rank's record.
fn record(topic: Topic, seq: u64, value: u64) -> [u64; WORDS] {
    [MARK[0], MARK[1], topic as u64, seq, value]
}

/// Every rank's value, in rank order, from the records every rank sent (`got`, as the
/// all-gather of `sent` returned them), or what differs from `sent` in one of them.
fn values(sent: &[u64; WORDS], got: &[u64], ranks: usize) -> std::result::Result<Vec<u64>, String> {
    if got.len() != WORDS * ranks {
        return Err(format!(
            "{} words came back, not {}",
            got.len(),
            WORDS * ranks
        ));
    }
    let mut out = Vec::with_capacity(ranks);
    for (rank, r) in got.chunks_exact(WORDS).enumerate() {
        let differs = if r[..2] != sent[..2] {
            "mark"
        } else if r[2] != sent[2] {
            "topic"
        } else if r[3] != sent[3] {
            "sequence number"
        } else {
            out.push(r[4]);
            continue;
        };
        return Err(format!("rank {rank}'s record has another {differs}"));
    }
    Ok(out)
}

/// The smallest value of the records every rank sent (see [`values`]).
#[cfg(test)]
fn smallest(sent: &[u64; WORDS], got: &[u64], ranks: usize) -> std::result::Result<u64, String> {
    values(sent, got, ranks).map(|v| v.into_iter().min().unwrap_or(u64::MAX))
}

/// The smallest of every rank's `value` on each of `ranks` (see [`values_of`]).
pub(crate) fn smallest_of(
    what: &'static str,
    topic: Topic,
    ranks: &[(&Communicator, u64)],
) -> Result<Vec<u64>> {
    Ok(values_of(what, topic, ranks)?
        .into_iter()
        .map(|v| v.into_iter().min().unwrap_or(u64::MAX))
        .collect())
}

/// Every rank's `value`, in rank order, as each of `ranks` received them (one
/// communicator per rank this thread drives, in one group when several), for `topic`.
/// Every rank of each communicator calls it at the same point of the crate's exchanges,
/// or every rank gets [`Error::Disagreement`] (or NCCL's error for a mismatched call),
/// never a value.
pub(crate) fn values_of(
    what: &'static str,
    topic: Topic,
    ranks: &[(&Communicator, u64)],
) -> Result<Vec<Vec<u64>>> {
    let mut parts = Vec::with_capacity(ranks.len());
    for (c, value) in ranks {
        // Numbered when issued (below): a rank that fails before issuing its exchange
        // keeps its number, as its peers do theirs.
        let sent = record(topic, c.agreements_issued(), *value);
        let stream = Stream::non_blocking(c.context())?;
        let send = DeviceBuffer::from_slice(c.context(), &sent)?;
        let recv = DeviceBuffer::<u64>::zeroed(c.context(), WORDS * c.size())?;
        parts.push((*c, sent, stream, (send, recv)));
    }
    type Part<'c> = (
        &'c Communicator,
        [u64; WORDS],
        Stream,
        (DeviceBuffer<u64>, DeviceBuffer<u64>),
    );
    let gather = |parts: &mut Vec<Part<'_>>| {
        for (c, _, stream, (send, recv)) in parts.iter_mut() {
            // Not compared in the checked mode: every rank makes this exchange itself.
            c.all_gather_unchecked(send, recv, stream)?;
            c.agreement_issued();
        }
        Ok(())
    };
    match parts.first() {
        Some((c, ..)) if parts.len() > 1 => {
            let nccl = c.nccl().clone();
            crate::group::group(&nccl, || gather(&mut parts))?;
        }
        _ => gather(&mut parts)?,
    }
    let mut out = Vec::with_capacity(parts.len());
    let mut disagreed = None;
    for (c, sent, stream, (_, recv)) in &parts {
        // Within the communicator's deadline, blocking or not: a peer that never makes
        // its exchange (it was refused before, or died) aborts this rank with a typed
        // error instead of leaving it waiting for good.
        c.wait_for_exchange(stream)?;
        match values(sent, &recv.to_vec()?, c.size()) {
            Ok(v) => out.push(v),
            Err(problem) => {
                disagreed.get_or_insert(problem);
            }
        }
    }
    match disagreed {
        None => Ok(out),
        Some(problem) => Err(Error::Disagreement {
            what,
            topic: topic.name(),
            problem,
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Consecutive exchanges on a communicator carry consecutive numbers on every rank (an
    /// exchange paired with another point of the sequence is then refused).
    #[test]
    fn each_exchange_issued_takes_the_next_number_on_every_rank() {
        use cuda_hal::Cuda;
        let (cuda, gpus) = cuda_mock::MockDriver::with_devices(2)
            .build_with(Cuda::from_driver)
            .unwrap();
        let nccl = std::sync::Arc::new(nccl_mock::MockNccl::new(&gpus).build().unwrap().0);
        let ctxs: Vec<_> = (0..2)
            .map(|d| cuda.device(d).unwrap().primary_context().unwrap())
            .collect();
        let comms = Communicator::init_all(&nccl, &ctxs).unwrap();
        for n in 1..=3 {
            let ranks = [(&comms[0], 8), (&comms[1], 4)];
            assert_eq!(
                smallest_of("test", Topic::WindowSize, &ranks).unwrap(),
                [4, 4]
            );
            assert!(comms.iter().all(|c| c.agreements_issued() == n));
        }
    }

    fn gathered(records: &[[u64; WORDS]]) -> Vec<u64> {
        records.concat()
    }

    #[test]
    fn the_records_of_one_exchange_give_the_smallest_value() {
        let mine = record(Topic::WindowSize, 3, 4096);
        let other = record(Topic::WindowSize, 3, 1024);
        assert_eq!(smallest(&mine, &gathered(&[mine, other]), 2), Ok(1024));
        assert_eq!(smallest(&mine, &gathered(&[mine]), 1), Ok(4096));
    }

    #[test]
    fn anything_else_in_a_records_place_is_refused() {
        let mine = record(Topic::WindowSize, 3, 4096);
        for seq in [2, 4] {
            let other = record(Topic::WindowSize, seq, 1024);
            let e = smallest(&mine, &gathered(&[mine, other]), 2).unwrap_err();
            assert_eq!(e, "rank 1's record has another sequence number");
        }
        // A user's data: any word of the record's fields changed, to more or to less.
        for w in 0..WORDS - 1 {
            for v in [0, u64::MAX, mine[w] ^ 1, mine[w].wrapping_add(1)] {
                let mut other = mine;
                other[w] = v;
                let e = smallest(&mine, &gathered(&[other, mine]), 2).unwrap_err();
                assert!(
                    e.starts_with("rank 0's record has another"),
                    "word {w}: {e}"
                );
            }
        }
        for user in [[u64::MAX; WORDS], [0; WORDS]] {
            assert!(smallest(&mine, &gathered(&[mine, user]), 2).is_err());
        }
        // Too few or too many words for the ranks.
        let both = gathered(&[mine, mine]);
        assert!(smallest(&mine, &both[..WORDS], 2).is_err());
        assert!(smallest(&mine, &both, 1).is_err());
    }
}
