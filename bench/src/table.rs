//! What rank 0 prints: nccl-tests' table (size, count, type, redop, root, then time,
//! algbw, busbw and #wrong out of place and in place), with one row per memory mode and
//! its ratios to the base mode when `-R` names several.

use std::fmt::Write as _;

use nccl_channel::Collective;

use crate::collective::{has_op, has_root, in_place_ok};
use crate::element::BenchVal;
use crate::memory::{ModeMemory, pool_registered};
use crate::mode::Mem;
use crate::options::Opts;

/// One mode's measurement of one size: (µs, busbw) out of place and in place, and the
/// wrong elements (the largest count over the ranks).
#[derive(Clone, Copy, Default)]
pub(crate) struct Sample {
    pub(crate) us: [f64; 2],
    pub(crate) busbw: [f64; 2],
    /// Bytes per µs / 1000 (GB/s), as nccl-tests' algbw: kept apart from busbw, whose
    /// factor is 0 for one rank.
    pub(crate) algbw: [f64; 2],
    pub(crate) wrong: [usize; 2],
}

/// The table's shape: whether it has the memory mode's columns (several modes), and the
/// mode (an index into the modes that run) their ratios compare with.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) multi: bool,
    pub(crate) base: usize,
}

/// Prints what rank 0 wrote so far: the table comes out row by row, as the sweep goes.
pub(crate) fn flush(out: &mut String) {
    print!("{out}");
    out.clear();
}

/// One line of the table's header.
pub(crate) fn line(out: &mut String, text: &str) {
    let _ = writeln!(out, "{text}");
}

/// The header line on the memory each mode allocated; `base`: the mode ratios compare
/// with (`None`: no mode is left to run).
pub(crate) fn memory(out: &mut String, send: usize, recv: usize, base: Option<Mem>, multi: bool) {
    let Some(base) = base else {
        line(out, "# no memory mode left to run");
        return;
    };
    let ratios = match multi {
        true => format!("; ratios against mode {}", base.name()),
        false => String::new(),
    };
    let _ = writeln!(
        out,
        "# memory: send {send} and recv {recv} elements per mode, allocated (and registered) \
         once for the largest size, outside the timing (pool: fresh buffers per collective, \
         registered by the first use that gains); smaller sizes use leading slices{ratios}"
    );
}

/// A collective's header: what runs, and the two lines of column names and units.
pub(crate) fn header(out: &mut String, coll: Collective, n: usize, o: &Opts, multi: bool) {
    let _ = writeln!(
        out,
        "#\n# {coll}: {} ranks, type {}, op {}, graphs {}",
        n,
        o.dtype,
        if has_op(coll) { &o.op } else { "-" },
        if o.graph { "yes" } else { "no" }
    );
    let extra = |a: &str, b: &str, c: &str| match multi {
        true => format!("   {a:>5}   {b:>7} {c:>7}   {b:>7} {c:>7}"),
        false => String::new(),
    };
    let _ = writeln!(
        out,
        "#{:>12} {:>12} {:>9} {:>7} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}{}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        extra("mem", "busbw", "time"),
    );
    let units = extra("(-R)", "/base", "/base");
    let _ = writeln!(
        out,
        "#{:>12} {:>12} {:>9} {:>7} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}{units}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "out",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "in",
    );
}

/// One size's rows, one per mode: `(count, bytes)`, the count column and the bytes it is.
pub(crate) fn rows(
    out: &mut String,
    o: &Opts,
    coll: Collective,
    (count, bytes): (usize, usize),
    modes: &[Mem],
    samples: &[Sample],
    layout: Layout,
) {
    let root = if has_root(coll) { o.root as i64 } else { -1 };
    let op = if has_op(coll) { o.op.as_str() } else { "none" };
    let base = samples[layout.base];
    for (m, s) in modes.iter().zip(samples) {
        let mut cols = columns(s, in_place_ok(coll));
        if layout.multi {
            cols.push_str(&ratios(*m, s, &base, in_place_ok(coll)));
        }
        let _ = writeln!(
            out,
            " {bytes:>12} {count:>12} {:>9} {op:>7} {root:>5}{cols}",
            o.dtype,
        );
    }
}

/// Time, algbw, busbw and #wrong out of place and in place (N/A without an in-place form).
fn columns(s: &Sample, in_place_ok: bool) -> String {
    let mut cols = String::new();
    for k in 0..2 {
        if k == 1 && !in_place_ok {
            let _ = write!(
                cols,
                "   {:>9} {:>7} {:>7} {:>6}",
                "N/A", "N/A", "N/A", "N/A"
            );
            continue;
        }
        let (us, busbw, algbw) = (s.us[k], s.busbw[k], s.algbw[k]);
        let _ = write!(
            cols,
            "   {us:>9.2} {algbw:>7.2} {busbw:>7.2} {:>6}",
            s.wrong[k]
        );
    }
    cols
}

/// The mode's name and its busbw and time over the base mode's, out of place and in place.
fn ratios(m: Mem, s: &Sample, base: &Sample, in_place_ok: bool) -> String {
    let mut cols = format!("   {:>5}", m.name());
    for k in 0..2 {
        let (bw, t) = if k == 1 && !in_place_ok {
            ("N/A".into(), "N/A".into())
        } else {
            (ratio(s.busbw[k], base.busbw[k]), ratio(s.us[k], base.us[k]))
        };
        let _ = write!(cols, "   {bw:>7} {t:>7}");
    }
    cols
}

/// `num / den` to three places, `-` where it means nothing.
fn ratio(num: f64, den: f64) -> String {
    if den > 0.0 && num.is_finite() {
        format!("{:.3}", num / den)
    } else {
        "-".into()
    }
}

/// A collective's footer: each mode's average out-of-place busbw over the `rows` sizes,
/// and whether the collective registered the pool's buffers.
pub(crate) fn averages<T: BenchVal>(
    out: &mut String,
    coll: Collective,
    mems: &[ModeMemory<'_, T>],
    bus_sum: &[f64],
    rows: usize,
    multi: bool,
) {
    for ((m, ..), sum) in mems.iter().zip(bus_sum) {
        let mode = match multi {
            true => format!(", mem {}", m.name()),
            false => String::new(),
        };
        let _ = writeln!(
            out,
            "# Avg bus bandwidth    : {:.3} (out of place, {coll}{mode})",
            sum / rows.max(1) as f64
        );
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    for mode in mems {
        if let Some((send, recv)) = pool_registered(mode) {
            let _ = writeln!(
                out,
                "# mode {}: registered by {coll}: send {}, recv {}",
                mode.0.name(),
                yes(send),
                yes(recv)
            );
        }
    }
}
