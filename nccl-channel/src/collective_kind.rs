//! Which collective a call is ([`Collective`]): the one list of them, which the pool's
//! table, the checked mode's records, the errors and the benchmark all use.

use std::fmt;

/// One of NCCL's collectives, as [`Communicator`](crate::Communicator)'s methods name them
/// (an in-place form is the same collective), and the pairwise sends and receives, which
/// NCCL, nccl-tests and the pool's table count as one more (`sendrecv`). They order as
/// [`ALL`](Self::ALL) lists them.
///
/// ```
/// use nccl_channel::Collective;
/// assert_eq!(Collective::AllGather.name(), "all_gather");
/// assert_eq!("all_gather".parse(), Ok(Collective::AllGather));
/// assert_eq!(Collective::ALL.len(), 10);
/// assert_eq!(Collective::ALL.iter().filter(|c| c.has_root()).count(), 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Collective {
    /// [`all_reduce`](crate::Communicator::all_reduce).
    AllReduce,
    /// [`all_gather`](crate::Communicator::all_gather).
    AllGather,
    /// [`reduce_scatter`](crate::Communicator::reduce_scatter).
    ReduceScatter,
    /// [`broadcast`](crate::Communicator::broadcast).
    Broadcast,
    /// [`reduce`](crate::Communicator::reduce).
    Reduce,
    /// [`all_to_all`](crate::Communicator::all_to_all).
    AllToAll,
    /// [`all_to_all_v`](crate::Communicator::all_to_all_v).
    AllToAllV,
    /// [`gather`](crate::Communicator::gather).
    Gather,
    /// [`scatter`](crate::Communicator::scatter).
    Scatter,
    /// [`send`](crate::Communicator::send) and [`recv`](crate::Communicator::recv):
    /// between two ranks, not all.
    SendRecv,
}

impl Collective {
    /// Every collective, in this order.
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Gather,
        Collective::Scatter,
        Collective::SendRecv,
    ];

    /// The method's name: `"all_gather"`.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_all_v",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// The collective named `name` (as [`name`](Self::name) says it).
    pub fn from_name(name: &str) -> Option<Collective> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether every rank takes part (all but [`SendRecv`](Self::SendRecv)).
    pub const fn involves_every_rank(self) -> bool {
        !matches!(self, Collective::SendRecv)
    }

    /// Whether it combines the ranks' elements with a [`ReduceOp`](crate::ReduceOp).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether one rank, the root, sends or receives for all.
    pub const fn has_root(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// Its position in [`ALL`](Self::ALL), as the checked mode's records carry it.
    pub(crate) fn code(self) -> u64 {
        self as u64
    }

    /// The collective at position `code` of [`ALL`](Self::ALL).
    pub(crate) fn from_code(code: u64) -> Option<Collective> {
        Self::ALL.get(usize::try_from(code).ok()?).copied()
    }
}

/// A method as its errors name it (`"all_gather_in_place"`), and the collective it runs,
/// whose rules of the pool's table its buffers follow (`None`: a one-sided operation,
/// which the table has no rules for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Method {
    pub(crate) name: &'static str,
    pub(crate) collective: Option<Collective>,
}

impl Method {
    /// The method `name` of the collective `collective`.
    pub(crate) const fn of(collective: Collective, name: &'static str) -> Method {
        Method {
            name,
            collective: Some(collective),
        }
    }

    /// The method `name`, which runs no collective.
    pub(crate) const fn other(name: &'static str) -> Method {
        Method {
            name,
            collective: None,
        }
    }
}

impl std::str::FromStr for Collective {
    type Err = UnknownCollective;

    /// The collective of that [`name`](Collective::name).
    fn from_str(s: &str) -> Result<Collective, UnknownCollective> {
        Collective::from_name(s).ok_or_else(|| UnknownCollective(s.to_owned()))
    }
}

/// A name that is no [`Collective`]'s; it prints the names there are.
///
/// ```
/// use nccl_channel::Collective;
/// let e = "allgather".parse::<Collective>().unwrap_err();
/// assert!(e.to_string().starts_with("unknown collective \"allgather\" (one of all_reduce, "));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown collective {0:?} (one of {names})", names = Collective::names())]
pub struct UnknownCollective(pub String);

impl Collective {
    /// The names, comma-separated, in [`ALL`](Self::ALL)'s order.
    fn names() -> String {
        Self::ALL.map(Collective::name).join(", ")
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reductions_and_the_rooted_collectives_are_these() {
        let reduces: Vec<_> = Collective::ALL
            .into_iter()
            .filter(|c| c.reduces())
            .collect();
        assert_eq!(
            reduces,
            [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::Reduce
            ]
        );
        let rooted: Vec<_> = Collective::ALL
            .into_iter()
            .filter(|c| c.has_root())
            .collect();
        assert_eq!(
            rooted,
            [
                Collective::Broadcast,
                Collective::Reduce,
                Collective::Gather,
                Collective::Scatter
            ]
        );
        assert_eq!(Collective::AllToAllV.to_string(), "all_to_all_v");
        let pairwise: Vec<_> = Collective::ALL
            .into_iter()
            .filter(|c| !c.involves_every_rank())
            .collect();
        assert_eq!(pairwise, [Collective::SendRecv]);
    }

    #[test]
    fn every_collective_is_found_by_its_name_and_no_other() {
        for c in Collective::ALL {
            assert_eq!(Collective::from_name(c.name()), Some(c));
            assert_eq!(c.name().parse(), Ok(c));
        }
        for bad in ["", "allgather", "All_Gather", "send", "all_gather_in_place"] {
            assert_eq!(Collective::from_name(bad), None, "{bad}");
            assert_eq!(
                bad.parse::<Collective>(),
                Err(UnknownCollective(bad.into()))
            );
        }
    }

    /// The simulator names the collectives it runs as one NCCL call as this list does:
    /// all of them but the two that are groups of sends and receives.
    #[test]
    fn the_simulator_runs_the_single_call_collectives_by_these_names() {
        let single_call: Vec<&str> = Collective::ALL
            .into_iter()
            .filter(|c| !matches!(c, Collective::AllToAllV | Collective::SendRecv))
            .map(Collective::name)
            .collect();
        assert_eq!(nccl_mock::collectives().collect::<Vec<_>>(), single_call);
    }

    #[test]
    fn every_collective_round_trips_through_its_code() {
        for (i, c) in Collective::ALL.into_iter().enumerate() {
            assert_eq!(c.code(), i as u64, "{c} stands at its code in ALL");
            assert_eq!(Collective::from_code(c.code()), Some(c));
        }
        assert_eq!(Collective::from_code(Collective::ALL.len() as u64), None);
        assert_eq!(Collective::from_code(u64::MAX), None);
    }
}
