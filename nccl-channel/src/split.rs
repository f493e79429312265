//! Splits and shrinks: one rank's ([`Communicator::split`], [`Communicator::shrink`]) and
//! several local ranks' from one thread in one NCCL group ([`Communicator::split_all`],
//! [`Communicator::shrink_all`]).
//! The children are made by children.rs, and get their private channels
//! (comm/private.rs) before they are handed out.

use std::ffi::c_int;
use std::sync::Arc;

use cuda_hal::DeferScope;
use nccl_sys::{NCCL_SPLIT_NOCOLOR, ncclResult_t};

use crate::children::Plan;
use crate::comm::private::with_channels;
use crate::{CommConfig, Communicator, Error, ParentsProblem, Result};

const SPLIT_ALL: &str = "Communicator::split_all";
const SHRINK_ALL: &str = "Communicator::shrink_all";

/// Splits and shrinks inside an open group would give their new communicator only after
/// the group ends (NCCL's rule): refused, pointing to the grouped API.
pub(crate) fn refuse_in_group(what: &'static str, instead: &'static str) -> Result<()> {
    if DeferScope::is_open() {
        return Err(Error::SplitInGroup { what, instead });
    }
    Ok(())
}

/// NCCL's color: `None` is `NCCL_SPLIT_NOCOLOR`.
fn color_arg(color: Option<u32>) -> Result<c_int> {
    match color {
        None => Ok(NCCL_SPLIT_NOCOLOR),
        Some(c) => c_int::try_from(c).map_err(|_| Error::InvalidArgument {
            what: "color",
            problem: format!("{c} does not fit NCCL's int"),
        }),
    }
}

/// Checks that `parents` can split together in one group from this thread, and that
/// each is live (performing a requested abort, as every call does). `what` is the
/// grouped API called.
pub(crate) fn check_parents(what: &'static str, parents: &[&Communicator]) -> Result<()> {
    let bad = |problem| Err(Error::GroupedParents { what, problem });
    let Some(first) = parents.first() else {
        return bad(ParentsProblem::Empty);
    };
    refuse_in_group(what, what)?;
    for (i, p) in parents.iter().enumerate() {
        if !Arc::ptr_eq(p.nccl(), first.nccl()) {
            return bad(ParentsProblem::MixedLibraries { first: 0, other: i });
        }
        if p.config().is_blocking() != first.config().is_blocking() {
            return bad(ParentsProblem::MixedModes {
                first: 0,
                first_blocking: first.config().is_blocking(),
                other: i,
            });
        }
        if let Some(j) = parents[..i].iter().position(|q| q.as_raw() == p.as_raw()) {
            return bad(ParentsProblem::Duplicate { first: j, again: i });
        }
        p.handle().map_err(|e| match e {
            Error::GroupedElsewhere { .. } => Error::GroupedElsewhere { what },
            e => e,
        })?;
    }
    Ok(())
}

