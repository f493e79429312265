//! `--threads N` (and the default without a launcher): one process drives every GPU, one
//! thread and communicator each, the ranks agreeing on times through shared memory.
//!
//! A rank that fails ends the others: those waiting for it at the agreement on times get
//! an error at once, and those waiting for it inside NCCL (which cannot be interrupted
//! there) are left behind after [`GRACE`], so that the run ends with the failed rank's
//! error instead of a hang.

use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use cuda_hal::{Cuda, Stream};
use nccl_channel::{Communicator, Error, Result, UniqueId};

use crate::options::Opts;
use crate::rank::Rank;
use crate::setup::comm_config;
use crate::sweep::run_rank;

/// How long the other ranks get to end once one rank has failed.
const GRACE: Duration = Duration::from_secs(10);

/// Runs the sweep on devices `0..n` of `cuda`, one thread each, with NCCL `nccl`.
pub(crate) fn run_threads(
    cuda: &Cuda,
    nccl: &Arc<nccl_sys::Nccl>,
    n: usize,
    o: &Opts,
) -> Result<()> {
    let config = comm_config(o);
    let id = UniqueId::generate(nccl)?;
    let slots = Arc::new(Mutex::new(vec![0f64; n]));
    let (cuda, nccl, o) = (cuda.clone(), nccl.clone(), o.clone());
    supervise(n, GRACE, move |rank, gate| {
        let ctx = cuda.device(rank)?.primary_context()?;
        let comm = match &config {
            Some(c) => Communicator::init_rank_with(&nccl, &ctx, &id, n, rank, c)?,
            None => Communicator::init_rank(&nccl, &ctx, &id, n, rank)?,
        };
        let stream = Stream::non_blocking(&ctx)?;
        let max_time = |v: f64| max_over_threads(&slots, gate, rank, v);
        let r = Rank {
            comm: &comm,
            stream: &stream,
            max_time: &max_time,
        };
        run_rank(&r, &o)
    })
}

/// Runs `rank(r, gate)` for `r` in `0..n`, one thread each, and returns the first
/// failure (else `Ok`). Once a rank fails, the gate fails every wait at it, and the ranks
/// that have not ended within `grace` are left running (detached; they end with the
/// process), the error saying so.
fn supervise<F>(n: usize, grace: Duration, rank: F) -> Result<()>
where
    F: Fn(usize, &Gate) -> Result<()> + Send + Sync + 'static,
{
    let (rank, gate) = (Arc::new(rank), Arc::new(Gate::new(n)));
    let (tx, rx) = mpsc::channel();
    for r in 0..n {
        let (rank, gate, tx) = (rank.clone(), gate.clone(), tx.clone());
        std::thread::spawn(move || {
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rank(r, &gate)))
                .unwrap_or(Err(Error::Aborted));
            if res.is_err() {
                gate.fail();
            }
            // The receiver is gone only once the run has ended without this rank.
            let _ = tx.send((r, res));
        });
    }
    drop(tx);
    let (mut failed, mut ended, mut deadline) = (None, 0, None::<Instant>);
    while ended < n {
        let got = match deadline {
            None => rx.recv().ok(),
            Some(d) => rx
                .recv_timeout(d.saturating_duration_since(Instant::now()))
                .ok(),
        };
        let Some((r, res)) = got else { break };
        ended += 1;
        if let Err(e) = res {
            // A rank the gate released with `Aborted` failed because another did: that
            // other rank's error is the one to report, whichever thread sent first.
            let cause_known = failed
                .as_ref()
                .is_some_and(|(_, f)| !matches!(f, Error::Aborted));
            if failed.is_none() {
                deadline = Some(Instant::now() + grace);
            }
            if !cause_known && (failed.is_none() || !matches!(e, Error::Aborted)) {
                failed = Some((r, e));
            }
        }
    }
    match failed {
        None => Ok(()),
        Some((_, e)) if ended == n => Err(e),
        Some((r, e)) => Err(Error::Timeout {
            what: format!(
                "the other ranks to end after rank {r} failed ({e}); {} still waited (for it, \
                 in NCCL?) and were left behind",
                n - ended
            ),
            after: grace,
        }),
    }
}

