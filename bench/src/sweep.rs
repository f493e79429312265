//! The sweep of one rank: every collective of `-c`, every size, every memory mode of
//! `-R`; the measurements are collective (every rank makes the same calls in the same
//! order), the table is rank 0's.

use nccl_channel::half::{bf16, f16};
use nccl_channel::{Collective, Result};

use crate::check::check;
use crate::collective::{bus_factor, counts, in_place_ok};
use crate::element::BenchVal;
use crate::memory::{Bufs, ModeMemory, alloc_modes, fresh_pool};
use crate::mode::Mem;
use crate::options::Opts;
use crate::rank::Rank;
use crate::sizes::sizes;
use crate::table::{self, Layout, Sample};
use crate::timing::time;

/// The whole sweep in element type `T`; rank 0 prints the table through `out`.
pub(crate) fn run_type<T: BenchVal>(r: &Rank, o: &Opts, out: &mut String) -> Result<()> {
    let me = r.comm.rank();
    let sizes = sizes(
        o.min,
        o.max,
        usize::try_from(o.factor).unwrap_or(usize::MAX),
    );
    let (send_max, recv_max) = largest::<T>(o, &sizes, r.comm.size());
    fits_on_device::<T>(r, o, send_max, recv_max)?;
    let (mut mems, notes) = alloc_modes::<T>(r.comm, &o.mems, send_max, recv_max)?;
    let layout = Layout {
        multi: o.mems.len() > 1,
        base: mems
            .iter()
            .position(|(m, ..)| *m == Mem::Plain)
            .unwrap_or(0),
    };
    if me == 0 {
        notes.iter().for_each(|n| table::line(out, n));
        let base = mems.get(layout.base).map(|(m, ..)| *m);
        table::memory(out, send_max, recv_max, base, layout.multi);
        table::flush(out);
    }
    if mems.is_empty() {
        return Ok(());
    }
    for &coll in &o.colls.0 {
        fresh_pool(r.comm, &mut mems, send_max, recv_max)?;
        run_collective(r, o, coll, &sizes, &mut mems, layout, out)?;
    }
    Ok(())
}

/// The send and receive elements of the largest size, over the collectives: what each
/// mode allocates once.
fn largest<T: BenchVal>(o: &Opts, sizes: &[usize], n: usize) -> (usize, usize) {
    let largest = sizes.last().copied().unwrap_or(o.min);
    let (mut send_max, mut recv_max) = (1, 1);
    for &coll in &o.colls.0 {
        let (sn, rn, _) = counts(coll, largest, size_of::<T>(), n);
        send_max = send_max.max(sn);
        recv_max = recv_max.max(rn);
    }
    (send_max, recv_max)
}

/// `-e` checked against the rank's device before anything is allocated: every memory mode
/// of `-R` holds a send and a receive buffer of the largest size. A size that does not fit
/// is an error naming the flag, the bytes needed and the device's (not an allocation that
/// fails halfway through the modes, or a host copy that aborts the process).
fn fits_on_device<T: BenchVal>(r: &Rank, o: &Opts, send_max: usize, recv_max: usize) -> Result<()> {
    let modes = o.mems.len() as u128;
    let need = modes * (send_max as u128 + recv_max as u128) * size_of::<T>() as u128;
    let device = r.comm.context().device();
    let total = device.total_memory()?;
    if need <= total as u128 {
        return Ok(());
    }
    Err(nccl_channel::Error::InvalidArgument {
        what: "-e",
        problem: format!(
            "{} bytes need {need} bytes of device memory per rank ({modes} memory mode{} of -R, \
             each {send_max} elements of {} to send and {recv_max} to receive), more than the \
             {total} bytes of device {}",
            o.max,
            if modes == 1 { "" } else { "s" },
            o.dtype,
            device.ordinal()
        ),
    })
}

/// One collective over every size and mode: its header, a row per size and mode, and
/// its averages.
fn run_collective<T: BenchVal>(
    r: &Rank,
    o: &Opts,
    coll: Collective,
    sizes: &[usize],
    mems: &mut [ModeMemory<'_, T>],
    layout: Layout,
    out: &mut String,
) -> Result<()> {
    let (me, n, tsize) = (r.comm.rank(), r.comm.size(), size_of::<T>());
    if me == 0 {
        table::header(out, coll, n, o, layout.multi);
    }
    let mut bus_sum = vec![0.0; mems.len()];
    let mut rows = 0;
    for &bytes in sizes {
        let (sn, rn, count) = counts(coll, bytes, tsize, n);
        let samples = measure(r, o, coll, mems, (sn, rn), count * tsize)?;
        rows += 1;
        for (sum, s) in bus_sum.iter_mut().zip(&samples) {
            *sum += s.busbw[0];
        }
        if me == 0 {
            let modes: Vec<Mem> = mems.iter().map(|(m, ..)| *m).collect();
            table::rows(
                out,
                o,
                coll,
                (count, count * tsize),
                &modes,
                &samples,
                layout,
            );
            table::flush(out);
        }
    }
    if me == 0 {
        table::averages(out, coll, mems, &bus_sum, rows, layout.multi);
        table::flush(out);
    }
    Ok(())
}

/// One size in every mode, out of place and in place: checked (`--check 1`), then timed.
/// `lens`: the send and receive elements; `bytes`: what the bandwidths divide.
fn measure<T: BenchVal>(
    r: &Rank,
    o: &Opts,
    coll: Collective,
    mems: &mut [ModeMemory<'_, T>],
    (sn, rn): (usize, usize),
    bytes: usize,
) -> Result<Vec<Sample>> {
    let mut samples = vec![Sample::default(); mems.len()];
    for ((_, send, recv), sample) in mems.iter_mut().zip(&mut samples) {
        let mut b = Bufs {
            send: send.view(sn)?,
            recv: recv.view(rn)?,
        };
        for (k, in_place) in [false, true].into_iter().enumerate() {
            if in_place && !in_place_ok(coll) {
                continue;
            }
            let wrong = if o.check {
                check(r, coll, &mut b, in_place, &o.op, o.root)?
            } else {
                0
            };
            let us = time(r, coll, &mut b, in_place, o)?;
            sample.wrong[k] = (r.max_time)(wrong as f64)? as usize;
            sample.us[k] = us;
            sample.algbw[k] = bytes as f64 / us / 1000.0;
            sample.busbw[k] = sample.algbw[k] * bus_factor(coll, r.comm.size());
        }
    }
    Ok(samples)
}

/// Runs the whole sweep on this rank in the element type `-d` names.
pub(crate) fn run_rank(r: &Rank, o: &Opts) -> Result<()> {
    let mut out = String::new();
    match o.dtype.as_str() {
        "float" => run_type::<f32>(r, o, &mut out),
        "double" => run_type::<f64>(r, o, &mut out),
        "half" => run_type::<f16>(r, o, &mut out),
        "bfloat16" => run_type::<bf16>(r, o, &mut out),
        "int32" => run_type::<i32>(r, o, &mut out),
        "int8" => run_type::<i8>(r, o, &mut out),
        "uint8" => run_type::<u8>(r, o, &mut out),
        other => Err(nccl_channel::Error::InvalidArgument {
            what: "options",
            problem: format!("unknown -d {other}"),
        }),
    }
}
