//! What ranks contribute (Kind, Op, Contrib, Done) and how the parts of a collective that agree move and reduce data (move_data): one rule for the in-process clique and the multi-process hub, so it sits below both.

use std::sync::{Arc, Mutex};

use crate::dtype::{self, V};
use nccl_sys::{ncclDataType_t, ncclRedOp_t, ncclResult_t};

/// What a rank asks its peers to do together: the collectives NCCL runs as one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
}

impl Kind {
    /// Every kind, in this order (the wire sends a kind as its place here).
    pub(crate) const ALL: [Kind; 8] = [
        Kind::AllReduce,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::Broadcast,
        Kind::Reduce,
        Kind::AllToAll,
        Kind::Gather,
        Kind::Scatter,
    ];

    /// The name nccl-channel's `Collective` gives it (`"all_gather"`).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::AllToAll => "all_to_all",
            Kind::Gather => "gather",
            Kind::Scatter => "scatter",
        }
    }
}

/// The collectives the simulator runs as one NCCL call each, by the names nccl-channel's
/// `Collective` gives them (`"all_gather"` for `ncclAllGather`); the others (sends and
/// receives, a variable-size all-to-all) are groups of sends and receives.
///
/// ```
/// assert!(nccl_mock::collectives().any(|c| c == "all_gather"));
/// assert!(!nccl_mock::collectives().any(|c| c == "sendrecv"));
/// ```
pub fn collectives() -> impl Iterator<Item = &'static str> {
    Kind::ALL.into_iter().map(Kind::name)
}

/// How elements combine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Op {
    Builtin(ncclRedOp_t),
    Avg,
    /// Pre-multiplied sum; this rank's scalar.
    PreMul(V),
}

impl Op {
    fn same_kind(&self, other: &Op) -> bool {
        match (self, other) {
            (Op::PreMul(_), Op::PreMul(_)) => true,
            (a, b) => a == b,
        }
    }
}

/// One rank's part of a collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Contrib {
    /// The C name of the rank's call, for reports.
    pub(crate) call: &'static str,
    pub(crate) kind: Kind,
    pub(crate) send: usize,
    pub(crate) recv: usize,
    pub(crate) count: usize,
    pub(crate) dtype: ncclDataType_t,
    pub(crate) op: Op,
    pub(crate) root: i32,
    /// Where its send and receive buffers lie among the communicator's symmetric windows
    /// (not shipped across processes: checked among the ranks of one process).
    pub(crate) placed: [Placement; 2],
}

/// Where a buffer of a rank's part lies among its communicator's symmetric windows
/// (`NCCL_WIN_COLL_SYMMETRIC`): NCCL's symmetric kernels reach a peer's buffer at the
/// same offset of the peer's window of the same place, so every rank's buffer must lie
/// there too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Not read or written on this rank (a rooted collective off its root), or unknown.
    #[default]
    Unused,
    /// In no symmetric window.
    Outside,
    /// Wholly inside the communicator's `window`-th window, at `offset`.
    Inside { window: u64, offset: u64 },
    /// Partly inside the `window`-th window, partly past its end.
    Straddles { window: u64 },
}

impl Placement {
    fn describe(self) -> String {
        match self {
            Placement::Unused => "is not used".into(),
            Placement::Outside => "lies in no symmetric window".into(),
            Placement::Inside { window, offset } => {
                format!("is at offset {offset} of window {window}")
            }
            Placement::Straddles { window } => format!("runs past the end of window {window}"),
        }
    }
}

