//! Safe CUDA driver layer over [`cuda_sys`]'s run-time-loaded function table.
//!
//! * [`Cuda`]: the driver, loaded once, initialised, shared and cheap to clone.
//! * [`Device`]: by ordinal, by UUID ([`DeviceUuid`], printed as `nvidia-smi -L` does), by
//!   PCI bus id, or by a selector string such as `cuda://0` or `cuda://GPU-<uuid>`
//!   ([`DeviceSelector`]).
//! * [`Context`]: the device's primary context, retained by RAII; [`Context::bind`] makes
//!   it current on the calling thread, so one thread can drive several devices.
//! * [`Stream`], [`Event`], [`DeviceBuffer`], [`PinnedBuffer`].
//! * [`DeviceSlice`] / [`DeviceSliceMut`]: "device memory holding `len` values of `T` in
//!   this context", taken by every copy, fill, kernel argument and (in `nccl-channel`)
//!   collective; implemented by buffers, by the views [`DeviceView`] / [`DeviceViewMut`]
//!   (`slice`, `split_at`, `chunks`, like `&[T]`), and by other crates for their memory,
//!   which is then borrowed, never owned.
//! * [`Module`] (code loaded in one context) and [`Library`] (code for every context),
//!   their kernels as [`Function`]s, device globals as [`Global`]s, and launches:
//!   [`Function::launch`] with a [`LaunchConfig`] and a tuple of [`KernelArg`]s
//!   (numbers, buffers, views, [`ByValue`] structs), checked against the kernel's
//!   parameters; attributes and occupancy.
//!
//! Every fallible call returns [`Error`], which keeps the driver's `CUresult`, its name
//! and its message. Drops never panic, and memory, streams and events hold their context,
//! so they are released before it.
//!
//! # Quick start
//!
//! The crate `cuda-mock` (a dev-dependency for your tests) builds the same API over a
//! simulated driver, for tests on machines without a GPU: its `MockDriver` hands its table
//! to [`Cuda::from_driver`]. Every example in these docs runs on it. The simulated machine also checks that nothing leaked and nothing was misused:
//!
//! ```
//! use cuda_mock::MockDriver;
//! use cuda_hal::{Cuda, DeviceBuffer, Stream};
//!
//! let (cuda, world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
//! assert_eq!(cuda.device_count()?, 2);
//! let gpu = cuda.select("cuda://1")?;
//! let ctx = gpu.primary_context()?;
//! let stream = Stream::new(&ctx)?;
//! let mut buf = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0, 4.0])?;
//! buf.slice_mut(2..)?.fill_async(0.5, &stream)?;
//! stream.synchronize()?;
//! assert_eq!(buf.to_vec()?, [1.0, 2.0, 0.5, 0.5]);
//! drop((buf, stream, ctx, gpu, cuda));
//! assert!(world.live().is_empty() && world.violations().is_empty());
//! # Ok::<(), cuda_hal::Error>(())
//! ```
//!
//! On a machine with a GPU the same code starts from [`Cuda::load`] (`no_run`: it needs
//! a GPU):
//!
//! ```no_run
//! use cuda_hal::{Cuda, DeviceBuffer};
//! let cuda = Cuda::load()?;
//! let gpu = cuda.select("cuda://0")?;
//! let ctx = gpu.primary_context()?;
//! let buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2, 3])?;
//! assert_eq!(buf.to_vec()?, [1, 2, 3]);
//! # Ok::<(), cuda_hal::Error>(())
//! ```
//!
//! # Features
//!
//! * `half`: `half::f16` and `half::bf16` as [`DeviceRepr`] element types and
//!   [`KernelArg`]s.
//!
//! # Safety: the memory model for asynchronous work
//!
//! A call that enqueues GPU work returns before the work runs; a call inside an NCCL
//! group only records its work, which `ncclGroupEnd` enqueues; work captured into a graph
//! runs whenever the graph is launched. Safe code of this crate (and of `nccl-channel`,
//! built on the same rules) can never make the GPU or NCCL touch memory, a stream or a
//! communicator after it was freed. Device memory *contents* may still race, as on any
//! GPU (two streams writing one buffer give unspecified values); every element type is
//! [`DeviceRepr`], valid for any bit pattern, so that is never undefined behaviour.
//!
//! 1. **Use logs.** Each device allocation records the streams whose work used it
//!    ([`DeviceBuffer::used_on`], called by every enqueueing API before the work is
//!    enqueued). When the last owner drops it, the free is ordered after that work: a
//!    plain allocation waits for those streams, then `cuMemFree`; a stream-ordered one
//!    (`alloc_on`) makes its free stream wait for an event recorded on each of them, then
//!    `cuMemFreeAsync`. If ordering fails (a broken context), the memory is leaked rather
//!    than freed under running work. The usual case, the same stream again, costs two
//!    loads and a thread-local read per buffer. Stream-ordered memory is also ordered
//!    *before* its first use on another stream (and before the first synchronous call),
//!    since the pool may hand out memory that earlier work on its stream still uses.
//! 2. **Shared owners for work not enqueued yet or enqueued again.** A buffer's memory is
//!    shared ([`KeepAlive`]): an open group ([`DeferScope`], per thread and `!Send`, like
//!    NCCL's group state) holds everything its calls used, streams and communicators too,
//!    until the group has ended (and, for NCCL's non-blocking communicators, until NCCL
//!    has enqueued the work); a capture begun with [`Stream::begin_capture`] holds what
//!    the captured work uses, and hands it to the [`Graph`] and every [`GraphExec`] made
//!    of it. Dropping a `DeviceBuffer` only drops its handle; the memory goes when the
//!    last holder does. A stream that joins a capture through [`Stream::wait_event`] is
//!    tracked too, and memory dropped while a stream it would be freed on is captured
//!    goes to that capture's graph (freeing then would put a free node into the graph).
//! 3. **Threads.** Work is noted and enqueued under the stream's order lock
//!    ([`Stream::enqueue_lock`]), which a capture takes exclusively to begin, end or be
//!    joined: no work slips into a graph between its noting and its enqueue. Frees and
//!    orderings of stream-ordered memory take the locks of the streams they enqueue on
//!    without blocking (the caller may hold one); a free that cannot have them waits in a
//!    queue and finishes when the capture lets the lock go, or at this crate's next
//!    allocation or release: a contended lock never decides between freeing and leaking.
//!    Each lock guard accounts for itself, so locks released in any order leave the
//!    thread's record exact ([`Stream::after_enqueue`] relies on it). An event's capture
//!    is read and waited for atomically. A communicator held by an open group is refused to
//!    other threads until the group ends, and its teardown waits for the group; a group
//!    whose background work cannot be confirmed keeps what it holds (a leak, never a
//!    free under running work). [`GraphExec`] is not `Sync`.
//! 4. **Gates.** What can become unusable while a graph holds it (an NCCL communicator
//!    that was aborted) is a gated [`Dependency`]: [`GraphExec::launch`] checks it and
//!    keeps it from being torn down until the launch is enqueued, and returns
//!    [`Error::Unusable`] once it is gone.
//! 5. **Host memory** cannot be held that way, so the copies that borrow it either wait
//!    for their stream before returning (`*_on`, refused while the stream is captured,
//!    holding the order lock until the wait is over) or are `unsafe` (`*_async`).
//!    Device-to-device copies are safe either way.
//! 6. **A leak is whole.** When a release cannot be proven safe (a context that cannot be
//!    made current, a wait that fails), nothing it needs is released either: the memory,
//!    its context, the streams that used it and the closure or owner that frees it all
//!    stay, so no context is ever released under memory that work may use.
//! 7. **Other libraries' captures.** Work this crate enqueues on a stream another library
//!    is capturing (a stream adopted with [`Stream::from_owner`], or cudarc's) is kept by
//!    a CUDA user object that library's graph owns: released once that graph, every
//!    instance of it and their launches are gone.
//! 8. **`unsafe` where nothing else can hold**: raw handles (`from_raw`), captures begun
//!    or joined through the raw table, or through another `Stream` value wrapping the
//!    same raw stream (work recorded behind the crate's back is not held;
//!    [`Stream::end_capture`] refuses a capture it did not begin), loading a library by
//!    path (`Driver::load_from`; `$CUDA_SYS_LIBRARY` is trusted input, like
//!    `LD_PRELOAD`), loading binary code ([`Module::from_binary`]: the driver takes no
//!    length), and launching a kernel ([`Function::launch`]: no type system can check
//!    what a kernel does with its arguments; their packing and contexts are checked, and
//!    buffers and views given are held like any other use; the kernel's behaviour, and
//!    memory reached through raw addresses, are the caller's promise), and implementing
//!    [`KernelArg`] (an implementation that hands out an address keeps its memory alive).
//! 9. **Code is kept alive like memory.** A [`Module`] or [`Library`] is shared like an
//!    allocation: a launch notes it used on its stream and holds it for a capture or
//!    group, exactly as its buffer arguments are; the last owner unloads it only after
//!    synchronising the streams that launched its kernels (or hands it to the graph of a
//!    capture recording one of them). Functions and globals borrow it, so they cannot
//!    outlive it.
//!
//! Views note their work on the memory they were taken of (a buffer's allocation, or
//! another crate's [`DeviceSlice`], whose implementation promises the same rules), so they
//! follow the same rules; the compiler keeps a view from outliving its buffer. The
//! simulated driver of `cuda-mock` checks all of this when work executes: a freed,
//! out-of-bounds or foreign address, and a stream-ordered free not ordered after the work
//! that used the memory, are reported as violations naming the call.
//!
//! # Glossary
//!
//! The docs use a few words in one sense throughout:
//!
//! * **Enqueue**: hand work to a stream; the call returns before the work runs.
//! * **Use log**: what an allocation records of the streams whose work used it, so that
//!   its free can wait for that work.
//! * **Hold** (a [`KeepAlive`]): a shared owner of memory, a stream, a module or a
//!   communicator, kept by work that is not enqueued yet or may be enqueued again (an
//!   open group, a capture and its graphs). While any hold is alive, the thing is not
//!   freed.
//! * **Capture**: recording a stream's work into a [`Graph`] instead of running it
//!   ([`Stream::begin_capture`]). A **strict** capture (global or thread-local mode)
//!   forbids host waits, which this crate refuses first ([`Error::Capturing`]); a
//!   **relaxed** one forbids nothing.
//! * **Group**: NCCL's `ncclGroupStart`/`ncclGroupEnd`, which records calls and enqueues
//!   them at its end; [`DeferScope`] is its counterpart here. A group has **settled**
//!   when its work is enqueued and its holds may go.
//! * **Leak**: memory that is never freed because the work that may use it could not be
//!   waited for; always whole, with its context, so nothing is freed under running work.
//!

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

