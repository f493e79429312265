//! The collectives `-c` names: what each takes and moves (nccl-tests' conventions), and
//! how each is called.

use nccl_channel::{Result, group};

use crate::element::{BenchVal, op_of};
use crate::memory::Bufs;
use crate::rank::Rank;

/// The collectives of `-c`.
#[derive(Clone, Debug)]
pub(crate) struct Colls(pub(crate) Vec<String>);

/// Every collective, in the order `-c all` runs them.
const ALL: [&str; 7] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "sendrecv",
];

/// `-c`: a comma list of collectives, or `all`.
pub(crate) fn colls_arg(s: &str) -> std::result::Result<Colls, String> {
    if s == "all" {
        return Ok(Colls(ALL.iter().map(|s| s.to_string()).collect()));
    }
    let v: Vec<String> = s.split(',').map(str::to_string).collect();
    match v.iter().find(|c| !ALL.contains(&c.as_str())) {
        Some(c) => Err(format!("unknown collective {c:?}; one of {ALL:?} or all")),
        None => Ok(Colls(v)),
    }
}

/// Whether the collective reduces (its rows name the `-o` operation).
pub(crate) fn has_op(coll: &str) -> bool {
    matches!(coll, "all_reduce" | "reduce_scatter" | "reduce")
}

/// Whether the collective has a root (`-r`).
pub(crate) fn has_root(coll: &str) -> bool {
    matches!(coll, "broadcast" | "reduce")
}

/// Whether the collective has an in-place form (its in-place columns say N/A otherwise).
pub(crate) fn in_place_ok(coll: &str) -> bool {
    !matches!(coll, "all_to_all" | "sendrecv")
}

/// nccl-tests' bus-bandwidth factor: what the busbw column multiplies the algorithm
/// bandwidth by, so that every collective's busbw compares with the links' speed.
pub(crate) fn bus_factor(coll: &str, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// For a size of `bytes` (as nccl-tests counts them) of `tsize`-byte elements on `n`
/// ranks: (send elements, receive elements, the "count" column).
pub(crate) fn counts(coll: &str, bytes: usize, tsize: usize, n: usize) -> (usize, usize, usize) {
    let total = (bytes / tsize).max(1);
    match coll {
        "all_gather" => {
            let c = (total / n).max(1);
            (c, c * n, c * n)
        }
        "reduce_scatter" | "all_to_all" => {
            let c = (total / n).max(1);
            (c * n, if coll == "all_to_all" { c * n } else { c }, c * n)
        }
        _ => (total, total, total),
    }
}

/// Enqueues one `coll` on the rank's stream, out of place or in place (all_to_all and
/// sendrecv have one form), reducing with `op` and rooted at `root` where that applies.
pub(crate) fn launch_op<T: BenchVal>(
    r: &Rank,
    coll: &str,
    b: &mut Bufs<T>,
    in_place: bool,
    op: &str,
    root: usize,
) -> Result<()> {
    let (c, s) = (r.comm, r.stream);
    let me = c.rank();
    let n = c.size();
    match (coll, in_place) {
        ("all_reduce", false) => c.all_reduce(&b.send, &mut b.recv, op_of(op), s),
        ("all_reduce", true) => c.all_reduce_in_place(&mut b.recv, op_of(op), s),
        ("all_gather", false) => c.all_gather(&b.send, &mut b.recv, s),
        ("all_gather", true) => c.all_gather_in_place(&mut b.recv, s),
        ("reduce_scatter", false) => c.reduce_scatter(&b.send, &mut b.recv, op_of(op), s),
        ("reduce_scatter", true) => c.reduce_scatter_in_place(&mut b.send, op_of(op), s),
        ("broadcast", false) => c.broadcast(
            (me == root).then_some(b.send.as_view()),
            &mut b.recv,
            root,
            s,
        ),
        ("broadcast", true) => c.broadcast_in_place(&mut b.recv, root, s),
        ("reduce", false) => c.reduce(
            &b.send,
            (me == root).then_some(b.recv.reborrow()),
            op_of(op),
            root,
            s,
        ),
        ("reduce", true) => c.reduce_in_place(&mut b.recv, op_of(op), root, s),
        ("all_to_all", _) => c.all_to_all(&b.send, &mut b.recv, s),
        ("sendrecv", _) => group(c.nccl(), || {
            c.send(&b.send, (me + 1) % n, s)?;
            c.recv(&mut b.recv, (me + n - 1) % n, s)
        }),
        _ => Ok(()),
    }
}