/// Why the ranks' buffers of one collective are not symmetric where some of them lie in
/// a symmetric window (NCCL would reach the wrong memory of a peer): a sanitizer
/// finding, naming rank 0's buffer and the first that differs. `None`: symmetric, or no
/// symmetric window involved. As NCCL's own check (`NCCL_CHECK_MODE`'s global debug
/// mode) has it: a buffer must be in a symmetric window on every rank or on none, and
/// at the same place of the same window where every rank's part of it is the same (the
/// send buffer of an all-reduce, reduce-scatter, all-to-all or gather; the receive
/// buffer of an all-reduce, all-gather, all-to-all or scatter); an in-place all-gather's
/// send buffer, at each rank's own share, differs by design. A buffer that runs past
/// its window's end is always a finding.
pub(crate) fn asymmetry(parts: &[Contrib]) -> Option<String> {
    let first = parts.first()?;
    let same_place = [
        matches!(
            first.kind,
            Kind::AllReduce | Kind::ReduceScatter | Kind::AllToAll | Kind::Gather
        ),
        matches!(
            first.kind,
            Kind::AllGather | Kind::AllReduce | Kind::AllToAll | Kind::Scatter
        ),
    ];
    for (b, name) in ["sendbuff", "recvbuff"].into_iter().enumerate() {
        let used: Vec<(usize, Placement)> = parts
            .iter()
            .enumerate()
            .map(|(r, c)| (r, c.placed[b]))
            .filter(|(_, p)| *p != Placement::Unused)
            .collect();
        let Some(&(r0, p0)) = used.first() else {
            continue;
        };
        let windowed = |p: &Placement| !matches!(p, Placement::Outside);
        let differs = |p: &Placement| {
            windowed(p) != windowed(&p0)
                || matches!(p, Placement::Straddles { .. })
                || (same_place[b] && *p != p0)
        };
        if let Some(&(r, p)) = used.iter().find(|(_, p)| differs(p)) {
            let call = first.call;
            return Some(if r == r0 {
                format!("{call}: the {name} of rank {r} {}", p.describe())
            } else {
                format!(
                    "{call}: the ranks' {name}s are not symmetric: rank {r0}'s {}, rank {r}'s {}",
                    p0.describe(),
                    p.describe()
                )
            });
        }
    }
    None
}

/// Completion of one rank's part: `None` while pending.
pub(crate) type Done = Arc<Mutex<Option<ncclResult_t>>>;

/// Bytes of `count` elements of `dtype` (saturating: the driver refuses such a range).
pub(crate) fn bytes(count: usize, dtype: ncclDataType_t) -> usize {
    count.saturating_mul(dtype::size_of(dtype).unwrap_or(1))
}

/// Why a matched send and receive do not copy: either side withdrawn (`ncclRemoteError`)
/// or they disagree on the count or type (`ncclInvalidUsage`, on both sides). `None`:
/// they copy. One rule for both modes (the in-process clique and the hub).
pub(crate) fn p2p_refusal(
    (send_count, send_type, send_withdrawn): (usize, ncclDataType_t, bool),
    (recv_count, recv_type, recv_withdrawn): (usize, ncclDataType_t, bool),
) -> Option<ncclResult_t> {
    if send_withdrawn || recv_withdrawn {
        Some(ncclResult_t::ncclRemoteError)
    } else if send_count != recv_count || send_type != recv_type {
        Some(ncclResult_t::ncclInvalidUsage)
    } else {
        None
    }
}

/// Where a collective reads its ranks' inputs and writes their outputs: the simulated
/// device memory of one process (the clique's `Memory`), or the bytes the ranks of several processes
/// shipped to their hub. [`move_data`] serves both, so both modes compute the same.
pub(crate) trait Buffers {
    /// `len` bytes of rank `rank`'s send buffer; `None` if they cannot be read (the rank
    /// is then marked failed).
    fn input(&mut self, rank: usize, len: usize) -> Option<Vec<u8>>;

    /// Gives rank `rank`'s receive buffer `data`.
    fn output(&mut self, rank: usize, data: &[u8]);
}

/// Each rank's result given the ranks whose buffers failed: success, or
/// `ncclUnhandledCudaError` for a failed rank and `ncclRemoteError` for its peers.
pub(crate) fn results(failed: &[bool]) -> Vec<ncclResult_t> {
    let any = failed.iter().any(|f| *f);
    failed
        .iter()
        .map(|&f| match (any, f) {
            (false, _) => ncclResult_t::ncclSuccess,
            (true, true) => ncclResult_t::ncclUnhandledCudaError,
            (true, false) => ncclResult_t::ncclRemoteError,
        })
        .collect()
}