/// A barrier of `n` threads that a failed thread opens for good: every wait at it, now
/// or later, is then an error (a rank that is gone never arrives).
struct Gate {
    n: usize,
    state: Mutex<GateState>,
    cond: Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    generation: u64,
    failed: bool,
}

impl Gate {
    fn new(n: usize) -> Self {
        Gate {
            n,
            state: Mutex::default(),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until all `n` threads have come, or until one has failed ([`Error::Aborted`]).
    fn wait(&self) -> Result<()> {
        let mut s = self.lock();
        if s.failed {
            return Err(Error::Aborted);
        }
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cond.notify_all();
            return Ok(());
        }
        let generation = s.generation;
        while s.generation == generation && !s.failed {
            s = self.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match s.generation == generation {
            true => Err(Error::Aborted),
            false => Ok(()),
        }
    }

    /// A thread has failed: every wait, now or later, ends with an error.
    fn fail(&self) {
        self.lock().failed = true;
        self.cond.notify_all();
    }
}

/// The largest of every thread's `v`: each writes its slot, all wait, all read, all wait
/// (so that no thread writes its next value before every thread has read this one).
fn max_over_threads(slots: &Mutex<Vec<f64>>, gate: &Gate, rank: usize, v: f64) -> Result<f64> {
    slots.lock().unwrap_or_else(|e| e.into_inner())[rank] = v;
    gate.wait()?;
    let m = slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .fold(f64::MIN, f64::max);
    gate.wait()?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's result, or a panic after 20 s: a hang fails the test instead of
    /// stopping it.
    fn within_20s(f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the run hung")
    }

    fn failed() -> Error {
        Error::InvalidArgument {
            what: "test",
            problem: "rank 1 fails".into(),
        }
    }

    /// Rank 1 fails before the agreement on times: rank 0, waiting there, gets an error
    /// at once, and the run ends with rank 1's error.
    #[test]
    fn a_failed_rank_ends_the_others_waiting_for_it() {
        let r = within_20s(|| {
            supervise(2, Duration::from_secs(3600), |rank, gate| {
                if rank == 1 {
                    std::thread::sleep(Duration::from_millis(50));
                    return Err(failed());
                }
                let slots = Mutex::new(vec![0.0; 2]);
                max_over_threads(&slots, gate, rank, 1.0).map(drop)
            })
        });
        assert_eq!(r, Err(failed()));
    }

    /// A rank that waits where the gate cannot reach (inside NCCL) is left behind after
    /// the grace, the error naming the failed rank and its error.
    #[test]
    fn ranks_that_do_not_end_are_left_behind_after_the_grace() {
        let r = within_20s(|| {
            supervise(3, Duration::from_millis(100), |rank, _| {
                if rank == 1 {
                    return Err(failed());
                }
                if rank == 2 {
                    // Waits forever, as a rank waiting in NCCL for rank 1 would.
                    let (_tx, rx) = mpsc::channel::<()>();
                    let _ = rx.recv_timeout(Duration::from_secs(3600));
                }
                Ok(())
            })
        });
        assert_eq!(
            r,
            Err(Error::Timeout {
                what: "the other ranks to end after rank 1 failed (test: rank 1 fails); 1 still \
                       waited (for it, in NCCL?) and were left behind"
                    .into(),
                after: Duration::from_millis(100),
            })
        );
    }

    /// All ranks pass the gate together, again and again.
    #[test]
    fn the_gate_lets_all_ranks_through_each_time() {
        let r = within_20s(|| {
            let slots = Arc::new(Mutex::new(vec![0.0; 3]));
            supervise(3, Duration::from_secs(1), move |rank, gate| {
                for round in 0..5 {
                    let m = max_over_threads(&slots, gate, rank, (rank + round) as f64)?;
                    assert_eq!(m, (2 + round) as f64);
                }
                Ok(())
            })
        });
        assert_eq!(r, Ok(()));
    }
}
