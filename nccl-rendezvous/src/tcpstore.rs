//! A client of PyTorch's TCPStore, the key-value server torchrun's agent hosts at
//! `MASTER_ADDR:MASTER_PORT` when `TORCHELASTIC_USE_AGENT_STORE=True`.
//!
//! The wire format, as in `torch/csrc/distributed/c10d/TCPStore.cpp` (client),
//! `TCPStoreBackend.hpp` (query types, magic number), `TCPStoreBackend.cpp` (the legacy
//! server) and `TCPStoreLibUvBackend.cpp` (the default server since torch 2.4). Every
//! request is one query-type byte and its arguments; integers are in the host's byte order
//! (both ends run on the same kind of machine), a string or byte string is a `u64` length
//! and the bytes:
//!
//! | Query | Byte | Arguments | Answer |
//! |---|---|---|---|
//! | `VALIDATE` | 0 | `u32` 0x3C85F7CE | none; must be a connection's first query (the libuv server drops anything else until then) |
//! | `SET` | 1 | key, value | none |
//! | `GET` | 3 | key | value |
//! | `CHECK` | 5 | `u64` count, keys | `u8`: 0 ready, 1 not ready |
//! | `WAIT` | 6 | `u64` count, keys | `u8` 0 (`STOP_WAITING`) once all keys exist |
//! | `DELETE_KEY` | 8 | key | `i64`: how many keys were removed (0 or 1) |
//!
//! Only queries every server since torch 2.4 answers are used: torch 2.5 added `PING` (13),
//! which torch's own client sends after `VALIDATE`, but the servers of torch 2.4 and older
//! close the connection on a query they do not know. A connection is validated with
//! `VALIDATE` and a `CHECK` of a key that is never set instead: a TCPStore answers exactly
//! one byte, 1 (not ready), and nothing more. An echo server answers 0 (`VALIDATE`'s own
//! byte), and most other servers something that is not 1, or more bytes. Checked against the real servers of torch 2.4.1 and
//! 2.5.1, libuv and legacy (`tests/suite/torch_store_real.rs`, which checks any other release
//! with `TORCH_PY`); from 2.4 to 2.5 the query types were only appended to. The keys here
//! start with `/nccl-channel/`, apart from those of torch and torchrun.
//!
//! Every answer is read before a deadline (the socket's read timeout is set to the time
//! left, at most [`STEP`](crate::net::STEP), before every read), so a store that trickles
//! its answers cannot keep a rank past its deadline.
//!
//! The exchange: rank 0 removes whatever an earlier exchange under the same key left (its
//! id, its acknowledgements), then `SET`s `/nccl-channel/<key>` to a value carrying the id
//! and a nonce of its own, and `WAIT`s for `<that>/ack/1` .. `/ack/<size-1>`; every other
//! rank `WAIT`s for the id, `GET`s it, checks it is well-formed and for its world size, and
//! `SET`s its ack to the nonce it read. Rank 0 `GET`s every ack and counts only those with
//! its nonce: an ack with another one was written by a rank of an earlier exchange (after
//! rank 0 removed the old ones), and rank 0 reads it again until the rank of this exchange
//! overwrites it.
//!
//! The agent store outlives the worker processes of one torchrun attempt, so rank 0
//! deletes the id and the acknowledgements once every rank took the id (a failed deletion
//! then is a warning on stderr, not an error: the other ranks have gone on to
//! `ncclCommInitRank`), and deletes the id, best-effort, when it fails: a second program
//! run by the same workers (same run id and restart count, so the same key) waits for its
//! own rank 0 instead of reading a stale id.
//!
//! When its `WAIT` runs out (or fails), rank 0 asks on a fresh connection which acks are
//! missing; if none is (the last came just then), the exchange succeeds. This look and the
//! clean-up take at most [`AFTER`] past the deadline.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::decimal::parse_decimal;
use crate::decimal::{hex, unhex};
use crate::net::{self, STEP, describe, step_until, time_for_attempt};
use crate::point::Rendezvous;
use crate::proof::{self, Keys, NONCE_LEN, Role, SEALED_LEN};
use crate::secret::SECRET_FILE_ENV;
use crate::{Id, Result};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const DELETE_KEY: u8 = 8;
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
const READY: u8 = 0;
const NOT_READY: u8 = 1;
const STOP_WAITING: u8 = 0;
/// The largest value read back (ours are under 400 bytes).
const MAX_VALUE: u64 = 4096;
/// What rank 0 stores: `MAGIC VERSION size nonce hex-id` (version 1 had no nonce).
const VALUE_MAGIC: &str = "nccl-channel-rendezvous 2";
/// What rank 0 stores with a secret: `MAGIC size nonce sealed-id`, the nonce 64 hex
/// digits, the id sealed over the key, the size and the nonce (288 hex digits).
const SEALED_MAGIC: &str = "nccl-channel-rendezvous sealed";
/// The most rank 0 spends past its deadline: removing the id and the acks, or asking the
/// store on a fresh connection which ranks did not acknowledge the id.
pub(crate) const AFTER: Duration = Duration::from_secs(1);
/// How many requests go out before their answers are read.
const BATCH: usize = 256;

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

    /// One byte, read before `deadline`.
    fn read_u8(&mut self, deadline: Instant) -> io::Result<u8> {
        let mut b = [0u8; 1];
        net::read_exact(&self.stream, &mut b, deadline)?;
        Ok(b[0])
    }

    fn set(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        self.send(SET, &[key.as_bytes(), value], None)
    }

    fn get(&mut self, key: &str, deadline: Instant) -> io::Result<Vec<u8>> {
        self.send(GET, &[key.as_bytes()], None)?;
        self.read_value(deadline)
    }

    /// The values of `keys` (which must all exist: torch's legacy server drops the
    /// connection on a `GET` of a missing key), asked in batches.
    fn get_many(&mut self, keys: &[String], deadline: Instant) -> io::Result<Vec<Vec<u8>>> {
        let mut values = Vec::with_capacity(keys.len());
        for batch in keys.chunks(BATCH) {
            let mut buf = Vec::new();
            for k in batch {
                buf.extend_from_slice(&request(GET, None, &[k.as_bytes()]));
            }
            self.stream.write_all(&buf)?;
            for _ in batch {
                values.push(self.read_value(deadline)?);
            }
        }
        Ok(values)
    }

    /// A `GET`'s answer: a `u64` length and the bytes.
    fn read_value(&mut self, deadline: Instant) -> io::Result<Vec<u8>> {
        let mut len = [0u8; 8];
        net::read_exact(&self.stream, &mut len, deadline)?;
        let len = u64::from_ne_bytes(len);
        if len > MAX_VALUE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a value of {len} bytes, more than any rendezvous stores"),
            ));
        }
        let mut value = vec![0u8; len as usize];
        net::read_exact(&self.stream, &mut value, deadline)?;
        Ok(value)
    }

    fn check(&mut self, keys: &[String], deadline: Instant) -> io::Result<bool> {
        self.send(CHECK, &[], Some(keys))?;
        match self.read_u8(deadline)? {
            READY => Ok(true),
            NOT_READY => Ok(false),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("answered a check with {other} instead of 0 or 1"),
            )),
        }
    }

    /// Removes `keys`, each with its own `DELETE_KEY` (sent in batches, then the answers
    /// read), before `deadline`.
    fn delete(&mut self, keys: &[String], deadline: Instant) -> io::Result<()> {
        for batch in keys.chunks(BATCH) {
            let mut buf = Vec::new();
            for k in batch {
                buf.extend_from_slice(&request(DELETE_KEY, None, &[k.as_bytes()]));
            }
            self.stream.write_all(&buf)?;
            for k in batch {
                let mut n = [0u8; 8];
                net::read_exact(&self.stream, &mut n, deadline)?;
                let n = i64::from_ne_bytes(n);
                if !(0..=1).contains(&n) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("answered the deletion of {k} with {n} instead of 0 or 1"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `Ok(false)`: the keys did not all appear before `deadline`; the connection is then
    /// left with a wait pending and must be dropped.
    fn wait(&mut self, keys: &[String], deadline: Instant) -> io::Result<bool> {
        self.send(WAIT, &[], Some(keys))?;
        loop {
            self.stream.set_read_timeout(Some(step_until(deadline)))?;
            let mut b = [0u8; 1];
            match self.stream.read_exact(&mut b).map(|()| b[0]) {
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

/// Connects and validates, retrying until the deadline (`within` is the time it was given,
/// for the message); the error says what the last attempt met.
fn connect(rdv: &Rendezvous, deadline: Instant, within: Duration) -> Result<Store, String> {
    let mut backoff = net::attempts_backoff();
    loop {
        let last = match try_connect(rdv, deadline) {
            Ok(store) => return Ok(store),
            Err(why) => why,
        };
        std::thread::sleep(backoff.pause_until(deadline));
        if !time_for_attempt(deadline) {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return Err(format!(
                "did not answer within {within:?} (last attempt: {last})"
            ));
        }
    }
}

/// The key the validating `CHECK` asks about (it is never set: every key set here is under
/// `/nccl-channel/`).
const PROBE_KEY: &str = "/nccl-channel";

fn try_connect(rdv: &Rendezvous, deadline: Instant) -> Result<Store, String> {
    let stream =
        net::connect(&rdv.host, rdv.port, step_until(deadline)).map_err(|e| e.to_string())?;
    let mut store = Store { stream };
    let mut hello = vec![VALIDATE];
    hello.extend_from_slice(&VALIDATION_MAGIC.to_ne_bytes());
    hello.extend_from_slice(&request(CHECK, Some(&[PROBE_KEY.to_string()]), &[]));
    store
        .stream
        .write_all(&hello)
        .map_err(|e| format!("sending the validation: {e}"))?;
    // A TCPStore answers at once; something silent gets one STEP, then the next attempt.
    let read_by = deadline.min(Instant::now() + STEP);
    let mut answer = [0u8; 1];
    match net::read_exact(&store.stream, &mut answer, read_by) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(
                "something accepted the connection but closed it on a TCPStore check".into(),
            );
        }
        Err(e) if net::timed_out(&e) => {
            return Err(
                "something accepted the connection but did not answer a TCPStore check in \
                 time (not a TCPStore?)"
                    .into(),
            );
        }
        Err(e) => return Err(format!("validating: {e}")),
    }
    if !matches!(answer[0], READY | NOT_READY) {
        return Err(format!(
            "something answered a TCPStore check with {} instead of 0 or 1: not a TCPStore",
            describe(&answer)
        ));
    }
    if answer[0] == READY {
        return Err(format!(
            "something answered a TCPStore check of {PROBE_KEY}, a key that is never set, \
             with 0 (ready) instead of 1: not a TCPStore (an echo server?)"
        ));
    }
    // A TCPStore sends nothing it was not asked for; whatever came with the answer (an
    // echo, a banner) is not one.
    let mut more = [0u8; 64];
    let extra = store
        .stream
        .set_nonblocking(true)
        .and_then(|()| store.stream.peek(&mut more));
    store
        .stream
        .set_nonblocking(false)
        .map_err(|e| format!("validating: {e}"))?;
    match extra {
        Ok(0) => return Err("something closed the connection after a TCPStore check".into()),
        Ok(n) => {
            return Err(format!(
                "something answered a TCPStore check with more than one byte ({} then {}): \
                 not a TCPStore",
                describe(&answer),
                describe(&more[..n])
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(format!("validating: {e}")),
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

/// A fresh nonce: 16 hex digits from a randomly keyed hash of the time, the process and
/// a counter.
fn new_nonce() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

/// `rank 1`, `ranks 1, 3`.
fn ranks(list: &[usize]) -> String {
    let names: Vec<String> = list.iter().map(ToString::to_string).collect();
    format!(
        "rank{} {}",
        if list.len() == 1 { "" } else { "s" },
        names.join(", ")
    )
}

/// Rank 0: removes what an earlier exchange under the key left, stores the id with a
/// fresh nonce, then waits until every other rank acknowledged it with that nonce.
pub(crate) fn publish<E: From<crate::Error>>(
    rdv: &Rendezvous,
    key: &str,
    size: usize,
    make: impl FnOnce() -> Result<Id, E>,
) -> Result<Id, E> {
    let deadline = crate::backoff::deadline_after(rdv.timeout);
    let mut store = connect(rdv, deadline, rdv.timeout).map_err(|p| rdv.error(p))?;
    let id = make()?;
    let skey = store_key(key);
    let acks = ack_keys(key, size);
    let mut every_key = vec![skey.clone()];
    every_key.extend(acks.iter().cloned());
    // An earlier exchange under this key (a program that failed, under the same torchrun
    // attempt) may have left its id and acks: an old ack must not count for this one.
    store.delete(&every_key, deadline).map_err(|e| {
        let problem = format!("failed removing what an earlier exchange left under key {skey}");
        rdv.io_error(problem, e)
    })?;
    let (value, expected) = match &rdv.secret {
        None => {
            let nonce = new_nonce();
            let value = format!("{VALUE_MAGIC} {size} {nonce} {}", hex(&id));
            (value, vec![nonce.into_bytes(); size - 1])
        }
        Some(secret) => {
            let keys = Keys::new(secret);
            let nonce = proof::nonce()?;
            let t = sealed_transcript(&rdv.bound_address(), &skey, size, &nonce);
            let sealed = keys.seal(&t, &id);
            let value = format!("{SEALED_MAGIC} {size} {} {}", hex(&nonce), hex(&sealed));
            let expected = (1..size).map(|r| sealed_ack(&keys, &t, r)).collect();
            (value, expected)
        }
    };
    // The ranks (1 ..) whose ack is not yet this exchange's.
    let mut unacked: Vec<usize> = (1..size).collect();
    let waited = store
        .set(&skey, value.as_bytes())
        .map_err(|e| Some(format!("failed storing the id: {e}")))
        .and_then(|()| wait_for_acks(&mut store, &acks, &mut unacked, &expected, deadline));
    if let Err(problem) = &waited {
        // The connection is spoilt (a wait pending, or broken); look again on a fresh one.
        let by = Instant::now() + AFTER;
        let (fresh, looked) = look_again(rdv, &acks, &mut unacked, &expected, by);
        if looked.is_ok() && unacked.is_empty() {
            // Every ack came, the last just as the wait ran out.
            if let Some(mut fresh) = fresh {
                clean_up(rdv, &mut fresh, &every_key, by);
            }
            return Ok(id);
        }
        // Best-effort: a later exchange under this key must not read this id.
        if let Some(mut fresh) = fresh {
            let _ = fresh.delete(&every_key, by);
        }
        let problem = match (problem, looked) {
            (None, Ok(stale)) => missing(rdv, &skey, &unacked, &stale),
            (Some(p), Ok(stale)) => format!("{p}; then {}", missing(rdv, &skey, &unacked, &stale)),
            (None, Err(e)) => format!(
                "did not see every rank take the id (key {skey}) within {:?} (then the store \
                 could not be asked which ranks: {e})",
                rdv.timeout
            ),
            (Some(p), Err(e)) => {
                format!("{p} (then the store could not be asked which ranks took the id: {e})")
            }
        };
        return Err(rdv.error(problem).into());
    }
    clean_up(rdv, &mut store, &every_key, Instant::now() + AFTER);
    Ok(id)
}

/// Waits until every rank `r` in `unacked` acknowledged with `expected[r - 1]`, removing
/// them from it. `Err(None)`: the deadline passed; `Err(Some(problem))`: the store failed.
fn wait_for_acks(
    store: &mut Store,
    acks: &[String],
    unacked: &mut Vec<usize>,
    expected: &[Vec<u8>],
    deadline: Instant,
) -> Result<(), Option<String>> {
    let mut backoff = net::attempts_backoff();
    loop {
        let pending: Vec<String> = unacked.iter().map(|r| acks[r - 1].clone()).collect();
        let all = store
            .wait(&pending, deadline)
            .map_err(|e| Some(format!("failed waiting for the ranks: {e}")))?;
        if !all {
            return Err(None);
        }
        let values = store
            .get_many(&pending, deadline)
            .map_err(|e| Some(format!("failed reading the acknowledgements: {e}")))?;
        let mut values = values.iter();
        unacked.retain(|r| values.next().is_none_or(|v| !same(v, &expected[r - 1])));
        if unacked.is_empty() {
            return Ok(());
        }
        // Acks of an earlier exchange, written after this rank 0 removed the old ones:
        // read them again until this exchange's ranks overwrite them.
        std::thread::sleep(backoff.pause_until(deadline));
        if !time_for_attempt(deadline) {
            return Err(None);
        }
    }
}

/// Whether an ack is the one expected, in constant time (with a secret, the expected
/// one is a proof).
fn same(ack: &[u8], expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    ack.len() == expected.len() && bool::from(ack.ct_eq(expected))
}

/// On a fresh connection, by `by`: which of `unacked` acknowledged after all (removed from
/// it). The connection (when one was made) and the ranks whose ack carries another nonce,
/// or why the store could not be asked (stopping at the first failure).
fn look_again(
    rdv: &Rendezvous,
    acks: &[String],
    unacked: &mut Vec<usize>,
    expected: &[Vec<u8>],
    by: Instant,
) -> (Option<Store>, Result<Vec<usize>, String>) {
    let mut fresh = match connect(rdv, by, AFTER) {
        Ok(fresh) => fresh,
        Err(e) => return (None, Err(format!("it {e}"))),
    };
    let mut stale = Vec::new();
    let mut still = Vec::new();
    for &r in unacked.iter() {
        let k = &acks[r - 1];
        let present = match fresh.check(std::slice::from_ref(k), by) {
            Ok(present) => present,
            Err(e) => return (Some(fresh), Err(format!("checking {k}: {e}"))),
        };
        if !present {
            still.push(r);
            continue;
        }
        match fresh.get(k, by) {
            Ok(v) if same(&v, &expected[r - 1]) => {}
            Ok(_) => {
                stale.push(r);
                still.push(r);
            }
            Err(e) => return (Some(fresh), Err(format!("reading {k}: {e}"))),
        }
    }
    *unacked = still;
    (Some(fresh), Ok(stale))
}

/// The error of a rank 0 that did not see `unacked` acknowledge; `stale`: those whose ack
/// is another exchange's.
fn missing(rdv: &Rendezvous, skey: &str, unacked: &[usize], stale: &[usize]) -> String {
    let mut problem = format!(
        "did not see {} take the id (key {skey}) within {:?}",
        ranks(unacked),
        rdv.timeout
    );
    if !stale.is_empty() {
        problem.push_str(&format!(
            " ({} acknowledged another exchange's id under that key: an earlier program's?)",
            ranks(stale)
        ));
    }
    problem
}

/// Every rank took the id: removes it and the acks, so that a later program under the same
/// torchrun attempt (same key) does not read this stale id. A failure is one line on
/// stderr, not an error: the other ranks have gone on with the id, and a later rank 0
/// removes the keys before storing its own.
fn clean_up(rdv: &Rendezvous, store: &mut Store, keys: &[String], by: Instant) {
    if let Err(e) = store.delete(keys, by) {
        eprintln!(
            "nccl-channel: warning: {}",
            rdv.error(format!(
                "could not remove the id (key {}) after every rank took it: {e}; a rank of a \
                 later program under the same key that comes before its rank 0 could read it",
                keys[0]
            ))
        );
    }
}

/// Ranks other than 0: wait for the id, read it, acknowledge it with its nonce.
pub(crate) fn fetch(
    rdv: &Rendezvous,
    key: &str,
    rank: usize,
    size: usize,
    found: &crate::notice::Found,
) -> Result<Id> {
    let deadline = crate::backoff::deadline_after(rdv.timeout);
    let mut store = connect(rdv, deadline, rdv.timeout).map_err(|p| rdv.error(p))?;
    let skey = store_key(key);
    let there = store
        .wait(std::slice::from_ref(&skey), deadline)
        .map_err(|e| rdv.io_error(format!("failed waiting for key {skey}"), e))?;
    if !there {
        return Err(rdv.error(format!(
            "did not get the id from rank 0 (key {skey}) within {:?}",
            rdv.timeout
        )));
    }
    let (id, ack) = match &rdv.secret {
        None => {
            let value = store
                .get(&skey, deadline)
                .map_err(|e| rdv.io_error(format!("failed reading key {skey}"), e))?;
            let parsed = parse_value(&value, size)
                .map_err(|p| rdv.error(format!("holds under key {skey} {p}")))?;
            match parsed {
                Value::Plain { id, nonce } => (id, nonce.into_bytes()),
                Value::Sealed { .. } => {
                    return Err(rdv.refused(format!(
                        "holds under key {skey} an id sealed with a secret, and this rank has \
                         none: give every rank the same secret ({SECRET_FILE_ENV})"
                    )));
                }
            }
        }
        Some(secret) => fetch_sealed(rdv, &mut store, &skey, rank, size, secret, deadline, found)?,
    };
    store
        .set(&ack_keys(key, size)[rank - 1], &ack)
        .map_err(|e| rdv.io_error("failed acknowledging the id".to_string(), e))?;
    Ok(id)
}

/// With a secret: reads the value under `skey` until it opens with the secret, or the
/// deadline passes. Anything else there (a stranger's `SET` before rank 0's, a value of
/// another secret, garbage) proves nothing and decides nothing: rank 0 removes what is
/// there before it stores its own, so the value is read again, with growing pauses.
#[allow(clippy::too_many_arguments)]
fn fetch_sealed(
    rdv: &Rendezvous,
    store: &mut Store,
    skey: &str,
    rank: usize,
    size: usize,
    secret: &crate::RendezvousSecret,
    deadline: Instant,
    found: &crate::notice::Found,
) -> Result<(Id, Vec<u8>)> {
    let keys = Keys::new(secret);
    let mut backoff = net::attempts_backoff();
    loop {
        let value = store
            .get(skey, deadline)
            .map_err(|e| rdv.io_error(format!("failed reading key {skey}"), e))?;
        let unproven = match parse_value(&value, size) {
            Ok(Value::Sealed { nonce, sealed }) => {
                let t = sealed_transcript(&rdv.bound_address(), skey, size, &nonce);
                match keys.open(&t, &sealed[..]) {
                    Some(id) => return Ok((id, sealed_ack(&keys, &t, rank))),
                    None => "an id not sealed with this rank's secret (rank 0 holds another \
                             secret, or something else stored it)"
                        .to_string(),
                }
            }
            Ok(Value::Plain { .. }) => "an id stored without a secret, and this rank has one \
                                        (give every rank the same secret, or none)"
                .to_string(),
            Err(p) => p,
        };
        crate::notice::found(found, crate::notice::Cause::UnprovenValue);
        let refused = || {
            rdv.refused(format!(
                "holds under key {skey} {unproven}, and nothing sealed with this rank's secret \
                 came in its place within {:?}",
                rdv.timeout
            ))
        };
        std::thread::sleep(backoff.pause_until(deadline));
        if !time_for_attempt(deadline) {
            return Err(refused());
        }
        // Rank 0 removes the value before it stores its own: wait until one is there.
        match store.wait(std::slice::from_ref(&skey.to_string()), deadline) {
            Ok(true) => {}
            Ok(false) => return Err(refused()),
            Err(e) => return Err(rdv.io_error(format!("failed waiting for key {skey}"), e)),
        }
    }
}

/// What a sealed id is sealed over: the store's address as the ranks name it, the store
/// key (hence the job and the exchange), the world size and rank 0's nonce.
fn sealed_transcript(address: &str, skey: &str, size: usize, nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut t = format!("{SEALED_MAGIC}\n{address}\n{skey}\n{size}\n").into_bytes();
    t.extend_from_slice(nonce);
    t
}

/// Rank `rank`'s ack of a sealed id: its proof of having opened it, which nobody without
/// the secret can write for it.
fn sealed_ack(keys: &Keys, t: &[u8], rank: usize) -> Vec<u8> {
    let mut what = t.to_vec();
    what.extend_from_slice(format!("\nrank {rank}").as_bytes());
    hex(&keys.prove(Role::Ack, &what)).into_bytes()
}

/// Rank 0's value, as stored.
#[derive(Debug, PartialEq, Eq)]
enum Value {
    /// Without a secret: the id and the nonce the acks carry.
    Plain { id: Id, nonce: String },
    /// With one: rank 0's nonce and the sealed id.
    Sealed {
        nonce: [u8; NONCE_LEN],
        sealed: Box<[u8; SEALED_LEN]>,
    },
}

/// Rank 0's value: checks the format and the world size.
fn parse_value(value: &[u8], size: usize) -> Result<Value, String> {
    let bad = || {
        format!(
            "something that is not a rendezvous value: {}",
            describe(value)
        )
    };
    let text = std::str::from_utf8(value).map_err(|_| bad())?;
    if let Some(rest) = text.strip_prefix(SEALED_MAGIC) {
        let mut words = rest.split_whitespace();
        let (Some(n), Some(nonce), Some(sealed), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(bad());
        };
        let n: usize = parse_decimal(n).ok_or_else(bad)?;
        let (Some(nonce), Some(sealed)) = (unhex(nonce), unhex(sealed)) else {
            return Err(bad());
        };
        check_size(n, size)?;
        return Ok(Value::Sealed {
            nonce,
            sealed: Box::new(sealed),
        });
    }
    if text.starts_with("nccl-channel-rendezvous ") && !text.starts_with(VALUE_MAGIC) {
        return Err(format!(
            "a value of another version of nccl-channel's rendezvous ({}); every rank must \
             run the same",
            describe(value)
        ));
    }
    let rest = text.strip_prefix(VALUE_MAGIC).ok_or_else(bad)?;
    let mut words = rest.split_whitespace();
    let (Some(n), Some(nonce), Some(hex), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(bad());
    };
    let n: usize = parse_decimal(n).ok_or_else(bad)?;
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    check_size(n, size)?;
    Ok(Value::Plain {
        id: unhex(hex).ok_or_else(bad)?,
        nonce: nonce.to_string(),
    })
}

fn check_size(n: usize, size: usize) -> Result<(), String> {
    if n != size {
        return Err(format!(
            "an id for a world of {n} ranks, but this rank's world has {size}; every rank must \
             see the same world size"
        ));
    }
    Ok(())
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
        assert_eq!((VALIDATE, GET, CHECK, DELETE_KEY), (0, 3, 5, 8));
        if cfg!(target_endian = "little") {
            assert_eq!(VALIDATION_MAGIC.to_ne_bytes(), [0xce, 0xf7, 0x85, 0x3c]);
        }
    }

    #[test]
    fn values_are_checked() {
        let id = [0x42; 128];
        let v = format!("{VALUE_MAGIC} 3 0123456789abcdef {}", hex(&id));
        assert_eq!(
            parse_value(v.as_bytes(), 3),
            Ok(Value::Plain {
                id,
                nonce: "0123456789abcdef".to_string()
            })
        );
        let sealed = format!("{SEALED_MAGIC} 3 {} {}", "ab".repeat(32), "cd".repeat(144));
        assert_eq!(
            parse_value(sealed.as_bytes(), 3),
            Ok(Value::Sealed {
                nonce: [0xab; NONCE_LEN],
                sealed: Box::new([0xcd; SEALED_LEN])
            })
        );
        assert!(
            parse_value(sealed.as_bytes(), 2)
                .unwrap_err()
                .contains("world of 3 ranks")
        );
        assert!(
            parse_value(v.as_bytes(), 4)
                .unwrap_err()
                .contains("world of 3 ranks")
        );
        for bad in [
            &b""[..],
            b"nccl-channel-rendezvous 2 3",
            b"\xff",
            b"nccl-channel-rendezvous 2 x 0123456789abcdef 00",
            format!("{VALUE_MAGIC} 3 {}", hex(&id)).as_bytes(),
            format!("{VALUE_MAGIC} 3 0123456789abcdeg {}", hex(&id)).as_bytes(),
            format!("{VALUE_MAGIC} 3 0123456789abcdef0 {}", hex(&id)).as_bytes(),
            format!("{SEALED_MAGIC} 3 {} {}", "ab".repeat(31), "cd".repeat(144)).as_bytes(),
            format!("{SEALED_MAGIC} 3 {} {}", "ab".repeat(32), "cd".repeat(143)).as_bytes(),
            format!("{SEALED_MAGIC} 3 {}", "ab".repeat(32)).as_bytes(),
            format!("{SEALED_MAGIC} x {} {}", "ab".repeat(32), "cd".repeat(144)).as_bytes(),
        ] {
            assert!(
                parse_value(bad, 3)
                    .unwrap_err()
                    .contains("not a rendezvous value"),
                "{bad:?}"
            );
        }
        let old = format!("nccl-channel-rendezvous 1 3 {}", hex(&id));
        assert!(
            parse_value(old.as_bytes(), 3)
                .unwrap_err()
                .contains("another version")
        );
        assert_ne!(new_nonce(), new_nonce());
        assert_eq!(new_nonce().len(), 16);
    }

    /// Closes `c` with a reset (RST), not a FIN: a zero linger time. Closing with unread
    /// data resets only on Linux; BSDs and macOS flush the data and send a FIN.
    fn reset(c: std::net::TcpStream) {
        use std::os::fd::AsRawFd;
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and option value of the option's size.
        let set = unsafe {
            libc::setsockopt(
                c.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "{}", io::Error::last_os_error());
        drop(c);
    }

    /// A server that resets the connection instead of answering the validation: the
    /// attempt fails with the reset, not as a silence.
    #[test]
    fn a_reset_instead_of_an_answer_fails_the_attempt() {
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (c, _) = listener.accept().unwrap();
            // Waits for the validation, then resets the connection.
            let _ = c.peek(&mut [0u8; 1]);
            reset(c);
        });
        let rdv = Rendezvous::torch_store(&addr).unwrap();
        let e = match try_connect(&rdv, Instant::now() + Duration::from_secs(20)) {
            Ok(_) => panic!("a reset connection was taken for a TCPStore"),
            Err(e) => e,
        };
        assert!(e.starts_with("validating: Connection reset by peer"), "{e}");
    }

    /// A server that answers the validation with 1 and then resets the connection: an
    /// attempt that sees the reset when it looks for more bytes fails with it, rather than
    /// taking every failed look for "no more bytes" and going on with a dead connection.
    /// The reset follows the answer by microseconds, so an attempt may look before it
    /// comes (and succeed): of many attempts, one sees it.
    #[test]
    fn a_reset_after_the_answer_fails_the_attempt() {
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for c in listener.incoming() {
                let Ok(mut c) = c else { continue };
                // Waits for the validation, answers it, then resets the connection.
                let _ = c.peek(&mut [0u8; 1]);
                let _ = c.write_all(&[NOT_READY]);
                reset(c);
            }
        });
        let rdv = Rendezvous::torch_store(&addr).unwrap();
        for _ in 0..200 {
            match try_connect(&rdv, Instant::now() + Duration::from_secs(20)) {
                Ok(_) => {}
                Err(e) if e.starts_with("validating: ") && e.contains("reset") => return,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no attempt of 200 saw the reset");
    }
}
