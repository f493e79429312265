//! Shared test rig: a simulated machine, ranks in threads, and host-side references.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod backend;
pub mod demo;
pub use test_support::env;
pub mod lookup;
#[cfg(feature = "half")]
pub mod matrix;
pub mod tcpstore;
pub mod wheel;

use std::sync::Arc;

use cuda_hal::{CaptureMode, Cuda, DeviceBuffer, GraphExec, Stream};
use cuda_mock::{MockDriver, MockWorld};
use nccl_channel::{Communicator, Error, Fp8E4M3, Fp8E5M2, NcclType, ReduceOp, UniqueId};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::{Nccl, NcclVersion, ncclResult_t};

pub struct Rig {
    pub cuda: Cuda,
    pub gpus: MockWorld,
    pub nccl: Arc<Nccl>,
    pub world: MockNcclWorld,
}

impl Rig {
    pub fn new(devices: usize) -> Rig {
        Self::with_version(devices, NcclVersion(nccl_sys::NCCL_VERSION_CODE as i32))
    }

    pub fn with_version(devices: usize, version: NcclVersion) -> Rig {
        Self::with_timeout(devices, version, std::time::Duration::from_secs(20))
    }

    /// As `with_version`, a simulated NCCL whose waits for peers end after `timeout`.
    pub fn with_timeout(devices: usize, version: NcclVersion, timeout: std::time::Duration) -> Rig {
        Self::with_nccl(devices, |nccl| nccl.version(version).timeout(timeout))
    }

    /// `devices` simulated GPUs and a simulated NCCL as `configure` sets it up from
    /// `MockNccl`'s defaults.
    pub fn with_nccl(devices: usize, configure: impl FnOnce(MockNccl) -> MockNccl) -> Rig {
        Self::from_driver(MockDriver::with_devices(devices), configure)
    }

    /// The simulated GPUs of `driver` and a simulated NCCL as `configure` sets it up from
    /// `MockNccl`'s defaults.
    pub fn from_driver(driver: MockDriver, configure: impl FnOnce(MockNccl) -> MockNccl) -> Rig {
        let (cuda, gpus) = driver.build_with(Cuda::from_driver).unwrap();
        let (nccl, world) = configure(MockNccl::new(&gpus)).build().unwrap();
        Rig {
            cuda,
            gpus,
            nccl: Arc::new(nccl),
            world,
        }
    }

    /// Runs `scenario` on this machine, then asserts that nothing is left alive in
    /// either simulation ([`Rig::assert_clean`]).
    pub fn check(self, scenario: impl FnOnce(&Rig)) {
        scenario(&self);
        self.assert_clean();
    }

    /// Runs `scenario` on [`OneRank`] of device 0 of this machine, then asserts that
    /// nothing is left alive in either simulation.
    pub fn check_on_one_rank(self, scenario: impl FnOnce(&Rig, OneRank)) {
        self.check(|rig| {
            let (ctx, comm) = rig.one_rank(0);
            let s = Stream::new(&ctx).unwrap();
            scenario(rig, OneRank { ctx, comm, s });
        });
    }

    /// A channel builder for `world` on this machine (its driver and NCCL).
    pub fn channel(&self, world: nccl_channel::World) -> nccl_channel::ChannelBuilder {
        nccl_channel::ChannelBuilder::new()
            .world(world)
            .cuda(self.cuda.clone())
            .nccl(self.nccl.clone())
    }

    /// The primary context of device `d`.
    pub fn context(&self, d: usize) -> cuda_hal::Context {
        self.cuda.device(d).unwrap().primary_context().unwrap()
    }

    /// Runs `f` on `n` ranks, one thread each, rank r on device r.
    pub fn run<R: Send>(&self, n: usize, f: impl Fn(&Communicator, &Stream) -> R + Sync) -> Vec<R> {
        self.run_with(n, &nccl_channel::CommConfig::new(), f)
    }