/// Reduces element-wise `inputs` (one per rank, `count` elements each) with the ranks' ops.
fn reduce(inputs: &[Vec<u8>], ops: &[Op], count: usize, t: ncclDataType_t) -> Vec<u8> {
    let n = inputs.len();
    let size = dtype::size_of(t).unwrap_or(1);
    // One rank: NCCL copies the input (`ncclLaunchOneRank`'s memcpy) for every op but a
    // pre-multiplied sum, which a float average is; nothing is rounded or saturated.
    let premul =
        |op: &Op| matches!(op, Op::PreMul(_)) || (*op == Op::Avg && dtype::is_float_type(t));
    if n == 1 && !premul(&ops[0]) {
        return inputs[0][..count * size].to_vec();
    }
    let mut out = vec![0u8; count * size];
    for i in 0..count {
        let term = |r: usize| {
            let x = dtype::get(t, &inputs[r], i);
            match ops[r] {
                Op::PreMul(s) => dtype::scale(t, x, s),
                Op::Avg if dtype::is_float_type(t) => dtype::scale(t, x, dtype::avg_scalar(t, n)),
                _ => x,
            }
        };
        let builtin = match ops[0] {
            Op::Builtin(b) => b,
            _ => ncclRedOp_t::ncclSum,
        };
        let mut acc = term(0);
        for r in 1..n {
            acc = dtype::combine(t, builtin, acc, term(r));
        }
        if ops[0] == Op::Avg && !dtype::is_float_type(t) {
            acc = dtype::divide(t, acc, n as i128);
        }
        dtype::put(t, &mut out, i, acc);
    }
    out
}

/// Why the ranks' parts (one per rank, in rank order) do not describe the same
/// collective (kind, count, type, root, op kind), naming rank 0's call and the first rank
/// whose call differs: "rank 0 calls ncclAllGather of 4 ncclInt32, rank 1 ncclAllGather
/// of 6 ncclInt32". `None`: they agree. If they do not, every rank fails with
/// `ncclInvalidUsage` and this is its `ncclGetLastError`.
pub(crate) fn disagreement(parts: &[Contrib]) -> Option<String> {
    let Some(first) = parts.first() else {
        return Some("no rank took part".into());
    };
    let same = |c: &Contrib| {
        c.kind == first.kind
            && c.count == first.count
            && c.dtype == first.dtype
            && c.root == first.root
            && c.op.same_kind(&first.op)
    };
    let (rank, other) = parts.iter().enumerate().find(|(_, c)| !same(c))?;
    Some(format!(
        "the ranks disagree on a collective: rank 0 calls {}, rank {rank} {}",
        first.summary(),
        other.summary()
    ))
}

impl Contrib {
    /// What the call asks, for a report: "ncclReduce of 4 ncclFloat32 (ncclSum, root 1)".
    fn summary(&self) -> String {
        let op = match self.op {
            Op::Builtin(b) => Some(match b {
                ncclRedOp_t::ncclSum => "ncclSum".to_owned(),
                ncclRedOp_t::ncclProd => "ncclProd".to_owned(),
                ncclRedOp_t::ncclMax => "ncclMax".to_owned(),
                ncclRedOp_t::ncclMin => "ncclMin".to_owned(),
                other => format!("op {}", other.0),
            }),
            Op::Avg => Some("ncclAvg".to_owned()),
            Op::PreMul(_) => Some("a pre-multiplied sum".to_owned()),
        };
        let reduces = matches!(
            self.kind,
            Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter
        );
        let rooted = matches!(
            self.kind,
            Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter
        );
        let mut extra = Vec::new();
        if let (true, Some(op)) = (reduces, op) {
            extra.push(op);
        }
        if rooted {
            extra.push(format!("root {}", self.root));
        }
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!(" ({})", extra.join(", "))
        };
        format!(
            "{} of {} {}{extra}",
            self.call,
            self.count,
            dtype::name(self.dtype)
        )
    }
}

