//! Safe NCCL for Rust: communicators and every collective, configured from code or from
//! the launcher's environment, over [`nccl_sys`]'s run-time-loaded table.
//!
//! * [`World`]: size and rank from code or from `NCCL_CHANNEL_*`, IREE's
//!   `IREE_CUDA_NCCL_*`, torchrun, Open MPI, PMI or Slurm variables ([`ENV_FAMILIES`]).
//! * [`UniqueId`]: generated and shared as bytes or hex, derived from `NCCL_COMM_ID`, or
//!   exchanged through a file.
//! * [`Rendezvous`]: rank 0 hands its id to the others over TCP, at an address derived
//!   from the launcher (torchrun's `MASTER_ADDR`/`MASTER_PORT` or its agent's TCPStore,
//!   Slurm's node list and job id, Open MPI or MPICH on one node) or named with
//!   `NCCL_CHANNEL_RENDEZVOUS=host:port`; no extra variable under those launchers, and it
//!   works with every NCCL (on 2.18–2.21 `NCCL_COMM_ID` cannot give ranks one id).
//! * [`Communicator`]: init by rank, all local devices at once, split and shrink (one rank,
//!   or every local rank from one thread in one group); collectives typed over
//!   [`NcclType`] with lengths, roots, peers, devices and types checked before any FFI
//!   call, on any [`DeviceSlice`](cuda_hal::DeviceSlice): whole buffers, views (bucketed
//!   all-reduce over `chunks_mut` of one flat buffer), other crates' memory; raw addresses
//!   through [`RawCollectives`] (`unsafe`); [`group`] / [`Group`] always end their group.
//! * [`CommConfig`]: non-blocking mode with deadlines, and every `ncclConfig_t` field as a
//!   typed setter checked against the release of the loaded NCCL.
//! * Registered memory, NCCL's faster paths: [`Communicator::buffer`] (the default: a pool
//!   of NCCL memory that registers itself for the collectives that gain, measured never
//!   slower than plain buffers), [`Communicator::symmetric`] (memory every rank allocates
//!   at once as a symmetric window: NCCL's symmetric kernels and zero-SM collectives),
//!   [`alloc_nccl`] (`ncclMemAlloc`),
//!   [`Communicator::register`] and [`Communicator::register_window`] (RAII handles that
//!   borrow their communicator and hold their memory; released only after the work,
//!   graphs and groups that may use them). Which suits which collective and size, measured
//!   on 2 × H200: BENCHMARKS.md.
//! * [`Channel`]: the default channel; NCCL is opened only when one is asked for with a
//!   world size of at least 1. Its ranks agree on an id through `NCCL_COMM_ID` when set,
//!   else through the launcher's [`Rendezvous`] ([`IdSource`]).
//!
//! # Quick start
//!
//! Two ranks all-gather `[101, 102]`, and each ends with `[101, 102, 101, 102]`. This crate
//! is the only dependency: the CUDA layer and NCCL's table are re-exported as
//! [`nccl_channel::cuda_hal`](cuda_hal) and [`nccl_channel::nccl_sys`](nccl_sys). Here
//! the two GPUs and NCCL are simulated (the crates `cuda-mock` and `nccl-mock`, beside
//! this one in `[dependencies]`, or `[dev-dependencies]` for tests) and each rank is a
//! thread; the data really moves through the simulated device memory, so this runs
//! anywhere, with no GPU and no libnccl.
//!
//! ```
//! use std::sync::Arc;
//! use nccl_channel::cuda_hal::{Cuda, DeviceBuffer, Stream};
//! use nccl_channel::{Communicator, UniqueId};
//!
//! // Two simulated GPUs and their NCCL. On a machine with GPUs instead:
//! //   let cuda = Cuda::load()?;
//! //   let nccl = nccl_channel::nccl_sys::Nccl::load()?;
//! let (cuda, gpus) = cuda_mock::MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
//! let (nccl, _simulation) = nccl_mock::MockNccl::new(&gpus).build()?;
//! let nccl = Arc::new(nccl);
//! // Rank 0 makes the id and hands it to the others (here they share memory).
//! let id = UniqueId::generate(&nccl)?;
//! let gathered = std::thread::scope(|s| {
//!     let ranks: Vec<_> = (0..2)
//!         .map(|rank| {
//!             let (cuda, nccl) = (&cuda, &nccl);
//!             s.spawn(move || -> nccl_channel::Result<Vec<i32>> {
//!                 let ctx = cuda.device(rank)?.primary_context()?;
//!                 let comm = Communicator::init_rank(nccl, &ctx, &id, 2, rank)?;
//!                 let stream = Stream::new(&ctx)?;
//!                 let send = DeviceBuffer::from_slice(&ctx, &[101, 102])?;
//!                 let mut recv = DeviceBuffer::zeroed(&ctx, 2 * comm.size())?;
//!                 comm.all_gather(&send, &mut recv, &stream)?;
//!                 stream.synchronize()?;
//!                 Ok(recv.to_vec()?)
//!             })
//!         })
//!         .collect();
//!     ranks
//!         .into_iter()
//!         .map(|r| r.join().expect("a rank panicked"))
//!         .collect::<nccl_channel::Result<Vec<_>>>()
//! })?;
//! assert_eq!(gathered, [[101, 102, 101, 102], [101, 102, 101, 102]]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # On real GPUs
//!
//! Each rank is a process, started by a launcher; [`Channel::from_env`] reads the world
//! from the launcher's variables, loads the CUDA driver and libnccl, picks the device of
//! the local rank and agrees on the id with the other ranks. The rank's work is the same
//! as above. (Not run here: it needs GPUs, libnccl and a launcher.)
//!
//! ```no_run
//! use nccl_channel::Channel;
//! use nccl_channel::cuda_hal::DeviceBuffer;
//! // torchrun --nproc-per-node 2 ./prog, srun -n 2 ./prog, mpirun -n 2 ./prog, or by hand:
//! // NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=0 NCCL_COMM_ID=127.0.0.1:8000 ./prog (and 1)
//! if let Some(ch) = Channel::from_env()? {
//!     let ctx = ch.comm().context();
//!     let send = DeviceBuffer::from_slice(ctx, &[101i32, 102])?;
//!     let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 2 * ch.comm().size())?;
//!     ch.comm().all_gather(&send, &mut recv, ch.stream())?;
//!     ch.stream().synchronize()?;
//!     assert_eq!(recv.to_vec()?, [101, 102].repeat(ch.comm().size()));
//!     ch.close()?;
//! }
//! # Ok::<(), nccl_channel::Error>(())
//! ```
//!
//! The same program can be tested without GPUs by building its channel from code:
//! [`ChannelBuilder`] takes a [`World`], a simulated [`Cuda`](cuda_hal::Cuda) and NCCL, and an
//! [`IdSource`] (see [`Channel`]'s example).
//!
//! # The source, file by file
//!
//! [`Communicator`]'s docs list where each family of its methods lives, and follow one
//! call down to NCCL. The rest of `src/`: `world.rs`, `unique_id.rs`, `rendezvous.rs`
//! (who the ranks are and how they agree on an id; the network side of the rendezvous
//! is the crate nccl-rendezvous), `channel.rs` (the default channel),
//! `config.rs`, `params.rs`, `encryption.rs` (settings), `types.rs` (element types and
//! reductions), `collective_kind.rs` ([`Collective`]), `group.rs`, `error.rs`,
//! `reliability.rs` and `notice.rs` (deadlines, aborts, the notice of a long wait),
//! `registered/` (NCCL memory, the pool, registrations and windows, and when their
//! memory may go), `suspend/`, `enqueue.rs` (the one order every call takes: checks, each
//! buffer's use noted with its address, the comparison, the raw call), `children.rs` (the
//! children of splits, shrinks and grows), `comm/private.rs` (the private channel every
//! communicator gets), `exchange/` (the crate's own exchanges on it), `agreement/` (the
//! values the ranks agree on there), `call_check/` (the checked mode) and `topic.rs`.

