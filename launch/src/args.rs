//! Command-line values the programs share, parsed as strictly as the library parses the
//! launchers' variables (so that `--nprocs +2` is refused the way `WORLD_SIZE=+2` is).

use std::time::Duration;

/// `text` as a `T` when it is one or more ASCII decimal digits and nothing else: the
/// integer `FromStr` of Rust also takes a leading `+`, which the programs refuse (as the
/// library refuses it in the launcher's variables). The library's own parser, not a copy.
pub use cuda_hal::digits::parse_decimal;

/// A count of at least 1 (`--nprocs`, `--count`), for clap's `value_parser`.
pub fn positive(s: &str) -> Result<usize, String> {
    match parse_decimal::<usize>(s) {
        Some(0) => Err("must be at least 1".into()),
        Some(n) => Ok(n),
        None => Err(format!("expects a number, not {s:?}")),
    }
}

/// The longest `--timeout`: a year (what NCCL's own configuration accepts, see
/// `nccl_channel::CommConfig::MAX_TIMEOUT`), so that no deadline overflows.
pub(crate) const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// A positive, finite number of seconds (`--timeout`), at most a year, for clap's
/// `value_parser`.
pub fn seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_SECONDS => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{s:?} is not a positive number of seconds up to {MAX_SECONDS} (a year)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_positive_and_at_most_a_year() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds("31536000"), Ok(Duration::from_secs(31_536_000)));
        for bad in ["31536001", "1e20", "1e19", "0", "-1", "inf", "nan", "x"] {
            assert_eq!(
                seconds(bad),
                Err(format!(
                    "{bad:?} is not a positive number of seconds up to 31536000 (a year)"
                ))
            );
        }
    }
}
