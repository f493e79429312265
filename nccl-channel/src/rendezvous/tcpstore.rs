//! A client of PyTorch's TCPStore, the key-value server torchrun's agent hosts at
//! `MASTER_ADDR:MASTER_PORT` when `TORCHELASTIC_USE_AGENT_STORE=True`.
//!
//! The wire format, as in `torch/csrc/distributed/c10d/TCPStore.cpp` (client),
//! `TCPStoreBackend.hpp` (query types, magic number) and `TCPStoreLibUvBackend.cpp`
//! (the default server since torch 2.4) of torch 2.5–2.8. Every request is one query-type
//! byte and its arguments; integers are in the host's byte order (both ends run on the
//! same kind of machine), a string or byte string is a `u64` length and the bytes:
//!
//! | Query | Byte | Arguments | Answer |
//! |---|---|---|---|
//! | `VALIDATE` | 0 | `u32` 0x3C85F7CE | none; must be a connection's first query (the libuv server drops anything else until then) |
//! | `SET` | 1 | key, value | none |
//! | `GET` | 3 | key | value |
//! | `CHECK` | 5 | `u64` count, keys | `u8`: 0 ready, 1 not ready |
//! | `WAIT` | 6 | `u64` count, keys | `u8` 0 (`STOP_WAITING`) once all keys exist |
//! | `PING` | 13 | `u32` nonce | the same `u32` |
//!
//! Torch's own client sends `VALIDATE` then `PING` on connecting; so does this one, and a
//! wrong or missing ping answer means something else listens there (or a torch whose store
//! predates `PING`: those are not supported, and the error says the ping went unanswered). Python's
//! `TCPStore.set("k", …)` sends the key `/k`; the keys here start with `/nccl-channel/` so
//! they never meet torch's.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::Rendezvous;
use super::net::{self, Backoff, describe, step_until};
use crate::{Result, UniqueId};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const PING: u8 = 13;
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
const READY: u8 = 0;
const STOP_WAITING: u8 = 0;
/// The largest value read back (ours are under 400 bytes).
const MAX_VALUE: u64 = 4096;
/// What rank 0 stores: `MAGIC VERSION size hex-id`.
const VALUE_MAGIC: &str = "nccl-channel-rendezvous 1";

/// One validated connection to the store.
struct Store {
    stream: TcpStream,
}

/// Appends a `u64`-length-prefixed string.
fn put_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(&(s.len() as u64).to_ne_bytes());
    buf.extend_from_slice(s);
}

/// One request: the query byte, then the key count and keys (`CHECK`, `WAIT`), then the
/// length-prefixed arguments.
fn request(query: u8, keys: Option<&[String]>, args: &[&[u8]]) -> Vec<u8> {
    let mut buf = vec![query];
    if let Some(keys) = keys {
        buf.extend_from_slice(&(keys.len() as u64).to_ne_bytes());
        for k in keys {
            put_str(&mut buf, k.as_bytes());
        }
    }
    for a in args {
        put_str(&mut buf, a);
    }
    buf
}

impl Store {
    fn send(&mut self, query: u8, args: &[&[u8]], keys: Option<&[String]>) -> io::Result<()> {
        self.stream.write_all(&request(query, keys, args))
    }

    fn read_u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.stream.read_exact(&mut b)?;
        Ok(b[0])
    }

    fn set(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        self.send(SET, &[key.as_bytes(), value], None)
    }

    fn get(&mut self, key: &str) -> io::Result<Vec<u8>> {
        self.send(GET, &[key.as_bytes()], None)?;
        let mut len = [0u8; 8];
        self.stream.read_exact(&mut len)?;
        let len = u64::from_ne_bytes(len);
        if len > MAX_VALUE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a value of {len} bytes, more than any rendezvous stores"),
            ));
        }
        let mut value = vec![0u8; len as usize];
        self.stream.read_exact(&mut value)?;
        Ok(value)
    }

    fn check(&mut self, keys: &[String]) -> io::Result<bool> {
        self.send(CHECK, &[], Some(keys))?;
        Ok(self.read_u8()? == READY)
    }

    /// `Ok(false)`: the keys did not all appear before `deadline`; the connection is then
    /// left with a wait pending and must be dropped.
    fn wait(&mut self, keys: &[String], deadline: Instant) -> io::Result<bool> {
        self.send(WAIT, &[], Some(keys))?;
        loop {
            self.stream.set_read_timeout(Some(step_until(deadline)))?;
            match self.read_u8() {
                Ok(STOP_WAITING) => return Ok(true),
                Ok(other) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("answered a wait with {other} instead of 0 (stop waiting)"),
                    ));
                }
                Err(e) if net::timed_out(&e) && Instant::now() < deadline => {}
                Err(e) if net::timed_out(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }
}

