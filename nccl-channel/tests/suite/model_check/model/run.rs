//! Runs a program on a fresh simulated machine (two devices, the simulated driver and
//! NCCL as sanitizers) and judges it: no sanitizer report, no panic but the injected
//! ones, nothing leaked unless the program took a documented leak-on-failure path.

use std::cell::{OnceCell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_hal::{
    CaptureMode, Context, Cuda, DeferScope, Dependency, DeviceBuffer, GraphExec, KeepAlive, Stream,
};
use cuda_mock::{MockDriver, MockWorld};
use cuda_sys::{CUresult, CUstreamCaptureMode};
use nccl_channel::{
    AbortHandle, Collective, CommConfig, Communicator, Error, Group, PoolPolicy, PooledBuffer,
    ReduceOp, Registration, Signal, SignalWait, SymmetricBuffer, UniqueId, Window, WindowFlags,
};
use nccl_mock::{MockNccl, MockNcclWorld};
use nccl_sys::Nccl;

use super::generate::Rng;
use super::program::{Coll, Fault, Op, Program, Sabotage};

mod newer;

/// The calls whose failure takes a documented leak-on-failure path: a free whose wait
/// fails keeps its memory; a settle whose poll fails keeps what its group held; NCCL that
/// refuses a deregistration keeps the memory. Other injected failures excuse nothing.
const LEAKY: [&str; 3] = [
    "cuStreamSynchronize",
    "ncclCommGetAsyncError",
    "ncclCommDeregister",
];

/// The payload of the one panic a program may inject.
pub const INJECTED: &str = "model: injected panic";

/// The panic of the faulty kernel's host twin (reported by the simulated driver: expected).
pub const FAULTY_KERNEL: &str = "model: faulty kernel";

/// The PTX the programs load: the simulated driver reads its `.entry` names.
const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 x, .param .u32 n) { ret; }
.visible .entry fault(.param .u64 x, .param .u32 n) { ret; }
";

/// The sanitizer's reports, less the expected ones (the faulty kernel's).
fn unexpected(v: Vec<String>) -> Vec<String> {
    v.into_iter()
        .filter(|m| !m.contains(FAULTY_KERNEL))
        .collect()
}

/// What went wrong, as the shrinker compares failures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The sanitizer's reports.
    Violation(String),
    /// A panic that was not injected: the step and its message.
    Panic(String),
    /// Something left alive where no leak is documented.
    Leak(String),
    /// The program did not finish within its deadline.
    Hang,
    /// The child process died without a result (an abort, a signal).
    Crash(String),
}

impl Failure {
    /// The kind, for the shrinker: a smaller program must fail the same way.
    pub fn kind(&self) -> u8 {
        match self {
            Failure::Violation(_) => 0,
            Failure::Panic(_) => 1,
            Failure::Leak(_) => 2,
            Failure::Hang => 3,
            Failure::Crash(_) => 4,
        }
    }

    /// One line, for the child's answer.
    pub fn encode(&self) -> String {
        let (k, m) = match self {
            Failure::Violation(m) => ("violation", m.as_str()),
            Failure::Panic(m) => ("panic", m.as_str()),
            Failure::Leak(m) => ("leak", m.as_str()),
            Failure::Hang => ("hang", ""),
            Failure::Crash(m) => ("crash", m.as_str()),
        };
        format!("{k} {}", m.replace('\\', "\\\\").replace('\n', "\\n"))
    }

    pub fn decode(s: &str) -> Failure {
        let (k, m) = s.split_once(' ').unwrap_or((s, ""));
        let m = m.replace("\\n", "\n").replace("\\\\", "\\");
        match k {
            "violation" => Failure::Violation(m),
            "panic" => Failure::Panic(m),
            "leak" => Failure::Leak(m),
            "hang" => Failure::Hang,
            _ => Failure::Crash(m),
        }
    }
}

/// Runs `p` on a thread of its own within `deadline`.
pub fn run(p: &Program, deadline: Duration) -> Result<(), Failure> {
    let p = p.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("model-program".into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| execute(&p)));
            let _ = tx.send(r.unwrap_or_else(|e| Err(Failure::Panic(message(&*e)))));
        })
        .expect("a thread for the program");
    match rx.recv_timeout(deadline) {
        Ok(r) => {
            let _ = worker.join();
            r
        }
        // The worker is left behind (a hang cannot be cancelled).
        Err(_) => Err(Failure::Hang),
    }
}

fn message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| e.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// A refused `Communicator::symmetric` of `len` elements on a single-rank communicator:
/// an argument refused only for the documented misuses (empty, inside a group), and
/// `Unsupported` only from an NCCL without windows (the simulated NCCL's windows are on);
/// other errors come from injected faults, captures, or a dead or suspended communicator.
fn symmetric_refused(c: &Communicator, len: u8, e: &Error) {
    match e {
        Error::InvalidArgument { problem, .. } => {
            let documented =
                len == 0 || (cuda_hal::DeferScope::is_open() && problem.contains("open group"));
            assert!(documented, "Communicator::symmetric({len}): {e:?}");
        }
        Error::Unsupported { .. } => assert!(
            c.nccl().version() < nccl_sys::NcclVersion(22703),
            "Communicator::symmetric({len}) on NCCL {}: {e:?}",
            c.nccl().version()
        ),
        _ => {}
    }
}

/// A buffer of the program, of whichever kind.
enum Buf<'c> {
    Plain(DeviceBuffer<i32>),
    Pooled(PooledBuffer<'c, i32>),
    /// With the communicator that allocated it.
    Symmetric(SymmetricBuffer<'c, i32>, &'c Communicator),
    /// Memory adopted with an [`Owner`]: `owner` indexes the drop counters.
    Adopted {
        buf: DeviceBuffer<i32>,
        owner: usize,
    },
}

impl Buf<'_> {
    fn get(&self) -> &DeviceBuffer<i32> {
        match self {
            Buf::Plain(b) | Buf::Adopted { buf: b, .. } => b,
            Buf::Pooled(b) => b,
            Buf::Symmetric(b, _) => b,
        }
    }

    fn get_mut(&mut self) -> &mut DeviceBuffer<i32> {
        match self {
            Buf::Plain(b) | Buf::Adopted { buf: b, .. } => b,
            Buf::Pooled(b) => b,
            Buf::Symmetric(b, _) => b,
        }
    }

    /// The buffer itself, when it can be moved out (not a pool's).
    fn into_buffer(self) -> Result<DeviceBuffer<i32>, Self> {
        match self {
            Buf::Plain(b) | Buf::Adopted { buf: b, .. } => Ok(b),
            other => Err(other),
        }
    }
}

/// Counts its drops (owners of adopted memory and contexts).
struct Token(Arc<AtomicUsize>);

impl Drop for Token {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Another crate's buffer, moved whole into `DeviceBuffer::from_owner(_on)`: dropping it
/// frees the memory.
struct Owner {
    buf: Option<DeviceBuffer<i32>>,
    _token: Token,
}

/// A dependency whose `settle` panics with [`INJECTED`].
struct PanicsWhenSettled;

impl Dependency for PanicsWhenSettled {
    fn settle(&self) -> bool {
        std::panic::panic_any(INJECTED)
    }
}

thread_local! {
    /// A user's thread-local keeping an open group (GroupInThreadLocal).
    static KEPT: RefCell<Option<Group<'static>>> = const { RefCell::new(None) };
}

/// What a running program holds; `'c` is the life of its communicators.
struct State<'c> {
    nccl: &'c Arc<Nccl>,
    cuda: &'c Cuda,
    gpus: &'c MockWorld,
    world: &'c MockNcclWorld,
    comms: Vec<&'c Communicator>,
    aborts: Vec<AbortHandle>,
    /// The abort handles of the non-blocking communicators (whose unsettled groups leak).
    non_blocking_aborts: Vec<AbortHandle>,
    children: &'c [OnceCell<Communicator>],
    modules: &'c [cuda_hal::Module; 2],
    streams: Vec<Stream>,
    bufs: Vec<Option<Buf<'c>>>,
    graphs: Vec<Option<GraphExec>>,
    regs: Vec<Option<Registration<'c>>>,
    wins: Vec<Option<Window<'c>>>,
    /// Signals known to have arrived, by communicator address (puts and signals done
    /// outside groups and captures).
    arrived: std::collections::HashMap<usize, u32>,
    /// The communicator of each of `wins`.
    win_comms: Vec<Option<&'c Communicator>>,
    groups: Vec<Group<'c>>,
    injected_panic: bool,
    /// Injected failures, with the calls of their function so far when injected: one
    /// whose function was called since has fired.
    faults: Vec<(Fault, u64)>,
    /// A group was kept in another thread's thread-local (it leaks by design).
    thread_local_group: bool,
    /// Threads still running beside the program (joined by the teardown).
    background: Vec<std::thread::JoinHandle<()>>,
    /// The drop counters of the owners of adopted memory, by owner.
    owners: Vec<Arc<AtomicUsize>>,
    /// The drop counters of the owners of adopted contexts.
    ctx_owners: Vec<Arc<AtomicUsize>>,
    /// Stream-ordered memory given back by its owner (`into_raw` of it would need a
    /// stream-ordered free): their addresses.
    ordered: Vec<u64>,
    /// The foreign streams (also in `streams`).
    foreign: Vec<Stream>,
    /// Graphs another library captured on foreign stream `.0` (executable, raw).
    raw_graphs: Vec<(usize, usize)>,
    /// Another library captured a foreign stream: work the crate enqueued meanwhile keeps
    /// what it uses for good (documented), so leaks are excused.
    foreign_capture: bool,
    /// `after_enqueue` hooks registered in an open group: each runs at most once.
    hooks: Vec<Arc<AtomicUsize>>,
    /// The raw streams on which the program began a capture (the crate's or another
    /// library's): no other stream may ever be found captured.
    began: Vec<usize>,
    /// The simulated NCCL's release.
    version: nccl_sys::NcclVersion,
    /// The communicators the program suspended (by address) and did not resume.
    suspended: std::collections::HashSet<usize>,
}

