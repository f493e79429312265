//! Elastic training (`--elastic`): the same regression, on ranks that may die and be
//! replaced while it runs.
//!
//! The global data set is fixed: one shard per rank of the launch (`--nprocs` N shards of
//! `--samples` rows). Rank `r` of a communicator of `k` ranks trains on the shards `s`
//! with `s % k == r`, and the gradient is a sum over all rows scaled by one over the
//! data set's size, so the training is the same full-batch descent whatever `k` is.
//!
//! With `--kill-rank R --kill-at K`, rank R kills itself (SIGKILL) as step K starts. The
//! survivors' communicators are non-blocking with a deadline (`--deadline`), so the
//! step's all-reduce fails within it (an error from NCCL, or the deadline) and the crate
//! aborts that communicator. They then shrink a second communicator of the same ranks
//! that carried no work (the crate aborts a communicator whose operation failed, so the
//! one that failed cannot be shrunk) into a new pair of N-1 ranks, re-assign the shards
//! by their new ranks and carry on. The launcher starts a replacement process on the dead
//! rank's device as soon as it is gone; after `--rejoin-after` steps the survivors grow
//! both communicators back to N: rank 0 makes each grow's id and hands it to the
//! replacement through the launch's rendezvous (a key per communicator), the replacement
//! joins as rank N-1 and gets the weights and the step by broadcast from rank 0, the
//! shards are re-assigned again, and training goes on. Rank 0 compares the final loss
//! with the uninterrupted run's (the same training on the host in f64).
//!
//! Which rank died is known from `--kill-rank` (every rank has the same arguments): the
//! survivors detect the failure themselves, but agreeing on who failed is left to the
//! launcher here, as an elastic agent's job.

use std::time::{Duration, Instant};

use clap::Args;
use cuda_hal::{Context, DeviceBuffer, Function, LaunchConfig, Module, Stream};
use nccl_channel::{CommConfig, Communicator, ReduceOp, Rendezvous, World};
use nccl_launch as launch;
use nccl_sys::{Nccl, NcclVersion};

use crate::data::{host_vec, shard};
use crate::reference::host_losses;
use crate::twins::with_kernels;
use crate::{BLOCK, KERNELS, Opts, positive_seconds};

/// The options of elastic training.
#[derive(Args, Debug, Clone)]
pub(crate) struct ElasticOpts {
    /// Elastic training: non-blocking communicators with a deadline; a rank that dies is
    /// shrunk away, and its replacement grown back in (with --kill-rank).
    #[arg(long)]
    pub(crate) elastic: bool,
    /// With --elastic: the rank that kills itself (SIGKILL), 1 to --nprocs - 1 (rank 0
    /// serves the rendezvous and coordinates the grows).
    #[arg(long, requires = "elastic", requires = "kill_at", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) kill_rank: Option<u32>,
    /// With --kill-rank: the step at whose start it does.
    #[arg(long, requires = "kill_rank", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) kill_at: Option<u32>,
    /// With --kill-rank: the steps the survivors train alone before the replacement is
    /// grown back in.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) rejoin_after: u32,
    /// With --elastic: seconds any one wait for the peers may last (the communicators'
    /// deadline, NCCL's non-blocking mode): a dead peer is detected within it.
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    pub(crate) deadline: f64,
    /// With --elastic: the largest relative difference of the final loss from the
    /// uninterrupted run's (the host's, in f64).
    #[arg(long, default_value_t = 1e-2, value_parser = tolerance)]
    pub(crate) tolerance: f64,
    /// The replacement of a killed rank (the launcher starts it so).
    #[arg(long, hide = true, requires = "kill_rank")]
    pub(crate) join: bool,
    /// Without a CUDA driver: the version the simulated NCCL reports (X.Y.Z), to see an
    /// NCCL without grow refused.
    #[arg(long, hide = true, requires = "elastic", value_name = "X.Y.Z", value_parser = version_arg)]
    pub(crate) sim_nccl: Option<NcclVersion>,
}

