//! World size and rank, from code or from the launcher's environment.

use crate::{Error, Result};

/// One launcher's variables: world size, rank, and (optionally) local rank.
///
/// [`ENV_FAMILIES`] lists them in the order [`World::from_env`] tries them:
///
/// ```
/// use nccl_channel::ENV_FAMILIES;
/// let torchrun = ENV_FAMILIES.iter().find(|f| f.launcher == "torchrun").expect("listed");
/// assert_eq!((torchrun.size, torchrun.rank, torchrun.local_rank), ("WORLD_SIZE", "RANK", Some("LOCAL_RANK")));
/// let order: Vec<_> = ENV_FAMILIES.iter().map(|f| f.launcher).collect();
/// assert_eq!(order, ["nccl-channel", "IREE", "torchrun", "Open MPI", "PMI", "Slurm"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvFamily {
    /// Who sets these variables.
    pub launcher: &'static str,
    /// The world-size variable.
    pub size: &'static str,
    /// The rank variable.
    pub rank: &'static str,
    /// The local-rank variable, if the launcher has one.
    pub local_rank: Option<&'static str>,
}

/// The environment variables read, in precedence order: the first family whose size
/// variable is set decides; the others are then not read.
pub const ENV_FAMILIES: &[EnvFamily] = &[
    EnvFamily {
        launcher: "nccl-channel",
        size: "NCCL_CHANNEL_NPROCS",
        rank: "NCCL_CHANNEL_PROCID",
        local_rank: Some("NCCL_CHANNEL_LOCAL_PROCID"),
    },
    EnvFamily {
        launcher: "IREE",
        size: "IREE_CUDA_NCCL_NPROCS",
        rank: "IREE_CUDA_NCCL_PROCID",
        local_rank: None,
    },
    EnvFamily {
        launcher: "torchrun",
        size: "WORLD_SIZE",
        rank: "RANK",
        local_rank: Some("LOCAL_RANK"),
    },
    EnvFamily {
        launcher: "Open MPI",
        size: "OMPI_COMM_WORLD_SIZE",
        rank: "OMPI_COMM_WORLD_RANK",
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
    },
    EnvFamily {
        launcher: "PMI",
        size: "PMI_SIZE",
        rank: "PMI_RANK",
        local_rank: None,
    },
    EnvFamily {
        launcher: "Slurm",
        size: "SLURM_NTASKS",
        rank: "SLURM_PROCID",
        local_rank: Some("SLURM_LOCALID"),
    },
];

/// This process's place in the world.
///
/// Size and rank only: how the ranks then agree on a unique id is [`IdSource`]'s choice
/// (by default `NCCL_COMM_ID`, else the launcher's rendezvous, which
/// [`Rendezvous::from_env`] derives from this world's [`source`](World::source) and the
/// launcher's other variables).
///
/// ```
/// use nccl_channel::World;
/// // From code: rank 2 of 4, on this node's device 0.
/// let w = World::new(4, 2)?.with_local_rank(0);
/// assert_eq!((w.size, w.rank, w.default_device(), w.source), (4, 2, 0, "code"));
///
/// // From a launcher's variables, here torchrun's given as a list (`World::from_env`
/// // reads the process's own).
/// let env = [("WORLD_SIZE", "8"), ("RANK", "5"), ("LOCAL_RANK", "1")];
/// let lookup = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
/// let w = World::from_lookup(lookup)?.expect("torchrun's variables are set");
/// assert_eq!(w, World { size: 8, rank: 5, local_rank: Some(1), source: "torchrun" });
///
/// // Nothing set: no world, so no NCCL needed.
/// assert_eq!(World::from_lookup(|_| None)?, None);
/// # Ok::<(), nccl_channel::Error>(())
/// ```
///
/// [`IdSource`]: crate::IdSource
/// [`Rendezvous::from_env`]: crate::Rendezvous::from_env
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    /// Number of ranks (at least 1).
    pub size: usize,
    /// This process's rank, below `size`.
    pub rank: usize,
    /// This process's rank on its node, when the launcher says.
    pub local_rank: Option<usize>,
    /// Where it came from: `"code"` or a launcher's name ([`EnvFamily::launcher`]); it
    /// picks the row of the rendezvous rule ([`Rendezvous::from_lookup`](crate::Rendezvous::from_lookup)).
    pub source: &'static str,
}

impl World {
    /// A world given in code. Errors when `size` is 0 or `rank >= size`.
    pub fn new(size: usize, rank: usize) -> Result<World> {
        if size == 0 {
            return Err(Error::InvalidArgument {
                what: "World::new",
                problem: "the world size must be at least 1".into(),
            });
        }
        if rank >= size {
            return Err(Error::InvalidRank {
                what: "World::new",
                rank,
                size,
            });
        }
        Ok(World {
            size,
            rank,
            local_rank: None,
            source: "code",
        })
    }

    /// Sets the local rank (the default device ordinal).
    #[must_use = "it returns the changed world and leaves the original alone"]
    pub fn with_local_rank(mut self, local_rank: usize) -> World {
        self.local_rank = Some(local_rank);
        self
    }

    /// The device ordinal this rank uses by default: the local rank, else the rank.
    #[must_use]
    pub fn default_device(&self) -> usize {
        self.local_rank.unwrap_or(self.rank)
    }

    /// Reads the process environment ([`ENV_FAMILIES`]). `Ok(None)`: no world is
    /// configured (no size variable set, or a size of 0), so NCCL is not needed.
    pub fn from_env() -> Result<Option<World>> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`World::from_env`], reading variables through `lookup` (for tests and for
    /// programs that keep their configuration elsewhere).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<World>> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        for fam in ENV_FAMILIES {
            let Some(size_text) = get(fam.size) else {
                // Our own and IREE's rank variables mean nothing without their size.
                if (fam.launcher == "nccl-channel" || fam.launcher == "IREE")
                    && let Some(r) = get(fam.rank)
                {
                    return Err(Error::Env {
                        variable: fam.rank.into(),
                        value: r,
                        problem: format!("it is set but {} is not; set both", fam.size),
                    });
                }
                continue;
            };
            let size = parse(fam.size, &size_text)?;
            if size == 0 {
                return Ok(None);
            }
            let Some(rank_text) = get(fam.rank) else {
                return Err(Error::Env {
                    variable: fam.size.into(),
                    value: size_text,
                    problem: format!("it is set but {} is not; set both", fam.rank),
                });
            };
            let rank = parse(fam.rank, &rank_text)?;
            if rank >= size {
                return Err(Error::Env {
                    variable: fam.rank.into(),
                    value: rank_text,
                    problem: format!("the rank must be below {}={size}", fam.size),
                });
            }
            let local_rank = match fam.local_rank.and_then(|v| get(v).map(|t| (v, t))) {
                Some((var, text)) => Some(parse(var, &text)?),
                None => None,
            };
            return Ok(Some(World {
                size,
                rank,
                local_rank,
                source: fam.launcher,
            }));
        }
        Ok(None)
    }
}

fn parse(variable: &str, text: &str) -> Result<usize> {
    crate::decimal::parse_decimal::<usize>(text.trim()).ok_or_else(|| Error::Env {
        variable: variable.into(),
        value: text.into(),
        problem: "expected a non-negative integer".into(),
    })
}
