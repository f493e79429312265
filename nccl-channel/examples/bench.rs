//! An nccl-tests-style benchmark of every collective through nccl-channel.
//!
//! ```text
//! bench [-c all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all|sendrecv|all]
//!       [-b 8] [-e 4G] [-f 2] [-n 20] [-w 5] [-d float|half|bfloat16|double|int32|int8|uint8]
//!       [-o sum|prod|max|min|avg] [-r ROOT] [-G] [--check 0|1] [--threads N | --nprocs N]
//!       [-R 0,nccl,1,2,pool] [--cta-policy default|efficiency|zero] [--min-ctas N] [--max-ctas N]
//!       [--nvls-ctas N]
//! ```
//! Sizes are bytes of the whole buffer as nccl-tests counts them (all_gather: the gathered
//! buffer; reduce_scatter and all_to_all: a rank's send buffer). `--threads N` (default: every
//! local GPU): one process drives the GPUs, one thread each. `--nprocs N`: one process per
//! GPU (this program starts them, as the other examples' launcher does). Under torchrun,
//! srun or mpirun (`torchrun --no-python --nproc-per-node 2 bench -c all`) each process is a
//! rank configured by its launcher and rank 0 prints the table. `-G` captures the `-n` iterations of each size into a CUDA
//! graph and times its replay. `-R` picks the memory the buffers live in (plain cuMemAlloc,
//! NCCL memory registered locally or as a symmetric window, or the communicator's pool);
//! with several modes each size runs once per mode and the table gets one row per mode
//! with its busbw and time relative to mode 0. Without a CUDA driver it runs on the simulated devices and
//! says so: a smoke test, not a figure.

use nccl_launch as launch;
use std::fmt::Write as _;

use std::process::ExitCode;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use clap::Parser;

use cuda_hal::{CaptureMode, Cuda, DeviceBuffer, DeviceViewMut, Event, Stream};
use nccl_channel::half::{bf16, f16};
use nccl_channel::{
    CommConfig, Communicator, CtaPolicy, NcclType, PooledBuffer, ReduceOp, Registration, Result,
    UniqueId, Window, WindowFlags, World, group,
};

/// An nccl-tests-style benchmark of every collective through nccl-channel.
#[derive(Parser, Clone, Debug)]
#[command(name = "bench")]
struct Opts {
    /// Collectives: a comma list of all_reduce, all_gather, reduce_scatter, broadcast,
    /// reduce, all_to_all, sendrecv, or `all`.
    #[arg(short = 'c', long = "collective", default_value = "all_reduce", value_parser = colls_arg)]
    colls: Colls,
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', default_value = "8", value_parser = size_arg)]
    min: usize,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', default_value = "64M", value_parser = size_arg)]
    max: usize,
    /// Factor between sizes.
    #[arg(short = 'f', default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Warm-up iterations per size.
    #[arg(short = 'w', default_value_t = 5)]
    warmup: usize,
    /// Element type.
    #[arg(short = 'd', default_value = "float",
          value_parser = ["float", "half", "bfloat16", "double", "int32", "int8", "uint8"])]
    dtype: String,
    /// Reduction.
    #[arg(short = 'o', default_value = "sum", value_parser = ["sum", "prod", "max", "min", "avg"])]
    op: String,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', default_value_t = 0)]
    root: usize,
    /// Capture the `-n` iterations of each size into a CUDA graph and time its replay.
    #[arg(short = 'G', long = "graph")]
    graph: bool,
    /// Check each result (1) or not (0).
    #[arg(long, default_value = "1", value_name = "0|1", action = clap::ArgAction::Set, value_parser = check_arg)]
    check: bool,
    /// One process, one thread per GPU (default: every local GPU; 2 simulated devices).
    #[arg(long, conflicts_with = "nprocs")]
    threads: Option<usize>,
    /// One process per GPU (or simulated device), started by this program; each is
    /// configured as under torchrun, rank 0 prints the table.
    #[arg(long, value_parser = launch::positive)]
    nprocs: Option<usize>,
    /// With --nprocs: seconds the ranks may take before they are stopped. A rank waits for
    /// the others (the unique id, and without a driver the simulated NCCL) this long, at
    /// most 300 s.
    #[arg(long, value_name = "SECONDS", default_value = "3600", value_parser = launch::seconds)]
    timeout: std::time::Duration,
    /// Memory modes, a comma list or repeated: 0 plain cuMemAlloc buffers, 1 ncclMemAlloc
    /// registered with the communicator (ncclCommRegister), 2 ncclMemAlloc registered as a
    /// symmetric window (NCCL >= 2.27), pool the communicator's pool of registered memory.
    /// Each size runs once per mode.
    #[arg(short = 'R', default_value = "0", value_delimiter = ',', value_parser = mem_arg)]
    mems: Vec<Mem>,
    /// CTA policy of the communicator's config.
    #[arg(long, value_parser = ["default", "efficiency", "zero"])]
    cta_policy: Option<String>,
    /// Fewest CTAs per collective (config minCTAs).
    #[arg(long)]
    min_ctas: Option<u32>,
    /// Most CTAs per collective (config maxCTAs).
    #[arg(long)]
    max_ctas: Option<u32>,
    /// CTAs of NVLink-SHARP collectives (config nvlsCTAs).
    #[arg(long)]
    nvls_ctas: Option<u32>,
    /// The version the simulated NCCL reports (X.Y.Z; only without a CUDA driver), to see
    /// how the modes an older NCCL lacks are skipped.
    #[arg(long, value_name = "X.Y.Z", value_parser = version_arg)]
    sim_nccl: Option<nccl_sys::NcclVersion>,
}

