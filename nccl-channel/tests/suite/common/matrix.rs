//! Every collective × data type × op on one rank, checked against host-computed results.
//! Run by every rank of a communicator at the same time (threads or processes).

use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Communicator, Fp8E4M3, Fp8E5M2, Result, group};
use nccl_sys::NcclVersion;

use super::{TestVal, expected, input, ops, same};

const COUNT: usize = 5;

fn fill<T: TestVal>(
    comm: &Communicator,
    len: usize,
    f: impl Fn(usize) -> i64,
) -> Result<DeviceBuffer<T>> {
    let host: Vec<T> = (0..len).map(|i| T::from_i(f(i))).collect();
    Ok(DeviceBuffer::from_slice(comm.context(), &host)?)
}

fn get<T: TestVal>(b: &DeviceBuffer<T>, s: &Stream) -> Result<Vec<T>> {
    s.synchronize()?;
    Ok(b.to_vec()?)
}

/// A plain value for data-movement collectives: exact in every type, fp8 included.
fn plain(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 8) as i64
}

/// Runs the whole matrix for type `T` on this rank; returns a line per wrong result.
pub fn check_type<T: TestVal>(comm: &Communicator, s: &Stream) -> Result<Vec<String>> {
    let (n, r) = (comm.size(), comm.rank());
    let mut bad = Vec::new();
    let name = T::NAME;
    let mut expect = |what: &str, got: &[T], want: &dyn Fn(usize) -> bool| {
        for (i, _) in got.iter().enumerate() {
            if !want(i) {
                bad.push(format!(
                    "{what}<{name}> rank {r} elem {i}: got {:?}",
                    got[i]
                ));
                return;
            }
        }
    };
    let root = n - 1;
    for op in ops::<T>() {
        let oname = op.name();
        let scalar = 2;
        let inp = |i: usize| input(&op, r, i);
        // all_reduce, out of place and in place.
        let send = fill::<T>(comm, COUNT, inp)?;
        let mut recv = DeviceBuffer::<T>::alloc(comm.context(), COUNT)?;
        comm.all_reduce(&send, &mut recv, op, s)?;
        let got = get(&recv, s)?;
        expect(&format!("all_reduce {oname}"), &got, &|i| {
            same(got[i], expected(&op, n, i, scalar), &op)
        });
        let mut inplace = fill::<T>(comm, COUNT, inp)?;
        comm.all_reduce_in_place(&mut inplace, op, s)?;
        let got = get(&inplace, s)?;
        expect(&format!("all_reduce_in_place {oname}"), &got, &|i| {
            same(got[i], expected(&op, n, i, scalar), &op)
        });
        // reduce to the last rank.
        let mut rbuf = DeviceBuffer::<T>::alloc(comm.context(), COUNT)?;
        comm.reduce(
            &send,
            (r == root).then_some(rbuf.as_view_mut()),
            op,
            root,
            s,
        )?;
        if r == root {
            let got = get(&rbuf, s)?;
            expect(&format!("reduce {oname}"), &got, &|i| {
                same(got[i], expected(&op, n, i, scalar), &op)
            });
        }
        let mut rin = fill::<T>(comm, COUNT, inp)?;
        comm.reduce_in_place(&mut rin, op, root, s)?;
        let got = get(&rin, s)?;
        if r == root {
            expect(&format!("reduce_in_place {oname}"), &got, &|i| {
                same(got[i], expected(&op, n, i, scalar), &op)
            });
        }
        // reduce_scatter: chunk q of every rank's send reduces into rank q.
        let big = fill::<T>(comm, COUNT * n, inp)?;
        let mut part = DeviceBuffer::<T>::alloc(comm.context(), COUNT)?;
        comm.reduce_scatter(&big, &mut part, op, s)?;
        let got = get(&part, s)?;
        expect(&format!("reduce_scatter {oname}"), &got, &|i| {
            same(got[i], expected(&op, n, r * COUNT + i, scalar), &op)
        });
        let mut bin = fill::<T>(comm, COUNT * n, inp)?;
        comm.reduce_scatter_in_place(&mut bin, op, s)?;
        let got = get(&bin, s)?;
        let mine = &got[r * COUNT..(r + 1) * COUNT];
        expect(&format!("reduce_scatter_in_place {oname}"), mine, &|i| {
            same(mine[i], expected(&op, n, r * COUNT + i, scalar), &op)
        });
    }
    let want_of = |rank: usize, i: usize| T::from_i(plain(rank, i));
    // all_gather, out of place and in place.
    let send = fill::<T>(comm, COUNT, |i| plain(r, i))?;
    let mut all = DeviceBuffer::<T>::alloc(comm.context(), COUNT * n)?;
    comm.all_gather(&send, &mut all, s)?;
    let got = get(&all, s)?;
    expect("all_gather", &got, &|i| {
        got[i] == want_of(i / COUNT, i % COUNT)
    });
    let mut agi = fill::<T>(comm, COUNT * n, |i| {
        if i / COUNT == r {
            plain(r, i % COUNT)
        } else {
            0
        }
    })?;
    comm.all_gather_in_place(&mut agi, s)?;
    let got = get(&agi, s)?;
    expect("all_gather_in_place", &got, &|i| {
        got[i] == want_of(i / COUNT, i % COUNT)
    });
    // broadcast from the last rank, out of place and in place.
    let mut b = DeviceBuffer::<T>::alloc(comm.context(), COUNT)?;
    comm.broadcast((r == root).then_some(send.as_view()), &mut b, root, s)?;
    let got = get(&b, s)?;
    expect("broadcast", &got, &|i| got[i] == want_of(root, i));
    let mut bi = fill::<T>(comm, COUNT, |i| plain(r, i))?;
    comm.broadcast_in_place(&mut bi, root, s)?;
    let got = get(&bi, s)?;
    expect("broadcast_in_place", &got, &|i| got[i] == want_of(root, i));
    // all_to_all: rank r's chunk q goes to rank q's chunk r.
    let a2a = fill::<T>(comm, COUNT * n, |i| plain(r, i))?;
    let mut a2b = DeviceBuffer::<T>::alloc(comm.context(), COUNT * n)?;
    comm.all_to_all(&a2a, &mut a2b, s)?;
    let got = get(&a2b, s)?;
    expect("all_to_all", &got, &|i| {
        got[i] == want_of(i / COUNT, r * COUNT + i % COUNT)
    });
    // gather to rank 0, scatter from the last rank.
    let mut g = DeviceBuffer::<T>::alloc(comm.context(), COUNT * n)?;
    comm.gather(&send, (r == 0).then_some(g.as_view_mut()), 0, s)?;
    if r == 0 {
        let got = get(&g, s)?;
        expect("gather", &got, &|i| got[i] == want_of(i / COUNT, i % COUNT));
    }
    let mut sc = DeviceBuffer::<T>::alloc(comm.context(), COUNT)?;
    comm.scatter((r == root).then_some(a2a.as_view()), &mut sc, root, s)?;
    let got = get(&sc, s)?;
    expect("scatter", &got, &|i| got[i] == want_of(root, r * COUNT + i));
    // send/recv around a ring, grouped.
    let mut from_left = DeviceBuffer::<T>::alloc(comm.context(), COUNT)?;
    group(comm.nccl(), || {
        comm.send(&send, (r + 1) % n, s)?;
        comm.recv(&mut from_left, (r + n - 1) % n, s)
    })?;
    let got = get(&from_left, s)?;
    expect("send/recv", &got, &|i| {
        got[i] == want_of((r + n - 1) % n, i)
    });
    Ok(bad)
}