fn version_arg(s: &str) -> Result<NcclVersion, String> {
    let bad = || format!("bad version {s:?} (2.MINOR.PATCH, each below 100)");
    let p: Vec<u8> = s
        .split('.')
        .map(|x| launch::parse_decimal(x).ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    match p[..] {
        [2, b, c] if b < 100 && c < 100 => Ok(NcclVersion::new(2, b.into(), c.into())),
        _ => Err(bad()),
    }
}

fn tolerance(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive relative difference")),
    }
}

impl ElasticOpts {
    /// The arguments a launched rank gets.
    pub(crate) fn rank_args(&self) -> Vec<String> {
        if !self.elastic {
            return Vec::new();
        }
        let mut a = vec![
            "--elastic".to_string(),
            format!("--deadline={}", self.deadline),
            format!("--tolerance={}", self.tolerance),
            format!("--rejoin-after={}", self.rejoin_after),
        ];
        if let (Some(r), Some(k)) = (self.kill_rank, self.kill_at) {
            a.push(format!("--kill-rank={r}"));
            a.push(format!("--kill-at={k}"));
        }
        if let Some(v) = self.sim_nccl {
            a.push(format!("--sim-nccl={v}"));
        }
        a
    }

    /// Checks the scripted failure against the world's size and the steps.
    pub(crate) fn check(&self, size: usize, steps: usize) -> Result<(), ElasticError> {
        self.kill(size, steps).map(|_| ())
    }

    /// The scripted failure, checked against the world and the steps.
    fn kill(&self, size: usize, steps: usize) -> Result<Option<Kill>, ElasticError> {
        let (Some(rank), Some(at)) = (self.kill_rank, self.kill_at) else {
            return Ok(None);
        };
        let (rank, at, rejoin) = (rank as usize, at as usize, self.rejoin_after as usize);
        if rank >= size {
            return Err(ElasticError::KillRank { rank, size });
        }
        if at + rejoin >= steps {
            return Err(ElasticError::Schedule { at, rejoin, steps });
        }
        Ok(Some(Kill {
            rank,
            at,
            regrow_at: at + rejoin,
        }))
    }
}