impl Communicator {
    /// Splits into sub-communicators: ranks with the same `color` form one, ordered by
    /// `key` then by rank; `None` opts out (returns `Ok(None)`). Collective over all ranks.
    /// The child has this communicator's configuration (NCCL's NULL config: it inherits
    /// the parent's; [`split_with`](Self::split_with) gives it one of its own), and a
    /// non-blocking split waits for it within the deadline (a failed wait aborts this
    /// communicator, which stops the split).
    ///
    /// One rank per call: in one process per rank, or with one thread per rank. Several
    /// local ranks driven from one thread split together with
    /// [`split_all`](Self::split_all); inside an open group this returns
    /// [`Error::SplitInGroup`].
    ///
    /// Ranks 0 and 1 of three form a communicator of their own; rank 2 opts out:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let children = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl) = (&cuda, &nccl);
    ///             s.spawn(move || -> nccl_channel::Result<Option<(usize, usize)>> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 3, rank)?;
    ///                 let color = (rank < 2).then_some(7);
    ///                 let child = comm.split(color, 0)?;
    ///                 Ok(child.map(|c| (c.rank(), c.size())))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(children, [Some((0, 2)), Some((1, 2)), None]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSplit")]
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.split_one(color, key, None)
    }

    /// As [`split`](Self::split), with the child's own [`CommConfig`] (NCCL's `config`
    /// argument) instead of this communicator's: e.g. a name or CTA limits of its own.
    /// It must keep this communicator's blocking mode (else [`Error::InvalidArgument`]):
    /// NCCL completes a split as its parent's work. Its fields are checked against the
    /// loaded NCCL as [`init_rank_with`](Self::init_rank_with) does, before the split.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{CommConfig, Communicator};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// let (nccl, world) = MockNccl::new(&gpus).build()?;
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
    /// let config = CommConfig::new().comm_name("experts").max_ctas(4);
    /// let child = comm.split_with(Some(0), 0, &config)?.expect("a color was given");
    /// assert_eq!(child.config().get_comm_name(), Some("experts"));
    /// let seen = world.config_of(child.as_raw()).expect("split with a config");
    /// assert_eq!((seen.comm_name.as_deref(), seen.raw.maxCTAs), (Some("experts"), 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSplit")]
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Communicator>> {
        if config.is_blocking() != self.config().is_blocking() {
            return Err(Error::InvalidArgument {
                what: "Communicator::split_with",
                problem: format!(
                    "the child's configuration is {}blocking and this communicator is not; \
                     a child keeps its parent's blocking mode",
                    if config.is_blocking() { "" } else { "non-" }
                ),
            });
        }
        self.split_one(color, key, Some(config))
    }

    /// One rank's split, with NCCL's NULL config (`None`: the child inherits ours) or
    /// `config`.
    fn split_one(
        &self,
        color: Option<u32>,
        key: i32,
        config: Option<&CommConfig>,
    ) -> Result<Option<Communicator>> {
        let color = color_arg(color)?;
        self.handle()?;
        refuse_in_group("split", SPLIT_ALL)?;
        // Lowered before the split; it and its names outlive make_children, which returns
        // only once NCCL is done with the split.
        let mut raw_config = config
            .map(|c| c.to_raw(self.nccl().version()))
            .transpose()?;
        let config_ptr = raw_config
            .as_mut()
            .map_or(std::ptr::null_mut(), |c| c.as_mut_ptr());
        let plan = Plan {
            call: "ncclCommSplit",
            grouped: false,
            expect: &[color != NCCL_SPLIT_NOCOLOR],
            config,
        };
        let mut children = with_channels(&[self], plan, &mut |_, raw, out| {
            // SAFETY: a live communicator; `out` stays valid and unread until the split
            // completed (make_children); the config is NULL (inherit ours) or lowered
            // above and alive until after make_children.
            unsafe { (self.nccl().fns().ncclCommSplit)(raw, color, key, out, config_ptr) }
        })?;
        drop(raw_config);
        Ok(children.pop().flatten())
    }

    /// Splits several local ranks from this thread at once, NCCL's pattern for one thread
    /// driving several devices: every `(parent, color, key)` is split in one NCCL group,
    /// and the new communicators are read only after the group ended (and, for
    /// non-blocking parents, after each parent's split completed within its deadline).
    /// Returns one entry per parent, in order, `None` where the color was `None`. Each
    /// child has its parent's configuration, as with [`split`](Self::split).
    ///
    /// Every rank of a parent communicator takes part in its split: the local ranks here,
    /// and any others from their own threads or processes (with `split` or `split_all`).
    ///
    /// Errors: an empty list, parents of different NCCL libraries or blocking modes, or
    /// the same parent twice are [`Error::GroupedParents`]; a call inside an open group is
    /// [`Error::SplitInGroup`]; a parent held by an open group of another thread is
    /// [`Error::GroupedElsewhere`]. If a call or the group fails, every child made is
    /// aborted (none leaks) and the error names the failing call; parents are aborted as
    /// after any failed call (not for usage errors), and always when waiting for them failed.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use nccl_channel::{Communicator, ReduceOp};
    /// use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_mock::MockNccl;
    /// // Four simulated GPUs, one communicator each, all driven from this thread.
    /// let (cuda, gpus) = MockDriver::with_devices(4).build_with(Cuda::from_driver)?;
    /// let (nccl, _world) = MockNccl::new(&gpus).build()?;
    /// let nccl = Arc::new(nccl);
    /// let ctxs = (0..4)
    ///     .map(|d| cuda.device(d)?.primary_context())
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// // Even and odd ranks form two communicators, each ordered by descending rank.
    /// let parts: Vec<_> = comms
    ///     .iter()
    ///     .map(|c| (c, Some(c.rank() as u32 % 2), -(c.rank() as i32)))
    ///     .collect();
    /// let halves = Communicator::split_all(&parts)?;
    /// let halves: Vec<Communicator> = halves.into_iter().flatten().collect();
    /// let ranks: Vec<_> = halves.iter().map(|h| (h.rank(), h.size())).collect();
    /// assert_eq!(ranks, [(1, 2), (1, 2), (0, 2), (0, 2)]);
    /// // Each half sums its ranks' values: 1 + 3 and 2 + 4.
    /// let streams = ctxs.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let mut bufs = (0..4)
    ///     .map(|r| DeviceBuffer::from_slice(&ctxs[r], &[r as i32 + 1]))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// nccl_channel::group(&nccl, || {
    ///     for ((h, b), s) in halves.iter().zip(&mut bufs).zip(&streams) {
    ///         h.all_reduce_in_place(b, ReduceOp::Sum, s)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// let mut sums = Vec::new();
    /// for (b, s) in bufs.iter().zip(&streams) {
    ///     s.synchronize()?;
    ///     sums.extend(b.to_vec()?);
    /// }
    /// assert_eq!(sums, [4, 6, 4, 6]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommSplit")]
    #[doc(alias = "ncclGroupStart")]
    pub fn split_all(
        parts: &[(&Communicator, Option<u32>, i32)],
    ) -> Result<Vec<Option<Communicator>>> {
        let parents: Vec<&Communicator> = parts.iter().map(|p| p.0).collect();
        check_parents(SPLIT_ALL, &parents)?;
        let args = parts
            .iter()
            .map(|&(_, color, key)| Ok((color_arg(color)?, key)))
            .collect::<Result<Vec<_>>>()?;
        let nccl = parents[0].nccl().clone();
        let expect: Vec<bool> = args.iter().map(|a| a.0 != NCCL_SPLIT_NOCOLOR).collect();
        let plan = Plan {
            call: "ncclCommSplit",
            grouped: true,
            expect: &expect,
            config: None,
        };
        with_channels(&parents, plan, &mut |i, raw, out| {
            let Some(&(color, key)) = args.get(i) else {
                return ncclResult_t::ncclInvalidArgument;
            };
            // SAFETY: a live communicator; `out` stays valid and unread until the group's
            // splits completed (make_children); NULL config inherits the parent's.
            unsafe { (nccl.fns().ncclCommSplit)(raw, color, key, out, std::ptr::null_mut()) }
        })
    }

    /// A new communicator of the ranks not in `exclude` (NCCL ≥ 2.27), e.g. after a peer
    /// died. Every remaining rank calls it with the same list; ranks keep their order. A
    /// non-blocking shrink waits as [`split`](Self::split) does. Several local ranks
    /// driven from one thread shrink together with [`shrink_all`](Self::shrink_all);
    /// inside an open group this returns [`Error::SplitInGroup`].
    ///
    /// Rank 1 of three dies; the others carry on as ranks 0 and 1 of two:
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
    /// let survivors = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl) = (&cuda, &nccl);
    ///             s.spawn(move || -> nccl_channel::Result<Option<(usize, usize, Vec<i32>)>> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 3, rank)?;
    ///                 if rank == 1 {
    ///                     comm.abort()?; // lost
    ///                     return Ok(None);
    ///                 }
    ///                 let small = comm.shrink(&[1])?;
    ///                 let stream = Stream::new(&ctx)?;
    ///                 let mut buf = DeviceBuffer::from_slice(&ctx, &[rank as i32])?;
    ///                 small.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
    ///                 stream.synchronize()?;
    ///                 Ok(Some((small.rank(), small.size(), buf.to_vec()?)))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// // Old ranks 0 and 2 are ranks 0 and 1 now, and sum 0 + 2.
    /// assert_eq!(survivors, [Some((0, 2, vec![2])), None, Some((1, 2, vec![2]))]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommShrink")]
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        self.handle()?;
        refuse_in_group("shrink", SHRINK_ALL)?;
        let mut children = shrink_each(&[self], exclude, "shrink", false)?;
        children.pop().ok_or_else(no_child)
    }

    /// Shrinks several local ranks from this thread at once (NCCL ≥ 2.27): every parent
    /// is shrunk to the ranks not in `exclude`, in one NCCL group, and the new
    /// communicators are read only after the group ended, as with
    /// [`split_all`](Self::split_all) (same errors, plus [`ParentsProblem::ExcludesItself`]
    /// for a parent whose own rank is excluded). Returns one communicator per parent.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use nccl_channel::Communicator;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_mock::MockNccl;
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let (nccl, _world) = MockNccl::new(&gpus).build()?;
    /// let ctxs = (0..3)
    ///     .map(|d| cuda.device(d)?.primary_context())
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut comms = Communicator::init_all(&Arc::new(nccl), &ctxs)?;
    /// comms.remove(1).abort()?; // rank 1 is lost
    /// let small = Communicator::shrink_all(&[&comms[0], &comms[1]], &[1])?;
    /// let ranks: Vec<_> = small.iter().map(|c| (c.rank(), c.size())).collect();
    /// assert_eq!(ranks, [(0, 2), (1, 2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommShrink")]
    pub fn shrink_all(parents: &[&Communicator], exclude: &[usize]) -> Result<Vec<Communicator>> {
        check_parents(SHRINK_ALL, parents)?;
        shrink_each(parents, exclude, SHRINK_ALL, true)
    }
}

