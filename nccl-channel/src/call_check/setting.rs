//! The checked mode's switch for a whole job: the variable [`CHECK_CALLS_ENV`].

use crate::{Error, Result};

/// The variable that turns the checked mode on for every communicator made without an
/// explicit choice: `1` on, `0` or unset off.
pub const CHECK_CALLS_ENV: &str = "NCCL_CHANNEL_CHECK_CALLS";

/// Whether [`CHECK_CALLS_ENV`] turns the checked mode on; [`Error::Env`] for a value
/// other than `0` or `1`.
pub(crate) fn from_env() -> Result<bool> {
    parse_env(std::env::var(CHECK_CALLS_ENV).ok().as_deref())
}

fn parse_env(value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(Error::Env {
            variable: CHECK_CALLS_ENV.into(),
            value: other.into(),
            problem: "must be 1 (compare each collective between the ranks before it is \
                      issued) or 0"
                .into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_variable_takes_one_or_zero() {
        assert!(!parse_env(None).unwrap());
        assert!(!parse_env(Some("0")).unwrap());
        assert!(!parse_env(Some("")).unwrap());
        assert!(parse_env(Some("1")).unwrap());
        assert!(parse_env(Some(" 1 ")).unwrap());
        for bad in ["yes", "2", "true", "DETAIL"] {
            let e = parse_env(Some(bad)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "environment variable NCCL_CHANNEL_CHECK_CALLS={bad:?}: must be 1 (compare \
                     each collective between the ranks before it is issued) or 0"
                )
            );
        }
    }
}