/// Connects, validates and pings, retrying until the deadline; the error text says what
/// the last attempt met.
fn connect(rdv: &Rendezvous, deadline: Instant) -> Result<Store> {
    let mut backoff = Backoff::new();
    loop {
        let last = match try_connect(rdv, deadline) {
            Ok(store) => return Ok(store),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(rdv.error(format!(
                "did not answer within {:?} (last attempt: {last})",
                rdv.timeout
            )));
        }
        backoff.sleep(deadline);
    }
}

fn try_connect(rdv: &Rendezvous, deadline: Instant) -> Result<Store, String> {
    let stream =
        net::connect(&rdv.host, rdv.port, step_until(deadline)).map_err(|e| e.to_string())?;
    let mut store = Store { stream };
    let nonce = std::process::id();
    let mut hello = vec![VALIDATE];
    hello.extend_from_slice(&VALIDATION_MAGIC.to_ne_bytes());
    hello.push(PING);
    hello.extend_from_slice(&nonce.to_ne_bytes());
    store
        .stream
        .write_all(&hello)
        .map_err(|e| format!("sending the validation: {e}"))?;
    let mut answer = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match store.stream.read(&mut answer[got..]) {
            Ok(0) => {
                return Err(format!(
                    "something accepted the connection but closed it on a TCPStore ping{}",
                    if got > 0 {
                        format!(" after {}", describe(&answer[..got]))
                    } else {
                        String::new()
                    }
                ));
            }
            Ok(n) => got += n,
            Err(e) if net::timed_out(&e) => {
                return Err("something accepted the connection but did not answer a TCPStore ping (a torch older than 2.4, or not a TCPStore)".into());
            }
            Err(e) => return Err(format!("pinging: {e}")),
        }
    }
    if u32::from_ne_bytes(answer) != nonce {
        return Err(format!(
            "something answered a TCPStore ping with {} instead of the nonce: not a TCPStore",
            describe(&answer)
        ));
    }
    Ok(store)
}

fn store_key(key: &str) -> String {
    format!("/nccl-channel/{key}")
}

fn ack_keys(key: &str, size: usize) -> Vec<String> {
    (1..size)
        .map(|r| format!("{}/ack/{r}", store_key(key)))
        .collect()
}

/// Rank 0: stores the id, then waits until every other rank acknowledged it.
pub(super) fn publish(
    rdv: &Rendezvous,
    key: &str,
    size: usize,
    make: impl FnOnce() -> Result<UniqueId>,
) -> Result<UniqueId> {
    let deadline = Instant::now() + rdv.timeout;
    let mut store = connect(rdv, deadline)?;
    let id = make()?;
    let value = format!("{VALUE_MAGIC} {size} {id}");
    store
        .set(&store_key(key), value.as_bytes())
        .map_err(|e| rdv.error(format!("failed storing the id: {e}")))?;
    let acks = ack_keys(key, size);
    let all = store
        .wait(&acks, deadline)
        .map_err(|e| rdv.error(format!("failed waiting for the ranks: {e}")))?;
    if all {
        return Ok(id);
    }
    // The pending wait spoils this connection; ask on a fresh one who is missing.
    let mut fresh = connect(rdv, Instant::now() + Duration::from_secs(5))?;
    let mut missing = Vec::new();
    for (r, k) in (1..size).zip(&acks) {
        if !fresh.check(std::slice::from_ref(k)).unwrap_or(false) {
            missing.push(r.to_string());
        }
    }
    Err(rdv.error(format!(
        "did not see rank{} {} take the id (key {}) within {:?}",
        if missing.len() == 1 { "" } else { "s" },
        missing.join(", "),
        store_key(key),
        rdv.timeout
    )))
}

