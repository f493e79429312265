//! Two GPUs, one rank each: a communicator grown from one rank to two, one-sided
//! puts between the GPUs' windows, and cudarc's memory in collectives (plain, in a group,
//! in a captured graph). The `#[ignore]`d tests run on the GPU machine
//! (`--ignored two_gpu --test-threads=1`, as `scripts/gpu suite` does); each says
//! "skipped: needs 2 GPUs" and passes on one, and where the loaded NCCL is older than grow
//! and one-sided (2.29.2) it checks the typed refusal and says what it skipped. The same
//! bodies run here on simulated devices: the grow and the puts on the in-process
//! simulators (also as an NCCL 2.28.9, the refusal), the cudarc one on the drop-in library,
//! which cudarc opens as its libcuda.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::Duration;

use cuda_hal::{Context, DeviceBuffer, Stream};
use nccl_channel::{
    CommConfig, Communicator, Error, ReduceOp, Signal, SignalWait, UniqueId, WindowFlags,
};
use nccl_sys::{Nccl, NcclVersion};

use crate::common::Rig;
use crate::common::backend::Machine;

/// Grow and one-sided operations came in this release.
const GROW_AND_ONE_SIDED: NcclVersion = NcclVersion::new(2, 29, 2);

/// Every wait of these tests ends here at the latest (a rank that never comes fails the
/// test with a timeout instead of hanging it).
const DEADLINE: Duration = Duration::from_secs(60);

/// The environment variable that marks a child running one test.
const CHILD: &str = "TWO_GPU_TEST_CHILD";

/// For a GPU test that must run without the caller's launcher variables (NCCL refuses
/// grow ids while `NCCL_COMM_ID` is set): `true` in the child that runs the test `name`
/// of this module, `false` in the test's process once that child passed. The child's
/// environment is scrubbed as for every GPU test's children: `NCCL_SYS_LIBRARY` and
/// `CUDA_SYS_LIBRARY` pass through.
fn in_gpu_child(name: &str) -> bool {
    let full = test_support::test_name(module_path!(), name);
    if std::env::var_os(CHILD).is_some_and(|v| v == full.as_str()) {
        return true;
    }
    let out = test_support::env::scrubbed_for_gpu(std::env::current_exe().unwrap())
        .args([
            &full,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &full)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "test {full} failed in its child");
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test named {full}"
    );
    false
}

/// Whether `nccl` has grow and the one-sided calls; when not, says what is skipped.
fn has_grow_and_one_sided(nccl: &Nccl, what: &str) -> bool {
    if nccl.version() >= GROW_AND_ONE_SIDED {
        return true;
    }
    println!(
        "skipped: {what} needs NCCL {GROW_AND_ONE_SIDED}, this is {} (the refusal is checked)",
        nccl.version()
    );
    false
}

/// The typed refusal of a call that needs 2.29.2.
fn too_old(nccl: &Nccl, feature: &'static str) -> Error {
    Error::Unsupported {
        feature,
        needed: GROW_AND_ONE_SIDED.to_string(),
        found: nccl.version().to_string(),
    }
}

/// A one-rank communicator on `ctx`, non-blocking with the tests' deadline.
fn alone(nccl: &Arc<Nccl>, ctx: &Context) -> Communicator {
    let id = UniqueId::generate(nccl).unwrap();
    Communicator::init_rank_with(nccl, ctx, &id, 1, 0, &CommConfig::non_blocking(DEADLINE)).unwrap()
}

// ---------------------------------------------------------------------------------------
// a. Grow from one rank to two

/// All-reduce length: prime, so no chunking of NCCL's lines up with it.
const REDUCED: usize = 1_000_003;
/// All-gather length per rank.
const GATHERED: usize = 65_537;

/// Rank `r`'s all-reduce input at element `i`: the sum over two ranks is `3 (i % 1009) + 1`.
fn reduce_input(r: usize, i: usize) -> i32 {
    ((i % 1009) * (r + 1) + r) as i32
}

/// Rank `r`'s all-gather input at element `i`: its rank and the index, both visible.
fn gather_input(r: usize, i: usize) -> u64 {
    ((r as u64) << 32) | i as u64
}