/// Calls a driver-table entry and checks its status; the error names the entry, so no
/// call site spells a C name by hand. Use inside `unsafe` (the call's contract is the
/// caller's): `unsafe { call!(cuda, cuMemAlloc(&mut p, n)) }`.
macro_rules! call {
    ($cuda:expr, $f:ident($($a:expr),* $(,)?)) => {{
        let cuda: &$crate::Cuda = &$cuda;
        cuda.check((cuda.fns().$f)($($a),*), stringify!($f))
    }};
}

/// An optional driver-table entry: [`Error::Unsupported`] when the driver lacks it, else
/// as [`call!`].
macro_rules! call_opt {
    ($cuda:expr, $f:ident($($a:expr),* $(,)?)) => {{
        let cuda: &$crate::Cuda = &$cuda;
        match cuda.require(cuda.fns().$f, stringify!($f)) {
            Ok(f) => cuda.check(f($($a),*), stringify!($f)),
            Err(e) => Err(e),
        }
    }};
}

/// The raw status and the entry's name, for calls with statuses that are not failures
/// (`CUDA_ERROR_NOT_READY`).
macro_rules! raw_call {
    ($cuda:expr, $f:ident($($a:expr),* $(,)?)) => {{
        let cuda: &$crate::Cuda = &$cuda;
        ((cuda.fns().$f)($($a),*), stringify!($f))
    }};
}

