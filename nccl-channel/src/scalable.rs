//! Inits other than by one unique id: with several ids ([`Communicator::init_rank_scalable`],
//! NCCL ≥ 2.23); they share comm/init.rs's `init_via`, the path of every init that takes a
//! config and may complete in the background.

use std::ffi::c_int;
use std::sync::Arc;

use cuda_hal::Context;
use nccl_sys::{Nccl, ncclUniqueId};

use crate::comm::init::{init_via, world_args};
use crate::{CommConfig, Communicator, Error, Result, UniqueId};

impl Communicator {
    /// Joins the communicator of several unique ids as `rank` of `size`
    /// (`ncclCommInitRankScalable`, NCCL ≥ 2.23), on `ctx`'s device: NCCL spreads the
    /// bootstrap of a large world over the ids' roots. Every rank passes the same ids in
    /// the same order; one id is the same as [`init_rank_with`](Self::init_rank_with).
    ///
    /// Who makes the ids: each [`UniqueId::generate`] runs a bootstrap root in the process
    /// that calls it, so for load spreading NCCL recommends that the first rank of each of
    /// `ids.len()` even blocks of ranks make one ([`scalable_root`] says which ranks),
    /// and that every rank then learns all of them; functionally any process may make
    /// them all, e.g. rank 0 making `k` ids and handing them out through `k`
    /// [`Rendezvous`](crate::Rendezvous) exchanges (keys of their own) or a file.
    ///
    /// Errors: no id, or more ids than ranks, is [`Error::InvalidArgument`]; NCCL before
    /// 2.23 is [`Error::Unsupported`]; then as [`init_rank_with`](Self::init_rank_with).
    ///
    /// Three ranks, two ids (made here by one process):
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{CommConfig, Communicator, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ids = [UniqueId::generate(&nccl)?, UniqueId::generate(&nccl)?];
    /// let joined = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let (cuda, nccl, ids) = (&cuda, &nccl, &ids);
    ///             s.spawn(move || -> nccl_channel::Result<(usize, usize)> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let config = CommConfig::new();
    ///                 let comm = Communicator::init_rank_scalable(nccl, &ctx, ids, 3, rank, &config)?;
    ///                 Ok((comm.rank(), comm.size()))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(joined, [(0, 3), (1, 3), (2, 3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclCommInitRankScalable")]
    pub fn init_rank_scalable(
        nccl: &Arc<Nccl>,
        ctx: &Context,
        ids: &[UniqueId],
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<Communicator> {
        const WHAT: &str = "Communicator::init_rank_scalable";
        let (f, call) = optional!(nccl, ncclCommInitRankScalable)?;
        config.check_timeout()?;
        world_args(WHAT, size, rank)?;
        if ids.is_empty() || ids.len() > size {
            return Err(Error::InvalidArgument {
                what: WHAT,
                problem: format!(
                    "{} unique ids for {size} ranks: NCCL takes 1 to one per rank",
                    ids.len()
                ),
            });
        }
        let mut raw_ids: Vec<ncclUniqueId> = ids.iter().map(UniqueId::to_raw).collect();
        let (n, r, k) = (size as c_int, rank as c_int, ids.len() as c_int);
        init_via(nccl, ctx, (size, rank), config, call, |out, cfg| {
            // SAFETY: a valid out-pointer, `k` ids alive for the call, a lowered config
            // alive until the communicator is ready (init_via); the device's context is
            // current.
            unsafe { f(out, n, r, k, raw_ids.as_mut_ptr(), cfg) }
        })
    }
}

/// Whether `rank` of `size` should make one of `ids` unique ids for
/// [`Communicator::init_rank_scalable`], so that each id's bootstrap root runs with the
/// first rank of its block (NCCL's `rankHasRoot`: `ids` even blocks, the first
/// `size % ids` one rank longer). `false` for `ids == 0` or a rank out of range.
///
/// ```
/// use nccl_channel::scalable_root;
/// // 3 ids over 7 ranks: blocks 0-2, 3-4 and 5-6.
/// let roots: Vec<usize> = (0..7).filter(|&r| scalable_root(r, 7, 3)).collect();
/// assert_eq!(roots, [0, 3, 5]);
/// ```
#[must_use]
pub fn scalable_root(rank: usize, size: usize, ids: usize) -> bool {
    if ids == 0 || rank >= size {
        return false;
    }
    let (rmr, rpr) = (size % ids, size / ids);
    let rlim = rmr * (rpr + 1);
    if rank < rlim {
        rank.is_multiple_of(rpr + 1)
    } else {
        rpr != 0 && (rank - rlim).is_multiple_of(rpr)
    }
}