//!
//! # Glossary
//!
//! Beside cuda-hal's words (enqueue, hold, capture, group; see [its
//! glossary](cuda_hal#glossary)):
//!
//! * **Rank**: one member of a communicator, numbered from 0; the **world** is every rank
//!   of a job ([`World`]).
//! * **Unique id**: the 128 bytes every rank of one communicator passes to its init
//!   ([`UniqueId`]); **rendezvous**: how rank 0 hands it to the others.
//! * **The owner's thread**: the thread that holds a [`Communicator`] (it is `Send`, not
//!   `Sync`); NCCL calls on it are made only there, so releases that must call NCCL
//!   wait in a queue for that thread's next call.
//! * **Registration**: memory made known to NCCL for one communicator
//!   (`ncclCommRegister`), which its collectives may then use directly; a **window** is
//!   a registration every rank makes together (`ncclCommWindowRegister`), which one-sided
//!   operations and symmetric paths need.
//! * **Pool**: the communicator's store of NCCL memory ([`Communicator::buffer`]), which
//!   registers itself where the [`PoolPolicy`] measured a gain.
//! * **Deadline**: how long a non-blocking communicator's waits may take
//!   ([`CommConfig`]) before it is aborted; an **abort** stops its work without waiting
//!   for the other ranks.
//! * **Checked mode**: the ranks compare each collective's arguments before NCCL gets it
//!   ([`CommConfig::check_calls`]).
//! * **Private channel**: a communicator of the same ranks, split from each communicator
//!   inside its init, that carries only the crate's own exchanges between the ranks (the
//!   checked mode's comparisons, a window's size), so that no collective of the program
//!   can pair with them.
//!
//! # Features
//!
//! * `rendezvous` (on by default): [`Rendezvous`], [`RendezvousSecret`] and the launcher's
//!   rendezvous of [`IdSource::Auto`], through the crate `nccl-rendezvous`. Off
//!   (`default-features = false`), nccl-channel builds without that crate's cryptography
//!   and event loop (hkdf, hmac, sha2, chacha20poly1305, subtle, zeroize, getrandom, mio,
//!   socket2), and ranks agree on an id through `NCCL_COMM_ID`, a file or bytes of their
//!   own.
//! * `half`: [`half::f16`](https://docs.rs/half) and `half::bf16` as [`NcclType`]s.

