//! Strict number parsing for selectors, UUIDs and PCI bus ids (and, in nccl-channel, for
//! what users and launchers write): Rust's integer `FromStr` and `from_str_radix` accept a
//! leading `+` (`cuda://GPU-+f…`), which nothing prints; these accept digits only.
//!
//! Not part of the API (hidden): public only so that nccl-channel shares `parse_decimal`.

use std::str::FromStr;

/// `text` as a `T` when it is one or more ASCII decimal digits and nothing else; `None`
/// when it is not, or does not fit.
pub fn parse_decimal<T: FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `text` as a `u32` when it is one or more ASCII hex digits (`[0-9a-fA-F]`) and nothing
/// else; `None` when it is not, or does not fit.
pub(crate) fn parse_hex(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_only() {
        assert_eq!(parse_decimal::<usize>("12"), Some(12));
        assert_eq!(parse_decimal::<usize>("007"), Some(7));
        assert_eq!(parse_hex("fF"), Some(0xff));
        for bad in ["", "+1", "-1", " 1", "1 ", "0x1"] {
            assert_eq!(parse_decimal::<usize>(bad), None, "{bad:?}");
            assert_eq!(parse_hex(bad), None, "{bad:?}");
        }
        for bad in ["2.0", "٣"] {
            assert_eq!(parse_decimal::<usize>(bad), None, "{bad:?}");
        }
        assert_eq!(parse_decimal::<u16>("65536"), None);
        assert_eq!(parse_hex("g"), None);
        assert_eq!(parse_hex("100000000"), None);
    }
}
