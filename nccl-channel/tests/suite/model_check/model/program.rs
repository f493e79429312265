//! Programs over the public API: what the checker generates, runs, shrinks and prints.
//!
//! Every operand is an index taken modulo what exists when the operation runs, so any
//! sequence of operations is a valid program: the shrinker may drop any of them.

use nccl_channel::Collective;
use nccl_sys::NcclVersion;

/// A collective on one single-rank communicator, in place or between two buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    /// One of nccl-channel's collectives ([`Collective::ALL`]; a send to itself and the
    /// matching receive in one group for [`Collective::SendRecv`]). The variable-size
    /// all-to-all is generated as [`Coll::AllToAllV`], with its operands; here it
    /// exchanges nothing.
    Of(Collective),
    /// A variable-size all-to-all of one buffer into another (one rank: a region of each,
    /// to itself): `count` elements from displacement `send_at` to displacement
    /// `recv_at`, each taken modulo what fits. `misuse` breaks the layout on purpose (0:
    /// none; 1: counts for two ranks; 2: a send region one past its buffer's end; 3: a
    /// receive displacement whose sum with its count overflows; 4: a send count to itself
    /// unlike the receive count), which is refused before any NCCL call.
    AllToAllV {
        count: u8,
        send_at: u8,
        recv_at: u8,
        misuse: u8,
    },
    Barrier,
    /// A pre-multiplied sum (an op NCCL creates and destroys).
    PreMulSum,
}

/// An injected failure: the next call of a simulated function fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Nccl(&'static str, nccl_sys::ncclResult_t),
    Cuda(&'static str, cuda_sys::CUresult),
}

/// What the oracle must catch, done on purpose (never generated: the checker's own tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// `mem::forget` of a buffer: a leak outside the documented paths.
    Leak,
    /// A panic that was not injected.
    Panic,
    /// A raw NCCL call on freed memory: the sanitizer's report.
    UseAfterFree,
    /// A step that never ends.
    Hang,
}

