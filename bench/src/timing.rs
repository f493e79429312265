//! One size's time: `-w` warm-up launches, then `-n` launches between two events (or,
//! with `-G`, one replay of a graph of them), the slowest rank's time per operation.

use cuda_hal::{CaptureMode, Event};
use nccl_channel::{Collective, Result};

use crate::collective::launch_op;
use crate::element::BenchVal;
use crate::memory::Bufs;
use crate::options::Opts;
use crate::rank::Rank;

/// Times `iters` launches (or one replay of their graph); returns µs per operation,
/// the largest over the ranks.
pub(crate) fn time<T: BenchVal>(
    r: &Rank,
    coll: Collective,
    b: &mut Bufs<T>,
    in_place: bool,
    o: &Opts,
) -> Result<f64> {
    for _ in 0..o.warmup {
        launch_op(r, coll, b, in_place, &o.op, o.root)?;
    }
    r.stream.synchronize()?;
    let us = if o.graph {
        graph_replay(r, coll, b, in_place, o)?
    } else {
        launches(r, coll, b, in_place, o)?
    };
    (r.max_time)(us)
}

/// `-n` launches between two events: µs per operation on this rank.
fn launches<T: BenchVal>(
    r: &Rank,
    coll: Collective,
    b: &mut Bufs<T>,
    in_place: bool,
    o: &Opts,
) -> Result<f64> {
    let ctx = r.comm.context();
    let (start, end) = (Event::new(ctx)?, Event::new(ctx)?);
    r.stream.record(&start)?;
    for _ in 0..o.iters {
        launch_op(r, coll, b, in_place, &o.op, o.root)?;
    }
    r.stream.record(&end)?;
    end.synchronize()?;
    Ok(start.elapsed(&end)?.as_secs_f64() * 1e6 / o.iters as f64)
}

/// `-G`: the `-n` launches captured into a graph, replayed once untimed (its warm-up),
/// then once between two events: µs per operation on this rank.
fn graph_replay<T: BenchVal>(
    r: &Rank,
    coll: Collective,
    b: &mut Bufs<T>,
    in_place: bool,
    o: &Opts,
) -> Result<f64> {
    let ctx = r.comm.context();
    let (start, end) = (Event::new(ctx)?, Event::new(ctx)?);
    r.stream.begin_capture(CaptureMode::ThreadLocal)?;
    let captured: Result<()> =
        (0..o.iters).try_for_each(|_| launch_op(r, coll, b, in_place, &o.op, o.root));
    let graph = r.stream.end_capture()?;
    captured?;
    let exec = graph.instantiate()?;
    exec.launch(r.stream)?;
    r.stream.synchronize()?;
    r.stream.record(&start)?;
    exec.launch(r.stream)?;
    r.stream.record(&end)?;
    end.synchronize()?;
    Ok(start.elapsed(&end)?.as_secs_f64() * 1e6 / o.iters as f64)
}