    /// As `run`, the communicators made with `config`.
    pub fn run_with<R: Send>(
        &self,
        n: usize,
        config: &nccl_channel::CommConfig,
        f: impl Fn(&Communicator, &Stream) -> R + Sync,
    ) -> Vec<R> {
        let id = UniqueId::generate(&self.nccl).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let (f, id) = (&f, &id);
                    s.spawn(move || {
                        let ctx = self.cuda.device(rank).unwrap().primary_context().unwrap();
                        let comm =
                            Communicator::init_rank_with(&self.nccl, &ctx, id, n, rank, config)
                                .unwrap();
                        let stream = Stream::new(&ctx).unwrap();
                        f(&comm, &stream)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Runs `f` on two ranks of a non-blocking communicator (deadline `timeout`), one
    /// thread each, rank r on device r.
    pub fn non_blocking_ranks<R: Send>(
        &self,
        timeout: std::time::Duration,
        f: impl Fn(usize, &cuda_hal::Context, &Communicator) -> R + Sync,
    ) -> Vec<R> {
        let id = UniqueId::generate(&self.nccl).unwrap();
        let config = nccl_channel::CommConfig::non_blocking(timeout);
        std::thread::scope(|scope| {
            let hs: Vec<_> = (0..2)
                .map(|rank| {
                    let (f, id, config) = (&f, &id, &config);
                    scope.spawn(move || {
                        let ctx = self.cuda.device(rank).unwrap().primary_context().unwrap();
                        let comm =
                            Communicator::init_rank_with(&self.nccl, &ctx, id, 2, rank, config)
                                .unwrap();
                        f(rank, &ctx, &comm)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// The primary contexts of devices 0..n.
    pub fn contexts(&self, n: usize) -> Vec<cuda_hal::Context> {
        (0..n).map(|d| self.context(d)).collect()
    }

    /// The communicators of devices 0..n made together (ncclCommInitAll), with their
    /// contexts.
    pub fn all_ranks(&self, n: usize) -> (Vec<cuda_hal::Context>, Vec<Communicator>) {
        let ctxs = self.contexts(n);
        let comms = Communicator::init_all(&self.nccl, &ctxs).unwrap();
        (ctxs, comms)
    }

    /// A one-rank communicator on `ctx` made by ncclCommInitRank with a new unique id,
    /// configured by `config`.
    pub fn init_rank_with(
        &self,
        ctx: &cuda_hal::Context,
        config: &nccl_channel::CommConfig,
    ) -> Communicator {
        let id = UniqueId::generate(&self.nccl).unwrap();
        Communicator::init_rank_with(&self.nccl, ctx, &id, 1, 0, config).unwrap()
    }

    /// A one-rank non-blocking communicator on `device` (deadline `timeout`), with its
    /// context.
    pub fn one_non_blocking(
        &self,
        device: usize,
        timeout: std::time::Duration,
    ) -> (cuda_hal::Context, Communicator) {
        let ctx = self.context(device);
        let config = nccl_channel::CommConfig::non_blocking(timeout);
        let comm = self.init_rank_with(&ctx, &config);
        (ctx, comm)
    }

    /// A one-rank communicator on `device` (ncclCommInitAll), with its context.
    pub fn one_rank(&self, device: usize) -> (cuda_hal::Context, Communicator) {
        let ctx = self.context(device);
        let comm = Communicator::init_all(&self.nccl, std::slice::from_ref(&ctx))
            .unwrap()
            .remove(0);
        (ctx, comm)
    }

    /// Makes the simulated NCCL's next call of `function` fail with `error`.
    pub fn fail_next(&self, function: &str, error: ncclResult_t) {
        self.world.fail_next(function, error);
    }

    /// Asserts that the simulated NCCL's sanitizer saw no invalid call.
    pub fn assert_no_nccl_violations(&self) {
        let v = self.world.violations();
        assert!(v.is_empty(), "{v:?}");
    }

    /// Asserts that the simulated GPU's sanitizer saw no invalid access.
    pub fn assert_no_gpu_violations(&self) {
        let v = self.gpus.violations();
        assert!(v.is_empty(), "{v:?}");
    }

    /// Asserts that nothing is left alive in either simulation.
    pub fn assert_clean(self) {
        let Rig {
            cuda,
            gpus,
            nccl,
            world,
        } = self;
        drop(nccl);
        drop(cuda);
        assert!(world.live().is_empty(), "NCCL leaked: {:?}", world.live());
        assert!(gpus.live().is_empty(), "CUDA leaked: {:?}", gpus.live());
        assert_eq!(gpus.order_violations(), 0);
        let v = gpus.violations();
        assert!(
            v.is_empty(),
            "the simulated GPU saw invalid accesses:\n{}",
            v.join("\n")
        );
    }
}

/// One rank on device 0: its context, a one-rank communicator (ncclCommInitAll) and a
/// stream of that context.
pub struct OneRank {
    pub ctx: cuda_hal::Context,
    pub comm: Communicator,
    pub s: Stream,
}

/// On a simulated machine of `devices` GPUs, runs `scenario` on [`OneRank`] of device 0,
/// then asserts that nothing is left alive in either simulation.
pub fn on_one_rank(devices: usize, scenario: impl FnOnce(&Rig, OneRank)) {
    Rig::new(devices).check_on_one_rank(scenario);
}

/// What `ChannelBuilder::build` says for rank 0 of 2 on a simulated machine when the
/// process's environment names no way to share the unique id.
pub fn two_ranks_without_a_shared_id() -> Error {
    let rig = Rig::new(2);
    let world = nccl_channel::World::new(2, 0).unwrap();
    let e = rig.channel(world).build().unwrap_err();
    rig.assert_clean();
    e
}

/// Runs `rank(r)` for each r in 0..n, one thread each; the results in rank order.
pub fn on_threads<R: Send>(n: usize, rank: impl Fn(usize) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let rank = &rank;
        let hs: Vec<_> = (0..n).map(|r| s.spawn(move || rank(r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// All-gathers `mine` over the channel's communicator on its stream, then closes the
/// channel; returns what the ranks sent, in rank order.
pub fn all_gather_and_close(ch: nccl_channel::Channel, mine: &[i32]) -> Vec<i32> {
    let ctx = ch.comm().context();
    let send = DeviceBuffer::from_slice(ctx, mine).unwrap();
    let mut recv = DeviceBuffer::<i32>::alloc(ctx, mine.len() * ch.comm().size()).unwrap();
    ch.comm().all_gather(&send, &mut recv, ch.stream()).unwrap();
    ch.stream().synchronize().unwrap();
    let v = recv.to_vec().unwrap();
    drop((send, recv));
    ch.close().unwrap();
    v
}

/// A port of 127.0.0.1 that the system just handed out (free when asked).
pub fn loopback_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A stream on each of `ctxs`.
pub fn streams(ctxs: &[cuda_hal::Context]) -> Vec<Stream> {
    ctxs.iter().map(|c| Stream::new(c).unwrap()).collect()
}

/// A stream on the context of each of `comms`.
pub fn streams_of(comms: &[&Communicator]) -> Vec<Stream> {
    comms
        .iter()
        .map(|c| Stream::new(c.context()).unwrap())
        .collect()
}

/// Sums `bufs[i]` in place over `comms[i]` on `streams[i]`, the ranks driven from this
/// thread in one group; waits for each rank and returns its result.
pub fn grouped_sums<T: NcclType>(
    nccl: &Nccl,
    comms: &[&Communicator],
    bufs: &mut [DeviceBuffer<T>],
    streams: &[Stream],
) -> Vec<Vec<T>> {
    nccl_channel::group(nccl, || {
        for ((c, b), s) in comms.iter().zip(bufs.iter_mut()).zip(streams) {
            c.all_reduce_in_place(b, ReduceOp::Sum, s)?;
        }
        Ok(())
    })
    .unwrap();
    comms
        .iter()
        .zip(bufs.iter())
        .zip(streams)
        .map(|((c, b), s)| {
            c.wait(s).unwrap();
            b.to_vec().unwrap()
        })
        .collect()
}

/// A non-blocking stream on each of `ctxs`.
pub fn non_blocking_streams(ctxs: &[cuda_hal::Context]) -> Vec<Stream> {
    ctxs.iter()
        .map(|c| Stream::non_blocking(c).unwrap())
        .collect()
}

/// A zeroed buffer of `len` elements on each of `ctxs`.
pub fn zeroed_on_each<T: NcclType>(ctxs: &[cuda_hal::Context], len: usize) -> Vec<DeviceBuffer<T>> {
    ctxs.iter()
        .map(|c| DeviceBuffer::zeroed(c, len).unwrap())
        .collect()
}

/// The graph of what `enqueue` puts on `s` (captured thread-locally), instantiated.
pub fn capture(s: &Stream, enqueue: impl FnOnce()) -> GraphExec {
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    enqueue();
    s.end_capture().unwrap().instantiate().unwrap()
}

/// A graph of `b`'s in-place all-reduce (`op`) on `s`, captured while `b` was registered;
/// the registration is dropped after the capture, so only the graph and NCCL hold it.
pub fn graph_holding_a_registration<T: NcclType>(
    comm: &Communicator,
    b: &mut DeviceBuffer<T>,
    op: ReduceOp<T>,
    s: &Stream,
) -> GraphExec {
    let reg = comm.register(&*b).unwrap();
    let graph = capture(s, || comm.all_reduce_in_place(b, op, s).unwrap());
    drop(reg);
    graph
}

/// New memory of `len` f32, filled with -1: on a GPU, likely where memory just dropped
/// was, so work that still uses the freed memory reads the pattern.
pub fn scribble(ctx: &cuda_hal::Context, len: usize) -> DeviceBuffer<f32> {
    let mut b = DeviceBuffer::<f32>::alloc(ctx, len).unwrap();
    b.fill(-1.0).unwrap();
    b
}

/// Asserts that `e` is NCCL's status `code`, returned by `call`.
#[track_caller]
pub fn assert_nccl_error(e: &Error, call: &str, code: ncclResult_t) {
    assert!(
        matches!(e, Error::Nccl { call: c, code: k, .. } if *c == call && *k == code),
        "{e}"
    );
}

/// Element types the tests can make from small integers and compare.
pub trait TestVal: NcclType + PartialEq + std::fmt::Debug {
    const IS_INT: bool;
    const FP8: bool = false;
    /// An exactly representable small integer.
    fn from_i(v: i64) -> Self;
    /// Wraps an integer result into the type (integers only).
    fn wrap(v: i128) -> Self;
    fn to_f(self) -> f64;
    /// Tolerance for inexact results (avg of floats).
    const TOL: f64 = 0.0;
}

macro_rules! int_val {
    ($($t:ty),*) => { $(
        impl TestVal for $t {
            const IS_INT: bool = true;
            fn from_i(v: i64) -> Self { v as $t }
            fn wrap(v: i128) -> Self { v as $t }
            fn to_f(self) -> f64 { self as f64 }
        }
    )* };
}
int_val!(i8, u8, i32, u32, i64, u64);

/// Floats: from and to `f64` by `as`, results within `$tol`.
macro_rules! float_val {
    ($($t:ty: $tol:expr),*) => { $(
        impl TestVal for $t {
            const IS_INT: bool = false;
            const TOL: f64 = $tol;
            fn from_i(v: i64) -> Self { v as $t }
            fn wrap(v: i128) -> Self { v as $t }
            fn to_f(self) -> f64 { self as f64 }
        }
    )* };
}
float_val!(f32: 1e-5, f64: 1e-12);

/// The half-precision types: through their `f64` conversions, results within `$tol`.
#[cfg(feature = "half")]
macro_rules! half_val {
    ($($t:ty: $tol:expr),*) => { $(
        impl TestVal for $t {
            const IS_INT: bool = false;
            const TOL: f64 = $tol;
            fn from_i(v: i64) -> Self { <$t>::from_f64(v as f64) }
            fn wrap(v: i128) -> Self { <$t>::from_f64(v as f64) }
            fn to_f(self) -> f64 { self.to_f64() }
        }
    )* };
}
#[cfg(feature = "half")]
half_val!(half::f16: 2e-3, half::bf16: 2e-2);

/// Encodes a small exact value into a minifloat with `m` mantissa bits and `bias`.
fn mini(v: f64, m: u32, bias: i32) -> u8 {
    if v == 0.0 {
        return 0;
    }
    let sign = if v < 0.0 { 0x80 } else { 0 };
    let a = v.abs();
    let e = a.log2().floor() as i32;
    let frac = a / 2f64.powi(e) - 1.0;
    let man = (frac * f64::from(1u32 << m)).round() as u8;
    sign | (((e + bias) as u8) << m) | man
}

fn unmini(b: u8, m: u32, bias: i32, fn_style: bool) -> f64 {
    let e_bits = 7 - m;
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> m) & ((1 << e_bits) - 1) as u8);
    let man = f64::from(b & ((1 << m) - 1) as u8) / f64::from(1u32 << m);
    if exp == (1 << e_bits) - 1 && (!fn_style || man == 1.0 - 1.0 / f64::from(1u32 << m)) {
        return if fn_style || man > 0.0 {
            f64::NAN
        } else {
            sign * f64::INFINITY
        };
    }
    if exp == 0 {
        sign * man * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + man) * 2f64.powi(exp - bias)
    }
}

/// The FP8 types: minifloats of `$m` mantissa bits and exponent bias `$bias`, results
/// within `$tol`.
macro_rules! fp8_val {
    ($($t:ident: $m:expr, $bias:expr, $fn_style:expr, $tol:expr);*) => { $(
        impl TestVal for $t {
            const IS_INT: bool = false;
            const FP8: bool = true;
            const TOL: f64 = $tol;
            fn from_i(v: i64) -> Self { $t(mini(v as f64, $m, $bias)) }
            fn wrap(v: i128) -> Self { $t(mini(v as f64, $m, $bias)) }
            fn to_f(self) -> f64 { unmini(self.0, $m, $bias, $fn_style) }
        }
    )* };
}
fp8_val!(Fp8E4M3: 3, 7, true, 0.15; Fp8E5M2: 2, 15, false, 0.3);

/// The input of rank `r` at element `i` for an op (small, exact in every type, and with
/// every partial sum or product exact too, whatever order NCCL reduces in).
pub fn input<T: TestVal>(op: &ReduceOp<T>, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Prod => 1 + ((r + i) % 2) as i64,
        _ if T::FP8 => ((r + i) % 2) as i64,
        _ => ((r + 1) * (i % 3 + 1)) as i64,
    }
}

/// The host-computed reduction of element `i` over `n` ranks.
pub fn expected<T: TestVal>(op: &ReduceOp<T>, n: usize, i: usize, scalar: i64) -> (T, f64) {
    let xs: Vec<i128> = (0..n).map(|r| i128::from(input(op, r, i))).collect();
    let exact: f64;
    let v: i128 = match op {
        ReduceOp::Sum => xs.iter().sum(),
        ReduceOp::Prod => xs.iter().product(),
        ReduceOp::Max => *xs.iter().max().unwrap(),
        ReduceOp::Min => *xs.iter().min().unwrap(),
        ReduceOp::PreMulSum(_) => xs.iter().map(|x| x * i128::from(scalar)).sum(),
        ReduceOp::Avg => {
            let s: i128 = xs.iter().sum();
            if T::IS_INT {
                // Wrapped sum, then a division that truncates toward zero.
                let w = T::wrap(s).to_f() as i128;
                let q = w / n as i128;
                return (T::wrap(q), q as f64);
            }
            exact = s as f64 / n as f64;
            return (T::from_i(0), exact);
        }
        _ => unreachable!("a reduction these tests do not know: {}", op.name()),
    };
    (T::wrap(v), v as f64)
}

/// Compares one result element with the reference.
pub fn same<T: TestVal>(got: T, want: (T, f64), op: &ReduceOp<T>) -> bool {
    if matches!(op, ReduceOp::Avg) && !T::IS_INT {
        (got.to_f() - want.1).abs() <= T::TOL * want.1.abs().max(1.0)
    } else {
        got == want.0
    }
}

/// The ops, with the pre-multiplied sum's scalar.
pub fn ops<T: TestVal>() -> Vec<ReduceOp<T>> {
    vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(T::from_i(2)),
    ]
}

/// For GPU tests that start the examples: whether this machine has `n` GPUs; when not,
/// says "skipped: needs N GPUs" (the test returns and passes).
pub fn gpus_or_skip(n: usize) -> bool {
    let have = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver")
        .device_count()
        .unwrap();
    test_support::enough_gpus(have, n)
}

/// The table the pool's tests were written against: all-gather, all-to-all and
/// send/receive register their pooled buffers from 1 MiB. They set it on each
/// communicator they pool with ([`pooled`]), so a newly measured default does not change
/// what they test; the default itself is tested in registration.rs.
pub const POOL_TEST_POLICY: &str =
    "all_gather 1M registered\nall_to_all 1M registered\nsendrecv 1M registered\n";

/// 1 MiB of f32: the smallest use [`POOL_TEST_POLICY`] registers.
pub const MIB_F32: usize = 1 << 18;

/// `comm`, its pool set to [`POOL_TEST_POLICY`].
pub fn pooled(comm: &Communicator) -> &Communicator {
    comm.set_pool_policy(nccl_channel::PoolPolicy::parse(POOL_TEST_POLICY).unwrap());
    comm
}

/// A table that registers every collective's pooled buffers from 0 bytes.
pub fn pool_registers_everything() -> nccl_channel::PoolPolicy {
    let text: String = nccl_channel::Collective::ALL
        .iter()
        .filter(|c| **c != nccl_channel::Collective::AllToAllV)
        .map(|c| format!("{c} 0 registered\n"))
        .collect();
    nccl_channel::PoolPolicy::parse(&text).unwrap()
}
