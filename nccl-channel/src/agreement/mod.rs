//! Values the ranks agree on by the crate's own exchange (the smallest size of a window;
//! a symmetric allocation's size and outcome), which a program's collective can never
//! answer: it travels on the private channel (comm/private.rs, exchange/), which no
//! program can reach.
//!
//! Each rank sends its value with the topic; a rank whose peer's record is of another
//! topic, or is a checked call, gets [`Error::Disagreement`] (or, in the checked mode,
//! [`Error::CallMismatch`] naming both), and never a value.

use crate::call_check::{agreement, describe, first_difference, value};
use crate::exchange::exchange;
pub(crate) use crate::topic::{Topic, topic_name};
use crate::{Communicator, Error, Result};

/// In the checked mode, the ranks of each of `ranks` compare before a window's
/// registration (an NCCL collective of the program's communicator): a peer that issues
/// another call meets [`Error::CallMismatch`] here, on every rank, instead of pairing with
/// the registration inside NCCL. Nothing without the checked mode.
pub(crate) fn before_registration(what: &'static str, ranks: &[&Communicator]) -> Result<()> {
    if !ranks.iter().any(|c| c.checks_calls()) {
        return Ok(());
    }
    let values: Vec<(&Communicator, u64)> = ranks.iter().map(|c| (*c, 0)).collect();
    values_of(what, Topic::Registration, &values).map(drop)
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
/// or every rank gets an error (a rank that never comes: its deadline), never a value.
pub(crate) fn values_of(
    what: &'static str,
    topic: Topic,
    ranks: &[(&Communicator, u64)],
) -> Result<Vec<Vec<u64>>> {
    let sent: Vec<_> = ranks
        .iter()
        .map(|(c, v)| (*c, agreement(topic as u64, *v), c.exchanges_issued()))
        .collect();
    let payloads: Vec<_> = sent.iter().map(|(c, p, _)| (*c, *p)).collect();
    let got = exchange(what, &payloads)?;
    let mut out = Vec::with_capacity(got.len());
    let mut error = None;
    for ((c, mine, seq), got) in sent.iter().zip(got) {
        match first_difference(mine, &got) {
            None => out.push(got.iter().map(value).collect()),
            Some(d) => {
                let e = if c.checks_calls() {
                    c.mismatch(what, mine, *seq, d)
                } else {
                    Error::Disagreement {
                        what,
                        topic: topic.name(),
                        problem: format!(
                            "rank {} is not in this agreement: it makes {}",
                            d.0,
                            describe(&d.1, *seq, topic_name)
                        ),
                    }
                };
                error.get_or_insert(e);
            }
        }
    }
    match error {
        None => Ok(out),
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