fn version_arg(s: &str) -> std::result::Result<nccl_sys::NcclVersion, String> {
    let p: Vec<i32> = s
        .split('.')
        .map(|x| launch::parse_decimal(x).ok_or_else(|| format!("bad version {s:?}")))
        .collect::<std::result::Result<_, _>>()?;
    match p[..] {
        [a, b, c] => Ok(nccl_sys::NcclVersion::new(a, b, c)),
        _ => Err(format!("bad version {s:?} (X.Y.Z)")),
    }
}

/// Where a rank's send and receive memory comes from (`-R`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mem {
    /// `DeviceBuffer::zeroed` (cuMemAlloc).
    Plain,
    /// `Communicator::alloc_nccl`, not registered: what the allocator alone changes.
    Unregistered,
    /// `Communicator::alloc_nccl` + `Communicator::register`.
    Registered,
    /// `Communicator::alloc_nccl` + `Communicator::register_window` (COLL_SYMMETRIC).
    Window,
    /// `Communicator::buffer`.
    Pool,
}

impl Mem {
    /// The name `-R` takes and the tables print.
    fn name(self) -> &'static str {
        match self {
            Mem::Plain => "0",
            Mem::Unregistered => "nccl",
            Mem::Registered => "1",
            Mem::Window => "2",
            Mem::Pool => "pool",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mem::Plain => "cuMemAlloc",
            Mem::Unregistered => "ncclMemAlloc, unregistered",
            Mem::Registered => "ncclMemAlloc + ncclCommRegister",
            Mem::Window => "ncclMemAlloc + ncclCommWindowRegister(COLL_SYMMETRIC)",
            Mem::Pool => "the communicator's pool, registered by the collectives that gain",
        }
    }
}

fn mem_arg(s: &str) -> std::result::Result<Mem, String> {
    match s {
        "0" => Ok(Mem::Plain),
        "nccl" => Ok(Mem::Unregistered),
        "1" => Ok(Mem::Registered),
        "2" => Ok(Mem::Window),
        "pool" => Ok(Mem::Pool),
        _ => Err("0, nccl, 1, 2 or pool".into()),
    }
}

/// The collectives of `-c`.
#[derive(Clone, Debug)]
struct Colls(Vec<String>);

const ALL: [&str; 7] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "sendrecv",
];