/// One step of a program.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A plain buffer of `len` elements on device `dev`.
    Alloc {
        dev: u8,
        len: u8,
    },
    /// A buffer of NCCL memory (`alloc_nccl`, windows need it) of communicator `comm`.
    AllocNccl {
        comm: u8,
        len: u8,
    },
    /// A symmetric buffer of `len` elements (`Communicator::symmetric`) of communicator
    /// `comm`: refused when empty, inside a group, or where NCCL has no windows.
    Symmetric {
        comm: u8,
        len: u8,
    },
    /// A buffer from communicator `comm`'s pool.
    Pooled {
        comm: u8,
        len: u8,
    },
    /// Drops buffer `slot`.
    Drop {
        slot: u8,
    },
    /// Moves buffer `slot` (a plain one) to another thread, which drops it.
    DropOnThread {
        slot: u8,
    },
    /// Swaps a pooled buffer's contents with a plain buffer (safe, through `DerefMut`).
    SwapIntoPooled {
        pooled: u8,
        plain: u8,
    },
    Fill {
        slot: u8,
        stream: u8,
        value: i32,
    },
    Copy {
        dst: u8,
        src: u8,
        stream: u8,
    },
    Collective {
        kind: Coll,
        comm: u8,
        slot: u8,
        other: u8,
        stream: u8,
    },
    GroupStart,
    GroupEnd,
    BeginCapture {
        stream: u8,
    },
    EndCapture {
        stream: u8,
    },
    Launch {
        graph: u8,
        stream: u8,
    },
    DropGraph {
        graph: u8,
    },
    GraphToThread {
        graph: u8,
    },
    Register {
        comm: u8,
        slot: u8,
    },
    DropRegistration {
        reg: u8,
    },
    Window {
        comm: u8,
        slot: u8,
    },
    DropWindow {
        win: u8,
    },
    /// A put of buffer `slot` into this rank's own window `win` at byte `4 * offset`,
    /// with its signal.
    PutSignal {
        win: u8,
        slot: u8,
        offset: u8,
        stream: u8,
    },
    /// A put of buffer `slot` into this rank's own symmetric buffer `dst` at byte
    /// `4 * offset`, with its signal, through communicator `comm` (refused unless it is the
    /// one that allocated `dst`).
    SymmetricPut {
        dst: u8,
        slot: u8,
        comm: u8,
        offset: u8,
        stream: u8,
    },
    /// A signal of communicator `comm` to its own rank.
    Signal {
        comm: u8,
        stream: u8,
    },
    /// A wait for one signal of communicator `comm`'s own rank, issued only when one is
    /// known to have arrived (a wait for none would end only at the deadline).
    WaitSignal {
        comm: u8,
        stream: u8,
    },
    Split {
        comm: u8,
    },
    Shrink {
        comm: u8,
    },
    /// An abort through an `AbortHandle` (the communicator value stays).
    Abort {
        comm: u8,
    },
    Revoke {
        comm: u8,
    },
    Wait {
        comm: u8,
        stream: u8,
    },
    AsyncError {
        comm: u8,
    },
    TrimPool {
        comm: u8,
    },
    /// Sets communicator `comm`'s pool table: 0 never registers, 1 registers every
    /// collective's pooled buffers from 0 bytes, 2 the measured one.
    SetPoolPolicy {
        comm: u8,
        table: u8,
    },
    Synchronize {
        stream: u8,
    },
    Fail(Fault),
    /// Holds a dependency whose `settle` panics (the injected panic).
    HoldPanicking {
        stream: u8,
    },
    /// Another thread keeps an open group in a thread-local; it ends at thread exit.
    GroupInThreadLocal {
        dev: u8,
    },
    /// Another thread's group holds communicator `comm` (its `keep_alive` on a stream of
    /// that thread) for `ms` milliseconds while the program goes on.
    HoldFromThread {
        comm: u8,
        ms: u8,
    },
    /// Another thread begins a (relaxed) capture of stream `stream`, which a later
    /// `EndCapture` of this thread ends: a group open here may launch into it.
    BeginCaptureOnThread {
        stream: u8,
    },
    /// A plain buffer (or, with `graph`, a graph) dropped on another thread after `us`
    /// microseconds while the program goes on.
    DropConcurrently {
        slot: u8,
        graph: bool,
        us: u8,
    },
    /// A kernel that doubles buffer `slot` in place; `faulty`: its host twin panics (a
    /// kernel that faults), which the simulated driver reports and fails.
    Kernel {
        slot: u8,
        stream: u8,
        faulty: bool,
    },
    /// Adopts memory kept alive by an owner value (which counts its drops): plain buffer
    /// `slot`, its work waited for, through `DeviceBuffer::from_owner`; or, `on_home`, a
    /// fresh stream-ordered buffer of stream `stream` with a fill still pending there,
    /// through `from_owner_on` (that stream is its home).
    AdoptOwned {
        slot: u8,
        stream: u8,
        on_home: bool,
    },
    /// `into_owner` of buffer `slot` (mostly an adopted one): an adopted buffer's owner comes back (its buffer
    /// joins the program's plain ones) unless a graph, group or registration holds the
    /// memory, a stream is being captured or a wait fails; any other buffer is refused.
    GiveBackOwner {
        slot: u8,
    },
    /// `into_raw` of buffer `slot`: refused for memory an owner or closure releases; a
    /// plain buffer given up (its work waited for) is taken back with `from_raw`.
    IntoRaw {
        slot: u8,
    },
    /// A foreign stream (`Stream::from_owner`, kept alive by an `Arc<Stream>`): a new
    /// stream of stream `stream`'s context or, `alias`, that stream itself under a second
    /// wrapper. Later steps use it like the others.
    ForeignStream {
        stream: u8,
        alias: bool,
    },
    /// Another library begins a (relaxed) capture of foreign stream `stream` through the
    /// driver's table, behind the crate's back.
    RawCaptureBegin {
        stream: u8,
    },
    /// ... and ends it: the graph is instantiated (launched later, and once more after the
    /// teardown: what the crate's work in it uses must still be there).
    RawCaptureEnd {
        stream: u8,
    },
    /// Launches a graph of `RawCaptureEnd` on the foreign stream it was captured from.
    RawLaunch {
        graph: u8,
    },
    /// `Stream::expect_immediate`: refused (`Error::Deferred`) exactly while a group is open
    /// here or the driver says the stream is captured.
    ExpectImmediate {
        stream: u8,
    },
    /// `Stream::after_enqueue` under the stream's enqueue lock (buffer `slot` noted as
    /// used): refused while captured; otherwise run once, at the lock's release, or after
    /// the open group ended.
    AfterEnqueue {
        slot: u8,
        stream: u8,
    },
    /// `Context::from_raw` of device `dev`'s primary context with an owner that counts its
    /// drops, `Context::current` under it, and a buffer and a stream made in it.
    AdoptContext {
        dev: u8,
    },
    /// `Communicator::suspend` of communicator `comm`, with `SuspendFlags::MEM` when `mem`;
    /// `sync`: every stream synchronized first, so that when nothing else holds the
    /// communicator (no group, graph, capture or thread beside the program) it must succeed.
    /// Refused with `InFlight` exactly in an open group, `Suspended` exactly when suspended.
    Suspend {
        comm: u8,
        mem: bool,
        sync: bool,
    },
    /// `Communicator::resume`: `Ok` exactly when suspended, else `InvalidArgument`.
    Resume {
        comm: u8,
    },
    /// `Communicator::mem_stats`: says suspended exactly when the program suspended it.
    MemStats {
        comm: u8,
    },
    /// A group of its own (when none is open) holding a pre-multiplied all-reduce of a
    /// fresh buffer of communicator `comm` (dropped inside the group when `drop_inside`),
    /// ended with `Group::simulate_end`: nothing may run (blocking communicators).
    SimulatedGroup {
        comm: u8,
        stream: u8,
        drop_inside: bool,
    },
    /// Ends the innermost open group of the program with `simulate_end` instead of `end`.
    SimulateEnd,
    /// `Param` bind/get/get_value/value_string/keys of one of a few keys, as its type or
    /// another.
    Params {
        key: u8,
    },
    /// A grow of communicator `comm` by one rank: `grow_id` and `grow` here, `join_grown`
    /// on a thread for the other device; both grown ranks all-reduce once and are dropped.
    Grow {
        comm: u8,
    },
    /// `set_encryption`: none, a key long enough, or one too short.
    SetEncryption {
        mode: u8,
    },
    /// Three threads: one inside an enqueue on stream `stream` (holding its lock), one
    /// beginning a (relaxed) capture of it (waiting for that lock), and this one dropping
    /// fresh memory whose home is that stream, and buffer `slot`. Nothing may be freed
    /// under work, nor leaked: the releases wait and finish once the lock is let go.
    CaptureBehindEnqueue {
        slot: u8,
        stream: u8,
    },
    /// The enqueue locks of streams `first` and `second`, taken in that order and released
    /// in the same order: `after_enqueue` is refused (`InvalidArgument`) for a lock let
    /// go and accepted for one still held (`Deferred` while captured).
    LocksOutOfOrder {
        first: u8,
        second: u8,
    },
    /// A fresh world of two ranks on threads (devices `dev` and the next), each with
    /// NCCL memory for a window (4096 and 1024 bytes). `misordered`: each rank issues a
    /// collective of its own where the other is in the window-size agreement (shaped as
    /// it, with data that would claim a larger window): window registration is an error
    /// on every rank, never a window of the wrong size. Otherwise both succeed (or are
    /// `Unsupported` on a release without windows) and a put past rank 1's window is
    /// refused.
    WindowAgreement {
        dev: u8,
        misordered: bool,
    },
    /// A fresh world of two ranks on threads with non-blocking communicators: rank 0's
    /// all-reduce on stream `stream` polls for rank 1 while holding that stream's enqueue
    /// lock; meanwhile another thread begins a (relaxed) capture of the stream, waiting
    /// for the lock, and this one drops fresh memory whose home is the stream and buffer
    /// `slot`; then rank 1 comes. Nothing may be freed under work, leaked, or let its
    /// context go; the capture, once begun, is ended here and its graph kept.
    PollBehindCapture {
        slot: u8,
        stream: u8,
    },
    /// A fresh stream of device `dev` (noted in a `StreamLog`, which forgets it again when
    /// `forget`), a capture begun on it (`mode`: 0 thread-local, 1 global, 2 relaxed),
    /// buffer `slot` filled there, and the stream's one handle dropped (on another thread
    /// when `elsewhere`, for a relaxed capture) before the capture ends: nothing can end
    /// it any more, so it is abandoned and what it held goes.
    AbandonCapture {
        dev: u8,
        slot: u8,
        mode: u8,
        elsewhere: bool,
        forget: bool,
    },
    /// A fresh world of two ranks on threads (devices `dev` and the next) in the checked
    /// mode: rank 0 makes one of the crate's own collectives (`what`: 0 a symmetric
    /// allocation, 1 a window's registration; 2 a program's all-gather of a copy of an
    /// agreement's record, while rank 1 registers a window) and rank 1 all-reduces (for
    /// 0 and 1). Both ranks get `CallMismatch`, never a hang or a value.
    CheckedPeers {
        dev: u8,
        what: u8,
    },
    /// A fresh world of two ranks on threads: rank 1 all-gathers, on the program's
    /// communicator, a copy of the window-size agreement's record claiming a 1 TiB window,
    /// then registers its 1024-byte window; rank 0 registers its 4096-byte window, then
    /// all-gathers and puts 4096 bytes into rank 1's. The put is never accepted: no
    /// program's collective reaches the agreement.
    CopiedRecord {
        dev: u8,
    },
    /// Memory of device `dev` whose home is another library's stream (a foreign stream
    /// wrapping a stream the step owns), filled there, then used on a stream of the
    /// crate's while that library begins a relaxed capture of its stream on another thread,
    /// just before the `skip`-th event record of the ordering: the use is either refused
    /// (`Capturing`) or ordered without joining the capture; the capture then ends and its
    /// graph is destroyed unlaunched.
    ForeignCaptureDuringOrdering {
        dev: u8,
        skip: u8,
    },
    /// Never generated: what the checker's own tests break on purpose.
    Sabotage(Sabotage),
}

/// How the world of a program is made.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    /// The simulated NCCL's release (switches code paths: fallbacks, windows, shrink).
    pub version: NcclVersion,
    /// Communicator 0 (device 0) blocking; communicator 1 (device 1) non-blocking when set.
    pub second_non_blocking: bool,
    /// Seeds the order in which the teardown drops what is left.
    pub teardown: u64,
    /// The communicators are made with `init_rank_scalable` (one id; two are refused),
    /// where the release has it.
    pub scalable: bool,
    /// The communicators compare each collective between the ranks first
    /// (`CommConfig::check_calls`): one rank each, so the comparison always agrees, and
    /// what it adds (its exchange, its wait, its stream and buffers) meets every step.
    pub check_calls: bool,
}

/// A program: its setup and its steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub setup: Setup,
    pub ops: Vec<Op>,
}
