//! The `host:port` that users and launchers write for a rendezvous, read strictly: NCCL
//! reads `NCCL_COMM_ID` up to the first colon as the host, so an address that NCCL would
//! read otherwise is refused here too (it imports only decimal.rs).

/// `host:port` or `[v6]:port` with a port from 1 to 65535 in decimal digits; the error
/// says what is wrong. A bare IPv6 address is refused: NCCL (`NCCL_COMM_ID`) reads up to
/// the first colon as the host, so `a:b:c:8000` would not mean to NCCL what it means here.
pub(crate) fn parse_host_port(text: &str) -> Result<(String, u16), String> {
    let text = text.trim();
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("there is no `:port`".into());
    };
    let host = match host.strip_prefix('[') {
        Some(inner) => inner
            .strip_suffix(']')
            .and_then(|h| h.parse::<std::net::Ipv6Addr>().ok())
            .ok_or_else(|| format!("{host:?} is not an IPv6 address in brackets"))?
            .to_string(),
        None if host.contains(':') => {
            return Err(format!(
                "the host {host:?} has colons: NCCL reads up to the first colon as the host, \
                 so an IPv6 address must be in brackets ([addr]:port)"
            ));
        }
        None if host.contains(['[', ']']) => {
            return Err(format!("the host {host:?} has unbalanced brackets"));
        }
        None => host.to_string(),
    };
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    let port = crate::decimal::parse_port(port).ok_or_else(|| {
        format!("the port {port:?} is not a number from 1 to 65535 in decimal digits")
    })?;
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_and_a_port_in_decimal_digits() {
        assert_eq!(parse_host_port("node1:29500"), Ok(("node1".into(), 29500)));
        assert_eq!(parse_host_port("[::1]:1"), Ok(("::1".into(), 1)));
        for bad in [
            "node1",
            "node1:+80",
            "a:b:80",
            "[fe80::1%eth0]:29500",
            ":80",
            "node]1:80",
        ] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }
}