/// What went wrong, typed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ElasticError {
    #[error(
        "--kill-rank {rank} is not a rank of {size} other than 0 (rank 0 serves the \
         rendezvous and coordinates the grows)"
    )]
    KillRank { rank: usize, size: usize },
    #[error(
        "--kill-at {at} plus --rejoin-after {rejoin} must be below --steps {steps}, so that \
         the replacement joins before the end"
    )]
    Schedule {
        at: usize,
        rejoin: usize,
        steps: usize,
    },
    #[error(
        "--elastic needs a rendezvous to hand the grow ids to the replacement (run it with \
         --nprocs, or a launcher whose variables name one); NCCL_COMM_ID cannot serve: NCCL \
         refuses grow ids while it is set"
    )]
    NoRendezvous,
    #[error(
        "--kill-rank recovers with ncclCommShrink and ncclCommGrow, which need NCCL 2.29.2 or \
         newer; this is NCCL {found} (set NCCL_SYS_LIBRARY to a newer libnccl.so.2)"
    )]
    NoRecovery { found: String },
    #[error("{rows} rows per rank do not fit the kernels' int")]
    TooManyRows { rows: usize },
    #[error("rank {rank}: the weights differ between ranks")]
    WeightsDiffer { rank: usize },
    #[error(
        "the final loss {got:.6e} differs from the uninterrupted run's {want:.6e} by \
         {diff:.2e} (relative), more than --tolerance {tolerance:e}"
    )]
    Diverged {
        got: f64,
        want: f64,
        diff: f64,
        tolerance: f64,
    },
    #[error("{0}")]
    Launch(String),
    #[error("the host reference: {0}")]
    Reference(String),
    #[error(transparent)]
    Nccl(#[from] nccl_channel::Error),
    #[error(transparent)]
    Cuda(#[from] cuda_hal::Error),
}

/// The scripted failure.
#[derive(Clone, Copy, Debug)]
struct Kill {
    rank: usize,
    at: usize,
    /// The step at which the survivors grow back.
    regrow_at: usize,
}

/// Elastic training for one process of the launch (or the replacement, `--join`).
pub(crate) fn run(world: World, o: &Opts) -> Result<(), String> {
    run_inner(world, o).map_err(|e| launch::report(&e))
}

fn run_inner(world: World, o: &Opts) -> Result<(), ElasticError> {
    let e = &o.elastic;
    let kill = e.kill(world.size, o.steps)?;
    let setup = launch::RankSetup {
        device: o.device.clone(),
        timeout: Some(Duration::from_secs_f64(o.timeout)),
        sim_driver: Some(with_kernels),
        sim_version: e.sim_nccl,
        ..Default::default()
    };
    let rd = launch::rank_device(&world, &setup).map_err(ElasticError::Launch)?;
    println!("{}", rd.line);
    if kill.is_some() {
        can_recover(&rd.nccl)?;
    }
    let rdv = Rendezvous::from_env(&world)?
        .ok_or(ElasticError::NoRendezvous)?
        .timeout(Duration::from_secs_f64(o.timeout));
    let config = CommConfig::non_blocking(Duration::from_secs_f64(e.deadline));
    let module = Module::from_ptx(&rd.ctx, KERNELS)?;
    let k = Kernels::new(&module)?;
    let s = Stream::non_blocking(&rd.ctx)?;
    let run = Run {
        o,
        n: o.samples as usize,
        d: o.features as usize,
        total: world.size,
        rdv,
        ctx: rd.ctx.clone(),
        k,
        s,
    };
    let (comms, phase, step, w) = match (e.join, kill) {
        (true, Some(_)) => {
            let comms = Comms::join(&rd, &run, &config)?;
            let (w, step) = run.receive_state(&comms.work)?;
            println!(
                "replacement: joined as rank {} of {}; weights and step {step} received from \
                 rank 0",
                comms.work.rank(),
                comms.work.size()
            );
            (comms, Phase::Regrown, step, w)
        }
        _ => {
            let comms = Comms::init(&rd, &run, &world, &config)?;
            let w = DeviceBuffer::<f32>::zeroed(&rd.ctx, run.d + 1)?;
            (comms, Phase::Whole, 0, w)
        }
    };
    let me = (world.rank, kill);
    let comms = run.train(comms, phase, step, w, me)?;
    comms.work.close()?;
    comms.spare.close()?;
    run.s.synchronize()?;
    rd.check().map_err(ElasticError::Launch)
}

/// Whether `nccl` has the calls the recovery makes (shrink, grow): checked by every rank
/// before training, so an older NCCL fails the run at once, not the survivors after a
/// rank was killed (with the replacement waiting for a grow that never comes).
fn can_recover(nccl: &Nccl) -> Result<(), ElasticError> {
    let f = nccl.fns();
    match (f.ncclCommShrink, f.ncclCommGetUniqueId, f.ncclCommGrow) {
        (Some(_), Some(_), Some(_)) => Ok(()),
        _ => Err(ElasticError::NoRecovery {
            found: nccl.version().to_string(),
        }),
    }
}

/// Where the run is in the story.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// All ranks of the launch.
    Whole,
    /// The survivors alone, since the step they lost a peer at.
    Shrunk,
    /// Grown back to the launch's size.
    Regrown,
}

/// The kernels of `kernels.cu`.
struct Kernels<'m> {
    residual: Function<'m>,
    gradient: Function<'m>,
    sgd: Function<'m>,
    mse: Function<'m>,
}

