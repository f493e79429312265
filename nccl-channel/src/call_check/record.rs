//! The record of a call that the ranks compare: what it holds, how it reads in an error,
//! and which rank's differs.

use nccl_sys::ncclDataType_t;

use crate::{Collective, NcclType, ReduceOp};

/// The record's mark: "nccl-channel call" in ASCII, 16 bytes.
const MARK: [u64; 2] = [
    u64::from_be_bytes(*b"nccl-cha"),
    u64::from_be_bytes(*b"nnel-cal"),
];

/// A record's words: the mark (two), the call's number, the collective, the element type,
/// the count, the reduction, the root.
pub(crate) const WORDS: usize = 8;

/// A word that says "none" (no reduction, no root).
const NONE: u64 = u64::MAX;

/// What a rank is about to call, as the ranks compare it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    collective: Collective,
    dtype: ncclDataType_t,
    /// The count NCCL is given (the per-rank share where NCCL takes one); `None` where it
    /// may differ between ranks (a variable all-to-all's).
    count: Option<usize>,
    op: u64,
    root: u64,
}

impl Call {
    /// A call of `collective` on `count` elements of `T`.
    pub(crate) fn new<T: NcclType>(collective: Collective, count: usize) -> Call {
        Call {
            collective,
            dtype: T::DTYPE,
            count: Some(count),
            op: NONE,
            root: NONE,
        }
    }

    /// A call whose count may differ between ranks.
    pub(crate) fn uncounted<T: NcclType>(collective: Collective) -> Call {
        Call {
            count: None,
            ..Call::new::<T>(collective, 0)
        }
    }

    /// With the reduction `op`.
    pub(crate) fn op<T>(self, op: &ReduceOp<T>) -> Call {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum(_) => 5,
        };
        Call { op: code, ..self }
    }

    /// With the root `root`.
    pub(crate) fn root(self, root: usize) -> Call {
        Call {
            root: root as u64,
            ..self
        }
    }

    /// The record of this call, number `seq` among the communicator's checked calls.
    pub(crate) fn record(&self, seq: u64) -> [u64; WORDS] {
        [
            MARK[0],
            MARK[1],
            seq,
            self.collective.code(),
            u64::from(self.dtype.0),
            self.count.map_or(NONE, |c| c as u64),
            self.op,
            self.root,
        ]
    }
}

/// A record in words, as a call: "all_gather of 4 int32 (call 3)". Anything that is not
/// a record is said to be so.
pub(crate) fn describe(r: &[u64]) -> String {
    let [m0, m1, seq, coll, dtype, count, op, root] = r else {
        return "a record of the wrong size".into();
    };
    if [*m0, *m1] != MARK {
        return "something that is not a checked call: is the checked mode on for every \
                rank?"
            .into();
    }
    let coll = Collective::from_code(*coll)
        .map_or_else(|| format!("collective {coll}"), |c| c.name().to_owned());
    let count = if *count == NONE {
        "its counts".to_owned()
    } else {
        count.to_string()
    };
    let mut extra = Vec::new();
    if *op != NONE {
        let name = ["sum", "prod", "max", "min", "avg", "premul_sum"]
            .get(*op as usize)
            .copied()
            .unwrap_or("an unknown op");
        extra.push(name.to_owned());
    }
    if *root != NONE {
        extra.push(format!("root {root}"));
    }
    extra.push(format!("call {seq}"));
    format!(
        "{coll} of {count} {} ({})",
        type_name(*dtype),
        extra.join(", ")
    )
}

/// An NCCL element type's name, as [`NcclType::NAME`] says it.
fn type_name(code: u64) -> String {
    const NAMES: [&str; 12] = [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
        "bfloat16", "fp8e4m3", "fp8e5m2",
    ];
    NAMES
        .get(code as usize)
        .map_or_else(|| format!("type {code}"), |n| (*n).to_owned())
}

