//! The error type: NCCL failures keep the `ncclResult_t`, its name, NCCL's message and
//! `ncclGetLastError`'s detail.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use nccl_sys::{LoadError, ncclResult_t};

/// Everything that can go wrong in `nccl-channel`.
///
/// One type for setup (the world, the unique id, the rendezvous, the channel) and for what
/// a collective returns, on purpose: a rank's program does both in one function and
/// propagates with `?`, the same NCCL status can come from either (a peer that is gone
/// fails `ncclCommInitRank` and an all-reduce alike, as [`Error::Nccl`]), and the setup
/// failures are already variants of their own (`Env`, `UniqueId`, `Rendezvous`, ...), so a caller
/// who cares matches on them; two types would add a conversion at every `?` and split one
/// failure across both.
///
/// Arguments are checked before any NCCL call, and the error says what to fix:
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, Error, ReduceOp};
/// use nccl_sys::ncclResult_t;
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2])?;
///
/// let e = comm.send(&buf, 5, &stream).unwrap_err();
/// assert_eq!(e, Error::InvalidRank { what: "send", rank: 5, size: 1 });
/// assert_eq!(e.to_string(), "send: rank 5 is out of range for a communicator of 1 rank");
///
/// // A failure of NCCL itself keeps its status, and NCCL's message and detail. One that
/// // leaves the communicator in doubt (here an internal error, injected by the simulated
/// // NCCL) aborts it at once, so nothing waits later on a peer that may be gone.
/// world.fail_next("ncclAllReduce", ncclResult_t::ncclInternalError);
/// let e = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream).unwrap_err();
/// assert!(matches!(
///     &e,
///     Error::Nccl { call: "ncclAllReduce", name, .. } if name == "ncclInternalError"
/// ));
/// assert!(comm.is_aborted());
/// let again = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream);
/// assert_eq!(again, Err(Error::Aborted));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An NCCL call failed.
    #[error("{call} failed: {name} ({}): {message}{}", code.0, detail_suffix(detail))]
    Nccl {
        /// The NCCL function (`"ncclAllReduce"`).
        call: &'static str,
        /// The raw status.
        code: ncclResult_t,
        /// Its C name (`"ncclInvalidArgument"`).
        name: String,
        /// `ncclGetErrorString` of the status.
        message: String,
        /// `ncclGetLastError`: NCCL's detail about the last failure (may be empty).
        detail: String,
    },
    /// The checked mode ([`CommConfig::check_calls`](crate::CommConfig::check_calls))
    /// found that the ranks are about to call different collectives (or the same one with
    /// another count, type, reduction or root, or at another point of their sequence).
    /// Nothing was issued; every rank gets this error, naming its own call and the first
    /// rank whose call differs.
    #[error(
        "{what}: the ranks' calls differ: this rank ({rank}) calls {call}, rank {other_rank} calls {other_call}"
    )]
    CallMismatch {
        /// The operation.
        what: &'static str,
        /// This rank.
        rank: usize,
        /// What this rank called: "all_gather of 4 int32 (call 3)".
        call: String,
        /// The first rank whose call differs.
        other_rank: usize,
        /// What that rank called.
        other_call: String,
    },
    /// A CUDA driver call failed, or a device could not be selected.
    #[error(transparent)]
    Cuda(#[from] cuda_hal::Error),
    /// NCCL could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An environment variable is malformed or contradicts another.
    #[error("environment variable {variable}={value:?}: {problem}")]
    Env {
        /// The variable.
        variable: String,
        /// Its value.
        value: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// A unique id string or file is malformed.
    #[error("invalid NCCL unique id: {0}")]
    UniqueId(String),
    /// `NCCL_COMM_ID` cannot give every rank the same id with this NCCL.
    #[error(
        "NCCL {version} gives different unique ids for the same NCCL_COMM_ID={comm_id}, so \
         ranks cannot derive a shared id from it; share an id from rank 0 instead \
         (UniqueId::generate + bytes/hex, or a file)"
    )]
    CommIdNotDeterministic {
        /// The loaded NCCL's version.
        version: String,
        /// The value of NCCL_COMM_ID.
        comm_id: String,
    },
    /// A rank, root or peer is out of range.
    #[error(
        "{what}: rank {rank} is out of range for a communicator of {size} rank{}",
        if *size == 1 { "" } else { "s" }
    )]
    InvalidRank {
        /// The operation and the argument.
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// The communicator's size.
        size: usize,
    },
    /// A buffer has the wrong number of elements.
    #[error(
        "{what}: the {} must hold {expected} element{}, it holds {got}",
        buffer_name(buffer),
        if *expected == 1 { "" } else { "s" }
    )]
    LengthMismatch {
        /// The operation.
        what: &'static str,
        /// Which buffer (`"send"`, `"recv"`, or `"buffer"` for an in-place operation's).
        buffer: &'static str,
        /// The length needed.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A buffer or stream belongs to another device than the communicator.
    #[error("{what}: the {object} is on device {found}, the communicator on device {expected}")]
    WrongDevice {
        /// The operation.
        what: &'static str,
        /// `"stream"`, `"send buffer"`, ...
        object: &'static str,
        /// The communicator's device.
        expected: i32,
        /// The object's device.
        found: i32,
    },
    /// A buffer or stream is on the communicator's device but belongs to another CUDA
    /// context: one of another [`cuda_hal::Cuda`] instance (a driver loaded again, or a
    /// simulated machine of its own), whose memory and streams this communicator cannot
    /// use. Make them from the context the communicator was made with.
    #[error(
        "{what}: the {object} belongs to another CUDA context than the communicator's (both \
         are on device {device}; another cuda_hal::Cuda instance?): use the communicator's \
         context"
    )]
    WrongContext {
        /// The operation.
        what: &'static str,
        /// `"stream"`, `"send buffer"`, ...
        object: &'static str,
        /// The device both are on.
        device: i32,
    },
    /// A required argument is missing or has no meaning here.
    #[error("{what}: {problem}")]
    InvalidArgument {
        /// The operation.
        what: &'static str,
        /// What to fix.
        problem: String,
    },
    /// The loaded NCCL is too old for a feature.
    #[error("{feature} needs NCCL {needed} or newer; the loaded NCCL is {found}")]
    Unsupported {
        /// The feature (function or data type).
        feature: &'static str,
        /// The first NCCL release that has it.
        needed: String,
        /// The loaded NCCL's version.
        found: String,
    },
    /// Waiting for something took longer than allowed.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        after: Duration,
    },
    /// A file-system operation failed (the unique-id exchange, reading a pool table).
    #[error("{what} {path} failed")]
    Io {
        /// The operation.
        what: &'static str,
        /// The file.
        path: String,
        /// The operating system's error, also [`source`](std::error::Error::source).
        #[source]
        source: IoError,
    },
    /// Rank 0 could not hand its unique id to the other ranks over the network
    /// ([`Rendezvous`](crate::Rendezvous)): nothing answered before the deadline,
    /// something else answered, the ranks disagree on the world size, or rank 0 could not
    /// listen. The message names the address and the variables it was derived from, so a
    /// launcher's setting can be checked at a glance.
    #[error("{service} at {address} (derived from {derived_from}) {problem}")]
    Rendezvous {
        /// Who serves the id there: `"rank 0's rendezvous"` or `"torchrun's TCPStore"`.
        service: &'static str,
        /// `host:port`.
        address: String,
        /// The environment variables (or `"code"`) the address came from.
        derived_from: String,
        /// What went wrong. When one operating-system error caused it, that error is the
        /// [`source`](std::error::Error::source), not part of this text, so that a
        /// printed chain says it once.
        problem: String,
        /// The operating system's error, when one alone made the exchange fail (also
        /// [`source`](std::error::Error::source)); `None` when the failure is a protocol's
        /// or a deadline's, or sums up several attempts.
        #[source]
        source: Option<IoError>,
    },
    /// The rendezvous's secret refused the exchange ([`Rendezvous::secret`](crate::Rendezvous::secret)):
    /// rank 0 has a secret and this rank has none, or the other way round, or the two sides
    /// hold different secrets, or something that answered could not prove it knows the
    /// secret (an impostor, a replayed exchange). Nothing of the unique id was handed
    /// over. A rank meets this error at once when the other side tells it so, else at its
    /// deadline (what answered may have been another job's server, which a later attempt
    /// gets past).
    #[error("{service} at {address} (derived from {derived_from}) {problem}")]
    RendezvousRefused {
        /// Who serves the id there: `"rank 0's rendezvous"` or `"torchrun's TCPStore"`.
        service: &'static str,
        /// `host:port`.
        address: String,
        /// The environment variables (or `"code"`) the address came from.
        derived_from: String,
        /// What was refused, and why.
        problem: String,
    },
    /// The communicator was aborted; it accepts no more work.
    #[error("the communicator was aborted")]
    Aborted,
    /// The communicator has work in a group still open on another thread (NCCL allows one
    /// thread at a time): use it from that thread, or after the group ended.
    #[error("{what}: the communicator has work in a group still open on another thread")]
    GroupedElsewhere {
        /// The operation refused.
        what: &'static str,
    },
    /// A split or shrink was called inside an open group. NCCL gives the new communicator
    /// only when the (outermost) group ends, so it cannot be returned from inside one; to
    /// split several local ranks from one thread, use the grouped API named in `instead`
    /// ([`Communicator::split_all`](crate::Communicator::split_all),
    /// [`Communicator::shrink_all`](crate::Communicator::shrink_all)), outside any group.
    #[error(
        "{what} inside an open group: NCCL gives the new communicator only when the group \
         ends; split several local ranks together with {instead}, called outside any group"
    )]
    SplitInGroup {
        /// The operation refused.
        what: &'static str,
        /// The grouped API to use instead.
        instead: &'static str,
    },
    /// The communicators given to a grouped split or shrink cannot be split in one group.
    #[error("{what}: {problem}")]
    GroupedParents {
        /// The operation refused.
        what: &'static str,
        /// What is wrong with the list.
        problem: ParentsProblem,
    },
    /// The ranks' exchange of a value the crate agrees on by itself (`topic`: a window's
    /// size) did not match: on some rank another collective took its place (collectives
    /// issued in different orders on different ranks), or the ranks made the crate's
    /// exchanges in different orders. Every rank involved gets it; none gets a value.
    #[error(
        "{what}: the ranks' exchange of {topic} did not match ({problem}): a rank issued \
         another collective in its place, or the ranks made their calls in different orders"
    )]
    Disagreement {
        /// The operation that made the exchange.
        what: &'static str,
        /// What the ranks were agreeing on.
        topic: &'static str,
        /// What differed in the record this rank received.
        problem: String,
    },
    /// A one-sided put would write past the end of the peer's window.
    #[error("{what}: {bytes} bytes at offset {offset} do not fit a window of {window} bytes")]
    OutOfWindow {
        /// The operation.
        what: &'static str,
        /// The offset into the window, in bytes.
        offset: usize,
        /// How many bytes the put writes.
        bytes: usize,
        /// The window's size in bytes.
        window: usize,
    },
    /// The communicator is suspended ([`Communicator::suspend`](crate::Communicator::suspend)):
    /// NCCL released its memory, so it takes no work until
    /// [`resume`](crate::Communicator::resume).
    #[error("{what}: the communicator is suspended; resume it first")]
    Suspended {
        /// The operation refused.
        what: &'static str,
    },
    /// Work that may use the communicator may still run (on a stream, in an open group, in
    /// a captured graph), so it cannot be suspended now.
    #[error("{what}: {problem}")]
    InFlight {
        /// The operation refused.
        what: &'static str,
        /// What may still run, and what to do.
        problem: String,
    },
    /// NCCL has no parameter of this name ([`Param`](crate::Param)).
    #[error("NCCL has no parameter {key}")]
    UnknownParam {
        /// The key asked for.
        key: String,
    },
    /// An NCCL parameter is not of the type asked for ([`Param`](crate::Param)).
    #[error("NCCL parameter {key} is not of type {asked}")]
    ParamType {
        /// The key.
        key: String,
        /// The Rust type asked for (`"u32"`).
        asked: &'static str,
    },
}

