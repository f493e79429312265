//! Command-line values the programs share, parsed as strictly as the library parses the
//! launchers' variables (so that `--nprocs +2` is refused the way `WORLD_SIZE=+2` is).

use std::time::Duration;

/// `text` as a `T` when it is one or more ASCII decimal digits and nothing else: the
/// integer `FromStr` of Rust also takes a leading `+`, which the programs refuse (as the
/// library refuses it in the launcher's variables).
pub fn parse_decimal<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A count of at least 1 (`--nprocs`, `--count`), for clap's `value_parser`.
pub fn positive(s: &str) -> Result<usize, String> {
    match parse_decimal::<usize>(s) {
        Some(0) => Err("must be at least 1".into()),
        Some(n) => Ok(n),
        None => Err(format!("expects a number, not {s:?}")),
    }
}

/// A positive, finite number of seconds (`--timeout`), for clap's `value_parser`.
pub fn seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}
