//! Strict parsing (and writing) of the numbers and hex digits that users, launchers and
//! the rendezvous's peers write: Rust's `FromStr` for integers and `from_str_radix`
//! accept a leading `+`, which no launcher writes and NCCL reads differently; these accept
//! ASCII digits only.

// `text` as a `T` when it is one or more ASCII decimal digits and nothing else (no sign,
// no spaces); `None` when it is not, or does not fit: cuda-hal's, so both parse one way.
pub(crate) use cuda_hal::digits::parse_decimal;

/// A TCP port: plain decimal digits, from 1 to 65535.
pub(crate) fn parse_port(text: &str) -> Option<u16> {
    parse_decimal::<u16>(text).filter(|p| *p > 0)
}

/// A number of seconds written as decimal digits with at most one `.` (`30`, `0.5`):
/// no sign, exponent, spaces, `inf` or `NaN`.
pub(crate) fn parse_seconds(text: &str) -> Option<f64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !digits(whole) || !digits(fraction) {
        return None;
    }
    text.parse().ok()
}

/// The byte two ASCII hex digits (`[0-9a-fA-F]`, any case) spell.
pub(crate) fn hex_byte(pair: [u8; 2]) -> Option<u8> {
    let digit = |d: u8| (d as char).to_digit(16);
    Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8)
}

/// `bytes` as lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digits() {
        assert_eq!(parse_port("0"), None);
        assert_eq!(parse_port("1"), Some(1));
        assert_eq!(parse_port("65535"), Some(65535));
        assert_eq!(parse_port("65536"), None);
        assert_eq!(parse_port("+80"), None);
        assert_eq!(parse_seconds("0.5"), Some(0.5));
        assert_eq!(parse_seconds("30"), Some(30.0));
        assert_eq!(parse_seconds(".5"), Some(0.5));
        for bad in ["", ".", "+1", "-1", "1e3", "inf", "NaN", " 1", "1.2.3"] {
            assert_eq!(parse_seconds(bad), None, "{bad:?}");
        }
        assert_eq!(hex_byte(*b"fF"), Some(0xff));
        assert_eq!(hex_byte(*b"+f"), None);
        assert_eq!(hex_byte(*b"-0"), None);
        assert_eq!(hex_byte(*b"g0"), None);
    }

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        let b = [0u8, 0x7f, 0xff, 0x10];
        assert_eq!(hex(&b), "007fff10");
    }
}