impl<'m> Kernels<'m> {
    fn new(m: &'m Module) -> cuda_hal::Result<Self> {
        Ok(Kernels {
            residual: m.function("residual")?,
            gradient: m.function("gradient")?,
            sgd: m.function("sgd")?,
            mse: m.function("mse")?,
        })
    }
}

/// This rank's rows: the shards it trains on, on its device.
struct Rows {
    x: DeviceBuffer<f32>,
    y: DeviceBuffer<f32>,
    r: DeviceBuffer<f32>,
    /// How many (the kernels' int).
    m: i32,
}

/// A pair of communicators of the same ranks: `work` carries the training, `spare` only
/// ever shrinks or grows (it is never left aborted by a failed operation).
struct Comms {
    work: Communicator,
    spare: Communicator,
}

/// What every step uses.
struct Run<'a, 'm> {
    o: &'a Opts,
    n: usize,
    d: usize,
    /// The launch's size: the shards of the data set.
    total: usize,
    rdv: Rendezvous,
    ctx: Context,
    k: Kernels<'m>,
    s: Stream,
}

impl Comms {
    /// Two communicators of the launch's ranks, their ids through the rendezvous.
    fn init(
        rd: &launch::RankDevice,
        run: &Run<'_, '_>,
        world: &World,
        config: &CommConfig,
    ) -> Result<Comms, ElasticError> {
        let make = || -> Result<Communicator, ElasticError> {
            let id = run.rdv.exchange(&rd.nccl, world.rank, world.size)?;
            let c = Communicator::init_rank_with(
                &rd.nccl, &rd.ctx, &id, world.size, world.rank, config,
            )?;
            Ok(c)
        };
        let work = make()?;
        let spare = make()?;
        Ok(Comms { work, spare })
    }

    /// The survivors' side after `lost` died: `work` failed (aborted); `spare` is shrunk
    /// twice into the new pair, then aborted (its peer is gone).
    fn shrink(self, lost: usize) -> Result<Comms, ElasticError> {
        drop(self.work);
        let work = self.spare.shrink(&[lost])?;
        let spare = self.spare.shrink(&[lost])?;
        self.spare.abort()?;
        Ok(Comms { work, spare })
    }

    /// The survivors' side of the grow back to `size`: rank 0 makes each grow's id and
    /// serves it to the replacement (rank 1 of that exchange) under a key of its own.
    fn grow(self, run: &Run<'_, '_>, size: usize) -> Result<Comms, ElasticError> {
        let grow = |c: &Communicator, which: &str| -> Result<Communicator, ElasticError> {
            let rdv = grow_rendezvous(&run.rdv, which);
            let id = match c.rank() {
                0 => Some(rdv.exchange_with(0, 2, || c.grow_id())?),
                _ => None,
            };
            Ok(c.grow(size, id.as_ref())?)
        };
        let work = grow(&self.work, "work")?;
        let spare = grow(&self.spare, "spare")?;
        self.work.close()?;
        self.spare.close()?;
        Ok(Comms { work, spare })
    }

    /// The replacement's side: it fetches each grow's id and joins as the last rank.
    fn join(
        rd: &launch::RankDevice,
        run: &Run<'_, '_>,
        config: &CommConfig,
    ) -> Result<Comms, ElasticError> {
        let (size, rank) = (run.total, run.total - 1);
        let join = |which: &str| -> Result<Communicator, ElasticError> {
            let rdv = grow_rendezvous(&run.rdv, which);
            let id = rdv.exchange_with(1, 2, || {
                Err(nccl_channel::Error::InvalidArgument {
                    what: "the replacement",
                    problem: "only rank 0 makes a grow id".into(),
                })
            })?;
            Ok(Communicator::join_grown_with(
                &rd.nccl, &rd.ctx, &id, size, rank, config,
            )?)
        };
        let work = join("work")?;
        let spare = join("spare")?;
        Ok(Comms { work, spare })
    }
}