fn pick<T>(v: &[T], i: u8) -> Option<usize> {
    (!v.is_empty()).then(|| i as usize % v.len())
}

/// A variable-size all-to-all of `send` into `recv` on single-rank `c`: one entry per
/// slice, the region to itself, laid out by the step's `[count, send_at, recv_at, misuse]`
/// (see [`Coll::AllToAllV`]). A misused layout must be refused with `InvalidArgument`, or
/// with an error of the checks that come before the layout's (the communicator unusable
/// or suspended, a buffer or the stream of another device or context), and make no send
/// or receive.
fn all_to_all_v(
    c: &Communicator,
    send: &DeviceBuffer<i32>,
    recv: &mut DeviceBuffer<i32>,
    [count, send_at, recv_at, misuse]: [u8; 4],
    s: &Stream,
    world: &MockNcclWorld,
) -> nccl_channel::Result<()> {
    let (n, m) = (send.len(), recv.len());
    let count = count as usize % (n.min(m) + 1);
    let send_at = send_at as usize % (n - count + 1);
    let recv_at = recv_at as usize % (m - count + 1);
    let (mut sc, mut sd) = (vec![count], vec![send_at]);
    let (mut rc, mut rd) = (vec![count], vec![recv_at]);
    match misuse {
        0 => {}
        1 => {
            sc.push(0);
            rc.push(0);
        }
        2 => sd[0] = n - count + 1,
        3 => {
            sc[0] = count.max(1);
            rc[0] = count.max(1);
            rd[0] = usize::MAX;
        }
        // Both regions stay in their buffers: only the counts to itself differ.
        _ if count > 0 => sc[0] = count - 1,
        _ => (sc[0], sd[0]) = (1, 0),
    }
    let p2p = || (world.calls("ncclSend"), world.calls("ncclRecv"));
    let before = p2p();
    let r = c.all_to_all_v(send, &sc, &sd, recv, &rc, &rd, s);
    if misuse != 0 {
        let refused = match &r {
            Err(Error::InvalidArgument { what, .. }) => *what == "all_to_all_v",
            Err(
                Error::Aborted
                | Error::GroupedElsewhere { .. }
                | Error::Suspended { .. }
                | Error::WrongDevice { .. }
                | Error::WrongContext { .. },
            ) => true,
            _ => false,
        };
        assert!(refused, "all_to_all_v misused ({misuse}): {r:?}");
        assert_eq!(p2p(), before, "a refused all_to_all_v reached NCCL");
    }
    r
}

/// Runs `p` here and judges it.
pub fn execute(p: &Program) -> Result<(), Failure> {
    let driver = MockDriver::with_devices(2)
        .kernel("scale", &[8, 4], |k| {
            let (x, n) = (k.param::<u64>(0), k.param::<u32>(1) as usize);
            let v: Vec<i32> = k
                .read::<i32>(x, n)
                .iter()
                .map(|v| v.wrapping_mul(2))
                .collect();
            k.write(x, &v);
        })
        .kernel("fault", &[8, 4], |_| std::panic::panic_any(FAULTY_KERNEL));
    let (cuda, gpus) = driver
        .build_with(Cuda::from_driver)
        .expect("the simulated driver");
    let (nccl, world) = MockNccl::new(&gpus)
        .version(p.setup.version)
        .timeout(Duration::from_secs(3))
        .build()
        .expect("the simulated NCCL");
    let nccl = Arc::new(nccl);
    let ctxs = [
        cuda.device(0)
            .and_then(|d| d.primary_context())
            .expect("device 0"),
        cuda.device(1)
            .and_then(|d| d.primary_context())
            .expect("device 1"),
    ];
    let blocking = CommConfig::new().check_calls(p.setup.check_calls);
    let first = newer::init(&nccl, &ctxs[0], &blocking, p.setup.scalable).expect("communicator 0");
    let second = if p.setup.second_non_blocking {
        let config =
            CommConfig::non_blocking(Duration::from_secs(3)).check_calls(p.setup.check_calls);
        newer::init(&nccl, &ctxs[1], &config, p.setup.scalable).expect("communicator 1")
    } else {
        newer::init(&nccl, &ctxs[1], &blocking, p.setup.scalable).expect("communicator 1")
    };
    let children: [OnceCell<Communicator>; 4] = Default::default();
    let modules = [
        cuda_hal::Module::from_ptx(&ctxs[0], PTX).expect("module 0"),
        cuda_hal::Module::from_ptx(&ctxs[1], PTX).expect("module 1"),
    ];
    let streams = ctxs
        .iter()
        .flat_map(|c| [Stream::non_blocking(c), Stream::new(c)])
        .collect::<Result<Vec<_>, _>>()
        .expect("streams");
    let mut st = State {
        nccl: &nccl,
        cuda: &cuda,
        gpus: &gpus,
        world: &world,
        aborts: vec![first.abort_handle(), second.abort_handle()],
        non_blocking_aborts: if p.setup.second_non_blocking {
            vec![second.abort_handle()]
        } else {
            Vec::new()
        },
        comms: vec![&first, &second],
        children: &children,
        modules: &modules,
        streams,
        bufs: Vec::new(),
        graphs: Vec::new(),
        regs: Vec::new(),
        wins: Vec::new(),
        arrived: Default::default(),
        win_comms: Vec::new(),
        groups: Vec::new(),
        injected_panic: false,
        faults: Vec::new(),
        thread_local_group: false,
        background: Vec::new(),
        owners: Vec::new(),
        ctx_owners: Vec::new(),
        ordered: Vec::new(),
        foreign: Vec::new(),
        raw_graphs: Vec::new(),
        foreign_capture: false,
        hooks: Vec::new(),
        began: Vec::new(),
        version: p.setup.version,
        suspended: Default::default(),
    };
    for (i, op) in p.ops.iter().enumerate() {
        // A foreign stream being captured (by another library, or by the crate through
        // another wrapper of it) keeps what work on it uses for good: a documented leak.
        st.foreign_capture |= st.foreign.iter().any(|s| s.is_capturing().unwrap_or(true));
        let r = catch_unwind(AssertUnwindSafe(|| st.step(op)));
        if let Err(e) = r {
            let m = message(&*e);
            if !(m == INJECTED && st.injected_panic) {
                return Err(Failure::Panic(format!("step {i} ({op:?}): {m}")));
            }
        }
        // An owner goes only with its memory: never while the program's buffer lives.
        for b in st.bufs.iter().flatten() {
            if let Buf::Adopted { owner, .. } = b
                && st.owners[*owner].load(Ordering::SeqCst) != 0
            {
                return Err(Failure::Panic(format!(
                    "step {i} ({op:?}): owner {owner} was dropped while its buffer lives"
                )));
            }
        }
        // A stream captured that nobody began a capture on joined one behind everybody's
        // back (an event of a stream another library captures, waited for by the crate):
        // its work lands in that graph instead of running, and nothing holds it.
        if let Some(s) = st.streams.iter().find(|s| {
            s.is_capturing().unwrap_or(false) && !st.began.contains(&(s.as_raw() as usize))
        }) {
            return Err(Failure::Violation(format!(
                "after step {i} ({op:?}): stream {:?} joined a capture nobody began on it",
                s.as_raw()
            )));
        }
        // Steps may fail with typed errors (that is the point); only the sanitizer judges.
        let v = unexpected(gpus.violations());
        if !v.is_empty() {
            return Err(Failure::Violation(format!(
                "after step {i} ({op:?}):\n{}",
                v.join("\n")
            )));
        }
    }
    // (Also a capture the last step began.)
    st.foreign_capture |= st.foreign.iter().any(|s| s.is_capturing().unwrap_or(true));
    let r = catch_unwind(AssertUnwindSafe(|| st.teardown(p.setup.teardown)));
    if let Err(e) = r {
        let m = message(&*e);
        if !(m == INJECTED && st.injected_panic) {
            return Err(Failure::Panic(format!("teardown: {m}")));
        }
    }
    if p.setup.second_non_blocking {
        // A non-blocking communicator's grouped work runs in the background 20 ms after
        // its group ended: let it run while the communicators live, so that memory the
        // teardown freed too early is seen.
        std::thread::sleep(Duration::from_millis(30));
    }
    let injected = st.injected_panic;
    // A communicator that failed (an abort asked for by an error, a deadline or the
    // program) takes the leak-on-failure paths: what its unsettled work held is kept.
    let failed = st.non_blocking_aborts.iter().any(AbortHandle::is_requested);
    let (faults, thread_local_group) = (st.faults.clone(), st.thread_local_group);
    let foreign_capture = st.foreign_capture;
    let owners: Vec<_> = st.owners.iter().chain(&st.ctx_owners).cloned().collect();
    let hooks = st.hooks.clone();
    drop(st);
    drop(children);
    drop(modules);
    drop((first, second));
    if injected {
        // Background work of a group whose settle panicked runs a moment later.
        std::thread::sleep(Duration::from_millis(60));
    }
    drop((ctxs, nccl, cuda));
    let v = unexpected(gpus.violations());
    if !v.is_empty() {
        return Err(Failure::Violation(format!(
            "after the teardown:\n{}",
            v.join("\n")
        )));
    }
    // The documented leak-on-failure paths a program took: an injected failure that fired
    // (until the very end: a drop may be the call that fails), the injected panic, a
    // thread-local group, and a failed non-blocking communicator (an unsettled group keeps
    // what it held; a blocking one always settles).
    let fired = faults.iter().any(|&(f, before)| match f {
        Fault::Nccl(name, _) => LEAKY.contains(&name) && world.calls(name) > before,
        Fault::Cuda(name, _) => LEAKY.contains(&name) && gpus.calls(name) > before,
    });
    if let Some(h) = hooks.iter().find(|h| h.load(Ordering::SeqCst) > 1) {
        return Err(Failure::Panic(format!(
            "an after_enqueue hook ran {} times",
            h.load(Ordering::SeqCst)
        )));
    }
    let excused = injected
        || fired
        || thread_local_group
        || foreign_capture
        || (p.setup.second_non_blocking && failed);
    if !excused {
        // Every owner (of memory, of a context) is dropped once its memory is released.
        if let Some(k) = owners.iter().position(|o| o.load(Ordering::SeqCst) != 1) {
            return Err(Failure::Leak(format!(
                "owner {k} dropped {} times",
                owners[k].load(Ordering::SeqCst)
            )));
        }
        // A context released while memory of it lives: a leak (counted by the driver as
        // children outliving their context), allowed on the leak-on-failure paths only.
        if gpus.order_violations() != 0 {
            return Err(Failure::Leak(
                "a context outlived by its memory or streams".into(),
            ));
        }
        if !world.live().is_empty() {
            return Err(Failure::Leak(format!("NCCL: {:?}", world.live())));
        }
        if !gpus.live().is_empty() {
            return Err(Failure::Leak(format!("CUDA: {:?}", gpus.live())));
        }
    }
    Ok(())
}