/// Bytes rank `rank` of `n` reads of its send buffer in collective `c` (0: none), as
/// [`move_data`] reads them: the range a rank ships to the hub in the multi-process mode.
pub(crate) fn input_bytes(c: &Contrib, rank: usize, n: usize) -> usize {
    let root = rank == c.root.max(0) as usize;
    match c.kind {
        Kind::AllReduce | Kind::Reduce | Kind::AllGather | Kind::Gather => bytes(c.count, c.dtype),
        Kind::ReduceScatter | Kind::AllToAll => bytes(c.count.saturating_mul(n), c.dtype),
        Kind::Broadcast if root => bytes(c.count, c.dtype),
        Kind::Scatter if root => bytes(c.count.saturating_mul(n), c.dtype),
        Kind::Broadcast | Kind::Scatter => 0,
    }
}

/// Bytes [`move_data`] writes to rank `rank`'s receive buffer (0: none): what a rank of
/// the multi-process mode accepts from its hub.
pub(crate) fn output_bytes(c: &Contrib, rank: usize, n: usize) -> usize {
    let root = rank == c.root.max(0) as usize;
    match c.kind {
        Kind::AllReduce | Kind::Broadcast | Kind::ReduceScatter | Kind::Scatter => {
            bytes(c.count, c.dtype)
        }
        Kind::AllGather | Kind::AllToAll => bytes(c.count.saturating_mul(n), c.dtype),
        Kind::Reduce if root => bytes(c.count, c.dtype),
        Kind::Gather if root => bytes(c.count.saturating_mul(n), c.dtype),
        Kind::Reduce | Kind::Gather => 0,
    }
}

/// Reads every rank's `len` input bytes (each is read, so every illegal one is reported);
/// `None` if any is illegal.
fn read_all(mem: &mut impl Buffers, n: usize, len: usize) -> Option<Vec<Vec<u8>>> {
    let inputs: Vec<Option<Vec<u8>>> = (0..n).map(|r| mem.input(r, len)).collect();
    inputs.into_iter().collect()
}

