//! The collectives `-c` names: what each takes and moves (nccl-tests' conventions), and
//! how each is called.

use nccl_channel::{Collective, Result, group};

use crate::element::{BenchVal, op_of};
use crate::memory::Bufs;
use crate::rank::Rank;

/// The collectives of `-c`.
#[derive(Clone, Debug)]
pub(crate) struct Colls(pub(crate) Vec<Collective>);

/// `-c`: a comma list of collectives ([`Collective`]'s names), or `all` (every one, in
/// [`Collective::ALL`]'s order).
pub(crate) fn colls_arg(s: &str) -> std::result::Result<Colls, String> {
    if s == "all" {
        return Ok(Colls(Collective::ALL.to_vec()));
    }
    s.split(',')
        .map(|c| c.parse().map_err(|e| format!("{e} or all")))
        .collect::<std::result::Result<_, _>>()
        .map(Colls)
}

/// Whether the collective reduces (its rows name the `-o` operation).
pub(crate) fn has_op(coll: Collective) -> bool {
    coll.reduces()
}

/// Whether the collective has a root (`-r`).
pub(crate) fn has_root(coll: Collective) -> bool {
    coll.has_root()
}

/// Whether the collective has an in-place form (its in-place columns say N/A otherwise).
pub(crate) fn in_place_ok(coll: Collective) -> bool {
    use Collective::*;
    matches!(
        coll,
        AllReduce | AllGather | ReduceScatter | Broadcast | Reduce
    )
}

/// nccl-tests' bus-bandwidth factor: what the busbw column multiplies the algorithm
/// bandwidth by, so that every collective's busbw compares with the links' speed.
pub(crate) fn bus_factor(coll: Collective, n: usize) -> f64 {
    use Collective::*;
    let n = n as f64;
    match coll {
        AllReduce => 2.0 * (n - 1.0) / n,
        AllGather | ReduceScatter | AllToAll | AllToAllV | Gather | Scatter => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// For a size of `bytes` (as nccl-tests counts them) of `tsize`-byte elements on `n`
/// ranks: (send elements, receive elements, the "count" column).
pub(crate) fn counts(
    coll: Collective,
    bytes: usize,
    tsize: usize,
    n: usize,
) -> (usize, usize, usize) {
    use Collective::*;
    let total = (bytes / tsize).max(1);
    let c = (total / n).max(1);
    match coll {
        AllGather | Gather => (c, c * n, c * n),
        ReduceScatter | Scatter => (c * n, c, c * n),
        AllToAll | AllToAllV => (c * n, c * n, c * n),
        _ => (total, total, total),
    }
}

/// Enqueues one `coll` on the rank's stream, out of place or in place (where it has both
/// forms), reducing with `op` and rooted at `root` where that applies.
pub(crate) fn launch_op<T: BenchVal>(
    r: &Rank,
    coll: Collective,
    b: &mut Bufs<T>,
    in_place: bool,
    op: &str,
    root: usize,
) -> Result<()> {
    use Collective::*;
    let (c, s) = (r.comm, r.stream);
    let me = c.rank();
    let n = c.size();
    match (coll, in_place) {
        (AllReduce, false) => c.all_reduce(&b.send, &mut b.recv, op_of(op), s),
        (AllReduce, true) => c.all_reduce_in_place(&mut b.recv, op_of(op), s),
        (AllGather, false) => c.all_gather(&b.send, &mut b.recv, s),
        (AllGather, true) => c.all_gather_in_place(&mut b.recv, s),
        (ReduceScatter, false) => c.reduce_scatter(&b.send, &mut b.recv, op_of(op), s),
        (ReduceScatter, true) => c.reduce_scatter_in_place(&mut b.send, op_of(op), s),
        (Broadcast, false) => c.broadcast(
            (me == root).then_some(b.send.as_view()),
            &mut b.recv,
            root,
            s,
        ),
        (Broadcast, true) => c.broadcast_in_place(&mut b.recv, root, s),
        (Reduce, false) => c.reduce(
            &b.send,
            (me == root).then_some(b.recv.reborrow()),
            op_of(op),
            root,
            s,
        ),
        (Reduce, true) => c.reduce_in_place(&mut b.recv, op_of(op), root, s),
        (AllToAll, _) => c.all_to_all(&b.send, &mut b.recv, s),
        (AllToAllV, _) => {
            // Equal splits: the all-to-all's traffic, through the variable-size path.
            let m = b.send.len() / n;
            let counts = vec![m; n];
            let displs: Vec<usize> = (0..n).map(|p| p * m).collect();
            c.all_to_all_v(&b.send, &counts, &displs, &mut b.recv, &counts, &displs, s)
        }
        (Gather, _) => c.gather(&b.send, (me == root).then_some(b.recv.reborrow()), root, s),
        (Scatter, _) => c.scatter(
            (me == root).then_some(b.send.as_view()),
            &mut b.recv,
            root,
            s,
        ),
        (SendRecv, _) => group(c.nccl(), || {
            c.send(&b.send, (me + 1) % n, s)?;
            c.recv(&mut b.recv, (me + n - 1) % n, s)
        }),
        _ => Ok(()),
    }
}