/// Ranks other than 0: wait for the id, read it, acknowledge it.
pub(super) fn fetch(rdv: &Rendezvous, key: &str, rank: usize, size: usize) -> Result<UniqueId> {
    let deadline = Instant::now() + rdv.timeout;
    let mut store = connect(rdv, deadline)?;
    let skey = store_key(key);
    let there = store
        .wait(std::slice::from_ref(&skey), deadline)
        .map_err(|e| rdv.error(format!("failed waiting for key {skey}: {e}")))?;
    if !there {
        return Err(rdv.error(format!(
            "did not get the id from rank 0 (key {skey}) within {:?}",
            rdv.timeout
        )));
    }
    store
        .stream
        .set_read_timeout(Some(step_until(deadline)))
        .ok();
    let value = store
        .get(&skey)
        .map_err(|e| rdv.error(format!("failed reading key {skey}: {e}")))?;
    let id =
        parse_value(&value, size).map_err(|p| rdv.error(format!("holds under key {skey} {p}")))?;
    store
        .set(&ack_keys(key, size)[rank - 1], b"1")
        .map_err(|e| rdv.error(format!("failed acknowledging the id: {e}")))?;
    Ok(id)
}

/// Rank 0's value: checks the format and the world size.
fn parse_value(value: &[u8], size: usize) -> Result<UniqueId, String> {
    let bad = || {
        format!(
            "something that is not a rendezvous value: {}",
            describe(value)
        )
    };
    let text = std::str::from_utf8(value).map_err(|_| bad())?;
    let rest = text.strip_prefix(VALUE_MAGIC).ok_or_else(bad)?;
    let mut words = rest.split_whitespace();
    let (Some(n), Some(hex), None) = (words.next(), words.next(), words.next()) else {
        return Err(bad());
    };
    let n: usize = n.parse().map_err(|_| bad())?;
    if n != size {
        return Err(format!(
            "an id for a world of {n} ranks, but this rank's world has {size}; every rank must \
             see the same world size"
        ));
    }
    hex.parse().map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_torchs_bytes() {
        // SET "/k" = "v": type 1, u64 2, "/k", u64 1, "v" (little-endian hosts).
        let set = request(SET, None, &[b"/k", b"v"]);
        let mut want = vec![1u8];
        want.extend_from_slice(&2u64.to_ne_bytes());
        want.extend_from_slice(b"/k");
        want.extend_from_slice(&1u64.to_ne_bytes());
        want.extend_from_slice(b"v");
        assert_eq!(set, want);
        // WAIT ["/a", "/bc"]: type 6, u64 count 2, then each key.
        let keys = ["/a".to_string(), "/bc".to_string()];
        let wait = request(WAIT, Some(&keys), &[]);
        let mut want = vec![6u8];
        want.extend_from_slice(&2u64.to_ne_bytes());
        want.extend_from_slice(&2u64.to_ne_bytes());
        want.extend_from_slice(b"/a");
        want.extend_from_slice(&3u64.to_ne_bytes());
        want.extend_from_slice(b"/bc");
        assert_eq!(wait, want);
        assert_eq!((VALIDATE, GET, CHECK, PING), (0, 3, 5, 13));
        if cfg!(target_endian = "little") {
            assert_eq!(VALIDATION_MAGIC.to_ne_bytes(), [0xce, 0xf7, 0x85, 0x3c]);
        }
    }

    #[test]
    fn values_are_checked() {
        let id = UniqueId([0x42; 128]);
        let v = format!("{VALUE_MAGIC} 3 {id}");
        assert_eq!(parse_value(v.as_bytes(), 3), Ok(id));
        assert!(
            parse_value(v.as_bytes(), 4)
                .unwrap_err()
                .contains("world of 3 ranks")
        );
        for bad in [
            &b""[..],
            b"nccl-channel-rendezvous 1 3",
            b"\xff",
            b"nccl-channel-rendezvous 1 x 00",
        ] {
            assert!(
                parse_value(bad, 3)
                    .unwrap_err()
                    .contains("not a rendezvous value"),
                "{bad:?}"
            );
        }
    }
}
