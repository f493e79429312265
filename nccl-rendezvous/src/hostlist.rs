//! The first host of a Slurm host list (`SLURM_JOB_NODELIST` and friends), where task 0
//! of a step runs.
//!
//! Slurm compresses lists as `prefix[ranges]suffix…`, comma-separated at the top level:
//! `gpu[01-04,07],login1`, `rack[1-2]-n[3-4]`. Only the first host is needed: the
//! first item, with each bracket group replaced by the start of its first range, written
//! as Slurm wrote it (zero padding kept).

/// The first host of `list`, or `None` when the list is empty or malformed (an unclosed or
/// nested bracket, a range that does not start with a digit).
pub(crate) fn first_host(list: &str) -> Option<String> {
    let item = first_item(list.trim())?;
    let mut host = String::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find(']')?;
        let group = &after[..close];
        if group.contains('[') {
            return None;
        }
        let first_range = group.split(',').next()?.trim();
        let start = first_range.split('-').next()?.trim();
        if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        host.push_str(start);
        rest = &after[close + 1..];
    }
    if rest.contains(']') {
        return None;
    }
    host.push_str(rest);
    let host = host.trim();
    (!host.is_empty()).then(|| host.to_string())
}

/// The text before the first comma outside brackets.
fn first_item(list: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => return Some(&list[..i]),
            _ => {}
        }
    }
    Some(list)
}

#[cfg(test)]
mod tests {
    use super::first_host;

    #[test]
    fn first_hosts_of_slurm_lists() {
        let table: &[(&str, Option<&str>)] = &[
            ("node1", Some("node1")),
            ("localhost", Some("localhost")),
            ("127.0.0.1", Some("127.0.0.1")),
            ("node7,node3", Some("node7")),
            (" node1 ", Some("node1")),
            ("gpu[01-04,07],login1", Some("gpu01")),
            ("gpu[007-010]", Some("gpu007")),
            ("gpu[5,1-3]", Some("gpu5")),
            ("rack[1-2]-n[3-4]", Some("rack1-n3")),
            ("rack[01-02]-n[003,9]-ib", Some("rack01-n003-ib")),
            ("[3-4]x", Some("3x")),
            ("login1,gpu[01-02]", Some("login1")),
            ("a[1-2],b[3-4]", Some("a1")),
            ("", None),
            ("   ", None),
            ("gpu[01-04", None),
            ("gpu01-04]", None),
            ("gpu[]", None),
            ("gpu[a-b]", None),
            ("gpu[[1]]", None),
            (",node1", None),
        ];
        for (list, want) in table {
            assert_eq!(first_host(list).as_deref(), *want, "{list:?}");
        }
    }
}