/// The launch's rendezvous under the key of one grow (`work` or `spare`).
fn grow_rendezvous(rdv: &Rendezvous, which: &str) -> Rendezvous {
    let key = format!("{}-grow-{which}", rdv.get_key());
    rdv.clone().key(key)
}

impl Run<'_, '_> {
    /// The rows of rank `rank` of `size`: the shards `s` with `s % size == rank`.
    fn rows(&self, rank: usize, size: usize) -> Result<Rows, ElasticError> {
        let (n, d) = (self.n, self.d);
        let mine: Vec<usize> = (rank..self.total).step_by(size.max(1)).collect();
        let m = mine.len() * n;
        let mi = i32::try_from(m).map_err(|_| ElasticError::TooManyRows { rows: m })?;
        let mut x = host_vec::<f32>(m as u128 * d as u128, "a rank's shards")?;
        let mut y = host_vec::<f32>(m as u128, "a rank's shards")?;
        for s in mine {
            let (sx, sy) = shard(s, n, d)?;
            x.extend(sx);
            y.extend(sy);
        }
        Ok(Rows {
            x: DeviceBuffer::from_slice(&self.ctx, &x)?,
            y: DeviceBuffer::from_slice(&self.ctx, &y)?,
            r: DeviceBuffer::zeroed(&self.ctx, m)?,
            m: mi,
        })
    }

    /// Enqueues the residuals of `w` into `rows.r`.
    fn residuals(&self, rows: &mut Rows, w: &DeviceBuffer<f32>) -> cuda_hal::Result<()> {
        let cfg = LaunchConfig::linear(rows.m as u32, BLOCK);
        // SAFETY: as `kernels.cu` declares it: `x` holds m * d floats, `w` d + 1, `y` and
        // `r` m; the grid covers the m rows.
        unsafe {
            self.k.residual.launch(
                &self.s,
                cfg,
                (&rows.x, w, &rows.y, &mut rows.r, rows.m, self.d as i32),
            )
        }
    }

    /// The mean squared residual over every rank's rows (`rows.r` enqueued), on the host.
    fn loss(&self, comm: &Communicator, rows: &Rows) -> Result<f32, ElasticError> {
        let mut mean = DeviceBuffer::<f32>::zeroed(&self.ctx, 1)?;
        // SAFETY: `r` holds m floats, `mean` one; one block reduces them.
        unsafe {
            self.k.mse.launch(
                &self.s,
                LaunchConfig::linear(1, BLOCK),
                (&rows.r, &mut mean, rows.m),
            )?
        };
        let mut v = [0f32];
        mean.copy_to_host_on(&mut v, &self.s)?;
        let mut sum = DeviceBuffer::from_slice(&self.ctx, &[v[0] * rows.m as f32])?;
        comm.all_reduce_in_place(&mut sum, ReduceOp::Sum, &self.s)?;
        comm.wait(&self.s)?;
        sum.copy_to_host_on(&mut v, &self.s)?;
        Ok(v[0] / (self.total * self.n) as f32)
    }

    /// One step: the gradient over every rank's rows, summed; the loss when `log`; then
    /// the update. A failed collective returns before the update, so the step can be
    /// taken again.
    fn step(
        &self,
        comm: &Communicator,
        rows: &mut Rows,
        w: &mut DeviceBuffer<f32>,
        g: &mut DeviceBuffer<f32>,
        log: bool,
    ) -> Result<Option<f32>, ElasticError> {
        let d = self.d;
        self.residuals(rows, w)?;
        let grad_cfg = LaunchConfig::new(
            [
                (d as u32 + 1).div_ceil(BLOCK),
                (rows.m as u32).div_ceil(128).min(64),
                1,
            ],
            [BLOCK, 1, 1],
        );
        let scale = 2.0 / (self.total * self.n) as f32;
        g.fill_async(0.0, &self.s)?;
        // SAFETY: `x` holds m * d floats, `r` m, `g` d + 1 (zeroed: the kernel adds).
        unsafe {
            self.k.gradient.launch(
                &self.s,
                grad_cfg,
                (&rows.x, &rows.r, &mut *g, rows.m, d as i32, scale),
            )?
        };
        comm.all_reduce_in_place(g, ReduceOp::Sum, &self.s)?;
        comm.wait(&self.s)?;
        let loss = match log {
            true => Some(self.loss(comm, rows)?),
            false => None,
        };
        // SAFETY: `w` and `g` hold d + 1 floats; the grid covers them.
        unsafe {
            self.k.sgd.launch(
                &self.s,
                LaunchConfig::for_elements(d + 1, BLOCK),
                (&mut *w, &*g, self.o.lr, d as i32 + 1),
            )?
        };
        Ok(loss)
    }