/// The indices where `got` differs from `want(i)`, at most 5 of them, and how many.
fn wrong<T: PartialEq + Copy + std::fmt::Debug>(
    got: &[T],
    want: impl Fn(usize) -> T,
) -> (usize, Vec<(usize, T, T)>) {
    let bad: Vec<(usize, T, T)> = got
        .iter()
        .enumerate()
        .filter(|(i, g)| **g != want(*i))
        .map(|(i, g)| (i, *g, want(i)))
        .collect();
    (bad.len(), bad.into_iter().take(5).collect())
}

/// An all-reduce (sum) and an all-gather over `comm` (two ranks), checked element by
/// element; `(rank, size)` of the communicator.
fn all_reduce_and_all_gather(comm: &Communicator) -> (usize, usize) {
    let (rank, size) = (comm.rank(), comm.size());
    assert_eq!(size, 2);
    let ctx = comm.context();
    let stream = Stream::non_blocking(ctx).unwrap();
    let send: Vec<i32> = (0..REDUCED).map(|i| reduce_input(rank, i)).collect();
    let send = DeviceBuffer::from_slice(ctx, &send).unwrap();
    let mut sum = DeviceBuffer::<i32>::zeroed(ctx, REDUCED).unwrap();
    comm.all_reduce(&send, &mut sum, ReduceOp::Sum, &stream)
        .unwrap();
    let mine: Vec<u64> = (0..GATHERED).map(|i| gather_input(rank, i)).collect();
    let mine = DeviceBuffer::from_slice(ctx, &mine).unwrap();
    let mut all = DeviceBuffer::<u64>::zeroed(ctx, 2 * GATHERED).unwrap();
    comm.all_gather(&mine, &mut all, &stream).unwrap();
    comm.wait(&stream).unwrap();
    let (n, first) = wrong(&sum.to_vec().unwrap(), |i| {
        reduce_input(0, i) + reduce_input(1, i)
    });
    assert_eq!(n, 0, "rank {rank}: {n} wrong sums, first {first:?}");
    let (n, first) = wrong(&all.to_vec().unwrap(), |i| {
        gather_input(i / GATHERED, i % GATHERED)
    });
    assert_eq!(n, 0, "rank {rank}: {n} wrong gathered, first {first:?}");
    (rank, size)
}

/// Rank 0 alone on `ctxs[0]` (it all-reduces once alone), grown to two ranks with a new
/// rank on `ctxs[1]`; then an all-reduce and an all-gather on the grown communicator,
/// checked on both ranks. `None` where NCCL has no grow (its refusal checked).
fn grow_one_rank_to_two(nccl: &Arc<Nccl>, ctxs: &[Context]) -> Option<Vec<(usize, usize)>> {
    if !has_grow_and_one_sided(nccl, "growing a communicator") {
        let comm = alone(nccl, &ctxs[0]);
        assert_eq!(comm.grow_id(), Err(too_old(nccl, "ncclCommGetUniqueId")));
        assert_eq!(
            comm.grow(2, None).map(|c| c.size()),
            Err(too_old(nccl, "ncclCommGrow"))
        );
        comm.close().unwrap();
        return None;
    }
    let config = CommConfig::non_blocking(DEADLINE);
    let (tx, rx) = channel::<UniqueId>();
    let out = std::thread::scope(|s| {
        let first = s.spawn(move || {
            let comm = alone(nccl, &ctxs[0]);
            let stream = Stream::non_blocking(&ctxs[0]).unwrap();
            let mut v = DeviceBuffer::from_slice(&ctxs[0], &[7i32, -3]).unwrap();
            comm.all_reduce_in_place(&mut v, ReduceOp::Sum, &stream)
                .unwrap();
            comm.wait(&stream).unwrap();
            assert_eq!(v.to_vec().unwrap(), [7, -3], "one rank's sum is its value");
            let id = comm.grow_id().unwrap();
            tx.send(id).unwrap();
            let grown = comm.grow(2, Some(&id)).unwrap();
            // NCCL's advice: the old communicator goes once the grow is done.
            comm.close().unwrap();
            let got = all_reduce_and_all_gather(&grown);
            grown.close().unwrap();
            got
        });
        let config = &config;
        let joiner = s.spawn(move || {
            let id = rx.recv().unwrap();
            let grown = Communicator::join_grown_with(nccl, &ctxs[1], &id, 2, 1, config).unwrap();
            let got = all_reduce_and_all_gather(&grown);
            grown.close().unwrap();
            got
        });
        vec![first.join().unwrap(), joiner.join().unwrap()]
    });
    println!(
        "grown from 1 rank to 2 (the new rank on the second device); all_reduce of {REDUCED} \
         i32 and all_gather of {GATHERED} u64 per rank checked element by element on both"
    );
    Some(out)
}