/// Why communicators cannot go together into one grouped split or shrink
/// ([`Error::GroupedParents`]); indexes are positions in the list given.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, Error, ParentsProblem};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
/// let comms = Communicator::init_all(&nccl, &ctxs)?;
/// // Rank 0 twice (rank 1 forgotten): refused before any split is issued.
/// let e = Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[0], Some(0), 0)]);
/// let problem = ParentsProblem::Duplicate { first: 0, again: 1 };
/// assert_eq!(e.err(), Some(Error::GroupedParents { what: "Communicator::split_all", problem }));
/// assert_eq!(problem.to_string(), "communicator 1 is communicator 0 again");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParentsProblem {
    /// The list is empty.
    #[error("no communicator given")]
    Empty,
    /// Two communicators were made by different NCCL libraries (NCCL's group state is the
    /// library's: one group cannot hold both).
    #[error("communicators {first} and {other} belong to different NCCL libraries")]
    MixedLibraries {
        /// The first communicator's index.
        first: usize,
        /// The index of one made by another library.
        other: usize,
    },
    /// A blocking and a non-blocking communicator (NCCL refuses both in one group).
    #[error("communicator {first} is {}blocking and communicator {other} is not", if *.first_blocking { "" } else { "non-" })]
    MixedModes {
        /// The first communicator's index.
        first: usize,
        /// Whether the first one is blocking.
        first_blocking: bool,
        /// The index of one in the other mode.
        other: usize,
    },
    /// The same communicator twice: each rank takes part once.
    #[error("communicator {again} is communicator {first} again")]
    Duplicate {
        /// Where it first appears.
        first: usize,
        /// Where it appears again.
        again: usize,
    },
    /// A shrink's parent is itself in the list of excluded ranks (excluded ranks do not
    /// call the shrink).
    #[error("communicator {index} is rank {rank}, which the shrink excludes")]
    ExcludesItself {
        /// The communicator's index.
        index: usize,
        /// Its rank.
        rank: usize,
    },
}