#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs speak of the rendezvous (feature `rendezvous`, on by default, and on docs.rs):
// built without it, their links to it have nothing to point at.
#![cfg_attr(not(feature = "rendezvous"), allow(rustdoc::broken_intra_doc_links))]
#![warn(missing_debug_implementations)]

/// Calls an NCCL table entry and checks its status; the error names the entry, so no call
/// site spells a C name by hand. Use inside `unsafe`: `unsafe { nccl_call!(nccl, ncclX(..)) }`.
macro_rules! nccl_call {
    ($nccl:expr, $f:ident($($a:expr),* $(,)?)) => {{
        let nccl: &::nccl_sys::Nccl = &$nccl;
        $crate::check(nccl, (nccl.fns().$f)($($a),*), stringify!($f), None)
    }};
}

/// The raw status and the entry's name (for statuses that need more than a check:
/// `ncclInProgress`, or a communicator's own check).
macro_rules! nccl_raw_call {
    ($nccl:expr, $f:ident($($a:expr),* $(,)?)) => {{
        let nccl: &::nccl_sys::Nccl = &$nccl;
        ((nccl.fns().$f)($($a),*), stringify!($f))
    }};
}

/// An optional NCCL table entry and its name, or [`Error::Unsupported`] naming the
/// release that introduced it.
macro_rules! optional {
    ($nccl:expr, $f:ident) => {{
        let nccl: &::nccl_sys::Nccl = &$nccl;
        match nccl.fns().$f {
            Some(f) => Ok((f, stringify!($f))),
            None => Err($crate::reliability::unsupported(nccl, stringify!($f))),
        }
    }};
}

/// `if_rendezvous!({ items… } else { items… })`: the first items where nccl-channel was
/// built with its feature `rendezvous`, else the second. For the repository's launcher and
/// tests, which follow this crate's features without features of their own to set (a
/// dev-dependency cannot be given features by the crate it tests).
#[cfg(feature = "rendezvous")]
#[doc(hidden)]
#[macro_export]
macro_rules! if_rendezvous {
    ({ $($on:tt)* } else { $($off:tt)* }) => { $($on)* };
}