fn colls_arg(s: &str) -> std::result::Result<Colls, String> {
    if s == "all" {
        return Ok(Colls(ALL.iter().map(|s| s.to_string()).collect()));
    }
    let v: Vec<String> = s.split(',').map(str::to_string).collect();
    match v.iter().find(|c| !ALL.contains(&c.as_str())) {
        Some(c) => Err(format!("unknown collective {c:?}; one of {ALL:?} or all")),
        None => Ok(Colls(v)),
    }
}

fn check_arg(s: &str) -> std::result::Result<bool, String> {
    match s {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("0 or 1".into()),
    }
}

fn size_arg(s: &str) -> std::result::Result<usize, String> {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    launch::parse_decimal::<usize>(num)
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad size {s:?} (a positive number of bytes, suffix K, M or G)"))
}

fn parse() -> std::result::Result<Opts, clap::Error> {
    let mut o = Opts::try_parse()?;
    let mut seen = Vec::new();
    o.mems.retain(|m| {
        let new = !seen.contains(m);
        seen.push(*m);
        new
    });
    if o.min > o.max {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            "need -b <= -e\n",
        ));
    }
    Ok(o)
}

/// nccl-tests' bus-bandwidth factor.
fn bus_factor(coll: &str, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

trait BenchVal: NcclType + PartialEq + std::fmt::Debug {
    fn from_f(v: f64) -> Self;
}
macro_rules! bv { ($($t:ty),*) => { $( impl BenchVal for $t { fn from_f(v: f64) -> Self { v as $t } } )* } }
bv!(i8, u8, i32, f32, f64);
impl BenchVal for f16 {
    fn from_f(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl BenchVal for bf16 {
    fn from_f(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

fn op_of<T: BenchVal>(name: &str) -> ReduceOp<T> {
    match name {
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        _ => ReduceOp::Sum,
    }
}

/// A rank's buffers for one (collective, size, mode): leading slices of the mode's memory.
struct Bufs<'a, T: BenchVal> {
    send: DeviceViewMut<'a, T>,
    recv: DeviceViewMut<'a, T>,
}

/// A rank's send or receive memory in one mode, allocated (and registered) once, for the
/// largest size. A registration is a field before its memory, so it is dropped first.
enum Memory<'c, T: BenchVal> {
    Plain(DeviceBuffer<T>),
    Registered {
        _reg: Registration<'c>,
        buf: DeviceBuffer<T>,
    },
    Window {
        win: Window<'c>,
        buf: DeviceBuffer<T>,
    },
    Pool(PooledBuffer<'c, T>),
}

impl<'c, T: BenchVal> Memory<'c, T> {
    /// Collective for windows: every rank calls it for the same modes in the same order.
    fn alloc(comm: &'c Communicator, mem: Mem, len: usize) -> Result<Self> {
        let zero = T::from_f(0.0);
        Ok(match mem {
            Mem::Plain => Memory::Plain(DeviceBuffer::zeroed(comm.context(), len)?),
            Mem::Unregistered => {
                let mut b = comm.alloc_nccl::<T>(len)?;
                b.fill(zero)?;
                Memory::Plain(b)
            }
            Mem::Registered => {
                let mut b = comm.alloc_nccl::<T>(len)?;
                b.fill(zero)?;
                Memory::Registered {
                    _reg: comm.register(&b)?,
                    buf: b,
                }
            }
            Mem::Window => {
                let mut b = comm.alloc_nccl::<T>(len)?;
                b.fill(zero)?;
                Memory::Window {
                    win: comm.register_window(&b, WindowFlags::COLL_SYMMETRIC)?,
                    buf: b,
                }
            }
            Mem::Pool => {
                let mut b = comm.buffer::<T>(len)?;
                b.fill(zero)?;
                Memory::Pool(b)
            }
        })
    }

    /// What the mode's rows do not say on their own: memory that ended up unregistered.
    fn note(&self) -> Option<&'static str> {
        match self {
            Memory::Window { win, .. } if !win.is_active() => Some(
                "NCCL made no window (no symmetric memory support here): its rows are unregistered NCCL memory",
            ),
            _ => None,
        }
    }

    /// The first `len` elements.
    fn view(&mut self, len: usize) -> Result<DeviceViewMut<'_, T>> {
        let all = match self {
            Memory::Plain(b)
            | Memory::Registered { buf: b, .. }
            | Memory::Window { buf: b, .. } => b.as_view_mut(),
            Memory::Pool(b) => b.as_view_mut(),
        };
        Ok(all.slice_mut(..len)?)
    }
}

/// One rank's view of the run: its communicator, stream and a way to agree on times.
struct Rank<'a> {
    comm: &'a Communicator,
    stream: &'a Stream,
    max_time: &'a dyn Fn(f64) -> Result<f64>,
}

fn counts(coll: &str, bytes: usize, tsize: usize, n: usize) -> (usize, usize, usize) {
    // (send elements, recv elements, "count" column)
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

fn launch_op<T: BenchVal>(
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

/// Fills inputs (rank r holds r+1 everywhere), runs once, and counts wrong elements.
fn check<T: BenchVal>(
    r: &Rank,
    coll: &str,
    b: &mut Bufs<T>,
    in_place: bool,
    op: &str,
    root: usize,
) -> Result<usize> {
    let (me, n) = (r.comm.rank(), r.comm.size());
    let mine = T::from_f((me + 1) as f64);
    b.send.fill(mine)?;
    b.recv.fill(if in_place && coll != "all_gather" {
        mine
    } else {
        T::from_f(0.0)
    })?;
    if in_place && coll == "all_gather" {
        let c = b.recv.len() / n;
        let mut host = vec![T::from_f(0.0); b.recv.len()];
        host[me * c..(me + 1) * c].fill(mine);
        b.recv.copy_from_host(&host)?;
    }
    launch_op(r, coll, b, in_place, op, root)?;
    r.stream.synchronize()?;
    let (out, offset) = if coll == "reduce_scatter" && in_place {
        (b.send.to_vec()?, me * b.recv.len())
    } else {
        (b.recv.to_vec()?, 0)
    };
    let nn = n as f64;
    let reduced = match op {
        "prod" => (1..=n).map(|x| x as f64).product(),
        "max" => nn,
        "min" => 1.0,
        "avg" => (nn + 1.0) / 2.0,
        _ => nn * (nn + 1.0) / 2.0,
    };
    let len = if coll == "reduce_scatter" {
        b.recv.len()
    } else {
        out.len()
    };
    let want = |i: usize| -> Option<f64> {
        Some(match coll {
            "all_reduce" | "reduce_scatter" => reduced,
            "reduce" => {
                if me != root {
                    return None;
                }
                reduced
            }
            "broadcast" => (root + 1) as f64,
            "all_gather" | "all_to_all" => (i / (out.len() / n) + 1) as f64,
            "sendrecv" => ((me + n - 1) % n + 1) as f64,
            _ => return None,
        })
    };
    let mut wrong = 0;
    for i in 0..len {
        if let Some(w) = want(i)
            && out[offset + i] != T::from_f(w)
        {
            wrong += 1;
        }
    }
    Ok(wrong)
}

/// Times `iters` launches (or one replay of their graph); returns µs per operation,
/// the largest over the ranks.
fn time<T: BenchVal>(
    r: &Rank,
    coll: &str,
    b: &mut Bufs<T>,
    in_place: bool,
    o: &Opts,
) -> Result<f64> {
    let ctx = r.comm.context();
    let (start, end) = (Event::new(ctx)?, Event::new(ctx)?);
    for _ in 0..o.warmup {
        launch_op(r, coll, b, in_place, &o.op, o.root)?;
    }
    r.stream.synchronize()?;
    let us = if o.graph {
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
        start.elapsed(&end)?.as_secs_f64() * 1e6 / o.iters as f64
    } else {
        r.stream.record(&start)?;
        for _ in 0..o.iters {
            launch_op(r, coll, b, in_place, &o.op, o.root)?;
        }
        r.stream.record(&end)?;
        end.synchronize()?;
        start.elapsed(&end)?.as_secs_f64() * 1e6 / o.iters as f64
    };
    (r.max_time)(us)
}

/// The sizes of the sweep, smallest first.
fn sizes(o: &Opts) -> Vec<usize> {
    let mut v = Vec::new();
    let mut bytes = o.min;
    while bytes <= o.max {
        v.push(bytes);
        match bytes.checked_mul(o.factor as usize) {
            Some(b) => bytes = b,
            None => break,
        }
    }
    v
}

/// One mode's measurement of one size: (µs, busbw) out of place and in place, and the
/// wrong elements (the largest count over the ranks).
#[derive(Clone, Copy, Default)]
struct Sample {
    us: [f64; 2],
    busbw: [f64; 2],
    /// Bytes per µs / 1000 (GB/s), as nccl-tests' algbw: kept apart from busbw, whose
    /// factor is 0 for one rank.
    algbw: [f64; 2],
    wrong: [usize; 2],
}

fn ratio(num: f64, den: f64) -> String {
    if den > 0.0 && num.is_finite() {
        format!("{:.3}", num / den)
    } else {
        "-".into()
    }
}

fn run_type<T: BenchVal>(r: &Rank, o: &Opts, out: &mut String) -> Result<()> {
    let (me, n) = (r.comm.rank(), r.comm.size());
    let tsize = size_of::<T>();
    let sizes = sizes(o);
    let largest = sizes.last().copied().unwrap_or(o.min);
    let (mut send_max, mut recv_max) = (1, 1);
    for coll in &o.colls.0 {
        let (sn, rn, _) = counts(coll, largest, tsize, n);
        send_max = send_max.max(sn);
        recv_max = recv_max.max(rn);
    }
    // Each mode's memory, allocated and registered once (collectively, in the same order
    // on every rank), before anything is timed.
    let mut mems: Vec<(Mem, Memory<'_, T>, Memory<'_, T>)> = Vec::new();
    for &m in &o.mems {
        let pair = Memory::alloc(r.comm, m, send_max)
            .and_then(|s| Ok((s, Memory::alloc(r.comm, m, recv_max)?)));
        match pair {
            Ok((s, rv)) => {
                if me == 0
                    && let Some(note) = s.note().or(rv.note())
                {
                    let _ = writeln!(out, "# mode {}: {note}", m.name());
                }
                mems.push((m, s, rv));
            }
            Err(e @ nccl_channel::Error::Unsupported { .. }) => {
                if me == 0 {
                    let _ = writeln!(out, "# mode {} skipped: {e}", m.name());
                }
            }
            Err(e) => return Err(e),
        }
    }
    let multi = o.mems.len() > 1;
    let base = mems
        .iter()
        .position(|(m, ..)| *m == Mem::Plain)
        .unwrap_or(0);
    if me == 0 {
        if mems.is_empty() {
            let _ = writeln!(out, "# no memory mode left to run");
        } else {
            let _ = writeln!(
                out,
                "# memory: send {} and recv {} elements per mode, allocated (and registered) once \
                 for the largest size, outside the timing (pool: fresh buffers per collective, \
                 registered by the first use that gains); smaller sizes use leading slices{}",
                send_max,
                recv_max,
                if multi {
                    format!("; ratios against mode {}", mems[base].0.name())
                } else {
                    String::new()
                }
            );
        }
        print!("{out}");
        out.clear();
    }
    if mems.is_empty() {
        return Ok(());
    }
    for coll in &o.colls.0 {
        // The pool registers a buffer for the collectives that gain from it: give each
        // collective fresh pool buffers, as an application gives each use its own.
        for (m, s, rv) in mems.iter_mut() {
            if *m == Mem::Pool {
                *s = Memory::Plain(DeviceBuffer::alloc(r.comm.context(), 0)?);
                *rv = Memory::Plain(DeviceBuffer::alloc(r.comm.context(), 0)?);
                r.comm.trim_pool()?;
                *s = Memory::alloc(r.comm, Mem::Pool, send_max)?;
                *rv = Memory::alloc(r.comm, Mem::Pool, recv_max)?;
            }
        }
        let has_op = matches!(coll.as_str(), "all_reduce" | "reduce_scatter" | "reduce");
        let has_root = matches!(coll.as_str(), "broadcast" | "reduce");
        let in_place_ok = !matches!(coll.as_str(), "all_to_all" | "sendrecv");
        if me == 0 {
            let _ = writeln!(
                out,
                "#\n# {coll}: {} ranks, type {}, op {}, graphs {}",
                n,
                o.dtype,
                if has_op { &o.op } else { "-" },
                if o.graph { "yes" } else { "no" }
            );
            let extra = |a: &str, b: &str, c: &str| {
                if multi {
                    format!("   {a:>5}   {b:>7} {c:>7}   {b:>7} {c:>7}")
                } else {
                    String::new()
                }
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
            let units = if multi {
                format!(
                    "   {:>5}   {:>7} {:>7}   {:>7} {:>7}",
                    "(-R)", "/base", "/base", "/base", "/base"
                )
            } else {
                String::new()
            };
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
        let mut bus_sum = vec![0.0; mems.len()];
        let mut rows = 0;
        for &bytes in &sizes {
            let (sn, rn, count) = counts(coll, bytes, tsize, n);
            let real_bytes = count * tsize;
            let mut samples = vec![Sample::default(); mems.len()];
            for ((_, send, recv), sample) in mems.iter_mut().zip(&mut samples) {
                let mut b = Bufs {
                    send: send.view(sn)?,
                    recv: recv.view(rn)?,
                };
                for (k, in_place) in [false, true].into_iter().enumerate() {
                    if in_place && !in_place_ok {
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
                    sample.algbw[k] = real_bytes as f64 / us / 1000.0;
                    sample.busbw[k] = sample.algbw[k] * bus_factor(coll, n);
                }
            }
            rows += 1;
            for (sum, s) in bus_sum.iter_mut().zip(&samples) {
                *sum += s.busbw[0];
            }
            if me == 0 {
                let root = if has_root { o.root as i64 } else { -1 };
                let b = samples[base];
                for ((m, ..), s) in mems.iter().zip(&samples) {
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
                    if multi {
                        let _ = write!(cols, "   {:>5}", m.name());
                        for k in 0..2 {
                            let (bw, t) = if k == 1 && !in_place_ok {
                                ("N/A".into(), "N/A".into())
                            } else {
                                (ratio(s.busbw[k], b.busbw[k]), ratio(s.us[k], b.us[k]))
                            };
                            let _ = write!(cols, "   {bw:>7} {t:>7}");
                        }
                    }
                    let _ = writeln!(
                        out,
                        " {real_bytes:>12} {count:>12} {:>9} {:>7} {root:>5}{cols}",
                        o.dtype,
                        if has_op { o.op.as_str() } else { "none" }
                    );
                }
                print!("{out}");
                out.clear();
            }
        }
        if me == 0 {
            for ((m, ..), sum) in mems.iter().zip(&bus_sum) {
                let mode = if multi {
                    format!(", mem {}", m.name())
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "# Avg bus bandwidth    : {:.3} (out of place, {coll}{mode})",
                    sum / rows.max(1) as f64
                );
            }
            for (m, s, rv) in &mems {
                if let (Memory::Pool(s), Memory::Pool(rv)) = (s, rv) {
                    let yes = |b: bool| if b { "yes" } else { "no" };
                    let _ = writeln!(
                        out,
                        "# mode {}: registered by {coll}: send {}, recv {}",
                        m.name(),
                        yes(s.is_registered()),
                        yes(rv.is_registered())
                    );
                }
            }
            print!("{out}");
            out.clear();
        }
    }
    Ok(())
}

fn run_rank(r: &Rank, o: &Opts) -> Result<()> {
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

/// Threads mode: one process, one thread per device; `max_time` through a shared vector.
fn run_threads(cuda: &Cuda, nccl: &Arc<nccl_sys::Nccl>, n: usize, o: &Opts) -> Result<()> {
    let config = &comm_config(o);
    let id = UniqueId::generate(nccl)?;
    let barrier = Barrier::new(n);
    let slots = Mutex::new(vec![0f64; n]);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let (barrier, slots) = (&barrier, &slots);
                s.spawn(move || -> Result<()> {
                    let ctx = cuda.device(rank)?.primary_context()?;
                    let comm = match config {
                        Some(c) => Communicator::init_rank_with(nccl, &ctx, &id, n, rank, c)?,
                        None => Communicator::init_rank(nccl, &ctx, &id, n, rank)?,
                    };
                    let stream = Stream::non_blocking(&ctx)?;
                    let max_time = |v: f64| -> Result<f64> {
                        slots.lock().unwrap_or_else(|e| e.into_inner())[rank] = v;
                        barrier.wait();
                        let m = slots
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .iter()
                            .copied()
                            .fold(f64::MIN, f64::max);
                        barrier.wait();
                        Ok(m)
                    };
                    run_rank(
                        &Rank {
                            comm: &comm,
                            stream: &stream,
                            max_time: &max_time,
                        },
                        o,
                    )
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(nccl_channel::Error::Aborted)))
            .collect()
    });
    results.into_iter().collect()
}

/// A rank configured by its launcher (`--nprocs`, torchrun, srun, mpirun): everything from
/// the environment, on a GPU or (without a driver) a simulated device; `max_time` through
/// NCCL. Rank 0 prints the header and the table.
fn run_child(world: World, o: &Opts) -> Result<()> {
    let setup = launch::RankSetup {
        config: comm_config(o),
        sim_version: o.sim_nccl,
        // The wait for the other ranks: --timeout, but not the hour a sweep may take.
        timeout: Some(o.timeout.min(std::time::Duration::from_secs(300))),
        ..Default::default()
    };
    let rank = launch::rank_channel(world, &setup).map_err(|problem| {
        nccl_channel::Error::InvalidArgument {
            what: "bench rank",
            problem,
        }
    })?;
    let ch = &rank.channel;
    if ch.comm().rank() == 0 {
        let what = if rank.simulated() {
            "; simulated devices: a smoke test, not a figure"
        } else {
            ""
        };
        println!(
            "# nccl-channel bench, {} ranks from {}{what}",
            ch.comm().size(),
            world.source
        );
        println!("# {}", rank.line);
        println!("# {}", std::env::args().collect::<Vec<_>>().join(" "));
        print_setup(o);
    }
    let scratch = std::cell::RefCell::new(DeviceBuffer::<f64>::zeroed(ch.comm().context(), 1)?);
    let max_time = |v: f64| -> Result<f64> {
        let mut b = scratch.borrow_mut();
        b.copy_from_host(&[v])?;
        ch.comm()
            .all_reduce_in_place(&mut *b, ReduceOp::Max, ch.stream())?;
        ch.stream().synchronize()?;
        Ok(b.to_vec()?[0])
    };
    run_rank(
        &Rank {
            comm: ch.comm(),
            stream: ch.stream(),
            max_time: &max_time,
        },
        o,
    )?;
    drop(scratch);
    rank.close()
        .map_err(|problem| nccl_channel::Error::InvalidArgument {
            what: "bench rank",
            problem,
        })
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => e.exit(),
    };
    let r = match World::from_env() {
        Ok(Some(world)) if o.nprocs.is_some() => Err(nccl_channel::Error::InvalidArgument {
            what: "--nprocs",
            problem: launch::nprocs_in_a_world(&world),
        }),
        Ok(Some(world)) => run_child(world, &o),
        Ok(None) => run_top(&o),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_top(o: &Opts) -> Result<()> {
    if let Some(n) = o.nprocs {
        let machine =
            launch::machine(n).map_err(|problem| nccl_channel::Error::InvalidArgument {
                what: "bench launcher",
                problem,
            })?;
        if let launch::Machine::Simulated(why) = machine {
            println!("# no CUDA driver ({why}): {n} processes on simulated devices");
        }
        return launch(n, o);
    }
    let t = Instant::now();
    let driver = Cuda::load();
    let driver_ms = t.elapsed().as_secs_f64() * 1e3;
    match driver {
        Ok(cuda) => {
            let t = Instant::now();
            let nccl = nccl_channel::nccl()?;
            let nccl_ms = t.elapsed().as_secs_f64() * 1e3;
            let gpus = cuda.device_count()?;
            println!(
                "# nccl-channel bench: CUDA driver {} ({}), loaded in {driver_ms:.2} ms",
                cuda.version(),
                cuda.driver().origin()
            );
            println!(
                "# NCCL {} ({}), loaded and resolved in {nccl_ms:.2} ms; {gpus} GPUs",
                nccl.version(),
                nccl.origin()
            );
            println!("# {}", std::env::args().collect::<Vec<_>>().join(" "));
            print_setup(o);
            run_threads(&cuda, &nccl, o.threads.unwrap_or(gpus), o)
        }
        Err(e) => {
            println!(
                "# no CUDA driver ({}): running on simulated devices; a smoke test, not a figure",
                e.to_string().lines().next().unwrap_or_default()
            );
            print_setup(o);
            let n = o.threads.unwrap_or(2);
            let (cuda, gpus) =
                cuda_mock::MockDriver::with_devices(n).build_with(Cuda::from_driver)?;
            let mut sim = nccl_mock::MockNccl::new(&gpus);
            if let Some(v) = o.sim_nccl {
                sim = sim.version(v);
            }
            let (nccl, _w) = sim.build()?;
            println!("# simulated NCCL {}", nccl.version());
            run_threads(&cuda, &Arc::new(nccl), n, o)
        }
    }
}

/// The communicator config the CTA options ask for (`None`: NCCL's defaults, plain init).
fn comm_config(o: &Opts) -> Option<CommConfig> {
    if o.cta_policy.is_none()
        && o.min_ctas.is_none()
        && o.max_ctas.is_none()
        && o.nvls_ctas.is_none()
    {
        return None;
    }
    let mut c = CommConfig::new();
    if let Some(p) = &o.cta_policy {
        c = c.cta_policy(match p.as_str() {
            "efficiency" => CtaPolicy::EFFICIENCY,
            "zero" => CtaPolicy::ZERO,
            _ => CtaPolicy::DEFAULT,
        });
    }
    if let Some(n) = o.min_ctas {
        c = c.min_ctas(n);
    }
    if let Some(n) = o.max_ctas {
        c = c.max_ctas(n);
    }
    if let Some(n) = o.nvls_ctas {
        c = c.nvls_ctas(n);
    }
    Some(c)
}

/// The header lines that say which memory modes and communicator config run.
fn print_setup(o: &Opts) {
    let modes: Vec<String> = o
        .mems
        .iter()
        .map(|m| format!("{} ({})", m.name(), m.describe()))
        .collect();
    println!("# memory modes (-R): {}", modes.join(", "));
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "# config: cta_policy {}, min_ctas {}, max_ctas {}, nvls_ctas {} (-: NCCL's default)",
        o.cta_policy.as_deref().unwrap_or("-"),
        opt(o.min_ctas),
        opt(o.max_ctas),
        opt(o.nvls_ctas)
    );
}

/// `--nprocs N`: one process per rank through the examples' shared launcher; rank 0's
/// output is the table.
fn launch(n: usize, o: &Opts) -> Result<()> {
    // The ranks get every option but the launcher's own.
    let mut args: Vec<String> = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(a) = given.next() {
        match a.as_str() {
            "--nprocs" => drop(given.next()),
            _ if a.starts_with("--nprocs=") => {}
            _ => args.push(a),
        }
    }
    launch::processes(n, &args, o.timeout, launch::Output::Rank0).map_err(|problem| {
        nccl_channel::Error::InvalidArgument {
            what: "bench launcher",
            problem,
        }
    })
}