/// The shrinks of `parents` (checked by the caller), one NCCL group of their own when
/// `grouped`; every parent gets a child.
fn shrink_each(
    parents: &[&Communicator],
    exclude: &[usize],
    what: &'static str,
    grouped: bool,
) -> Result<Vec<Communicator>> {
    let Some(first) = parents.first() else {
        return Ok(Vec::new());
    };
    let (f, call) = optional!(first.nccl(), ncclCommShrink)?;
    let list = exclude_list(what, exclude, parents, grouped)?;
    let expect = vec![true; parents.len()];
    let plan = Plan {
        call,
        grouped,
        expect: &expect,
        config: None,
    };
    let children = with_channels(parents, plan, &mut |_, raw, out| {
        let mut list = list.clone();
        // SAFETY: a live communicator, a list of valid ranks (NCCL may sort it in place),
        // `out` valid and unread until the shrink completed (the group ended, or NCCL
        // stored it), NULL config (inherit: the child gets its parent's blocking mode) and
        // NCCL_SHRINK_DEFAULT.
        unsafe {
            f(
                raw,
                list.as_mut_ptr(),
                list.len() as c_int,
                out,
                std::ptr::null_mut(),
                0,
            )
        }
    })?;
    children
        .into_iter()
        .map(|c| c.ok_or_else(no_child))
        .collect()
}

