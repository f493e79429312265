//! Growing a live communicator by new ranks (NCCL ≥ 2.29.2): the coordinator's id
//! ([`Communicator::grow_id`]), the existing ranks' side ([`Communicator::grow`],
//! [`Communicator::grow_with`], [`Communicator::grow_all`]) and the new ranks' side
//! ([`Communicator::join_grown`], [`Communicator::join_grown_with`]).
//!
//! NCCL's protocol (`ncclCommGetUniqueId`, `ncclCommGrow`):
//!
//! 1. One existing rank, the coordinator (any rank, e.g. 0), makes the grow id with
//!    `ncclCommGetUniqueId(comm)`; NCCL passes it to the other existing ranks itself
//!    (over the communicator's bootstrap). One id per grow, used once; the next only
//!    after this grow; refused while `NCCL_COMM_ID` is set.
//! 2. The coordinator hands the id to the new ranks out of band: as bytes, hex, a file
//!    or a [`Rendezvous`](crate::Rendezvous) exchange with a key of its own.
//! 3. Every existing rank calls `ncclCommGrow(comm, new_size, id or NULL, -1, ..)`: the
//!    coordinator passes the id, the others none; each keeps its rank.
//! 4. Every new rank calls `ncclCommGrow(NULL, new_size, &id, rank, ..)` with a rank in
//!    `old_size..new_size`.
//!
//! The grown communicator is a new one; the old one stays valid (NCCL advises destroying
//! it once the grow completed). The new communicator is written early, so a failed
//! non-blocking grow hands one over, which is aborted here, never leaked.

use std::ffi::c_int;
use std::sync::Arc;

use cuda_hal::Context;
use nccl_sys::{Nccl, ncclUniqueId};

use crate::children::Plan;
use crate::comm::init::init_via;
use crate::comm::init::world_args;
use crate::comm::private::with_channels;
use crate::split::{check_parents, refuse_in_group};
use crate::{CommConfig, Communicator, Error, Result, UniqueId};

const GROW_ALL: &str = "Communicator::grow_all";

/// Checks that `new_size` grows every parent and converts it to NCCL's int.
fn new_size_arg(what: &'static str, new_size: usize, parents: &[&Communicator]) -> Result<c_int> {
    if let Some(p) = parents.iter().find(|p| new_size <= p.size()) {
        return Err(Error::InvalidArgument {
            what,
            problem: format!(
                "new size {new_size} does not grow a communicator of {} ranks",
                p.size()
            ),
        });
    }
    c_int::try_from(new_size).map_err(|_| Error::InvalidArgument {
        what,
        problem: format!("{new_size} does not fit NCCL's int"),
    })
}

