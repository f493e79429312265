//! `--check 1`: each size's result checked once before it is timed, as nccl-tests does
//! (the `#wrong` columns).

use cuda_hal::DeviceViewMut;
use nccl_channel::{Collective, Result};

use crate::collective::launch_op;
use crate::element::BenchVal;
use crate::memory::Bufs;
use crate::rank::Rank;

/// Fills inputs (rank r holds r+1 everywhere), runs once, and counts wrong elements.
pub(crate) fn check<T: BenchVal>(
    r: &Rank,
    coll: Collective,
    b: &mut Bufs<T>,
    in_place: bool,
    op: &str,
    root: usize,
) -> Result<usize> {
    let (me, n) = (r.comm.rank(), r.comm.size());
    fill_inputs(b, coll, in_place, me, n)?;
    launch_op(r, coll, b, in_place, op, root)?;
    r.stream.synchronize()?;
    let (out, offset) = if coll == Collective::ReduceScatter && in_place {
        (download(&b.send)?, me * b.recv.len())
    } else {
        (download(&b.recv)?, 0)
    };
    let len = if matches!(coll, Collective::ReduceScatter | Collective::Scatter) {
        b.recv.len()
    } else {
        out.len()
    };
    let want = Expected {
        coll,
        reduced: reduced(op, n),
        me,
        n,
        root,
        block: out.len() / n,
    };
    let wrong = (0..len)
        .filter(|&i| want.at(i).is_some_and(|w| out[offset + i] != T::from_f(w)))
        .count();
    Ok(wrong)
}

/// Rank `me` holds `me + 1` in its send buffer, and in its receive buffer when the
/// collective works in place there (all_gather in place: only in its own block).
fn fill_inputs<T: BenchVal>(
    b: &mut Bufs<T>,
    coll: Collective,
    in_place: bool,
    me: usize,
    n: usize,
) -> Result<()> {
    let mine = T::from_f((me + 1) as f64);
    b.send.fill(mine)?;
    b.recv.fill(if in_place && coll != Collective::AllGather {
        mine
    } else {
        T::from_f(0.0)
    })?;
    if in_place && coll == Collective::AllGather {
        let c = b.recv.len() / n;
        let mut host = host_vec::<T>(b.recv.len())?;
        host.resize(b.recv.len(), T::from_f(0.0));
        host[me * c..(me + 1) * c].fill(mine);
        b.recv.copy_from_host(&host)?;
    }
    Ok(())
}

/// An empty host vector with room for `len` elements (sized by `-e`), or an error that
/// names the flag and the bytes the host refused, instead of an abort.
fn host_vec<T: BenchVal>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| nccl_channel::Error::InvalidArgument {
            what: "-e",
            problem: format!(
                "--check 1 copies results to the host, which cannot hold {len} elements ({} \
                 bytes); check less (--check 0) or a smaller -e",
                len as u128 * size_of::<T>() as u128
            ),
        })?;
    Ok(v)
}

/// A view's contents, in a host vector from [`host_vec`].
fn download<T: BenchVal>(view: &DeviceViewMut<'_, T>) -> Result<Vec<T>> {
    let mut v = host_vec::<T>(view.len())?;
    v.resize(view.len(), T::from_f(0.0));
    view.copy_to_host(&mut v)?;
    Ok(v)
}

/// `op` over the ranks' values 1..=n.
fn reduced(op: &str, n: usize) -> f64 {
    let nn = n as f64;
    match op {
        "prod" => (1..=n).map(|x| x as f64).product(),
        "max" => nn,
        "min" => 1.0,
        "avg" => (nn + 1.0) / 2.0,
        _ => nn * (nn + 1.0) / 2.0,
    }
}

/// What a rank's result holds after one collective on [`fill_inputs`]' values.
struct Expected {
    coll: Collective,
    /// The reduction of the ranks' values.
    reduced: f64,
    me: usize,
    n: usize,
    root: usize,
    /// Elements per rank in a gathered result.
    block: usize,
}

impl Expected {
    /// The value of element `i` (`None`: not defined on this rank, e.g. reduce off root).
    fn at(&self, i: usize) -> Option<f64> {
        let (me, n) = (self.me, self.n);
        use Collective::*;
        Some(match self.coll {
            AllReduce | ReduceScatter => self.reduced,
            Reduce if me == self.root => self.reduced,
            Broadcast | Scatter => (self.root + 1) as f64,
            AllGather | AllToAll | AllToAllV => (i / self.block + 1) as f64,
            Gather if me == self.root => (i / self.block + 1) as f64,
            SendRecv => ((me + n - 1) % n + 1) as f64,
            _ => return None,
        })
    }
}