/// The data movement of a collective whose parts agree ([`agree`], one per rank in rank
/// order); stops at the first illegal read, writing nothing.
pub(crate) fn move_data(mem: &mut impl Buffers, parts: &[Contrib]) {
    let Some(&first) = parts.first() else {
        return;
    };
    let n = parts.len();
    let (t, count) = (first.dtype, first.count);
    let size = dtype::size_of(t).unwrap_or(1);
    let root = first.root as usize;
    let ops: Vec<Op> = parts.iter().map(|p| p.op).collect();
    // Each input's length was checked against it, so it does not overflow.
    let chunk = count.saturating_mul(size);
    match first.kind {
        Kind::AllReduce | Kind::Reduce => {
            let Some(inputs) = read_all(mem, n, chunk) else {
                return;
            };
            let out = reduce(&inputs, &ops, count, t);
            for r in 0..n {
                if first.kind == Kind::AllReduce || r == root {
                    mem.output(r, &out);
                }
            }
        }
        Kind::ReduceScatter => {
            let Some(inputs) = read_all(mem, n, chunk * n) else {
                return;
            };
            for r in 0..n {
                let part: Vec<Vec<u8>> = inputs
                    .iter()
                    .map(|i| i[r * chunk..(r + 1) * chunk].to_vec())
                    .collect();
                mem.output(r, &reduce(&part, &ops, count, t));
            }
        }
        Kind::AllGather | Kind::Gather => {
            let Some(inputs) = read_all(mem, n, chunk) else {
                return;
            };
            let all = inputs.concat();
            for r in 0..n {
                if first.kind == Kind::AllGather || r == root {
                    mem.output(r, &all);
                }
            }
        }
        Kind::Broadcast => {
            let Some(data) = mem.input(root, chunk) else {
                return;
            };
            for r in 0..n {
                mem.output(r, &data);
            }
        }
        Kind::Scatter => {
            let Some(data) = mem.input(root, chunk * n) else {
                return;
            };
            for r in 0..n {
                mem.output(r, &data[r * chunk..(r + 1) * chunk]);
            }
        }
        Kind::AllToAll => {
            let Some(inputs) = read_all(mem, n, chunk * n) else {
                return;
            };
            for r in 0..n {
                let out: Vec<u8> = inputs
                    .iter()
                    .flat_map(|i| i[r * chunk..(r + 1) * chunk].iter().copied())
                    .collect();
                mem.output(r, &out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_sys::ncclDataType_t as D;

    fn part(kind: Kind, call: &'static str, count: usize, dtype: D, op: Op, root: i32) -> Contrib {
        Contrib {
            call,
            kind,
            send: 0,
            recv: 0,
            count,
            dtype,
            op,
            root,
            placed: [Placement::Unused; 2],
        }
    }

    #[test]
    fn buffers_in_symmetric_windows_must_sit_alike_on_every_rank() {
        let sum = Op::Builtin(ncclRedOp_t::ncclSum);
        let at = |send: Placement, recv: Placement| Contrib {
            placed: [send, recv],
            ..part(Kind::AllReduce, "ncclAllReduce", 4, D::ncclFloat32, sum, 0)
        };
        let inside = |window, offset| Placement::Inside { window, offset };
        let out = Placement::Outside;
        // No symmetric window, or the same place everywhere: nothing to say.
        assert_eq!(asymmetry(&[at(out, out), at(out, out)]), None);
        let same = at(inside(1, 64), inside(2, 0));
        assert_eq!(asymmetry(&[same, same, same]), None);
        // Unused buffers (off the root) are left out.
        assert_eq!(
            asymmetry(&[same, at(Placement::Unused, inside(2, 0))]),
            None
        );
        let cases = [
            (
                at(inside(1, 128), inside(2, 0)),
                "ncclAllReduce: the ranks' sendbuffs are not symmetric: rank 0's is at offset 64 \
                 of window 1, rank 1's is at offset 128 of window 1",
            ),
            (
                at(inside(1, 64), inside(3, 0)),
                "ncclAllReduce: the ranks' recvbuffs are not symmetric: rank 0's is at offset 0 \
                 of window 2, rank 1's is at offset 0 of window 3",
            ),
            (
                at(out, inside(2, 0)),
                "ncclAllReduce: the ranks' sendbuffs are not symmetric: rank 0's is at offset 64 \
                 of window 1, rank 1's lies in no symmetric window",
            ),
            (
                at(inside(1, 64), Placement::Straddles { window: 2 }),
                "ncclAllReduce: the ranks' recvbuffs are not symmetric: rank 0's is at offset 0 \
                 of window 2, rank 1's runs past the end of window 2",
            ),
        ];
        for (other, want) in cases {
            assert_eq!(asymmetry(&[same, other]).as_deref(), Some(want));
        }
        assert_eq!(
            asymmetry(&[at(Placement::Straddles { window: 1 }, out)]).as_deref(),
            Some("ncclAllReduce: the sendbuff of rank 0 runs past the end of window 1")
        );
        // An in-place all-gather sends each rank's own share: its send offsets differ, its
        // receive buffers do not.
        let gather = |send_at, recv_at| Contrib {
            placed: [inside(1, send_at), inside(1, recv_at)],
            ..part(Kind::AllGather, "ncclAllGather", 4, D::ncclFloat32, sum, 0)
        };
        assert_eq!(asymmetry(&[gather(0, 0), gather(16, 0)]), None);
        assert!(asymmetry(&[gather(0, 0), gather(16, 16)]).is_some());
        // A broadcast's buffers need only be windowed alike.
        let bcast = |recv| Contrib {
            placed: [Placement::Unused, recv],
            ..part(Kind::Broadcast, "ncclBroadcast", 4, D::ncclFloat32, sum, 0)
        };
        assert_eq!(
            asymmetry(&[bcast(inside(1, 0)), bcast(inside(1, 64))]),
            None
        );
        assert_eq!(
            asymmetry(&[bcast(inside(1, 0)), bcast(out)]).as_deref(),
            Some(
                "ncclBroadcast: the ranks' recvbuffs are not symmetric: rank 0's is at offset 0 \
                 of window 1, rank 1's lies in no symmetric window"
            )
        );
    }

    #[test]
    fn a_disagreement_names_rank_0s_call_and_the_first_that_differs() {
        let sum = Op::Builtin(ncclRedOp_t::ncclSum);
        let gather = |n| part(Kind::AllGather, "ncclAllGather", n, D::ncclInt32, sum, 0);
        assert_eq!(disagreement(&[gather(4), gather(4), gather(4)]), None);
        assert_eq!(
            disagreement(&[gather(4), gather(4), gather(6)]).as_deref(),
            Some(
                "the ranks disagree on a collective: rank 0 calls ncclAllGather of 4 \
                 ncclInt32, rank 2 ncclAllGather of 6 ncclInt32"
            )
        );
        assert_eq!(disagreement(&[]).as_deref(), Some("no rank took part"));
        // Each field tells calls apart; reductions name their op, rooted calls their root.
        let reduce = |op, root| part(Kind::Reduce, "ncclReduce", 2, D::ncclFloat32, op, root);
        let cases = [
            (
                reduce(Op::Builtin(ncclRedOp_t::ncclProd), 0),
                "ncclReduce of 2 ncclFloat32 (ncclProd, root 0)",
            ),
            (
                reduce(Op::Builtin(ncclRedOp_t::ncclMax), 0),
                "ncclReduce of 2 ncclFloat32 (ncclMax, root 0)",
            ),
            (
                reduce(Op::Builtin(ncclRedOp_t::ncclMin), 0),
                "ncclReduce of 2 ncclFloat32 (ncclMin, root 0)",
            ),
            (
                reduce(Op::Builtin(ncclRedOp_t(9)), 0),
                "ncclReduce of 2 ncclFloat32 (op 9, root 0)",
            ),
            (
                reduce(Op::Avg, 0),
                "ncclReduce of 2 ncclFloat32 (ncclAvg, root 0)",
            ),
            (
                reduce(Op::PreMul(V::F(0.5)), 0),
                "ncclReduce of 2 ncclFloat32 (a pre-multiplied sum, root 0)",
            ),
            (
                reduce(sum, 1),
                "ncclReduce of 2 ncclFloat32 (ncclSum, root 1)",
            ),
            (
                part(Kind::Broadcast, "ncclBroadcast", 2, D::ncclFloat32, sum, 0),
                "ncclBroadcast of 2 ncclFloat32 (root 0)",
            ),
            (
                part(Kind::AllReduce, "ncclAllReduce", 2, D::ncclFloat32, sum, 0),
                "ncclAllReduce of 2 ncclFloat32 (ncclSum)",
            ),
            (
                reduce(sum, 0).with_dtype(D::ncclUint8),
                "ncclReduce of 2 ncclUint8 (ncclSum, root 0)",
            ),
        ];
        for (other, said) in cases {
            let why = disagreement(&[reduce(sum, 0), other]).unwrap();
            assert_eq!(
                why,
                format!(
                    "the ranks disagree on a collective: rank 0 calls ncclReduce of 2 \
                     ncclFloat32 (ncclSum, root 0), rank 1 {said}"
                )
            );
        }
    }

    impl Contrib {
        fn with_dtype(self, dtype: D) -> Contrib {
            Contrib { dtype, ..self }
        }
    }

    /// NCCL's float `ncclAvg` is a pre-multiplied sum by 1/n rounded to the type
    /// (`__float2half(float(1.0/nRanks))`, ...): with 3 ranks, 5 on rank 0 and 0 elsewhere
    /// averages to round(5 * round(1/3)), not round(5/3).
    #[test]
    fn float_avg_premultiplies_by_one_over_n_rounded_to_the_type() {
        for (t, want) in [
            (D::ncclFloat16, 1.666015625),
            (D::ncclBfloat16, 1.671875),
            (D::ncclFloat8e4m3, 1.75),
            (D::ncclFloat8e5m2, 1.5),
        ] {
            let input = |x: f64| {
                let mut b = vec![0u8; dtype::size_of(t).unwrap_or(1)];
                dtype::put(t, &mut b, 0, V::F(x));
                b
            };
            let out = reduce(&[input(5.0), input(0.0), input(0.0)], &[Op::Avg; 3], 1, t);
            assert_eq!(dtype::get(t, &out, 0), V::F(want), "{t:?}");
        }
    }
}
