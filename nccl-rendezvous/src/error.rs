//! The error type. Its variants are the ones a program that agrees on an id must tell
//! apart: a malformed setting (`Env`, `InvalidArgument`, `InvalidRank`), a file it could
//! not read (`Io`), a rendezvous that failed (`Rendezvous`) and one whose secret refused
//! the exchange (`RendezvousRefused`); nccl-channel maps each onto its own variant of the
//! same name and fields.

use std::fmt;
use std::io;
use std::sync::Arc;

/// What can go wrong while ranks agree on an id.
///
/// ```
/// use nccl_rendezvous::{Error, Rendezvous};
/// let e = Rendezvous::tcp("no-port").unwrap_err();
/// assert!(matches!(e, Error::InvalidArgument { what: "Rendezvous address", .. }));
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// An argument is out of its range.
    #[error("{what}: {problem}")]
    InvalidArgument {
        /// The function or setting.
        what: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A rank outside `0..size`.
    #[error("{what}: rank {rank} is out of range for a world of {size} rank{}", if *size == 1 { "" } else { "s" })]
    InvalidRank {
        /// The operation.
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// The world size given.
        size: usize,
    },
    /// A file could not be read (the secret file).
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
    /// Rank 0 could not hand its id to the other ranks: nothing answered before the
    /// deadline, something else answered, the ranks disagree on the world size, or rank 0
    /// could not listen. The message names the address and the variables it was derived
    /// from, so a launcher's setting can be checked at a glance.
    #[error("{service} at {address} (derived from {derived_from}) {problem}")]
    Rendezvous {
        /// Who serves the id there: `"rank 0's rendezvous"` or `"torchrun's TCPStore"`.
        service: &'static str,
        /// `host:port`.
        address: String,
        /// The environment variables (or `"code"`) the address came from.
        derived_from: String,
        /// What went wrong. When one operating-system error caused it, that error is the
        /// [`source`](std::error::Error::source), not part of this text.
        problem: String,
        /// The operating system's error, when one alone made the exchange fail.
        #[source]
        source: Option<IoError>,
    },
    /// The rendezvous's secret refused the exchange: rank 0 has a secret and this rank has
    /// none, or the two sides hold different secrets, or what answered could not prove it
    /// knows the secret (an impostor, a replayed or spliced exchange). Nothing of the id
    /// was handed over. A rank without a secret meets it at once when rank 0 says it wants
    /// one; a rank holding a secret believes only proven answers, so it meets it at its
    /// deadline.
    #[error("{service} at {address} (derived from {derived_from}) {problem}")]
    RendezvousRefused {
        /// Who serves the id there.
        service: &'static str,
        /// `host:port`.
        address: String,
        /// The environment variables (or `"code"`) the address came from.
        derived_from: String,
        /// What was refused, and why.
        problem: String,
    },
}

/// The crate's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An [`io::Error`] shared, so that [`Error`] stays `Clone`, and equal to another when
/// their kinds and messages are (`io::Error` has no `PartialEq`).
#[derive(Debug, Clone)]
pub struct IoError(Arc<io::Error>);

impl IoError {
    /// The error itself.
    #[must_use]
    pub fn get(&self) -> &io::Error {
        &self.0
    }

    /// The shared error (for another crate's error type that shares it too).
    #[must_use]
    pub fn shared(&self) -> Arc<io::Error> {
        Arc::clone(&self.0)
    }

    /// Its kind.
    #[must_use]
    pub fn kind(&self) -> io::ErrorKind {
        self.0.kind()
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
