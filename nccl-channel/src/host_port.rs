//! The `host:port` that users and launchers write (`NCCL_COMM_ID`, rendezvous
//! addresses), checked as NCCL and this crate's rendezvous read it. Below both of its
//! users, the rendezvous and the unique id (it imports only decimal.rs).

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

/// `NCCL_COMM_ID`'s syntax, as [`parse_host_port`] checks it, with the problem to report.
/// NCCL also takes a link-local IPv6 address with its interface, `[fe80::1%eth0]:port`
/// (an interface name of 1 to 15 bytes, `IFNAMSIZ`): the address is checked without it.
pub(crate) fn check_host_port(text: &str) -> Result<(), String> {
    let unzoned = match (text.strip_prefix('['), text.find('%'), text.find(']')) {
        (Some(_), Some(pct), Some(close))
            if 1 < pct
                && pct + 1 < close
                && close - pct - 1 < 16
                && text[pct + 1..close].bytes().all(|b| b.is_ascii_graphic()) =>
        {
            format!("{}{}", &text[..pct], &text[close..])
        }
        _ => text.to_string(),
    };
    parse_host_port(&unzoned)
        .map(drop)
        .map_err(|detail| format!("expected host:port with a port from 1 to 65535: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL reads `[addr%ifname]:port` in `NCCL_COMM_ID` as a link-local IPv6 address on
    /// that interface (`ncclSocketGetAddrFromString`); it was taken before digits-only
    /// checks, and must still be.
    #[test]
    fn a_comm_id_may_name_a_link_local_ipv6_address_with_its_interface() {
        for ok in [
            "[fe80::1%eth0]:29500",
            "[fe80::1%enp129s0f1np1]:29500",
            // IFNAMSIZ is 16 with the NUL: 15 bytes at most.
            "[fe80::1%abcdefghijklmno]:29500",
            "[fe80::1]:29500",
            "host:1",
        ] {
            assert_eq!(check_host_port(ok), Ok(()), "{ok}");
        }
        for (bad, detail) in [
            (
                "[fe80::1%]:29500",
                "\"[fe80::1%]\" is not an IPv6 address in brackets",
            ),
            (
                "[fe80::1%an-interface-name]:29500",
                "\"[fe80::1%an-interface-name]\" is not an IPv6 address in brackets",
            ),
            (
                "[fe80::1%abcdefghijklmnop]:29500",
                "\"[fe80::1%abcdefghijklmnop]\" is not an IPv6 address in brackets",
            ),
            (
                "[%eth0]:29500",
                "\"[%eth0]\" is not an IPv6 address in brackets",
            ),
            // Not ASCII before the '%' (the interface is cut at the '%', not a byte before).
            (
                "[fe80::é%eth0]:29500",
                "\"[fe80::é]\" is not an IPv6 address in brackets",
            ),
            (
                "[fe80::1%eth0]:+80",
                "the port \"+80\" is not a number from 1 to 65535 in decimal digits",
            ),
            (
                "node]1:29500",
                "the host \"node]1\" has unbalanced brackets",
            ),
            (
                "node[1:29500",
                "the host \"node[1\" has unbalanced brackets",
            ),
        ] {
            assert_eq!(
                check_host_port(bad),
                Err(format!(
                    "expected host:port with a port from 1 to 65535: {detail}"
                )),
                "{bad}"
            );
        }
        // Our own rendezvous connects with Rust's sockets, which take no interface name.
        assert!(parse_host_port("[fe80::1%eth0]:29500").is_err());
    }
}