fn no_child() -> Error {
    Error::InvalidArgument {
        what: "shrink",
        problem: "NCCL returned no communicator for this rank".into(),
    }
}

/// Checks a shrink's exclusion list against its parents (in range, not a parent's own
/// rank, not empty: NCCL needs one) and converts it to NCCL's ints.
fn exclude_list(
    what: &'static str,
    exclude: &[usize],
    parents: &[&Communicator],
    grouped: bool,
) -> Result<Vec<c_int>> {
    if exclude.is_empty() {
        return Err(Error::InvalidArgument {
            what,
            problem: "no rank to exclude (NCCL needs at least one; keep the communicator)".into(),
        });
    }
    let mut sorted = exclude.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        // NCCL counts the list's length, not its distinct ranks: a repeat shrinks the
        // survivors' size wrongly (or fails on some ranks only).
        return Err(Error::InvalidArgument {
            what,
            problem: format!("rank {} is excluded twice", w[0]),
        });
    }
    for (index, p) in parents.iter().enumerate() {
        for &r in exclude {
            if r >= p.size() {
                return Err(Error::InvalidRank {
                    what,
                    rank: r,
                    size: p.size(),
                });
            }
            if r == p.rank() && grouped {
                return Err(Error::GroupedParents {
                    what,
                    problem: ParentsProblem::ExcludesItself { index, rank: r },
                });
            }
            if r == p.rank() {
                return Err(Error::InvalidArgument {
                    what,
                    problem: format!(
                        "rank {r} is this communicator's own rank; excluded ranks do not \
                         call shrink"
                    ),
                });
            }
        }
    }
    Ok(exclude.iter().map(|&r| r as c_int).collect())
}