#[test]
#[ignore = "needs 2 GPUs and NCCL >= 2.29.2 (says skipped otherwise)"]
fn grow_one_rank_to_two_on_two_gpus() {
    const ME: &str = "grow_one_rank_to_two_on_two_gpus";
    if std::env::var_os(CHILD).is_none() && !crate::common::gpus_or_skip(2) {
        return;
    }
    // In a child without the caller's NCCL_COMM_ID (NCCL refuses grow ids under it).
    if !in_gpu_child(ME) {
        return;
    }
    let Some(m) = Machine::gpus(2) else { return };
    if let Some(ranks) = grow_one_rank_to_two(&m.nccl, &m.ctxs) {
        assert_eq!(ranks, [(0, 2), (1, 2)]);
    }
}

#[test]
fn grow_one_rank_to_two_simulated() {
    // In a child with a scrubbed environment: NCCL_COMM_ID and the like change what ids
    // NCCL hands out (the simulated NCCL refuses grow ids under it, as NCCL does).
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let m = Machine::simulated(2);
    assert_eq!(
        grow_one_rank_to_two(&m.nccl, &m.ctxs),
        Some(vec![(0, 2), (1, 2)])
    );
    m.check();
    // An NCCL without grow: the refusal, typed, and a skip.
    let old = Rig::with_version(2, NcclVersion::new(2, 28, 9));
    assert_eq!(grow_one_rank_to_two(&old.nccl, &old.contexts(2)), None);
    assert_eq!(old.world.calls("ncclCommGrow"), 0);
}

// ---------------------------------------------------------------------------------------
// b. One-sided put, signal and wait between the two GPUs

/// Bytes of each window (two per rank: the source and the target).
const WINDOW: usize = 2 << 20;
/// Bytes each put carries: prime, so neither a multiple of a word nor of a page.
const PUT: usize = 1_000_003;

/// The byte rank `r` writes at source position `i` (period 251, prime: no power of two
/// lines up with it).
fn pattern(r: usize, i: usize) -> u8 {
    ((i * 7 + 13 * r + 1) % 251) as u8
}

/// What the target windows hold before the puts.
const UNTOUCHED: u8 = 0xEE;

/// One put: from byte `src_at` of the sender's source window to byte `dst_at` of the
/// receiver's target window.
#[derive(Clone, Copy)]
struct Put {
    from: usize,
    src_at: usize,
    dst_at: usize,
}

/// Rank 0 puts into rank 1, then rank 1 into rank 0, at odd offsets.
const PUTS: [Put; 2] = [
    Put {
        from: 0,
        src_at: 7,
        dst_at: 12_347,
    },
    Put {
        from: 1,
        src_at: 1_000_999,
        dst_at: 1_048_583,
    },
];

