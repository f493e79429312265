//! What a rank is about to do, as the ranks compare it in an exchange (exchange/): a
//! collective of the program's ([`Call`]) or one of the crate's own agreements; how it
//! reads in an error, and which rank's differs.

use nccl_sys::ncclDataType_t;

use crate::exchange::{PAYLOAD, Payload};
use crate::{Collective, NcclType, ReduceOp};

/// A word that says "none" (no reduction, no root, not in a symmetric window).
const NONE: u64 = u64::MAX;

/// The kind word of an agreement: this plus its topic's number (collectives are below).
const AGREEMENT: u64 = 1 << 32;

/// The kind word of a barrier (an all-reduce of one element of the crate's, which must not
/// be taken for a program's).
const BARRIER: u64 = AGREEMENT - 1;

/// Where a buffer lies in a symmetric window, as a word: the window's number above this
/// many bits, the offset below.
const PLACE_SHIFT: u32 = 40;

/// The payload's words.
const KIND: usize = 0;
const DTYPE: usize = 1;
/// The count of a call; the value of an agreement (which may differ between ranks).
const COUNT: usize = 2;
const OP: usize = 3;
const ROOT: usize = 4;
const SEND_AT: usize = 5;
const RECV_AT: usize = 6;

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
    /// Where the send and receive buffers lie in symmetric windows: the window's number
    /// among the communicator's and the offset in bytes from its start (`NONE`: not in
    /// one). NCCL's symmetric kernels need the same window and offset on every rank.
    send_at: u64,
    recv_at: u64,
    /// A barrier's all-reduce, told apart from a program's.
    barrier: bool,
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
            send_at: NONE,
            recv_at: NONE,
            barrier: false,
        }
    }

    /// A barrier: its all-reduce of one `i32`, named as the barrier it is.
    pub(crate) fn barrier() -> Call {
        Call {
            barrier: true,
            ..Call::new::<i32>(Collective::AllReduce, 1).op(&ReduceOp::<i32>::Sum)
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

    /// With where the buffers lie in symmetric windows (a window's number and an offset;
    /// `None`: not in one).
    pub(crate) fn symmetric_at(self, send: Option<(u64, u64)>, recv: Option<(u64, u64)>) -> Call {
        let word = |at: Option<(u64, u64)>| {
            at.map_or(NONE, |(place, offset)| place << PLACE_SHIFT | offset)
        };
        Call {
            send_at: word(send),
            recv_at: word(recv),
            ..self
        }
    }

    /// The words the ranks compare.
    pub(crate) fn payload(&self) -> Payload {
        let mut p = [NONE; PAYLOAD];
        p[KIND] = if self.barrier {
            BARRIER
        } else {
            self.collective.code()
        };
        p[DTYPE] = u64::from(self.dtype.0);
        p[COUNT] = self.count.map_or(NONE, |c| c as u64);
        p[OP] = self.op;
        p[ROOT] = self.root;
        p[SEND_AT] = self.send_at;
        p[RECV_AT] = self.recv_at;
        p
    }
}

/// The payload of an agreement on `topic` (its number and its name) with this rank's
/// `value`.
pub(crate) fn agreement(topic: u64, value: u64) -> Payload {
    let mut p = [NONE; PAYLOAD];
    p[KIND] = AGREEMENT + topic;
    p[COUNT] = value;
    p
}

/// The value of an agreement's payload.
pub(crate) fn value(p: &Payload) -> u64 {
    p[COUNT]
}

/// The names of the agreements' topics, by number (topic.rs's `Topic`).
pub(crate) type TopicName = fn(u64) -> Option<&'static str>;

/// A payload in words, as a call: "all_gather of 4 int32 (call 3)", or "an agreement on a
/// window's size (call 3)"; `seq` is the exchange's number.
pub(crate) fn describe(p: &Payload, seq: u64, topic: TopicName) -> String {
    if p[KIND] >= AGREEMENT {
        let name = topic(p[KIND] - AGREEMENT).unwrap_or("something unknown");
        return format!("the crate's agreement on {name} (call {seq})");
    }
    if p[KIND] == BARRIER {
        return format!("barrier (call {seq})");
    }
    let coll = Collective::from_code(p[KIND]).map_or_else(
        || format!("collective {}", p[KIND]),
        |c| c.name().to_owned(),
    );
    let count = if p[COUNT] == NONE {
        "its counts".to_owned()
    } else {
        p[COUNT].to_string()
    };
    let mut extra = Vec::new();
    if p[OP] != NONE {
        let name = ["sum", "prod", "max", "min", "avg", "premul_sum"]
            .get(p[OP] as usize)
            .copied()
            .unwrap_or("an unknown op");
        extra.push(name.to_owned());
    }
    if p[ROOT] != NONE {
        extra.push(format!("root {}", p[ROOT]));
    }
    for (word, side) in [(SEND_AT, "send"), (RECV_AT, "recv")] {
        if p[word] != NONE {
            let (place, offset) = (p[word] >> PLACE_SHIFT, p[word] & ((1 << PLACE_SHIFT) - 1));
            extra.push(format!(
                "{side} at byte {offset} of symmetric window {place}"
            ));
        }
    }
    extra.push(format!("call {seq}"));
    format!(
        "{coll} of {count} {} ({})",
        type_name(p[DTYPE]),
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

/// The first rank whose payload in `got` (every rank's, in rank order) differs from
/// `mine`, with it; `None` when all agree. An agreement's value may differ.
pub(crate) fn first_difference(mine: &Payload, got: &[Payload]) -> Option<(usize, Payload)> {
    let agreement = mine[KIND] >= AGREEMENT;
    got.iter()
        .enumerate()
        .find(|(_, p)| (0..PAYLOAD).any(|w| !(agreement && w == COUNT) && p[w] != mine[w]))
        .map(|(rank, p)| (rank, *p))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn topic(n: u64) -> Option<&'static str> {
        (n == 1).then_some("a window's size")
    }

    #[test]
    fn a_payload_names_the_call_it_describes() {
        let c = Call::new::<i32>(Collective::AllGather, 4).payload();
        assert_eq!(describe(&c, 3, topic), "all_gather of 4 int32 (call 3)");
        let c = Call::new::<f32>(Collective::Reduce, 8)
            .op(&ReduceOp::<f32>::Max)
            .root(1)
            .payload();
        assert_eq!(
            describe(&c, 0, topic),
            "reduce of 8 float32 (max, root 1, call 0)"
        );
        let c = Call::uncounted::<u8>(Collective::AllToAllV).payload();
        assert_eq!(
            describe(&c, 9, topic),
            "all_to_all_v of its counts uint8 (call 9)"
        );
        let c = Call::new::<f32>(Collective::AllReduce, 2)
            .symmetric_at(Some((1, 0)), Some((2, 256)))
            .payload();
        assert_eq!(
            describe(&c, 1, topic),
            "all_reduce of 2 float32 (send at byte 0 of symmetric window 1, recv at byte 256 \
             of symmetric window 2, call 1)"
        );
        assert_eq!(
            describe(&Call::barrier().payload(), 4, topic),
            "barrier (call 4)"
        );
        assert_eq!(
            describe(&agreement(1, 4096), 5, topic),
            "the crate's agreement on a window's size (call 5)"
        );
        assert_eq!(
            describe(&agreement(9, 0), 5, topic),
            "the crate's agreement on something unknown (call 5)"
        );
    }

    #[test]
    fn the_first_rank_whose_call_differs_is_named() {
        let mine = Call::new::<i32>(Collective::AllGather, 4).payload();
        assert_eq!(first_difference(&mine, &[mine, mine]), None);
        // Each field of the call tells calls apart.
        let others = [
            Call::new::<i32>(Collective::AllGather, 6),
            Call::new::<i32>(Collective::AllReduce, 4),
            Call::new::<u32>(Collective::AllGather, 4),
            Call::new::<i32>(Collective::AllGather, 4).root(0),
            Call::new::<i32>(Collective::AllGather, 4).op(&ReduceOp::<i32>::Sum),
            Call::new::<i32>(Collective::AllGather, 4).symmetric_at(Some((1, 0)), None),
            Call::new::<i32>(Collective::AllGather, 4).symmetric_at(None, Some((1, 0))),
        ];
        for other in others {
            let other = other.payload();
            assert_eq!(
                first_difference(&mine, &[mine, mine, other]),
                Some((2, other))
            );
        }
        // The same offset of another window, and a barrier against a program's all-reduce
        // of one element.
        let here = Call::new::<i32>(Collective::AllGather, 4).symmetric_at(Some((1, 64)), None);
        let there = Call::new::<i32>(Collective::AllGather, 4).symmetric_at(Some((2, 64)), None);
        assert!(first_difference(&here.payload(), &[there.payload()]).is_some());
        let one = Call::new::<i32>(Collective::AllReduce, 1).op(&ReduceOp::<i32>::Sum);
        assert!(first_difference(&Call::barrier().payload(), &[one.payload()]).is_some());
        assert_eq!(
            first_difference(&mine, &[agreement(1, 4)]),
            Some((0, agreement(1, 4)))
        );
    }

    #[test]
    fn agreements_differ_by_topic_not_by_value() {
        let mine = agreement(1, 4096);
        assert_eq!(first_difference(&mine, &[mine, agreement(1, 8)]), None);
        assert_eq!(
            first_difference(&mine, &[mine, agreement(2, 4096)]),
            Some((1, agreement(2, 4096)))
        );
        let call = Call::new::<u64>(Collective::AllGather, 4096).payload();
        assert_eq!(first_difference(&mine, &[call]), Some((0, call)));
    }
}
