//! The agreements between simulated ranks: their numbering, their topics, and a
//! program's copy of the exchange's own record.

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
    let forged = crate::exchange::forged_record(0, &agreement(Topic::WindowSize as u64, 1 << 40));
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
