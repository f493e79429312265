//! The sizes of the sweep: `-b`, `-e` (bytes with K, M, G) and the factor `-f` between them.

/// `-b` and `-e`: a positive number of bytes, suffix K, M or G (powers of 1024).
pub(crate) fn size_arg(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    nccl_launch::parse_decimal::<usize>(num)
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad size {s:?} (a positive number of bytes, suffix K, M or G)"))
}

/// The sizes of the sweep, smallest first: `min` (`-b`), times `factor` (`-f`) while at
/// most `max` (`-e`).
pub(crate) fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut bytes = min;
    while bytes <= max {
        v.push(bytes);
        match bytes.checked_mul(factor) {
            Some(b) => bytes = b,
            None => break,
        }
    }
    v
}
