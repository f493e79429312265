//! NCCL version codes (`ncclGetVersion`, `NCCL_VERSION(X,Y,Z)`).

use std::fmt;

/// An NCCL version as `ncclGetVersion` reports it (`22803` is 2.28.3, `23203` is 2.32.3).
///
/// The code changed its encoding after 2.8; [`new`](Self::new) and
/// [`parts`](Self::parts) follow both, and versions compare as releases:
///
/// ```
/// use nccl_sys::NcclVersion;
/// let v = NcclVersion::new(2, 28, 3);
/// assert_eq!(v, NcclVersion(22803));
/// assert_eq!(NcclVersion::new(2, 8, 4), NcclVersion(2804));
/// assert_eq!(NcclVersion(2804).parts(), (2, 8, 4));
/// assert_eq!(v.to_string(), "2.28.3");
/// assert!(v >= NcclVersion::MINIMUM && NcclVersion::MINIMUM.to_string() == "2.18.0");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion(pub i32);

impl NcclVersion {
    /// The oldest NCCL this crate loads: 2.18.0.
    ///
    /// From 2.17 every `ncclConfig_t` field has an "undefined" default, so one struct
    /// layout works across versions; 2.18 adds `ncclCommSplit`. Everything a communicator's
    /// life needs (config init, non-blocking mode, finalize, abort, async errors, split,
    /// send/recv, pre-multiplied sums) is then a required symbol.
    pub const MINIMUM: NcclVersion = NcclVersion::new(2, 18, 0);

    /// The `NCCL_VERSION(X,Y,Z)` macro: `X*1000+Y*100+Z` up to 2.8, `X*10000+Y*100+Z` after.
    pub const fn new(major: i32, minor: i32, patch: i32) -> NcclVersion {
        if major <= 2 && minor <= 8 {
            NcclVersion(major * 1000 + minor * 100 + patch)
        } else {
            NcclVersion(major * 10000 + minor * 100 + patch)
        }
    }

    /// `(major, minor, patch)`, decoding either encoding.
    pub const fn parts(self) -> (i32, i32, i32) {
        let c = self.0;
        if c < 10000 {
            (c / 1000, (c % 1000) / 100, c % 100)
        } else {
            (c / 10000, (c % 10000) / 100, c % 100)
        }
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.parts();
        write!(f, "{a}.{b}.{c}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_across_the_encoding_change() {
        assert_eq!(NcclVersion::new(2, 8, 4).0, 2804);
        assert_eq!(NcclVersion::new(2, 28, 9).0, 22809);
        assert_eq!(NcclVersion(2804).to_string(), "2.8.4");
        assert_eq!(NcclVersion(22809).to_string(), "2.28.9");
        assert_eq!(NcclVersion::MINIMUM.to_string(), "2.18.0");
        assert!(NcclVersion::new(2, 9, 0) > NcclVersion::new(2, 8, 9));
    }

    #[test]
    fn the_two_encodings_meet_at_10000() {
        // Below 10000: major * 1000 + minor * 100 + patch; from 10000: major * 10000 + ...
        assert_eq!(NcclVersion(9999).parts(), (9, 9, 99));
        assert_eq!(NcclVersion(10000).parts(), (1, 0, 0));
        assert_eq!(NcclVersion(10001).parts(), (1, 0, 1));
    }
}