mod code;
mod context;
mod copy;
mod cuda;
#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub mod cudarc;
mod device;
// Public but hidden: not API, shared with nccl-channel so that both parse one way.
#[cfg(test)]
mod contention_tests;
#[doc(hidden)]
pub mod digits;
mod error;
mod event;
mod function;
mod graph;
mod hold;
pub mod interop;
mod kernel_arg;
mod launch;
mod launch_config;
mod library;
mod memory;
mod module;
mod pinned;
mod relay;
mod repr;
mod selector;
mod slice;
mod stream;
mod view;

pub use context::{Context, CurrentGuard, MemoryInfo};
pub use cuda::Cuda;
pub use cuda_sys;
pub use device::Device;
pub use error::{Error, Result};
pub use event::Event;
pub use function::{BlockSize, Function, ParamInfo};
pub use graph::{CaptureMode, Graph, GraphExec};
pub use hold::core::{Dependency, KeepAlive, Stream};
pub use hold::group::DeferScope;
pub use hold::use_log::StreamLog;
pub use kernel_arg::{ByValue, KernelArg, KernelArgs};
pub use launch_config::LaunchConfig;
pub use library::{Kernel, Library};
pub use memory::DeviceBuffer;
pub use module::{Global, Module};
pub use pinned::PinnedBuffer;
pub use repr::DeviceRepr;
pub use selector::{DeviceSelector, DeviceUuid, PciBusId};
pub use slice::{DeviceSlice, DeviceSliceMut, Enqueuing};
pub use stream::EnqueueLock;
pub use view::{Chunks, ChunksMut, DeviceView, DeviceViewMut};

/// The `half` crate (feature `half`), whose `f16` and `bf16` are element types here: name
/// them as `cuda_hal::half::f16` without adding `half` (and matching its version) yourself.
#[cfg(feature = "half")]
pub use half;

// The README (the crate's registry page) runs as doctests, on the simulated devices.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
