//! Which collective a call is ([`Collective`]): the one list of them, for the checked
//! mode's records and its errors.

use std::fmt;

/// One of NCCL's collectives, as [`Communicator`](crate::Communicator)'s methods name them
/// (an in-place form is the same collective).
///
/// ```
/// use nccl_channel::Collective;
/// assert_eq!(Collective::AllGather.name(), "all_gather");
/// assert_eq!(Collective::ALL.len(), 9);
/// assert_eq!(Collective::ALL.iter().filter(|c| c.has_root()).count(), 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
}

impl Collective {
    /// Every collective, in this order.
    pub const ALL: [Collective; 9] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Gather,
        Collective::Scatter,
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
        }
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
        Self::ALL.iter().position(|c| *c == self).unwrap_or(0) as u64
    }

    /// The collective at position `code` of [`ALL`](Self::ALL).
    pub(crate) fn from_code(code: u64) -> Option<Collective> {
        Self::ALL.get(usize::try_from(code).ok()?).copied()
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
    }

    #[test]
    fn every_collective_round_trips_through_its_code() {
        for c in Collective::ALL {
            assert_eq!(Collective::from_code(c.code()), Some(c));
        }
        assert_eq!(Collective::from_code(Collective::ALL.len() as u64), None);
        assert_eq!(Collective::from_code(u64::MAX), None);
    }
}