/// Rank `rank` of two (a thread each): windows registered (a source and a target, both
/// `COLL_SYMMETRIC`), then for each put it sends it with a signal or waits for the
/// signal; returns its target window's bytes.
fn one_sided_rank(nccl: &Arc<Nccl>, ctx: &Context, id: &UniqueId, rank: usize) -> Vec<u8> {
    let config = CommConfig::non_blocking(DEADLINE);
    let comm = Communicator::init_rank_with(nccl, ctx, id, 2, rank, &config).unwrap();
    let stream = Stream::non_blocking(ctx).unwrap();
    let mut src = comm.alloc_nccl::<u8>(WINDOW).unwrap();
    let data: Vec<u8> = (0..WINDOW).map(|i| pattern(rank, i)).collect();
    src.copy_from_host(&data).unwrap();
    let mut dst = comm.alloc_nccl::<u8>(WINDOW).unwrap();
    dst.fill(UNTOUCHED).unwrap();
    let sym = WindowFlags::COLL_SYMMETRIC;
    // Collective: both ranks register their windows in the same order.
    let src_window = comm.register_window(&src, sym).unwrap();
    let dst_window = comm.register_window(&dst, sym).unwrap();
    println!(
        "rank {rank}: windows at {:x?} (source) and {:x?} (target)",
        src_window.user_ptr().unwrap(),
        dst_window.user_ptr().unwrap()
    );
    let peer = 1 - rank;
    for p in PUTS {
        if p.from == rank {
            let from = src.slice(p.src_at..p.src_at + PUT).unwrap();
            dst_window
                .put_signal(&from, peer, p.dst_at, Signal::DEFAULT, &stream)
                .unwrap();
        } else {
            comm.wait_signal(&[SignalWait::new(peer, 1)], &stream)
                .unwrap();
        }
        // Put done (sender), data arrived (receiver); within the deadline.
        comm.wait(&stream).unwrap();
    }
    let got = dst.to_vec().unwrap();
    dst_window.deregister().unwrap();
    src_window.deregister().unwrap();
    drop((src, dst));
    comm.close().unwrap();
    got
}

/// Two ranks on `ctxs` put a pattern into each other's window in turn and check it byte by
/// byte, and that nothing around it changed. `None` where NCCL has no one-sided calls
/// (their refusal checked).
fn one_sided_between_two_devices(nccl: &Arc<Nccl>, ctxs: &[Context]) -> Option<()> {
    if !has_grow_and_one_sided(nccl, "one-sided put/signal/wait") {
        let comm = alone(nccl, &ctxs[0]);
        let stream = Stream::non_blocking(&ctxs[0]).unwrap();
        assert_eq!(
            comm.signal(0, Signal::DEFAULT, &stream),
            Err(too_old(nccl, "ncclSignal"))
        );
        assert_eq!(
            comm.wait_signal(&[SignalWait::new(0, 1)], &stream),
            Err(too_old(nccl, "ncclWaitSignal"))
        );
        comm.close().unwrap();
        return None;
    }
    let id = UniqueId::generate(nccl).unwrap();
    let targets: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (ctx, id) = (&ctxs[r], &id);
                s.spawn(move || one_sided_rank(nccl, ctx, id, r))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for p in PUTS {
        let to = 1 - p.from;
        let landed = p.dst_at..p.dst_at + PUT;
        let (n, first) = wrong(&targets[to], |i| match landed.contains(&i) {
            true => pattern(p.from, p.src_at + (i - p.dst_at)),
            false => UNTOUCHED,
        });
        assert_eq!(
            n, 0,
            "rank {to}'s window after rank {}'s put of {PUT} bytes at {}: {n} wrong bytes, \
             first (index, got, want) {first:?}",
            p.from, p.dst_at
        );
    }
    println!(
        "one-sided: {PUT} bytes put with a signal from rank 0 into rank 1's window at byte \
         {} and back at byte {}, each waited for and checked byte by byte (and the bytes \
         around it untouched)",
        PUTS[0].dst_at, PUTS[1].dst_at
    );
    Some(())
}

#[test]
#[ignore = "needs 2 GPUs and NCCL >= 2.29.2 (says skipped otherwise)"]
fn one_sided_put_signal_wait_between_two_gpus() {
    let Some(m) = Machine::gpus(2) else { return };
    one_sided_between_two_devices(&m.nccl, &m.ctxs);
}

#[test]
fn one_sided_put_signal_wait_between_two_simulated_devices() {
    let m = Machine::simulated(2);
    assert_eq!(one_sided_between_two_devices(&m.nccl, &m.ctxs), Some(()));
    m.check();
    let old = Rig::with_version(2, NcclVersion::new(2, 28, 9));
    assert_eq!(
        one_sided_between_two_devices(&old.nccl, &old.contexts(2)),
        None
    );
    assert_eq!(old.world.calls("ncclSignal"), 0);
}

// ---------------------------------------------------------------------------------------
// c. cudarc's memory in collectives: plain, in a group, in a captured graph

/// cudarc on the devices `m` holds, one rank per thread (the drop-in library's on the
/// simulated machine: cudarc opens `libcuda` itself, so the in-process simulator cannot
/// serve it).
#[cfg(feature = "cudarc")]
mod cudarc_ranks {
    use std::sync::Arc;

