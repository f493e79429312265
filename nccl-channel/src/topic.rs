//! What the crate's own agreements between the ranks are about ([`Topic`]), by number and
//! in words: below the agreements (agreement/) and the checked mode (call_check/), which
//! both name them.

/// What an exchange agrees on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topic {
    /// The smallest size, in bytes, of the window each rank registers.
    WindowSize = 1,
    /// The bytes each rank allocated for a symmetric buffer (or that it could not).
    SymmetricSize = 2,
    /// Whether each rank's NCCL made the symmetric buffer's window.
    SymmetricWindow = 3,
    /// The checked mode's comparison before a window's registration (no value).
    Registration = 4,
}

impl Topic {
    const ALL: [Topic; 4] = [
        Topic::WindowSize,
        Topic::SymmetricSize,
        Topic::SymmetricWindow,
        Topic::Registration,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Topic::WindowSize => "a window's size",
            Topic::SymmetricSize => "a symmetric buffer's size",
            Topic::SymmetricWindow => "a symmetric buffer's window",
            Topic::Registration => "registering a window",
        }
    }
}

/// The name of topic number `n`.
pub(crate) fn topic_name(n: u64) -> Option<&'static str> {
    Topic::ALL
        .iter()
        .find(|t| **t as u64 == n)
        .map(|t| t.name())
}