impl<'c> State<'c> {
    fn comm(&self, i: u8) -> Option<&'c Communicator> {
        let live: Vec<&'c Communicator> = self
            .comms
            .iter()
            .copied()
            .chain(self.children.iter().filter_map(OnceCell::get))
            .collect();
        pick(&live, i).map(|k| live[k])
    }

    /// Whether work enqueued on `s` now runs now (no open group, no capture).
    fn runs_now(&self, s: &Stream) -> bool {
        !DeferScope::is_open() && !s.is_capturing().unwrap_or(true)
    }

    fn stream(&self, i: u8) -> &Stream {
        &self.streams[i as usize % self.streams.len()]
    }

    fn buf(&self, i: u8) -> Option<usize> {
        let live: Vec<usize> = (0..self.bufs.len())
            .filter(|&k| self.bufs[k].is_some())
            .collect();
        pick(&live, i).map(|k| live[k])
    }

    /// Moves buffer `slot` out, when it is not a pool's.
    fn take_buffer(&mut self, slot: u8) -> Option<DeviceBuffer<i32>> {
        let k = self.buf(slot)?;
        match self.bufs[k].take()?.into_buffer() {
            Ok(b) => Some(b),
            Err(other) => {
                self.bufs[k] = Some(other);
                None
            }
        }
    }

    /// Whether `into_owner` may refuse a buffer nobody else holds: a wait that may fail
    /// (an injected failure), a capture (of any stream: the checker does not know which
    /// streams the memory was used on) or an open group.
    fn may_refuse(&self) -> bool {
        !self.faults.is_empty()
            || DeferScope::is_open()
            || self
                .streams
                .iter()
                .any(|s| s.is_capturing().unwrap_or(true))
    }

    /// The adoption steps: other crates' memory, streams and contexts.
    fn foreign_step(&mut self, op: &Op) {
        match *op {
            Op::AdoptOwned {
                slot,
                stream,
                on_home,
            } => {
                let drops = Arc::new(AtomicUsize::new(0));
                let token = Token(drops.clone());
                let buf = if on_home {
                    let home = self.stream(stream).clone();
                    let len = 1 + (slot % 4) as usize * 2;
                    let Ok(mut theirs) = DeviceBuffer::<i32>::alloc_on(&home, len) else {
                        return;
                    };
                    // Pending on the home stream only, as `from_owner_on` allows.
                    let _ = theirs.fill_async(i32::from(slot), &home);
                    let ptr = theirs.as_raw();
                    let owner = Owner {
                        buf: Some(theirs),
                        _token: token,
                    };
                    // SAFETY: `len` `i32`s of `home`'s context, allocated in order on `home`
                    // while `owner` (holding `theirs`) lives, which frees them in order
                    // there; its only pending work is on `home`; nothing else uses them.
                    unsafe { DeviceBuffer::from_owner_on(&home, ptr, len, owner) }
                } else {
                    let Some(k) = self.buf(slot) else { return };
                    if !matches!(&self.bufs[k], Some(Buf::Plain(b)) if b.owners() == 1) {
                        return;
                    }
                    let Some(Buf::Plain(theirs)) = self.bufs[k].take() else {
                        return;
                    };
                    if theirs.synchronize_uses().is_err() {
                        self.bufs[k] = Some(Buf::Plain(theirs));
                        return;
                    }
                    let (ctx, ptr, len) = (theirs.context().clone(), theirs.as_raw(), theirs.len());
                    let owner = Owner {
                        buf: Some(theirs),
                        _token: token,
                    };
                    // SAFETY: `len` `i32`s of `ctx`, allocated while `owner` (holding the
                    // buffer, its sole holder) lives; its work is done (waited for above);
                    // nothing but the new buffer uses them until the owner goes.
                    unsafe { DeviceBuffer::from_owner(&ctx, ptr, len, owner) }
                };
                self.bufs.push(Some(Buf::Adopted {
                    buf,
                    owner: self.owners.len(),
                }));
                self.owners.push(drops);
            }
            Op::GiveBackOwner { slot } => {
                // Mostly an adopted buffer (when there is one), else any.
                let adopted: Vec<usize> = (0..self.bufs.len())
                    .filter(|&k| matches!(self.bufs[k], Some(Buf::Adopted { .. })))
                    .collect();
                let k = match pick(&adopted, slot / 4) {
                    Some(i) if slot % 4 != 0 => Some(adopted[i]),
                    _ => self.buf(slot),
                };
                let Some(k) = k else { return };
                let Some(b) = self.bufs[k].take() else { return };
                let adopted = match &b {
                    Buf::Adopted { owner, .. } => Some(*owner),
                    _ => None,
                };
                let Ok(buf) = b.into_buffer() else {
                    return;
                };
                let (held, ptr, len) = (buf.owners() > 1, buf.as_raw(), buf.len());
                let may_refuse = held || self.may_refuse();
                match buf.into_owner::<Owner>() {
                    Ok(mut o) => {
                        assert!(!held, "into_owner gave back an owner whose memory is held");
                        if let Some(i) = adopted {
                            assert_eq!(self.owners[i].load(Ordering::SeqCst), 0);
                        }
                        let theirs = o.buf.take().expect("the owner's buffer");
                        assert_eq!((theirs.as_raw(), theirs.len()), (ptr, len));
                        self.ordered.push(ptr);
                        drop(o);
                        self.bufs[k] = Some(Buf::Plain(theirs));
                    }
                    Err(buf) => {
                        assert_eq!((buf.as_raw(), buf.len()), (ptr, len), "given back changed");
                        assert!(
                            adopted.is_none() || may_refuse,
                            "into_owner refused an idle adopted buffer"
                        );
                        self.bufs[k] = Some(match adopted {
                            Some(owner) => Buf::Adopted { buf, owner },
                            None => Buf::Plain(buf),
                        });
                    }
                }
            }
            Op::IntoRaw { slot } => {
                let Some(k) = self.buf(slot) else { return };
                match self.bufs[k].take() {
                    Some(Buf::Adopted { buf, owner }) => match buf.into_raw() {
                        Ok(_) => panic!("into_raw handed out the address of memory an owner keeps"),
                        Err(buf) => self.bufs[k] = Some(Buf::Adopted { buf, owner }),
                    },
                    Some(Buf::Plain(buf))
                        if !self.ordered.contains(&buf.as_raw())
                            && buf.synchronize_uses().is_ok() =>
                    {
                        let ctx = buf.context().clone();
                        match buf.into_raw() {
                            Ok((ptr, len)) => {
                                // SAFETY: the allocation of `ctx` just given up: `cuMemAlloc`'s
                                // (stream-ordered memory is not given up here, and memory a
                                // closure releases is refused), `len` long, its work done.
                                let b = unsafe { DeviceBuffer::<i32>::from_raw(&ctx, ptr, len) };
                                self.bufs[k] = Some(Buf::Plain(b));
                            }
                            Err(buf) => self.bufs[k] = Some(Buf::Plain(buf)),
                        }
                    }
                    other => self.bufs[k] = other,
                }
            }
            Op::ForeignStream { stream, alias } => {
                let base = self.stream(stream).clone();
                let theirs = if alias {
                    base
                } else {
                    let Ok(s) = Stream::non_blocking(base.context()) else {
                        return;
                    };
                    s
                };
                let theirs = Arc::new(theirs);
                // SAFETY: `theirs` keeps its stream, of its context, alive.
                let s = unsafe {
                    Stream::from_owner(theirs.context(), theirs.as_raw(), theirs.clone())
                };
                self.streams.push(s.clone());
                self.foreign.push(s);
            }
            Op::RawCaptureBegin { stream } => {
                let Some(k) = pick(&self.foreign, stream) else {
                    return;
                };
                let f = self.cuda.fns().cuStreamBeginCapture;
                // SAFETY: a live stream (held by `foreign`); a documented mode. It fails
                // when the stream is captured already: nothing to do then.
                let rc = unsafe {
                    f(
                        self.foreign[k].as_raw(),
                        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                    )
                };
                if rc == CUresult::CUDA_SUCCESS {
                    self.began.push(self.foreign[k].as_raw() as usize);
                }
            }
            Op::RawCaptureEnd { stream } => {
                if let Some(k) = pick(&self.foreign, stream) {
                    self.raw_end(k);
                }
            }
            Op::RawLaunch { graph } => {
                if let Some(g) = pick(&self.raw_graphs, graph) {
                    self.raw_launch(g);
                }
            }
            Op::ExpectImmediate { stream } => {
                let s = self.stream(stream).clone();
                let deferred = DeferScope::is_open() || s.is_capturing().unwrap_or(true);
                match s.expect_immediate("model") {
                    Ok(()) => assert!(!deferred, "expect_immediate: Ok while deferred"),
                    Err(cuda_hal::Error::Deferred { what: "model", .. }) => {
                        assert!(deferred, "expect_immediate: Deferred while immediate");
                    }
                    Err(e) => panic!("expect_immediate: {e}"),
                }
            }
            Op::AfterEnqueue { slot, stream } => {
                let s = self.stream(stream).clone();
                let grouped = DeferScope::is_open();
                let ran = Arc::new(AtomicUsize::new(0));
                let r = {
                    let _order = s.enqueue_lock();
                    let captured = s.is_capturing().unwrap_or(true);
                    if let Some(k) = self.buf(slot)
                        && let Some(b) = &self.bufs[k]
                        && b.get().context() == s.context()
                    {
                        let _ = b.get().used_on(&s);
                    }
                    let hook = ran.clone();
                    let r = s.after_enqueue(move || {
                        hook.fetch_add(1, Ordering::SeqCst);
                    });
                    match &r {
                        Ok(()) => assert!(!captured, "after_enqueue: Ok while captured"),
                        Err(cuda_hal::Error::Deferred { .. }) => {
                            assert!(captured, "after_enqueue: Deferred while not captured");
                        }
                        Err(e) => panic!("after_enqueue: {e}"),
                    }
                    assert_eq!(ran.load(Ordering::SeqCst), 0, "a hook ran under the lock");
                    r
                };
                if r.is_ok() {
                    if grouped {
                        self.hooks.push(ran);
                    } else {
                        assert_eq!(ran.load(Ordering::SeqCst), 1, "the hook did not run");
                    }
                }
            }
            Op::AdoptContext { dev } => {
                let ctx = self.ctx(dev);
                let drops = Arc::new(AtomicUsize::new(0));
                // SAFETY: the primary context's handle, kept alive by the retain of the
                // clone of `ctx` in the owner.
                let adopted = unsafe {
                    Context::from_raw(
                        ctx.device(),
                        ctx.as_raw(),
                        (ctx.clone(), Token(drops.clone())),
                    )
                };
                self.ctx_owners.push(drops);
                assert_eq!(adopted, ctx);
                if let Ok(_current) = adopted.bind() {
                    assert_eq!(
                        Context::current(self.cuda).ok().flatten().as_ref(),
                        Some(&ctx),
                        "Context::current under an adopted primary context"
                    );
                }
                if let Ok(b) = DeviceBuffer::<i32>::zeroed(&adopted, 3) {
                    self.bufs.push(Some(Buf::Plain(b)));
                }
                if let Ok(s) = Stream::non_blocking(&adopted) {
                    self.streams.push(s);
                }
            }
            _ => unreachable!("not an adoption step"),
        }
    }

    /// The steps where threads contend for a stream's order lock.
    fn contention_step(&mut self, op: &Op) {
        match *op {
            Op::CaptureBehindEnqueue { slot, stream } => {
                let s = self.stream(stream).clone();
                let home = DeviceBuffer::<i32>::alloc_on(&s, 2).ok();
                let buffer = self.take_buffer(slot);
                let (entered, wait_entered) = std::sync::mpsc::channel::<()>();
                let (leave, wait_leave) = std::sync::mpsc::channel::<()>();
                let holder = {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let _order = s.enqueue_lock();
                        let _ = entered.send(());
                        let _ = wait_leave.recv();
                    })
                };
                let _ = wait_entered.recv();
                let raw = s.as_raw() as usize;
                let capture = {
                    let s = s.clone();
                    std::thread::spawn(move || s.begin_capture(CaptureMode::Relaxed).is_ok())
                };
                // Time for the capture to wait for the lock (either order is correct).
                std::thread::sleep(Duration::from_micros(300));
                drop(home);
                drop(buffer);
                let _ = leave.send(());
                holder.join().expect("the enqueuing thread");
                if capture.join().expect("the capturing thread") {
                    self.began.push(raw);
                }
            }
            Op::LocksOutOfOrder { first, second } => {
                let (a, b) = (self.stream(first).clone(), self.stream(second).clone());
                if a.as_raw() == b.as_raw() {
                    return;
                }
                let refused = |r: cuda_hal::Result<()>| {
                    matches!(
                        r,
                        Err(cuda_hal::Error::InvalidArgument {
                            what: "Stream::after_enqueue",
                            ..
                        })
                    )
                };
                let grouped = DeferScope::is_open();
                let ran = Arc::new(AtomicUsize::new(0));
                let lock_a = a.enqueue_lock();
                let lock_b = b.enqueue_lock();
                drop(lock_a);
                assert!(
                    refused(a.after_enqueue(|| ())),
                    "after_enqueue accepted for a lock let go"
                );
                let captured = b.is_capturing().unwrap_or(true);
                let hook = ran.clone();
                let r = b.after_enqueue(move || {
                    hook.fetch_add(1, Ordering::SeqCst);
                });
                match &r {
                    Ok(()) => assert!(!captured, "after_enqueue: Ok while captured"),
                    Err(cuda_hal::Error::Deferred { .. }) => {
                        assert!(captured, "after_enqueue: Deferred while not captured");
                    }
                    Err(e) => panic!("after_enqueue under a lock still held: {e}"),
                }
                drop(lock_b);
                if r.is_ok() {
                    if grouped {
                        self.hooks.push(ran);
                    } else {
                        assert_eq!(ran.load(Ordering::SeqCst), 1, "the hook did not run");
                    }
                }
                for s in [&a, &b] {
                    assert!(
                        refused(s.after_enqueue(|| ())),
                        "after_enqueue accepted with no lock held"
                    );
                }
            }
            _ => unreachable!("not a contention step"),
        }
    }

    /// [`Op::AbandonCapture`].
    fn abandon_capture(&mut self, dev: u8, slot: u8, mode: u8, elsewhere: bool, forget: bool) {
        // An abandonment whose end the driver refuses leaves the capture running, with what
        // it holds, on a stream no other step can reach (its own test covers that path).
        let end_fails = self.faults.iter().any(|&(f, before)| {
            matches!(f, Fault::Cuda("cuStreamEndCapture", _))
                && self.gpus.calls("cuStreamEndCapture") == before
        });
        if DeferScope::is_open() || end_fails {
            return;
        }
        let Ok(s) = Stream::non_blocking(&self.ctx(dev)) else {
            return;
        };
        let log = cuda_hal::StreamLog::new();
        log.note(&s);
        if forget {
            log.retain(|_| false);
            assert!(log.streams().is_empty(), "StreamLog::retain kept a stream");
        }
        let mode = match mode % 3 {
            0 => CaptureMode::ThreadLocal,
            1 => CaptureMode::Global,
            _ => CaptureMode::Relaxed,
        };
        // A strict capture ends only on the thread that began it (else it stays, whole).
        let elsewhere = elsewhere && mode == CaptureMode::Relaxed;
        if s.begin_capture(mode).is_err() {
            return;
        }
        if let Some(k) = self.buf(slot)
            && let Some(b) = &mut self.bufs[k]
        {
            let _ = b.get_mut().fill_async(7, &s);
        }
        if elsewhere {
            std::thread::spawn(move || drop(s))
                .join()
                .expect("the dropping thread");
        } else {
            drop(s);
        }
        drop(log);
    }

    /// [`Op::PollBehindCapture`].
    fn poll_behind_capture(&mut self, slot: u8, stream: u8) {
        let s0 = self.stream(stream).clone();
        if !self.runs_now(&s0) {
            return;
        }
        let ctx0 = s0.context().clone();
        let ctx1 = self.ctx(ctx0.device().ordinal() as u8 + 1);
        if ctx1.device().ordinal() == ctx0.device().ordinal() {
            return;
        }
        let Ok(id) = UniqueId::generate(self.nccl) else {
            return;
        };
        let home = DeviceBuffer::<i32>::alloc_on(&s0, 2).ok();
        let buffer = self.take_buffer(slot);
        let (nccl, world) = (self.nccl, self.world);
        let config = CommConfig::non_blocking(Duration::from_secs(3));
        let before = world.calls("ncclAllReduce");
        let (rank0, began) = std::thread::scope(|sc| {
            let (ctx0, ctx1, s0, id, config) = (&ctx0, &ctx1, &s0, &id, &config);
            let (go, wait_go) = std::sync::mpsc::channel::<()>();
            let rank1 = sc.spawn(move || -> nccl_channel::Result<()> {
                let c = Communicator::init_rank_with(nccl, ctx1, id, 2, 1, config);
                let _ = wait_go.recv();
                let c = c?;
                let s1 = Stream::non_blocking(ctx1)?;
                let mut b = DeviceBuffer::from_slice(ctx1, &[2i32])?;
                c.all_reduce_in_place(&mut b, ReduceOp::Sum, &s1)?;
                s1.synchronize()?;
                c.close()
            });
            let rank0 = sc.spawn(move || {
                let c = Communicator::init_rank_with(nccl, ctx0, id, 2, 0, config).ok()?;
                let mut b = DeviceBuffer::from_slice(ctx0, &[1i32]).ok()?;
                // Polls under s0's enqueue lock until rank 1 comes; nothing touches s0
                // afterwards (the capture may have begun).
                let r = c.all_reduce_in_place(&mut b, ReduceOp::Sum, s0);
                Some((r, c, b))
            });
            // Rank 0 in its all-reduce (or given up: an injected failure), then the
            // capture; either order is correct, only less is at stake after.
            let start = std::time::Instant::now();
            while world.calls("ncclAllReduce") == before
                && !rank0.is_finished()
                && start.elapsed() < Duration::from_secs(2)
            {
                std::thread::sleep(Duration::from_micros(100));
            }
            let capture = sc.spawn(move || s0.begin_capture(CaptureMode::Relaxed).is_ok());
            // Time for the capture to wait for the lock (not observable from here: on a
            // busy machine the drops may come first, a plain release, also correct).
            std::thread::sleep(Duration::from_millis(5));
            drop(home);
            drop(buffer);
            let _ = go.send(());
            let _ = rank1.join().expect("rank 1 of the polling collective");
            let rank0 = rank0.join().expect("rank 0 of the polling collective");
            (rank0, capture.join().expect("the capturing thread"))
        });
        if began {
            match s0.end_capture() {
                Ok(g) => {
                    if let Ok(exec) = g.instantiate() {
                        self.graphs.push(Some(exec));
                    }
                }
                // Still running (an injected failure of its end): a later step ends it.
                Err(_) if s0.is_capturing().unwrap_or(true) => {
                    self.began.push(s0.as_raw() as usize);
                }
                Err(_) => {}
            }
        }
        if let Some((_, c, b)) = rank0 {
            let _ = c.close();
            drop(b);
        }
    }

    /// [`Op::WindowAgreement`].
    fn window_agreement(&mut self, dev: u8, misordered: bool) {
        let first = self.ctx(dev).device().ordinal() as u8;
        let ctxs = [self.ctx(first), self.ctx(first + 1)];
        if ctxs[0] == ctxs[1] {
            return;
        }
        let Ok(id) = UniqueId::generate(self.nccl) else {
            return;
        };
        let nccl = &self.nccl;
        let out: Vec<(nccl_channel::Result<()>, bool)> = std::thread::scope(|sc| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| {
                    let (ctx, id) = (&ctxs[rank], &id);
                    sc.spawn(move || {
                        // Whether this rank's own collective was issued (the other rank's
                        // exchange then paired with it).
                        let issued = std::cell::Cell::new(false);
                        let r = (|| -> nccl_channel::Result<()> {
                            let c = Communicator::init_rank(nccl, ctx, id, 2, rank)?;
                            let s = Stream::non_blocking(ctx)?;
                            // A gather shaped as the agreement's, claiming a huge window.
                            let theirs = |c: &Communicator| -> nccl_channel::Result<()> {
                                let v = DeviceBuffer::from_slice(ctx, &[u64::MAX; 5])?;
                                let mut all = DeviceBuffer::<u64>::zeroed(ctx, 10)?;
                                c.all_gather(&v, &mut all, &s)?;
                                issued.set(true);
                                Ok(s.synchronize()?)
                            };
                            let buf = c.alloc_nccl::<u32>(1024 >> (2 * rank))?;
                            if misordered && rank == 1 {
                                let _ = theirs(&c);
                            }
                            let window = c.register_window(&buf, WindowFlags::COLL_SYMMETRIC);
                            if misordered && rank == 0 {
                                let _ = theirs(&c);
                            }
                            let window = window?;
                            if rank == 0 {
                                let put = window.put_signal(&buf, 1, 0, Signal::DEFAULT, &s);
                                assert!(put.is_err(), "a put past the peer's window was accepted");
                            }
                            s.synchronize()?;
                            Ok(())
                        })();
                        (r, issued.get())
                    })
                })
                .collect();
            ranks
                .into_iter()
                .map(|h| h.join().expect("a rank of the window agreement"))
                .collect()
        });
        // Whatever failed besides (injected faults), an exchange that the other rank's own
        // collective answered never yields a window: its size was not agreed.
        for (rank, (r, _)) in out.iter().enumerate() {
            let answered = misordered && out[1 - rank].1;
            assert!(
                !(answered && r.is_ok()),
                "window agreement: a user's collective answered rank {rank}'s"
            );
        }
        // Exact outcomes only on a clean run: no injected failure, and no capture running
        // (a global one forbids the exchange's host waits on every thread).
        let clean = self.faults.is_empty()
            && self
                .streams
                .iter()
                .all(|s| !s.is_capturing().unwrap_or(true));
        if !clean {
            return;
        }
        for (rank, (r, _)) in out.iter().enumerate() {
            match r {
                Err(Error::Unsupported { .. }) => {}
                // The program's collective never meets the agreement (the private
                // channel's): the rank that issued it waits for a peer that is in the
                // agreement, and both end in their deadline's error.
                Err(_) if misordered => {}
                Ok(()) if !misordered => {}
                other => {
                    panic!("window agreement (misordered: {misordered}), rank {rank}: {other:?}")
                }
            }
        }
    }

    /// Runs `body(rank, communicator, stream)` on a fresh world of two ranks on threads
    /// (devices `dev` and the next), made with `config`; each rank's result. `None` where
    /// the world cannot be made (one device, or a failure injected there).
    fn two_ranks<R: Send>(
        &self,
        dev: u8,
        config: &CommConfig,
        body: impl Fn(usize, &Communicator, &Stream) -> nccl_channel::Result<R> + Sync,
    ) -> Option<Vec<nccl_channel::Result<R>>> {
        let first = self.ctx(dev).device().ordinal() as u8;
        let ctxs = [self.ctx(first), self.ctx(first + 1)];
        if ctxs[0] == ctxs[1] {
            return None;
        }
        let id = UniqueId::generate(self.nccl).ok()?;
        let nccl = &self.nccl;
        let body = &body;
        Some(std::thread::scope(|sc| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| {
                    let (ctx, id) = (&ctxs[rank], &id);
                    sc.spawn(move || {
                        let c = Communicator::init_rank_with(nccl, ctx, id, 2, rank, config)?;
                        let s = Stream::non_blocking(ctx)?;
                        body(rank, &c, &s)
                    })
                })
                .collect();
            ranks
                .into_iter()
                .map(|h| h.join().expect("a rank of a two-rank step"))
                .collect()
        }))
    }

    /// Whether exact outcomes may be asked for: no injected failure, and no capture
    /// running (a global one forbids the exchanges' host waits on every thread).
    fn is_clean(&self) -> bool {
        self.faults.is_empty()
            && self
                .streams
                .iter()
                .all(|s| !s.is_capturing().unwrap_or(true))
    }

    /// [`Op::CheckedPeers`].
    fn checked_peers(&mut self, dev: u8, what: u8) {
        let config = CommConfig::new().check_calls(true);
        let Some(out) = self.two_ranks(dev, &config, |rank, c, s| {
            let forged: [u64; 5] = [
                u64::from_be_bytes(*b"nccl-cha"),
                u64::from_be_bytes(*b"nnel-agr"),
                1,
                0,
                1 << 40,
            ];
            match (rank, what) {
                (0, 0) => c.symmetric::<f32>(64).map(drop),
                (0, 1) | (1, 2) => {
                    let buf = c.alloc_nccl::<u32>(1024)?;
                    c.register_window(&buf, WindowFlags::COLL_SYMMETRIC)
                        .map(drop)
                }
                (0, _) => {
                    let v = DeviceBuffer::from_slice(c.context(), &forged)?;
                    let mut all = DeviceBuffer::<u64>::zeroed(c.context(), 10)?;
                    c.all_gather(&v, &mut all, s)?;
                    Ok(s.synchronize()?)
                }
                _ => {
                    let mut v = DeviceBuffer::from_slice(c.context(), &[1i32; 4])?;
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum, s)?;
                    Ok(s.synchronize()?)
                }
            }
        }) else {
            return;
        };
        // A release without windows refuses the crate's collective before it compares:
        // the peer then meets the refused rank's exit, not a comparison.
        let refused = out
            .iter()
            .any(|r| matches!(r, Err(Error::Unsupported { .. })));
        if !self.is_clean() || refused {
            return;
        }
        for (rank, r) in out.iter().enumerate() {
            match r {
                Err(Error::CallMismatch { .. }) => {}
                other => panic!("checked peers ({what}), rank {rank}: {other:?}"),
            }
        }
    }

    /// [`Op::CopiedRecord`].
    fn copied_record(&mut self, dev: u8) {
        let Some(out) = self.two_ranks(dev, &CommConfig::new(), |rank, c, s| {
            let forged: [u64; 5] = [
                u64::from_be_bytes(*b"nccl-cha"),
                u64::from_be_bytes(*b"nnel-agr"),
                1,
                0,
                1 << 40,
            ];
            let mine = if rank == 1 { forged } else { [7; 5] };
            let v = DeviceBuffer::from_slice(c.context(), &mine)?;
            let mut all = DeviceBuffer::<u64>::zeroed(c.context(), 10)?;
            let buf = c.alloc_nccl::<u32>(1024 >> (2 * rank))?;
            if rank == 1 {
                c.all_gather(&v, &mut all, s)?;
            }
            let window = c.register_window(&buf, WindowFlags::COLL_SYMMETRIC)?;
            if rank == 0 {
                c.all_gather(&v, &mut all, s)?;
                let put = window.put_signal(&buf, 1, 0, Signal::DEFAULT, s);
                s.synchronize()?;
                return Ok(Some(put));
            }
            s.synchronize()?;
            Ok(None)
        }) else {
            return;
        };
        assert!(
            !matches!(&out[0], Ok(Some(Ok(())))),
            "a copied record: rank 0 put 4096 bytes into rank 1's 1024-byte window"
        );
    }

    /// [`Op::ForeignCaptureDuringOrdering`].
    fn foreign_capture_during_ordering(&mut self, dev: u8, skip: u8) {
        let ctx = self.ctx(dev);
        let Ok(theirs) = Stream::non_blocking(&ctx) else {
            return;
        };
        let theirs = Arc::new(theirs);
        let raw = theirs.as_raw() as usize;
        // SAFETY: `theirs` keeps its stream, of `ctx`, alive as long as the wrapper.
        let home = unsafe { Stream::from_owner(&ctx, theirs.as_raw(), theirs.clone()) };
        let Ok(mut mem) = DeviceBuffer::<u32>::alloc_on(&home, 4) else {
            return;
        };
        if mem.fill_async(5, &home).is_err() {
            return;
        }
        let ptr = mem.as_raw();
        // SAFETY: 4 `u32`s of `ctx`, allocated while `mem` lives, which frees in order on
        // `home`; its pending work is on `home` only.
        let mut buf = unsafe { DeviceBuffer::<u32>::from_owner_on(&home, ptr, 4, mem) };
        let Ok(ours) = Stream::non_blocking(&ctx) else {
            return;
        };
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (a, begin) = (armed.clone(), self.cuda.fns().cuStreamBeginCapture);
        self.gpus
            .before_call("cuEventRecord", u64::from(skip), move || {
                if a.swap(false, Ordering::SeqCst) {
                    std::thread::scope(|sc| {
                        sc.spawn(move || {
                            let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
                            // SAFETY: a live stream (the step's `theirs`).
                            let _ = unsafe { begin(raw as cuda_sys::CUstream, mode) };
                        });
                    });
                }
            });
        let r = buf.slice_mut(..2).and_then(|mut v| v.fill_async(6, &ours));
        let began = !armed.swap(false, Ordering::SeqCst);
        let captured_ours = ours.is_capturing().unwrap_or(false);
        let mut graph = std::ptr::null_mut();
        // The other library ends its capture (again, should an injected failure stop the
        // first end: a capture that never ends keeps what the crate holds for good).
        for _ in 0..2 {
            if !began || !theirs.is_capturing().unwrap_or(true) {
                break;
            }
            // SAFETY: a live stream, a valid out-pointer.
            let _ = unsafe { (self.cuda.fns().cuStreamEndCapture)(theirs.as_raw(), &mut graph) };
            if !graph.is_null() {
                // SAFETY: the graph just made, destroyed once, never launched.
                let _ = unsafe { (self.cuda.fns().cuGraphDestroy)(graph) };
                graph = std::ptr::null_mut();
            }
        }
        assert!(
            !captured_ours,
            "the crate's stream joined another library's capture"
        );
        if self.faults.is_empty() {
            match &r {
                Ok(()) => {
                    let _ = ours.synchronize();
                    let _ = home.synchronize();
                    if let Ok(v) = buf.to_vec() {
                        assert_eq!(v, [6, 6, 5, 5], "an accepted use ran in order");
                    }
                }
                Err(cuda_hal::Error::Capturing { .. }) => {}
                Err(e) => panic!("a use during another library's capture: {e:?}"),
            }
        }
    }

    /// Ends another library's capture of foreign stream `k`, if one runs, and keeps its
    /// graph instantiated.
    fn raw_end(&mut self, k: usize) {
        let fns = self.cuda.fns();
        let raw = self.foreign[k].as_raw();
        let mut graph = std::ptr::null_mut();
        // SAFETY: a live stream, a valid out-pointer.
        if unsafe { (fns.cuStreamEndCapture)(raw, &mut graph) } != CUresult::CUDA_SUCCESS {
            return;
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: the graph just made, a valid out-pointer; the graph is destroyed once
        // (the executable graph is a copy).
        unsafe {
            if (fns.cuGraphInstantiateWithFlags)(&mut exec, graph, 0) == CUresult::CUDA_SUCCESS {
                self.raw_graphs.push((k, exec as usize));
            }
            (fns.cuGraphDestroy)(graph);
        }
    }

    /// Launches raw graph `g` on the foreign stream it was captured from.
    fn raw_launch(&self, g: usize) {
        let (k, exec) = self.raw_graphs[g];
        // SAFETY: a live executable graph and stream; what its work uses is kept alive
        // by the crate for good (the documented rule for work captured behind its back).
        let _ = unsafe {
            (self.cuda.fns().cuGraphLaunch)(exec as cuda_sys::CUgraphExec, self.foreign[k].as_raw())
        };
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::AdoptOwned { .. }
            | Op::GiveBackOwner { .. }
            | Op::IntoRaw { .. }
            | Op::ForeignStream { .. }
            | Op::RawCaptureBegin { .. }
            | Op::RawCaptureEnd { .. }
            | Op::RawLaunch { .. }
            | Op::ExpectImmediate { .. }
            | Op::AfterEnqueue { .. }
            | Op::AdoptContext { .. } => self.foreign_step(op),
            Op::CaptureBehindEnqueue { .. } | Op::LocksOutOfOrder { .. } => {
                self.contention_step(op);
            }
            Op::WindowAgreement { dev, misordered } => self.window_agreement(dev, misordered),
            Op::CheckedPeers { dev, what } => self.checked_peers(dev, what),
            Op::CopiedRecord { dev } => self.copied_record(dev),
            Op::ForeignCaptureDuringOrdering { dev, skip } => {
                self.foreign_capture_during_ordering(dev, skip);
            }
            Op::PollBehindCapture { slot, stream } => self.poll_behind_capture(slot, stream),
            Op::AbandonCapture {
                dev,
                slot,
                mode,
                elsewhere,
                forget,
            } => self.abandon_capture(dev, slot, mode, elsewhere, forget),
            Op::Suspend { .. }
            | Op::Resume { .. }
            | Op::MemStats { .. }
            | Op::SimulatedGroup { .. }
            | Op::SimulateEnd
            | Op::Params { .. }
            | Op::Grow { .. }
            | Op::SetEncryption { .. } => self.newer_step(op),
            Op::Alloc { dev, len } => {
                let ctx = self.ctx(dev);
                if let Ok(b) = DeviceBuffer::<i32>::zeroed(&ctx, len as usize) {
                    self.bufs.push(Some(Buf::Plain(b)));
                }
            }
            Op::AllocNccl { comm, len } => {
                if let Some(c) = self.comm(comm)
                    && let Ok(b) = c.alloc_nccl::<i32>(len as usize * 1024)
                {
                    self.bufs.push(Some(Buf::Plain(b)));
                }
            }
            Op::Symmetric { comm, len } => {
                if let Some(c) = self.comm(comm) {
                    match c.symmetric::<i32>(len as usize) {
                        Ok(b) => self.bufs.push(Some(Buf::Symmetric(b, c))),
                        Err(e) => symmetric_refused(c, len, &e),
                    }
                }
            }
            Op::Pooled { comm, len } => {
                if let Some(c) = self.comm(comm)
                    && let Ok(b) = c.buffer::<i32>(len as usize)
                {
                    self.bufs.push(Some(Buf::Pooled(b)));
                }
            }
            Op::Drop { slot } => {
                if let Some(k) = self.buf(slot) {
                    let held = match &self.bufs[k] {
                        Some(Buf::Adopted { buf, owner }) if buf.owners() > 1 => Some(*owner),
                        _ => None,
                    };
                    self.bufs[k] = None;
                    if let Some(o) = held {
                        assert_eq!(
                            self.owners[o].load(Ordering::SeqCst),
                            0,
                            "owner {o} was dropped while a graph, group or registration \
                             holds its memory"
                        );
                    }
                }
            }
            Op::DropOnThread { slot } => {
                if let Some(b) = self.take_buffer(slot) {
                    std::thread::spawn(move || drop(b))
                        .join()
                        .expect("the dropping thread");
                }
            }
            Op::SwapIntoPooled { pooled, plain } => {
                let (Some(a), Some(b)) = (self.buf(pooled), self.buf(plain)) else {
                    return;
                };
                if a == b {
                    return;
                }
                let (lo, hi) = (a.min(b), a.max(b));
                let (x, y) = self.bufs.split_at_mut(hi);
                let swapped = match (&mut x[lo], &mut y[0]) {
                    (Some(Buf::Pooled(p)), Some(Buf::Plain(q) | Buf::Adopted { buf: q, .. })) => {
                        std::mem::swap(&mut **p, q);
                        hi
                    }
                    (Some(Buf::Plain(q) | Buf::Adopted { buf: q, .. }), Some(Buf::Pooled(p))) => {
                        std::mem::swap(&mut **p, q);
                        lo
                    }
                    _ => return,
                };
                // Adopted memory went to the pool (its owner is still counted); the
                // pool's came out, a plain buffer.
                if let Some(Buf::Adopted { buf, .. }) = self.bufs[swapped].take() {
                    self.bufs[swapped] = Some(Buf::Plain(buf));
                }
            }
            Op::Fill {
                slot,
                stream,
                value,
            } => {
                let s = self.stream(stream).clone();
                if let Some(k) = self.buf(slot)
                    && let Some(b) = &mut self.bufs[k]
                {
                    let _ = b.get_mut().fill_async(value, &s);
                }
            }
            Op::Copy { dst, src, stream } => {
                let s = self.stream(stream).clone();
                let (Some(a), Some(b)) = (self.buf(dst), self.buf(src)) else {
                    return;
                };
                if a == b {
                    return;
                }
                let (lo, hi) = (a.min(b), a.max(b));
                let (x, y) = self.bufs.split_at_mut(hi);
                let (Some(p), Some(q)) = (&mut x[lo], &mut y[0]) else {
                    return;
                };
                let (d, s2) = if a < b { (p, q) } else { (q, p) };
                if d.get().len() == s2.get().len() {
                    let _ = d.get_mut().copy_from_async(s2.get(), &s);
                }
            }
            Op::Collective {
                kind,
                comm,
                slot,
                other,
                stream,
            } => self.collective(kind, comm, slot, other, stream),
            Op::GroupStart => {
                if let Ok(g) = Group::start(self.nccl) {
                    self.groups.push(g);
                }
            }
            Op::GroupEnd => {
                if let Some(g) = self.groups.pop() {
                    let _ = g.end();
                }
            }
            Op::BeginCapture { stream } => {
                // The stream's index takes the low bits; the mode, the rest.
                let mode = match stream / 4 % 3 {
                    0 => CaptureMode::ThreadLocal,
                    1 => CaptureMode::Global,
                    _ => CaptureMode::Relaxed,
                };
                let s = self.stream(stream);
                if s.begin_capture(mode).is_ok() {
                    self.began.push(s.as_raw() as usize);
                }
            }
            Op::BeginCaptureOnThread { stream } => {
                let s = self.stream(stream).clone();
                let raw = s.as_raw() as usize;
                let began =
                    std::thread::spawn(move || s.begin_capture(CaptureMode::Relaxed).is_ok())
                        .join()
                        .expect("the capturing thread");
                if began {
                    self.began.push(raw);
                }
            }
            Op::EndCapture { stream } => {
                if let Ok(g) = self.stream(stream).end_capture()
                    && let Ok(exec) = g.instantiate()
                {
                    self.graphs.push(Some(exec));
                }
            }
            Op::Launch { graph, stream } => {
                let s = self.stream(stream).clone();
                if let Some(k) = pick(&self.graphs, graph)
                    && let Some(g) = &self.graphs[k]
                {
                    let _ = g.launch(&s);
                }
            }
            Op::DropGraph { graph } => {
                if let Some(k) = pick(&self.graphs, graph) {
                    self.graphs[k] = None;
                }
            }
            Op::GraphToThread { graph } => {
                if let Some(k) = pick(&self.graphs, graph)
                    && let Some(g) = self.graphs[k].take()
                {
                    std::thread::spawn(move || drop(g))
                        .join()
                        .expect("the dropping thread");
                }
            }
            Op::Register { comm, slot } => {
                if let (Some(c), Some(k)) = (self.comm(comm), self.buf(slot))
                    && let Some(b) = &self.bufs[k]
                    && let Ok(r) = c.register(b.get())
                {
                    self.regs.push(Some(r));
                }
            }
            Op::DropRegistration { reg } => {
                if let Some(k) = pick(&self.regs, reg) {
                    self.regs[k] = None;
                }
            }
            Op::Window { comm, slot } => {
                if let (Some(c), Some(k)) = (self.comm(comm), self.buf(slot))
                    && let Some(b) = &self.bufs[k]
                    && let Ok(w) = c.register_window(b.get(), WindowFlags::COLL_SYMMETRIC)
                {
                    self.wins.push(Some(w));
                    self.win_comms.push(Some(c));
                }
            }
            Op::DropWindow { win } => {
                if let Some(k) = pick(&self.wins, win) {
                    self.wins[k] = None;
                }
            }
            Op::PutSignal {
                win,
                slot,
                offset,
                stream,
            } => {
                let s = self.stream(stream).clone();
                let now = self.runs_now(&s);
                if let (Some(w), Some(k)) = (pick(&self.wins, win), self.buf(slot))
                    && let (Some(c), Some(w), Some(b)) =
                        (self.win_comms[w], &self.wins[w], &self.bufs[k])
                    && w.put_signal(b.get(), c.rank(), 4 * offset as usize, Signal::DEFAULT, &s)
                        .is_ok()
                    && now
                {
                    *self
                        .arrived
                        .entry(std::ptr::from_ref(c).addr())
                        .or_default() += 1;
                }
            }
            Op::SymmetricPut {
                dst,
                slot,
                comm,
                offset,
                stream,
            } => {
                let s = self.stream(stream).clone();
                let now = self.runs_now(&s);
                if let (Some(d), Some(k), Some(via)) =
                    (self.buf(dst), self.buf(slot), self.comm(comm))
                    && let (Some(Buf::Symmetric(d, owner)), Some(b)) =
                        (&self.bufs[d], &self.bufs[k])
                {
                    let r = d.put_signal(
                        via,
                        b.get(),
                        via.rank(),
                        4 * offset as usize,
                        Signal::DEFAULT,
                        &s,
                    );
                    if !std::ptr::eq(via, *owner) {
                        assert!(
                            matches!(&r, Err(Error::InvalidArgument { .. })),
                            "a put through a communicator that did not allocate the buffer: {r:?}"
                        );
                    } else if r.is_ok() && now {
                        *self
                            .arrived
                            .entry(std::ptr::from_ref(via).addr())
                            .or_default() += 1;
                    }
                }
            }
            Op::Signal { comm, stream } => {
                let s = self.stream(stream).clone();
                let now = self.runs_now(&s);
                if let Some(c) = self.comm(comm)
                    && c.signal(c.rank(), Signal::DEFAULT, &s).is_ok()
                    && now
                {
                    *self
                        .arrived
                        .entry(std::ptr::from_ref(c).addr())
                        .or_default() += 1;
                }
            }
            Op::WaitSignal { comm, stream } => {
                let s = self.stream(stream).clone();
                if let Some(c) = self.comm(comm)
                    && self.runs_now(&s)
                    && let Some(n) = self.arrived.get_mut(&std::ptr::from_ref(c).addr())
                    && *n > 0
                {
                    *n -= 1;
                    let _ = c.wait_signal(&[SignalWait::new(c.rank(), 1)], &s);
                }
            }
            Op::Split { comm } => {
                if let Some(c) = self.comm(comm)
                    && let Some(slot) = self.children.iter().find(|s| s.get().is_none())
                    && let Ok(Some(child)) = c.split(Some(0), 0)
                {
                    self.aborts.push(child.abort_handle());
                    if !child.config().is_blocking() {
                        self.non_blocking_aborts.push(child.abort_handle());
                    }
                    let _ = slot.set(child);
                }
            }
            Op::Shrink { comm } => {
                if let Some(c) = self.comm(comm)
                    && let Some(slot) = self.children.iter().find(|s| s.get().is_none())
                    && let Ok(child) = c.shrink(&[])
                {
                    self.aborts.push(child.abort_handle());
                    if !child.config().is_blocking() {
                        self.non_blocking_aborts.push(child.abort_handle());
                    }
                    let _ = slot.set(child);
                }
            }
            Op::Abort { comm } => {
                if let Some(k) = pick(&self.aborts, comm) {
                    self.aborts[k].abort();
                }
            }
            Op::Revoke { comm } => {
                if let Some(c) = self.comm(comm) {
                    let _ = c.revoke();
                }
            }
            Op::Wait { comm, stream } => {
                let s = self.stream(stream).clone();
                if let Some(c) = self.comm(comm) {
                    let _ = c.wait(&s);
                }
            }
            Op::AsyncError { comm } => {
                if let Some(c) = self.comm(comm) {
                    let _ = c.async_error();
                }
            }
            Op::TrimPool { comm } => {
                if let Some(c) = self.comm(comm) {
                    let _ = c.trim_pool();
                }
            }
            Op::SetPoolPolicy { comm, table } => {
                if let Some(c) = self.comm(comm) {
                    c.set_pool_policy(match table % 3 {
                        0 => PoolPolicy::plain(),
                        1 => crate::common::pool_registers_everything(),
                        _ => PoolPolicy::measured().clone(),
                    });
                }
            }
            Op::Synchronize { stream } => {
                let _ = self.stream(stream).synchronize();
            }
            Op::Fail(fault) => {
                let before = match fault {
                    Fault::Nccl(f, e) => {
                        self.world.fail_next(f, e);
                        self.world.calls(f)
                    }
                    Fault::Cuda(f, e) => {
                        self.gpus.fail_next(f, e);
                        self.gpus.calls(f)
                    }
                };
                self.faults.push((fault, before));
            }
            Op::HoldPanicking { stream } => {
                if cuda_hal::DeferScope::is_open() {
                    self.injected_panic = true;
                }
                self.stream(stream)
                    .hold(|| KeepAlive::new(Arc::new(PanicsWhenSettled)));
            }
            Op::Kernel {
                slot,
                stream,
                faulty,
            } => {
                let s = self.stream(stream).clone();
                let Some(k) = self.buf(slot) else { return };
                let Some(b) = self.bufs[k].as_mut() else {
                    return;
                };
                let b = b.get_mut();
                let dev = b.context().device().ordinal() as usize;
                let name = if faulty { "fault" } else { "scale" };
                let Ok(f) = self.modules[dev % 2].function(name) else {
                    return;
                };
                let n = b.len() as u32;
                // SAFETY: the kernel reads and writes the `n` elements of the buffer it is
                // given, and nothing else; its parameters are a pointer and a u32.
                let _ = unsafe { f.launch(&s, cuda_hal::LaunchConfig::linear(1, 1), (&mut *b, n)) };
            }
            Op::Sabotage(what) => self.sabotage(what),
            Op::HoldFromThread { comm, ms } => {
                let Some(c) = self.comm(comm) else { return };
                let held = c.keep_alive();
                let ctx = c.context().clone();
                let (tx, rx) = std::sync::mpsc::channel();
                self.background.push(std::thread::spawn(move || {
                    let Ok(s) = Stream::non_blocking(&ctx) else {
                        let _ = tx.send(());
                        return;
                    };
                    let scope = cuda_hal::DeferScope::open();
                    s.hold(|| held);
                    let _ = tx.send(());
                    std::thread::sleep(Duration::from_millis(ms.into()));
                    drop(scope);
                }));
                // Held from here on (the program's next steps race its release).
                let _ = rx.recv();
            }
            Op::DropConcurrently { slot, graph, us } => {
                let pause = Duration::from_micros(us.into());
                if graph {
                    if let Some(k) = pick(&self.graphs, slot)
                        && let Some(g) = self.graphs[k].take()
                    {
                        self.background.push(std::thread::spawn(move || {
                            std::thread::sleep(pause);
                            drop(g);
                        }));
                    }
                } else if let Some(b) = self.take_buffer(slot) {
                    self.background.push(std::thread::spawn(move || {
                        std::thread::sleep(pause);
                        drop(b);
                    }));
                }
            }
            Op::GroupInThreadLocal { dev } => {
                self.thread_local_group = true;
                let nccl: &'static Arc<Nccl> = Box::leak(Box::new(self.nccl.clone()));
                let ctx = self.ctx(dev);
                std::thread::spawn(move || {
                    KEPT.with(|_| ()); // registered first: dropped after the crate's state
                    let Ok(mut comms) = Communicator::init_all(nccl, std::slice::from_ref(&ctx))
                    else {
                        return;
                    };
                    let comm = comms.remove(0);
                    let Ok(s) = Stream::non_blocking(&ctx) else {
                        return;
                    };
                    let Ok(g) = Group::start(nccl) else { return };
                    if let Ok(mut b) = DeviceBuffer::<i32>::zeroed(&ctx, 2) {
                        let _ = comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s);
                    }
                    drop((comm, s));
                    KEPT.with(|k| *k.borrow_mut() = Some(g));
                })
                .join()
                .expect("the thread-local group's thread");
            }
        }
    }

    fn ctx(&self, dev: u8) -> cuda_hal::Context {
        let d = self.cuda.device(dev as usize % 2).expect("a device");
        d.primary_context().expect("its context")
    }

    /// One collective on a single-rank communicator: any buffer, any stream (wrong
    /// devices and lengths are typed errors).
    fn collective(&mut self, kind: Coll, comm: u8, slot: u8, other: u8, stream: u8) {
        let Some(c) = self.comm(comm) else { return };
        let s = self.stream(stream).clone();
        let Some(a) = self.buf(slot) else {
            if kind == Coll::Barrier {
                let r = c.barrier(&s);
                self.refused_if_suspended(c, "barrier", &r);
            }
            return;
        };
        let suspended = self.is_suspended(c);
        let b = self.buf(other).filter(|&b| b != a);
        let nccl = self.nccl.clone();
        let world = self.world;
        // Two distinct buffers, when the collective needs them.
        let (first, second) = match b {
            Some(b) => {
                let (lo, hi) = (a.min(b), a.max(b));
                let (x, y) = self.bufs.split_at_mut(hi);
                let (p, q) = (&mut x[lo], &mut y[0]);
                if a < b {
                    (p.as_mut(), q.as_mut())
                } else {
                    (q.as_mut(), p.as_mut())
                }
            }
            None => (self.bufs[a].as_mut(), None),
        };
        let Some(x) = first else { return };
        let x = x.get_mut();
        let called = !matches!(
            (kind, &second),
            (
                Coll::Of(Collective::AllToAll | Collective::SendRecv | Collective::AllToAllV)
                    | Coll::AllToAllV { .. },
                None
            )
        );
        let r = match kind {
            Coll::Of(Collective::AllReduce) => c.all_reduce_in_place(x, ReduceOp::Sum, &s),
            Coll::PreMulSum => c.all_reduce_in_place(x, ReduceOp::PreMulSum(3), &s),
            Coll::Of(Collective::AllGather) => c.all_gather_in_place(x, &s),
            Coll::Of(Collective::ReduceScatter) => c.reduce_scatter_in_place(x, ReduceOp::Max, &s),
            Coll::Of(Collective::Broadcast) => c.broadcast_in_place(x, 0, &s),
            Coll::Of(Collective::Reduce) => c.reduce_in_place(x, ReduceOp::Min, 0, &s),
            Coll::Barrier => c.barrier(&s),
            Coll::Of(Collective::AllToAll) => match second {
                Some(y) => c.all_to_all(&*y.get_mut(), x, &s),
                None => Ok(()),
            },
            Coll::Of(Collective::Gather) => match second {
                Some(y) => c.gather(&*x, Some(y.get_mut().as_view_mut()), 0, &s),
                None => c.gather(&*x, None, 0, &s),
            },
            Coll::Of(Collective::Scatter) => match second {
                Some(y) => c.scatter(Some(y.get_mut().as_view()), x, 0, &s),
                None => c.scatter(None, x, 0, &s),
            },
            Coll::Of(Collective::SendRecv) => match second {
                Some(y) => nccl_channel::group(&nccl, || {
                    c.send(&*y.get_mut(), 0, &s)?;
                    c.recv(&mut *x, 0, &s)
                }),
                None => Ok(()),
            },
            Coll::Of(Collective::AllToAllV) => match second {
                Some(y) => all_to_all_v(c, &*y.get_mut(), x, [0; 4], &s, world),
                None => Ok(()),
            },
            Coll::AllToAllV {
                count,
                send_at,
                recv_at,
                misuse,
            } => match second {
                Some(y) => {
                    let layout = [count, send_at, recv_at, misuse];
                    all_to_all_v(c, &*y.get_mut(), x, layout, &s, world)
                }
                None => Ok(()),
            },
            Coll::Of(other) => panic!("the model runs every collective; {other} is new to it"),
        };
        if called && suspended {
            newer::refused_as_suspended(c, &format!("{kind:?}"), &r);
        }
    }

    /// What the oracle must catch (the checker's own tests).
    fn sabotage(&mut self, what: Sabotage) {
        match what {
            Sabotage::Leak => {
                if let Ok(b) = DeviceBuffer::<i32>::zeroed(&self.ctx(0), 1) {
                    std::mem::forget(b);
                }
            }
            Sabotage::Panic => panic!("model: a panic nobody injected"),
            Sabotage::Hang => loop {
                std::thread::sleep(Duration::from_secs(1));
            },
            Sabotage::UseAfterFree => {
                let ctx = self.ctx(0);
                let comm = self.comms[0];
                let s = self.stream(0).clone();
                let Ok(b) = DeviceBuffer::<i32>::zeroed(&ctx, 1) else {
                    return;
                };
                let p = b.as_raw();
                drop(b);
                let f = self.nccl.fns().ncclAllReduce;
                // SAFETY: none: a use after free on purpose, of the simulated NCCL, whose
                // sanitizer reports it and touches no host memory.
                let _ = unsafe {
                    f(
                        p as *const std::ffi::c_void,
                        p as *mut std::ffi::c_void,
                        1,
                        nccl_sys::ncclDataType_t::ncclInt32,
                        nccl_sys::ncclRedOp_t::ncclSum,
                        comm.as_raw(),
                        s.as_raw(),
                    )
                };
            }
        }
    }

    /// Drops what is left in an order the seed picks.
    fn teardown(&mut self, seed: u64) {
        for t in self.background.drain(..) {
            t.join().expect("a thread beside the program");
        }
        // Another library ends its captures first (the crate cannot end them).
        for k in 0..self.foreign.len() {
            self.raw_end(k);
        }
        let mut r = Rng::new(seed);
        let mut parts: Vec<u8> = (0..6).collect();
        for i in (1..parts.len()).rev() {
            parts.swap(i, r.below(i as u64 + 1) as usize);
        }
        for part in parts {
            match part {
                0 => self.bufs.clear(),
                1 => self.graphs.clear(),
                2 => self.regs.clear(),
                3 => self.wins.clear(),
                4 => {
                    while let Some(g) = self.groups.pop() {
                        drop(g);
                    }
                }
                _ => {
                    // Streams may be ended only once nothing is being captured on them
                    // (as a user would, again after an end that failed but left the
                    // capture running: an injected failure does).
                    for s in &self.streams {
                        for _ in 0..3 {
                            if !s.is_capturing().unwrap_or(false) {
                                break;
                            }
                            let _ = s.end_capture();
                        }
                    }
                }
            }
        }
        // Another library launches its graphs once more, after everything was dropped:
        // what the crate's work in them uses must still be there; then it destroys them.
        for g in 0..self.raw_graphs.len() {
            self.raw_launch(g);
        }
        for (k, exec) in self.raw_graphs.drain(..) {
            let _ = self.foreign[k].synchronize();
            // SAFETY: a live executable graph, destroyed once.
            let _ = unsafe { (self.cuda.fns().cuGraphExecDestroy)(exec as cuda_sys::CUgraphExec) };
        }
        let _ = (self.gpus, self.world);
    }
}