/// `if_rendezvous!({ items… } else { items… })`: the first items where nccl-channel was
/// built with its feature `rendezvous`, else the second.
#[cfg(not(feature = "rendezvous"))]
#[doc(hidden)]
#[macro_export]
macro_rules! if_rendezvous {
    ({ $($on:tt)* } else { $($off:tt)* }) => { $($off)* };
}

mod agreement;
mod backoff;
mod call_check;
mod channel;
mod children;
mod collective;
mod collective_kind;
mod comm;
mod config;
mod decimal;
mod encryption;
mod enqueue;
mod error;
mod exchange;
mod group;
mod grow;
mod host_port;
mod notice;
mod onesided;
mod params;
mod raw;
mod registered;
mod reliability;
#[cfg(feature = "rendezvous")]
mod rendezvous;
mod scalable;
mod split;
mod suspend;
mod sync;
mod topic;
mod types;
mod unique_id;
mod world;

pub use call_check::setting::CHECK_CALLS_ENV;
pub use channel::{Channel, ChannelBuilder, IdSource, nccl, nccl_opened};
pub use collective_kind::{Collective, UnknownCollective};
pub use comm::Communicator;
pub use config::{CommConfig, CtaPolicy, HostCftMode, NvlsHostMode};
pub use encryption::{Encryption, PSK_MIN_LEN, set_encryption};
pub use error::{Error, IoError, ParentsProblem, Result, report};
pub use group::{Group, group};
/// The crate that hands the id over TCP (feature `rendezvous`): its own types, for
/// programs that use it without NCCL's side.
#[cfg(feature = "rendezvous")]
pub use nccl_rendezvous;
pub use notice::WAIT_NOTICE_AFTER;
pub use onesided::{Signal, SignalWait};
pub use params::{Param, ParamValue};
pub use raw::RawCollectives;
pub use registered::nccl_memory::alloc_nccl;
pub use registered::policy::{POOL_POLICY_ENV, PoolMemory, PoolPolicy};
pub use registered::pool::PooledBuffer;
pub use registered::register::{Registration, Window, WindowFlags};
pub use registered::symmetric::SymmetricBuffer;
pub use reliability::AbortHandle;
#[cfg(feature = "rendezvous")]
pub use rendezvous::{
    DEFAULT_TIMEOUT, PORT_BASE, PORT_SPAN, Rendezvous, RendezvousKind, RendezvousSecret,
    SECRET_FILE_ENV,
};
pub use scalable::scalable_root;
pub use suspend::calls::{MemStats, SuspendFlags};
pub use types::{Fp8E4M3, Fp8E5M2, NcclType, ReduceOp};
pub use unique_id::UniqueId;
pub use world::{ENV_FAMILIES, EnvFamily, World};

pub use cuda_hal;
pub use nccl_sys;

/// The `half` crate (feature `half`), whose `f16` and `bf16` are [`NcclType`]s: name them
/// as `nccl_channel::half::f16` without adding `half` (and matching its version) yourself.
#[cfg(feature = "half")]
pub use half;

use nccl_sys::{Nccl, ncclComm_t, ncclResult_t};

/// Turns an NCCL status into a `Result`, with NCCL's message and last-error detail.
pub(crate) fn check(
    nccl: &Nccl,
    rc: ncclResult_t,
    call: &'static str,
    comm: Option<ncclComm_t>,
) -> Result<()> {
    if rc == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    Err(nccl_error(nccl, rc, call, comm))
}

#[cold]
fn nccl_error(
    nccl: &Nccl,
    code: ncclResult_t,
    call: &'static str,
    comm: Option<ncclComm_t>,
) -> Error {
    // SAFETY: ncclGetLastError accepts NULL or a live communicator and returns a string
    // owned by NCCL (or NULL).
    let p = unsafe { (nccl.fns().ncclGetLastError)(comm.unwrap_or(std::ptr::null_mut())) };
    let detail = if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null and NUL-terminated, valid until the next NCCL call.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    };
    Error::Nccl {
        call,
        code,
        name: code.name().unwrap_or("ncclUnknownResult").to_string(),
        message: nccl.error_string(code),
        detail,
    }
}

// The README (the crate's registry page) runs as doctests, on the simulated devices
// (the dev-dependencies enable them).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
