//! Loading errors: no panic and no process exit anywhere in loading; every failure ends here.

use crate::attempt::{Attempt, Attempts, Reason};

/// Why a library (libcuda, libnccl) or a resolver could not give a usable function table.
///
/// A search that found nothing usable is [`NotFound`](Self::NotFound), with every
/// candidate; a source the caller named is [`Unusable`](Self::Unusable), with its reason.
/// Too old a driver, for instance:
///
/// ```
/// use cuda_sys::LoadError;
/// use cuda_sys::dylib::Reason;
/// use cuda_mock::MockDriver;
///
/// let err = MockDriver::with_devices(1).version(11080).build().unwrap_err();
/// let LoadError::Unusable { library, origin, reason } = &err else {
///     panic!("a named source is never searched: {err}");
/// };
/// assert_eq!((*library, origin.as_str()), ("CUDA driver", "mock driver"));
/// assert_eq!(
///     *reason,
///     Reason::TooOld { found: "11.8".into(), minimum: "12.0".into() }
/// );
/// assert!(err.attempts().is_empty());
/// assert_eq!(
///     err.to_string(),
///     "CUDA driver from mock driver cannot be used: \
///      version 11.8 is older than the minimum supported 12.0"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The search found no usable library; every candidate with its reason.
    #[error("no usable {library} library was found; tried:{attempts}")]
    NotFound {
        /// What was looked for ("CUDA driver", "NCCL").
        library: &'static str,
        /// Each path tried, in order, with why it was rejected.
        attempts: Attempts,
    },
    /// One named source (an explicit path, an environment override, a resolver) was
    /// rejected; no other source was tried, because the caller asked for this one.
    #[error("{library} from {origin} cannot be used: {reason}")]
    Unusable {
        /// What was looked for.
        library: &'static str,
        /// The path and how it was chosen, or the resolver's name.
        origin: String,
        /// Why it was rejected.
        reason: Reason,
    },
}

impl LoadError {
    /// The attempts of a failed search; empty for a named source, whose rejection is
    /// [`LoadError::reason`].
    pub fn attempts(&self) -> Vec<Attempt> {
        match self {
            LoadError::NotFound { attempts, .. } => attempts.0.clone(),
            LoadError::Unusable { .. } => Vec::new(),
        }
    }

    /// The reason a named source was rejected.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            LoadError::Unusable { reason, .. } => Some(reason),
            LoadError::NotFound { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::Step;

    #[test]
    fn attempts_and_reason_each_answer_for_their_variant() {
        let tried = Attempt {
            path: "/x/libcuda.so.1".into(),
            step: Step::SystemDir,
            reason: Reason::NoSuchFile,
        };
        let search = LoadError::NotFound {
            library: "CUDA driver",
            attempts: Attempts(vec![tried.clone()]),
        };
        assert_eq!(search.attempts(), vec![tried]);
        assert_eq!(search.reason(), None);
        let named = LoadError::Unusable {
            library: "CUDA driver",
            origin: "/y (explicit path)".into(),
            reason: Reason::NoSuchFile,
        };
        assert!(named.attempts().is_empty());
        assert_eq!(named.reason(), Some(&Reason::NoSuchFile));
    }
}