    use cuda_hal::cudarc::{Borrowed, BorrowedMut};
    use cuda_hal::{CaptureMode, Context, Cuda, DeviceBuffer, Stream};
    use cudarc::driver::{CudaContext, CudaSlice};
    use nccl_channel::{Communicator, Error, ReduceOp, UniqueId, group};
    use nccl_sys::Nccl;

    use super::wrong;

    /// Elements per buffer: prime.
    const N: usize = 1_000_003;

    /// Rank `r`'s input at `i` (exact in f32, and so are its sums and their doubles).
    fn input(r: usize, i: usize) -> f32 {
        ((i % 1000) * (r + 1) + r) as f32
    }

    /// The sum over the two ranks at `i`.
    fn sum(i: usize) -> f32 {
        input(0, i) + input(1, i)
    }

    /// Asserts `got` is `want(i)` at every `i`.
    fn check(rank: usize, what: &str, got: &[f32], want: impl Fn(usize) -> f32) {
        assert_eq!(got.len(), N, "rank {rank}: {what}");
        let (n, first) = wrong(got, want);
        assert_eq!(n, 0, "rank {rank}: {what}: {n} wrong, first {first:?}");
    }

    /// What a loan of cudarc's memory is refused with where the work would outlive it.
    fn deferred(why: &'static str) -> Error {
        Error::Cuda(cuda_hal::Error::Deferred {
            what: "borrowed cudarc memory",
            why,
        })
    }

    const IN_A_GROUP: &str = "an NCCL group (a DeferScope) is open on this thread";
    const CAPTURED: &str = "the stream is being captured";