    /// The replacement's state: the weights and the step, broadcast from rank 0.
    fn receive_state(
        &self,
        comm: &Communicator,
    ) -> Result<(DeviceBuffer<f32>, usize), ElasticError> {
        let mut w = DeviceBuffer::<f32>::zeroed(&self.ctx, self.d + 1)?;
        let step = self.share_state(comm, &mut w, 0)?;
        Ok((w, step))
    }

    /// Broadcasts the weights and the step from rank 0 (whose `step` counts); the step.
    fn share_state(
        &self,
        comm: &Communicator,
        w: &mut DeviceBuffer<f32>,
        step: usize,
    ) -> Result<usize, ElasticError> {
        let mut at = DeviceBuffer::from_slice(&self.ctx, &[step as u64])?;
        comm.broadcast_in_place(w, 0, &self.s)?;
        comm.broadcast_in_place(&mut at, 0, &self.s)?;
        comm.wait(&self.s)?;
        let mut v = [0u64];
        at.copy_to_host_on(&mut v, &self.s)?;
        Ok(v[0] as usize)
    }

    /// Trains from `step` to the end, through the failure and the grow; returns the
    /// communicators to close. `me`: this process's rank in the launch and the failure.
    fn train(
        &self,
        mut comms: Comms,
        mut phase: Phase,
        mut step: usize,
        mut w: DeviceBuffer<f32>,
        (launch_rank, kill): (usize, Option<Kill>),
    ) -> Result<Comms, ElasticError> {
        let o = self.o;
        let mut g = DeviceBuffer::<f32>::zeroed(&self.ctx, self.d + 1)?;
        let mut rows = self.rows(comms.work.rank(), comms.work.size())?;
        let mut first = None;
        while step < o.steps {
            if let Some(k) = kill {
                if phase == Phase::Whole && launch_rank == k.rank && step == k.at {
                    die(k);
                }
                if phase == Phase::Shrunk && step == k.regrow_at {
                    let t = Instant::now();
                    let from = comms.work.size();
                    comms = comms.grow(self, self.total)?;
                    self.share_state(&comms.work, &mut w, step)?;
                    rows = self.rows(comms.work.rank(), comms.work.size())?;
                    phase = Phase::Regrown;
                    if comms.work.rank() == 0 {
                        println!(
                            "grew from {from} to {} ranks in {:.2} s at step {step}: the \
                             replacement joined as rank {}; weights and step broadcast from \
                             rank 0, shards re-assigned",
                            comms.work.size(),
                            t.elapsed().as_secs_f64(),
                            comms.work.size() - 1
                        );
                    }
                }
            }
            let log = step.is_multiple_of(o.log_every as usize);
            let t = Instant::now();
            match self.step(&comms.work, &mut rows, &mut w, &mut g, log) {
                Ok(loss) => {
                    if let Some(l) = loss {
                        first.get_or_insert(l);
                        if comms.work.rank() == 0 {
                            println!(
                                "step {step:>5}  loss {l:.6e}  ({} ranks)",
                                comms.work.size()
                            );
                        }
                    }
                    step += 1;
                }
                Err(ElasticError::Nccl(e))
                    if phase == Phase::Whole && kill.is_some() && comms.work.is_aborted() =>
                {
                    let Some(k) = kill else { return Err(e.into()) };
                    println!(
                        "rank {launch_rank}: lost a peer at step {step}, {:.3} s into it \
                         (deadline {} s): {}",
                        t.elapsed().as_secs_f64(),
                        o.elastic.deadline,
                        launch::report(&e)
                    );
                    let t = Instant::now();
                    let from = comms.spare.size();
                    comms = comms.shrink(k.rank)?;
                    rows = self.rows(comms.work.rank(), comms.work.size())?;
                    phase = Phase::Shrunk;
                    println!(
                        "rank {launch_rank} is rank {} of {} now",
                        comms.work.rank(),
                        comms.work.size()
                    );
                    if comms.work.rank() == 0 {
                        println!(
                            "shrunk from {from} to {} ranks in {:.2} s (rank {} excluded); \
                             training goes on with the shards re-assigned",
                            comms.work.size(),
                            t.elapsed().as_secs_f64(),
                            k.rank
                        );
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.finish(&comms.work, &mut rows, &w, first)?;
        Ok(comms)
    }

    /// The final loss, the weights' equality on every rank, and (rank 0) the comparison
    /// with the uninterrupted run.
    fn finish(
        &self,
        comm: &Communicator,
        rows: &mut Rows,
        w: &DeviceBuffer<f32>,
        first: Option<f32>,
    ) -> Result<(), ElasticError> {
        self.residuals(rows, w)?;
        let last = self.loss(comm, rows)?;
        let mine = w.to_vec()?;
        let mut hi = DeviceBuffer::<f32>::zeroed(&self.ctx, self.d + 1)?;
        let mut lo = DeviceBuffer::<f32>::zeroed(&self.ctx, self.d + 1)?;
        comm.all_reduce(w, &mut hi, ReduceOp::Max, &self.s)?;
        comm.all_reduce(w, &mut lo, ReduceOp::Min, &self.s)?;
        comm.wait(&self.s)?;
        let same = |v: Vec<f32>| v.iter().zip(&mine).all(|(a, b)| a.to_bits() == b.to_bits());
        if !(same(hi.to_vec()?) && same(lo.to_vec()?)) {
            return Err(ElasticError::WeightsDiffer { rank: comm.rank() });
        }
        if comm.rank() != 0 {
            return Ok(());
        }
        let o = self.o;
        println!(
            "weights equal on all {} ranks; loss {:.4e} -> {last:.4e} in {} steps",
            comm.size(),
            first.unwrap_or(f32::NAN),
            o.steps
        );
        let host = host_losses(self.total, self.n, self.d, o)
            .map_err(|e| ElasticError::Reference(e.to_string()))?;
        let want = host.last().map_or(f64::NAN, |l| l.1);
        let got = f64::from(last);
        let diff = (got - want).abs() / want.abs().max(1e-30);
        println!(
            "final loss {got:.6e} after {} steps; uninterrupted run (host f64, same data and \
             steps) {want:.6e}; relative difference {diff:.2e} (tolerance {:e})",
            o.steps, o.elastic.tolerance
        );
        if diff.is_nan() || diff > o.elastic.tolerance {
            return Err(ElasticError::Diverged {
                got,
                want,
                diff,
                tolerance: o.elastic.tolerance,
            });
        }
        Ok(())
    }
}

/// The scripted failure: this process ends at once, as a killed one does (no destructor
/// runs, no communicator is closed: its peers find out from NCCL or their deadline).
fn die(k: Kill) -> ! {
    use std::io::Write;
    println!("rank {}: killing itself at step {} (SIGKILL)", k.rank, k.at);
    let _ = std::io::stdout().flush();
    // SAFETY: kill(2) on this process with a valid signal; it touches no memory.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    std::process::abort()
}