/// The existing ranks' grows of `parents` (checked by the caller), each with its id
/// (the coordinator's) or none; in one NCCL group when `grouped`.
fn grow_each(
    parents: &[&Communicator],
    ids: &[Option<&UniqueId>],
    new_size: usize,
    config: Option<&CommConfig>,
    (what, grouped): (&'static str, bool),
) -> Result<Vec<Communicator>> {
    let Some(first) = parents.first() else {
        return Ok(Vec::new());
    };
    let (f, call) = optional!(first.nccl(), ncclCommGrow)?;
    let n = new_size_arg(what, new_size, parents)?;
    let raw_ids: Vec<Option<ncclUniqueId>> =
        ids.iter().map(|id| id.map(UniqueId::to_raw)).collect();
    // Lowered before the grow; it and its names outlive make_children, which returns only
    // once NCCL is done with the grow.
    let mut raw_config = config
        .map(|c| c.to_raw(first.nccl().version()))
        .transpose()?;
    let config_ptr = raw_config
        .as_mut()
        .map_or(std::ptr::null_mut(), |c| c.as_mut_ptr());
    let expect = vec![true; parents.len()];
    let plan = Plan {
        call,
        grouped,
        expect: &expect,
        config,
    };
    let children = with_channels(parents, plan, &mut |i, raw, out| {
        let id = raw_ids
            .get(i)
            .and_then(Option::as_ref)
            .map_or(std::ptr::null(), |id| id as *const ncclUniqueId);
        // SAFETY: a live communicator; the id is NULL or alive for the call; `out` stays
        // valid and unread until the grow completed (make_children); the config is NULL
        // (inherit the parent's) or lowered above and alive until after make_children.
        unsafe { f(raw, n, id, -1, out, config_ptr) }
    })?;
    drop(raw_config);
    children
        .into_iter()
        .map(|c| {
            c.ok_or_else(|| Error::InvalidArgument {
                what,
                problem: "NCCL returned no communicator for this rank".into(),
            })
        })
        .collect()
}

impl Communicator {
    /// Makes the id of the next grow of this communicator (`ncclCommGetUniqueId`, NCCL ≥
    /// 2.29.2), on one existing rank only: the coordinator. NCCL hands it to the other
    /// existing ranks itself; give it to the new ranks (as bytes, hex, a file or a
    /// [`Rendezvous`](crate::Rendezvous) exchange with a key of its own, where the
    /// coordinator serves it as rank 0 with
    /// [`exchange_with`](crate::Rendezvous::exchange_with)`(0, joining + 1, || comm.grow_id())`
    /// and the new ranks fetch it as ranks `1..=joining`). Then every rank grows:
    /// [`grow`](Self::grow) here (passing this id), [`join_grown`](Self::join_grown) on
    /// the new ranks.
    ///
    /// One id per grow, used once: a second before this one's grow is an NCCL usage
    /// error. NCCL refuses it while `NCCL_COMM_ID` is set (which gives every id the same
    /// address); before 2.29.2 it is [`Error::Unsupported`].
    ///
    /// See [`grow`](Self::grow) for a whole grow.
    #[doc(alias = "ncclCommGetUniqueId")]
    pub fn grow_id(&self) -> Result<UniqueId> {
        let (f, call) = optional!(self.nccl(), ncclCommGetUniqueId)?;
        let raw = self.handle()?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: a live communicator and a valid out-pointer.
        let rc = unsafe { f(raw, &mut id) };
        self.check(rc, call)?;
        Ok(UniqueId::from_raw(&id))
    }

    /// Grows this communicator to `new_size` ranks (`ncclCommGrow`, NCCL ≥ 2.29.2): the
    /// existing ranks' side, called by every rank of this communicator; each keeps its
    /// rank in the new communicator. `id`: the coordinator passes the id it made with
    /// [`grow_id`](Self::grow_id), the other ranks `None` (NCCL hands it to them). The
    /// new ranks join with [`join_grown`](Self::join_grown) and ranks
    /// `size()..new_size`. Returns the grown communicator; this one stays usable (close
    /// it when done). It has this communicator's configuration (NCCL's NULL config;
    /// [`grow_with`](Self::grow_with) gives it its own); a non-blocking grow waits
    /// within the deadline as [`split`](Self::split) does.
    ///
    /// Errors: `new_size` not above [`size`](Self::size) is [`Error::InvalidArgument`];
    /// before 2.29.2 [`Error::Unsupported`]; inside an open group [`Error::SplitInGroup`]
    /// (several local ranks grow together with [`grow_all`](Self::grow_all)); ranks that
    /// disagree on `new_size` fail as NCCL's rendezvous does (the simulated NCCL fails
    /// every rank with one `Error::Nccl`).
    ///
    /// Two ranks grow to three; the new rank is a thread here (a new process in a job):
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, ReduceOp, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let (tx, rx) = std::sync::mpsc::channel::<UniqueId>();
    /// let mut rx = Some(rx);
    /// let sums = std::thread::scope(|s| {
    ///     let mut ranks = Vec::new();
    ///     for rank in 0..3 {
    ///         let (cuda, nccl, tx) = (&cuda, &nccl, tx.clone());
    ///         let rx = if rank == 2 { rx.take() } else { None };
    ///         ranks.push(s.spawn(move || -> nccl_channel::Result<Vec<i32>> {
    ///             let ctx = cuda.device(rank)?.primary_context()?;
    ///             let grown = match rx {
    ///                 // The new rank: the coordinator's id, then the join.
    ///                 Some(rx) => {
    ///                     let grow_id = rx.recv().expect("the coordinator sends the id");
    ///                     Communicator::join_grown(nccl, &ctx, &grow_id, 3, 2)?
    ///                 }
    ///                 None => {
    ///                     let comm = Communicator::init_rank(nccl, &ctx, &id, 2, rank)?;
    ///                     let grow_id = (rank == 0).then(|| comm.grow_id()).transpose()?;
    ///                     if let Some(g) = grow_id {
    ///                         tx.send(g).expect("the new rank listens");
    ///                     }
    ///                     let grown = comm.grow(3, grow_id.as_ref())?;
    ///                     comm.close()?;
    ///                     grown
    ///                 }
    ///             };
    ///             let stream = Stream::new(&ctx)?;
    ///             let mut buf = DeviceBuffer::from_slice(&ctx, &[grown.rank() as i32 + 1])?;
    ///             grown.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    ///             stream.synchronize()?;
    ///             Ok(buf.to_vec()?)
    ///         }));
    ///     }
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(sums, [[6], [6], [6]]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommGrow")]
    pub fn grow(&self, new_size: usize, id: Option<&UniqueId>) -> Result<Communicator> {
        self.grow_one(new_size, id, None)
    }

    /// As [`grow`](Self::grow), with the new communicator's own [`CommConfig`] (NCCL's
    /// `config`) instead of this one's. It must keep this communicator's blocking mode
    /// (else [`Error::InvalidArgument`]), as for [`split_with`](Self::split_with).
    #[doc(alias = "ncclCommGrow")]
    pub fn grow_with(
        &self,
        new_size: usize,
        id: Option<&UniqueId>,
        config: &CommConfig,
    ) -> Result<Communicator> {
        if config.is_blocking() != self.config().is_blocking() {
            return Err(Error::InvalidArgument {
                what: "Communicator::grow_with",
                problem: "the grown communicator keeps this communicator's blocking mode".into(),
            });
        }
        self.grow_one(new_size, id, Some(config))
    }

    fn grow_one(
        &self,
        new_size: usize,
        id: Option<&UniqueId>,
        config: Option<&CommConfig>,
    ) -> Result<Communicator> {
        optional!(self.nccl(), ncclCommGrow)?;
        self.handle()?;
        refuse_in_group("grow", GROW_ALL)?;
        let mut grown = grow_each(
            &[self],
            &[id],
            new_size,
            config,
            ("Communicator::grow", false),
        )?;
        grown.pop().ok_or_else(|| Error::InvalidArgument {
            what: "Communicator::grow",
            problem: "NCCL returned no communicator for this rank".into(),
        })
    }

    /// Grows several local ranks from this thread at once (NCCL ≥ 2.29.2): every
    /// `(parent, id)` grows to `new_size` in one NCCL group, NCCL's pattern for one
    /// thread driving several devices (the coordinator's parent passes the id it made,
    /// the others `None`); errors as [`split_all`](Self::split_all). Returns one grown
    /// communicator per parent, in order.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::Communicator;
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctxs = (0..3).map(|d| cuda.device(d)?.primary_context()).collect::<Result<Vec<_>, _>>()?;
    /// let comms = Communicator::init_all(&nccl, &ctxs[..2])?;
    /// let id = comms[0].grow_id()?;
    /// let grown = std::thread::scope(|s| {
    ///     let joiner = s.spawn(|| Communicator::join_grown(&nccl, &ctxs[2], &id, 3, 2));
    ///     let grown = Communicator::grow_all(&[(&comms[0], Some(&id)), (&comms[1], None)], 3);
    ///     (grown, joiner.join().expect("the new rank panicked"))
    /// });
    /// let (old, new) = (grown.0?, grown.1?);
    /// let ranks: Vec<_> = old.iter().chain([&new]).map(|c| (c.rank(), c.size())).collect();
    /// assert_eq!(ranks, [(0, 3), (1, 3), (2, 3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommGrow")]
    #[doc(alias = "ncclGroupStart")]
    pub fn grow_all(
        parts: &[(&Communicator, Option<&UniqueId>)],
        new_size: usize,
    ) -> Result<Vec<Communicator>> {
        let parents: Vec<&Communicator> = parts.iter().map(|p| p.0).collect();
        check_parents(GROW_ALL, &parents)?;
        let ids: Vec<Option<&UniqueId>> = parts.iter().map(|p| p.1).collect();
        grow_each(&parents, &ids, new_size, None, (GROW_ALL, true))
    }

    /// Joins a grown communicator as new rank `rank` of `new_size` on `ctx`'s device
    /// (`ncclCommGrow` with no parent, NCCL ≥ 2.29.2): the new ranks' side of
    /// [`grow`](Self::grow), with the id the coordinator made
    /// ([`grow_id`](Self::grow_id)). `rank` is from the old size on. Blocks until every
    /// rank, old and new, came; see [`grow`](Self::grow) for an example.
    ///
    /// Errors: `rank` not below `new_size` is [`Error::InvalidRank`]; before 2.29.2
    /// [`Error::Unsupported`]; then as [`init_rank`](Self::init_rank).
    #[doc(alias = "ncclCommGrow")]
    pub fn join_grown(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        new_size: usize,
        rank: usize,
    ) -> Result<Communicator> {
        Self::join_grown_with(nccl, ctx, id, new_size, rank, &CommConfig::default())
    }

    /// As [`join_grown`](Self::join_grown) with a [`CommConfig`]: non-blocking, it waits
    /// for the other ranks at most the config's timeout, then aborts and returns
    /// [`Error::Timeout`].
    #[doc(alias = "ncclCommGrow")]
    pub fn join_grown_with(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        id: &UniqueId,
        new_size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<Communicator> {
        let (f, call) = optional!(nccl, ncclCommGrow)?;
        config.check_timeout()?;
        let (n, r) = world_args("Communicator::join_grown", new_size, rank)?;
        let raw_id = id.to_raw();
        init_via(nccl, ctx, (new_size, rank), config, call, |out, cfg| {
            // SAFETY: no parent (a new rank), the id alive for the call, a valid
            // out-pointer, a lowered config alive until the communicator is ready
            // (init_via); the device's context is current.
            unsafe { f(std::ptr::null_mut(), n, &raw_id, r, out, cfg) }
        })
    }
}