/// Whether `got` holds a record of this exchange from every rank: the mark and the number
/// of `sent` in each (what the records say may differ; a failed or unfinished exchange
/// leaves something else there).
pub(crate) fn exchanged(sent: &[u64; WORDS], got: &[u64], ranks: usize) -> bool {
    got.len() == WORDS * ranks && got.chunks_exact(WORDS).all(|r| r[..3] == sent[..3])
}

/// The first rank whose record in `got` (every rank's, in rank order) differs from `sent`,
/// with what it called; `None` when all agree.
pub(crate) fn first_difference(
    sent: &[u64; WORDS],
    got: &[u64],
    ranks: usize,
) -> Option<(usize, String)> {
    if got.len() != WORDS * ranks {
        return Some((0, "a reply of the wrong size".into()));
    }
    got.chunks_exact(WORDS)
        .enumerate()
        .find(|(_, r)| *r != sent)
        .map(|(rank, r)| (rank, describe(r)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gathered(records: &[[u64; WORDS]]) -> Vec<u64> {
        records.concat()
    }

    #[test]
    fn a_record_names_the_call_it_describes() {
        let c = Call::new::<i32>(Collective::AllGather, 4).record(3);
        assert_eq!(describe(&c), "all_gather of 4 int32 (call 3)");
        let c = Call::new::<f32>(Collective::Reduce, 8)
            .op(&ReduceOp::<f32>::Max)
            .root(1)
            .record(0);
        assert_eq!(describe(&c), "reduce of 8 float32 (max, root 1, call 0)");
        let c = Call::uncounted::<u8>(Collective::AllToAllV).record(9);
        assert_eq!(describe(&c), "all_to_all_v of its counts uint8 (call 9)");
        assert!(describe(&[0; WORDS]).starts_with("something that is not a checked call"));
        assert_eq!(describe(&[0; 3]), "a record of the wrong size");
    }

    #[test]
    fn an_exchange_is_complete_when_every_rank_sent_a_record_of_it() {
        let mine = Call::new::<i32>(Collective::AllGather, 4).record(3);
        let other = Call::new::<u32>(Collective::AllReduce, 6).record(3);
        assert!(exchanged(&mine, &gathered(&[mine, other]), 2));
        // Another exchange's record, something else, or too few words: not this exchange.
        let earlier = Call::new::<i32>(Collective::AllGather, 4).record(2);
        assert!(!exchanged(&mine, &gathered(&[mine, earlier]), 2));
        assert!(!exchanged(&mine, &gathered(&[mine, [0; WORDS]]), 2));
        assert!(!exchanged(&mine, &gathered(&[mine]), 2));
        let mut marked = mine;
        marked[1] ^= 1;
        assert!(!exchanged(&mine, &gathered(&[marked, mine]), 2));
    }

    #[test]
    fn the_first_rank_whose_call_differs_is_named() {
        let mine = Call::new::<i32>(Collective::AllGather, 4).record(3);
        assert_eq!(first_difference(&mine, &gathered(&[mine, mine]), 2), None);
        // Each field of the call, and its number, tells calls apart.
        let others = [
            Call::new::<i32>(Collective::AllGather, 6).record(3),
            Call::new::<i32>(Collective::AllReduce, 4).record(3),
            Call::new::<u32>(Collective::AllGather, 4).record(3),
            Call::new::<i32>(Collective::AllGather, 4).root(0).record(3),
            Call::new::<i32>(Collective::AllGather, 4)
                .op(&ReduceOp::<i32>::Sum)
                .record(3),
            Call::new::<i32>(Collective::AllGather, 4).record(4),
        ];
        for other in others {
            let got = gathered(&[mine, mine, other]);
            assert_eq!(
                first_difference(&mine, &got, 3),
                Some((2, describe(&other)))
            );
        }
        assert_eq!(
            first_difference(&mine, &gathered(&[mine]), 2),
            Some((0, "a reply of the wrong size".into()))
        );
    }
}