/// An [`io::Error`] kept whole as the source of an [`Error`]: shared, so that `Error`
/// stays `Clone`, and equal to another when their kinds and messages are (`io::Error`
/// has no `PartialEq`). It displays as the `io::Error` and passes on its source;
/// [`get`](Self::get) gives the error itself.
///
/// ```
/// use std::error::Error as _;
/// use std::time::Duration;
/// use nccl_channel::{Error, IoError, UniqueId};
/// # let (_cuda, machine) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let (nccl, _sim) = nccl_mock::MockNccl::new(&machine).build()?;
/// let path = std::env::temp_dir().join("no-such-directory-for-nccl-channel").join("id");
/// let e = UniqueId::exchange_via_file(&nccl, &path, 0, Duration::from_secs(1)).unwrap_err();
/// let Error::Io { what, source, .. } = &e else { panic!("{e:?}") };
/// assert_eq!((*what, source.kind()), ("writing", std::io::ErrorKind::NotFound));
/// // The chain reaches the operating system's error.
/// let io = e.source().and_then(|s| s.downcast_ref::<IoError>()).expect("an IoError");
/// assert_eq!(io.get().raw_os_error(), Some(2)); // ENOENT
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct IoError(Arc<io::Error>);

impl IoError {
    /// The error itself.
    #[must_use]
    pub fn get(&self) -> &io::Error {
        &self.0
    }

