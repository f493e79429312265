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
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Two simulated ranks driven from this thread.
    fn two_ranks() -> Vec<Communicator> {
        use cuda_hal::Cuda;
        let (cuda, gpus) = cuda_mock::MockDriver::with_devices(2)
            .build_with(Cuda::from_driver)
            .unwrap();
        let nccl = std::sync::Arc::new(nccl_mock::MockNccl::new(&gpus).build().unwrap().0);
        let ctxs: Vec<_> = (0..2)
            .map(|d| cuda.device(d).unwrap().primary_context().unwrap())
            .collect();
        Communicator::init_all(&nccl, &ctxs).unwrap()
    }

    /// Consecutive exchanges on a communicator carry consecutive numbers on every rank (an
    /// exchange paired with another point of the sequence is then refused), and give the
    /// smallest value.
    #[test]
    fn each_exchange_issued_takes_the_next_number_on_every_rank() {
        let comms = two_ranks();
        for n in 1..=3 {
            let ranks = [(&comms[0], 8), (&comms[1], 4)];
            assert_eq!(
                smallest_of("test", Topic::WindowSize, &ranks).unwrap(),
                [4, 4]
            );
            assert!(comms.iter().all(|c| c.exchanges_issued() == n));
        }
    }

    /// A program's all-gather of a record of the exchange's current shape (its mark, the
    /// first exchange's number, a window-size agreement claiming 1 TiB), made from the
    /// exchange's own constants, so that it stays the shape the exchange sends: rank 1
    /// gathers it on the program's communicator, then registers its 1024-byte window;
    /// rank 0 registers its 4096-byte window, then gathers on its own and puts 4096 bytes
    /// into rank 1's window. The agreement travels on the private channel, so the copy
    /// never answers it: rank 0 never believes rank 1's window larger, and the simulated
    /// GPU sees nothing written past a window. (Carried by the program's communicator, the
    /// agreement took the copy for rank 1's record and rank 0's put overran the window.)
    #[test]
    fn a_programs_gather_of_the_exchanges_own_record_never_answers_an_agreement() {
        use crate::{Signal, UniqueId, WindowFlags};
        use cuda_hal::{Cuda, DeviceBuffer, Stream};
        let (cuda, gpus) = cuda_mock::MockDriver::with_devices(2)
            .build_with(Cuda::from_driver)
            .unwrap();
        let nccl = std::sync::Arc::new(
            nccl_mock::MockNccl::new(&gpus)
                .timeout(std::time::Duration::from_secs(2))
                .build()
                .unwrap()
                .0,
        );
        let id = UniqueId::generate(&nccl).unwrap();
        let forged =
            crate::exchange::forged_record(0, &agreement(Topic::WindowSize as u64, 1 << 40));
        let out: Vec<Result<Option<Result<()>>>> = std::thread::scope(|sc| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| {
                    let (cuda, nccl, id) = (&cuda, &nccl, &id);
                    sc.spawn(move || -> Result<Option<Result<()>>> {
                        let ctx = cuda.device(rank)?.primary_context()?;
                        let c = Communicator::init_rank(nccl, &ctx, id, 2, rank)?;
                        let s = Stream::non_blocking(&ctx)?;
                        let mine = if rank == 1 {
                            forged.to_vec()
                        } else {
                            vec![7; forged.len()]
                        };
                        let v = DeviceBuffer::from_slice(&ctx, &mine)?;
                        let mut all = DeviceBuffer::<u64>::zeroed(&ctx, 2 * mine.len())?;
                        let buf = c.alloc_nccl::<u32>(1024 >> (2 * rank))?;
                        if rank == 1 {
                            c.all_gather(&v, &mut all, &s)?;
                        }
                        let window = c.register_window(&buf, WindowFlags::COLL_SYMMETRIC)?;
                        if rank == 0 {
                            c.all_gather(&v, &mut all, &s)?;
                            let put = window.put_signal(&buf, 1, 0, Signal::DEFAULT, &s);
                            s.synchronize()?;
                            return Ok(Some(put));
                        }
                        s.synchronize()?;
                        Ok(None)
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            !matches!(&out[0], Ok(Some(Ok(())))),
            "rank 0 put 4096 bytes into rank 1's 1024-byte window: {out:?}"
        );
        assert!(out.iter().all(Result::is_err), "{out:?}");
        assert_eq!(gpus.violations(), Vec::<String>::new());
    }

    /// Two ranks in agreements on different topics: each is told what the other makes.
    #[test]
    fn agreements_on_different_topics_are_refused_on_every_rank() {
        let comms = two_ranks();
        let payloads = [
            (&comms[0], agreement(Topic::WindowSize as u64, 8)),
            (&comms[1], agreement(Topic::SymmetricSize as u64, 8)),
        ];
        let got = exchange("test", &payloads).unwrap();
        assert_eq!(
            first_difference(&payloads[0].1, &got[0]),
            Some((1, payloads[1].1))
        );
        assert_eq!(topic_name(2), Some("a symmetric buffer's size"));
        assert_eq!(topic_name(0), None);
    }
}