    /// One rank: cudarc's context, stream and memory adopted; an all-reduce on lent
    /// memory; in a group moved-in memory works and lent memory is refused; in a captured
    /// graph launched twice likewise. Every result is read back by cudarc.
    fn rank(cuda: &Cuda, nccl: &Arc<Nccl>, id: &UniqueId, rank: usize) {
        let theirs = CudaContext::new(rank).unwrap();
        let ctx = Context::from_cudarc(cuda, &theirs).unwrap();
        assert_eq!(ctx, cuda.device(rank).unwrap().primary_context().unwrap());
        // cudarc's stream, and the same stream adopted.
        let home = theirs.new_stream().unwrap();
        // SAFETY: cudarc captures `home` on this thread only, never while work is being
        // enqueued on it from another.
        let adopted = unsafe { Stream::from_cudarc(&ctx, &home) }.unwrap();
        // A stream of this crate's own: lent memory is ordered across the two.
        let ours = Stream::non_blocking(&ctx).unwrap();
        let comm = Communicator::init_rank(nccl, &ctx, id, 2, rank).unwrap();
        let host: Vec<f32> = (0..N).map(|i| input(rank, i)).collect();

        // 1. Plain: cudarc's slices lent, the all-reduce on this crate's stream; cudarc's
        // read on its own stream comes after it.
        let send = home.clone_htod(&host).unwrap();
        let mut recv: CudaSlice<f32> = home.alloc_zeros(N).unwrap();
        comm.all_reduce(
            &Borrowed::new(&ctx, &send).unwrap(),
            &mut BorrowedMut::new(&ctx, &mut recv).unwrap(),
            ReduceOp::Sum,
            &ours,
        )
        .unwrap();
        check(rank, "lent", &home.clone_dtoh(&recv).unwrap(), sum);

        // 2. In a group: lent memory is refused (the work would run after the loan), both
        // kinds, before NCCL; moved-in memory works, its send buffer dropped inside.
        let mut out = DeviceBuffer::from_cudarc(&ctx, home.alloc_zeros::<f32>(N).unwrap()).unwrap();
        let refused = group(nccl, || {
            comm.all_reduce(
                &Borrowed::new(&ctx, &send)?,
                &mut out,
                ReduceOp::Sum,
                &adopted,
            )
        });
        assert_eq!(refused, Err(deferred(IN_A_GROUP)));
        let refused = group(nccl, || {
            let mut lent = BorrowedMut::new(&ctx, &mut recv)?;
            comm.all_reduce_in_place(&mut lent, ReduceOp::Sum, &adopted)
        });
        assert_eq!(refused, Err(deferred(IN_A_GROUP)));
        check(rank, "left alone", &home.clone_dtoh(&recv).unwrap(), sum);
        let moved_in = DeviceBuffer::from_cudarc(&ctx, home.clone_htod(&host).unwrap()).unwrap();
        group(nccl, || {
            comm.all_reduce(&moved_in, &mut out, ReduceOp::Sum, &adopted)?;
            // Kept until the group's end, then freed by cudarc after the work.
            drop(moved_in);
            Ok(())
        })
        .unwrap();
        let back = out.into_cudarc().unwrap();
        check(rank, "grouped", &home.clone_dtoh(&back).unwrap(), sum);

        // 3. In a captured graph, launched twice: the in-place sum doubles at the second
        // launch. Lent memory is refused in the capture, which goes on.
        let mut buf = DeviceBuffer::from_cudarc(&ctx, home.alloc_zeros::<f32>(N).unwrap()).unwrap();
        // Filled on the adopted stream before the capture: the crate counts the buffer's
        // home (its own wrapper of cudarc's stream) and `adopted` as two streams, and a
        // first use on another stream than the home is ordered with an event, which a
        // capture of that very stream refuses (`Capturing`).
        buf.copy_from_host_on(&host, &adopted).unwrap();
        // Lent before the capture: lending orders cudarc's stream, the one captured.
        let mut lent = BorrowedMut::new(&ctx, &mut recv).unwrap();
        adopted.begin_capture(CaptureMode::ThreadLocal).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &adopted)
            .unwrap();
        let refused = comm.all_reduce_in_place(&mut lent, ReduceOp::Sum, &adopted);
        let graph = adopted.end_capture().unwrap().instantiate().unwrap();
        drop(lent);
        assert_eq!(refused, Err(deferred(CAPTURED)));
        let buf = buf.into_cudarc().expect_err("the graph holds the memory");
        graph.launch(&adopted).unwrap();
        graph.launch(&adopted).unwrap();
        drop(graph);
        let back = buf.into_cudarc().unwrap();
        check(
            rank,
            "graph, 2 launches",
            &home.clone_dtoh(&back).unwrap(),
            |i| 2.0 * sum(i),
        );
        check(
            rank,
            "untouched by the capture",
            &home.clone_dtoh(&recv).unwrap(),
            sum,
        );
        drop((send, recv, back));
        comm.close().unwrap();
    }

    /// Two ranks, a thread each, on devices 0 and 1 of `cuda` (which cudarc's libcuda must
    /// be).
    pub(super) fn two_ranks(cuda: &Cuda, nccl: &Arc<Nccl>) {
        let id = UniqueId::generate(nccl).unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || rank(cuda, nccl, id, r))
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
        println!(
            "cudarc: {N} f32 per rank all-reduced on 2 devices lent (Borrowed), moved in \
             (from_cudarc) in a group, and in a captured graph launched twice; lent memory \
             refused in the group and the capture; every result read back by cudarc"
        );
    }
}

#[cfg(feature = "cudarc")]
#[test]
#[ignore = "needs 2 GPUs (says skipped otherwise); best under compute-sanitizer"]
fn cudarc_collectives_on_two_gpus() {
    let Some(m) = Machine::gpus(2) else { return };
    cudarc_ranks::two_ranks(&m.cuda, &m.nccl);
}

#[cfg(feature = "cudarc")]
#[test]
fn cudarc_collectives_on_two_simulated_gpus_of_the_dropin() {
    // In a child whose libcuda and libnccl are the drop-in (two devices), cudarc's and
    // ours alike; its sanitizer fails the child at exit on any invalid access or
    // unordered free.
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (dir, library) = (
        test_support::dropin::dir(tmp),
        test_support::dropin::library(tmp),
    );
    if !test_support::this_test_in_scrubbed_child!(&[
        ("LD_LIBRARY_PATH", dir.as_os_str()),
        ("CUDA_MOCK_DEVICES", std::ffi::OsStr::new("2")),
        // The child finds the built library here instead of building it again.
        ("DROPIN_LIBRARY", library.as_os_str()),
    ]) {
        return;
    }
    let m = Machine::gpus(2).expect("the drop-in has 2 devices");
    cudarc_ranks::two_ranks(&m.cuda, &m.nccl);
}