    /// Its kind.
    #[must_use]
    pub fn kind(&self) -> io::ErrorKind {
        self.0.kind()
    }
}

#[cfg(feature = "rendezvous")]
impl IoError {
    /// An error another crate's error already shares.
    pub(crate) fn shared(e: Arc<io::Error>) -> IoError {
        IoError(e)
    }
}

impl From<io::Error> for IoError {
    fn from(e: io::Error) -> IoError {
        IoError(Arc::new(e))
    }
}

impl AsRef<io::Error> for IoError {
    fn as_ref(&self) -> &io::Error {
        &self.0
    }
}

impl PartialEq for IoError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string())
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for IoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// An error and its sources as one line (`outer: cause: root cause`), for a program to
/// print. This crate's errors name what failed and keep why as their
/// [`source`](std::error::Error::source) (an operating system's error, the driver's);
/// printing only the outer message, or `main`'s `Debug` of it, would lose or bury the why.
///
/// ```
/// use std::process::ExitCode;
/// use nccl_channel::PoolPolicy;
///
/// fn run() -> Result<(), nccl_channel::Error> {
///     // A table file that is not there: the operating system's reason is the source.
///     PoolPolicy::from_file("/nonexistent/policy.tsv")?;
///     Ok(())
/// }
///
/// // A program's `main`.
/// fn program() -> ExitCode {
///     match run() {
///         Ok(()) => ExitCode::SUCCESS,
///         Err(e) => {
///             assert_eq!(
///                 nccl_channel::report(&e),
///                 "reading the pool policy /nonexistent/policy.tsv failed: No such file or \
///                  directory (os error 2)"
///             );
///             eprintln!("error: {}", nccl_channel::report(&e));
///             ExitCode::FAILURE
///         }
///     }
/// }
/// # fn main() {
/// #     let _ = program();
/// # }
/// ```
pub fn report(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// `"send"` as `"send buffer"`; `"buffer"` (an in-place operation's one buffer) as itself.
pub(crate) fn buffer_name(buffer: &str) -> String {
    if buffer == "buffer" {
        buffer.into()
    } else {
        format!("{buffer} buffer")
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

/// `Result` with [`Error`]. `?` turns the driver's errors ([`cuda_hal::Error`]) and
/// NCCL's load errors into an [`Error`], so one function can mix both crates:
///
/// ```
/// use cuda_hal::{Cuda, DeviceBuffer};
/// use cuda_mock::MockDriver;
/// use nccl_channel::Error;
///
/// fn round_trip(cuda: &Cuda, device: usize) -> nccl_channel::Result<Vec<u8>> {
///     let ctx = cuda.device(device)?.primary_context()?;
///     let buf = DeviceBuffer::from_slice(&ctx, &[1u8, 2])?;
///     Ok(buf.to_vec()?)
/// }
/// let (cuda, _gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// assert_eq!(round_trip(&cuda, 0)?, [1, 2]);
/// assert!(matches!(round_trip(&cuda, 3), Err(Error::Cuda(_)))); // no device 3
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// One element, one rank: no plural.
    #[test]
    fn counts_of_one_read_in_the_singular() {
        let e = Error::LengthMismatch {
            what: "broadcast",
            buffer: "recv",
            expected: 1,
            got: 2,
        };
        assert_eq!(
            e.to_string(),
            "broadcast: the recv buffer must hold 1 element, it holds 2"
        );
        let e = Error::LengthMismatch {
            what: "broadcast",
            buffer: "recv",
            expected: 2,
            got: 1,
        };
        assert_eq!(
            e.to_string(),
            "broadcast: the recv buffer must hold 2 elements, it holds 1"
        );
        let e = Error::InvalidRank {
            what: "send",
            rank: 1,
            size: 1,
        };
        assert_eq!(
            e.to_string(),
            "send: rank 1 is out of range for a communicator of 1 rank"
        );
    }

    #[test]
    fn io_errors_are_equal_by_kind_and_message() {
        let e = |kind, text: &str| IoError::from(io::Error::new(kind, text.to_string()));
        let a = e(io::ErrorKind::NotFound, "gone");
        assert_eq!(a, a.clone());
        assert_eq!(a, e(io::ErrorKind::NotFound, "gone"));
        assert_ne!(a, e(io::ErrorKind::NotFound, "elsewhere"));
        assert_ne!(a, e(io::ErrorKind::PermissionDenied, "gone"));
        assert_eq!(a.to_string(), "gone");
        assert_eq!(a.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn an_io_variant_has_the_io_error_as_its_source() {
        let os = io::Error::from_raw_os_error(13);
        let text = os.to_string();
        let e = Error::Io {
            what: "reading",
            path: "/id".into(),
            source: os.into(),
        };
        let source = std::error::Error::source(&e).unwrap();
        let io = source.downcast_ref::<IoError>().unwrap();
        assert_eq!(io.get().raw_os_error(), Some(13));
        assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(e.to_string(), "reading /id failed");
        // The reason is the source, not repeated in the text (a chain prints it once).
        assert_eq!(source.to_string(), text);
        // The io::Error's own source (none here) is passed on, not invented.
        assert!(std::error::Error::source(io).is_none());
    }

    /// An IoError passes its io::Error's source on, so that a printed chain loses no link
    /// (the io::Error's text is the wrapped error's own).
    #[test]
    fn an_io_error_passes_its_source_on() {
        #[derive(Debug)]
        struct Cause;
        impl fmt::Display for Cause {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the cause")
            }
        }
        impl std::error::Error for Cause {}
        #[derive(Debug)]
        struct Wrapper(Cause);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the wrapper")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = IoError::from(io::Error::other(Wrapper(Cause)));
        assert_eq!(e.to_string(), "the wrapper");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("the cause"));
    }
}