/// The matrix for every data type this NCCL has (fp8 from 2.24).
pub fn check_every_type(comm: &Communicator, s: &Stream) -> Result<Vec<String>> {
    let mut bad = Vec::new();
    bad.extend(check_type::<i8>(comm, s)?);
    bad.extend(check_type::<u8>(comm, s)?);
    bad.extend(check_type::<i32>(comm, s)?);
    bad.extend(check_type::<u32>(comm, s)?);
    bad.extend(check_type::<i64>(comm, s)?);
    bad.extend(check_type::<u64>(comm, s)?);
    bad.extend(check_type::<f32>(comm, s)?);
    bad.extend(check_type::<f64>(comm, s)?);
    bad.extend(check_type::<half::f16>(comm, s)?);
    bad.extend(check_type::<half::bf16>(comm, s)?);
    if comm.nccl().version() >= NcclVersion::new(2, 24, 0) {
        bad.extend(check_type::<Fp8E4M3>(comm, s)?);
        bad.extend(check_type::<Fp8E5M2>(comm, s)?);
    }
    Ok(bad)
}

/// How many checks `check_every_type` makes per rank (for the report).
pub fn checks_per_rank(fp8: bool) -> usize {
    let types = if fp8 { 12 } else { 10 };
    types * (6 * 6 + 8)
}
