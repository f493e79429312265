//! nccl-channel's own rendezvous: rank 0 listens and serves the id; the others connect.
//!
//! One line each way, ASCII, at most [`MAX_LINE`] bytes:
//!
//! ```text
//! rank r  → rank 0:  nccl-channel-rendezvous 1 hello <key> <rank> <size>
//! rank 0  → rank r:  nccl-channel-rendezvous 1 id <256 hex digits>   (same key, size and a valid rank)
//!                    nccl-channel-rendezvous 1 key <rank 0's key>    (another job or channel)
//!                    nccl-channel-rendezvous 1 size <rank 0's size>  (the ranks disagree)
//!                    nccl-channel-rendezvous 1 rank <rank 0's size>  (rank 0 or out of range)
//! rank r  → rank 0:  nccl-channel-rendezvous 1 ack <rank>            (after an id)
//! ```
//!
//! A peer that sends anything else, or does not finish its lines within
//! [`STEP`](super::net::STEP) of connecting, is dropped and rank 0 goes on serving; so is
//! one that says `hello` with another world size (it is answered `size`, and fails at
//! once on its side): no single connection can make rank 0 fail, only its deadline can,
//! and that error names what it saw. A rank that gets a `key` answer keeps retrying (an
//! earlier channel or another job may still hold the port) until its deadline, which then
//! says that a foreign key answered.

use std::collections::BTreeSet;
use std::io::{BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::net::{self, STEP, describe, read_line, step_until, time_for_attempt};
use super::point::Rendezvous;
use crate::decimal::parse_decimal;
use crate::{Result, UniqueId};

const MAGIC: &str = "nccl-channel-rendezvous";
const VERSION: u32 = 1;
/// The longest line either side reads.
pub(crate) const MAX_LINE: usize = 512;
/// At most this many peers are talked to at once; more connections are closed unread.
const MAX_HANDLERS: usize = 64;

/// What a connecting rank says.
#[derive(Debug, PartialEq, Eq)]
struct Hello {
    key: String,
    rank: usize,
    size: usize,
}

/// What rank 0 answers.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Id(UniqueId),
    Key(String),
    Size(usize),
    Rank(usize),
}

fn hello_line(h: &Hello) -> String {
    format!("{MAGIC} {VERSION} hello {} {} {}\n", h.key, h.rank, h.size)
}

fn reply_line(r: &Reply) -> String {
    match r {
        Reply::Id(id) => format!("{MAGIC} {VERSION} id {id}\n"),
        Reply::Key(k) => format!("{MAGIC} {VERSION} key {k}\n"),
        Reply::Size(n) => format!("{MAGIC} {VERSION} size {n}\n"),
        Reply::Rank(n) => format!("{MAGIC} {VERSION} rank {n}\n"),
    }
}

/// The words after `MAGIC VERSION`, if the line starts so.
fn words(line: &[u8]) -> Option<Vec<&str>> {
    let text = std::str::from_utf8(line).ok()?;
    let mut w = text.split(' ');
    if w.next()? != MAGIC || parse_decimal::<u32>(w.next()?)? != VERSION {
        return None;
    }
    Some(w.collect())
}

fn parse_hello(line: &[u8]) -> Option<Hello> {
    match words(line)?.as_slice() {
        ["hello", key, rank, size] if !key.is_empty() => Some(Hello {
            key: key.to_string(),
            rank: parse_decimal(rank)?,
            size: parse_decimal(size)?,
        }),
        _ => None,
    }
}

fn parse_reply(line: &[u8]) -> Option<Reply> {
    match words(line)?.as_slice() {
        ["id", hex] => hex.parse().ok().map(Reply::Id),
        ["key", k] => Some(Reply::Key(k.to_string())),
        ["size", n] => parse_decimal(n).map(Reply::Size),
        ["rank", n] => parse_decimal(n).map(Reply::Rank),
        _ => None,
    }
}

fn parse_ack(line: &[u8]) -> Option<usize> {
    match words(line)?.as_slice() {
        ["ack", r] => parse_decimal(r),
        _ => None,
    }
}

/// What one connection to rank 0 came to.
enum Outcome {
    Served(usize),
    WrongSize { rank: usize, size: usize },
    Ignored(String),
}

/// Rank 0's tally of connections it did not serve.
#[derive(Default)]
struct Ignored {
    count: usize,
    last: Option<String>,
    /// Greetings with this rendezvous's key but another world size: (rank, size), the
    /// first few.
    sizes: Vec<(usize, usize)>,
    other_sizes: usize,
}

impl Ignored {
    fn note(&mut self, why: String) {
        self.count += 1;
        self.last = Some(why);
    }

    fn wrong_size(&mut self, rank: usize, size: usize) {
        self.other_sizes += 1;
        if self.sizes.len() < 4 {
            self.sizes.push((rank, size));
        }
    }
}

/// Rank 0: listens, makes the id, serves it until every other rank confirmed.
pub(super) fn serve(
    rdv: &Rendezvous,
    key: &str,
    size: usize,
    make: impl FnOnce() -> Result<UniqueId>,
) -> Result<UniqueId> {
    let deadline = crate::backoff::deadline_after(rdv.timeout);
    let listener = listen(rdv, deadline)?;
    let id = make()?;
    listener
        .set_nonblocking(true)
        .map_err(|e| rdv.io_error("could not poll its socket".to_string(), e))?;
    let key: Arc<str> = Arc::from(key);
    let active = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let mut served = BTreeSet::new();
    // Connections that were not this rendezvous's ranks: how many, and the last one.
    let mut ignored = Ignored::default();
    loop {
        while let Ok(outcome) = rx.try_recv() {
            match outcome {
                Outcome::Served(r) => {
                    served.insert(r);
                }
                // Answered `size` and dropped: one line from anyone must not stop rank 0.
                Outcome::WrongSize { rank, size: theirs } => ignored.wrong_size(rank, theirs),
                Outcome::Ignored(why) => ignored.note(why),
            }
        }
        if served.len() == size - 1 {
            return Ok(id);
        }
        if Instant::now() >= deadline {
            let missing: Vec<String> = (1..size)
                .filter(|r| !served.contains(r))
                .map(|r| r.to_string())
                .collect();
            let mut problem = format!(
                "did not hear from rank{} {} within {:?}",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", "),
                rdv.timeout
            );
            if !ignored.sizes.is_empty() {
                let seen: Vec<String> = ignored
                    .sizes
                    .iter()
                    .map(|(r, n)| format!("rank {r} of {n}"))
                    .collect();
                problem.push_str(&format!(
                    "; {} greeting{} with another world size than rank 0's {size} ({}{}): \
                     every rank must see the same world size",
                    ignored.other_sizes,
                    if ignored.other_sizes == 1 { "" } else { "s" },
                    seen.join(", "),
                    if ignored.other_sizes > seen.len() {
                        ", …"
                    } else {
                        ""
                    }
                ));
            }
            if let Some(last) = &ignored.last {
                problem.push_str(&format!(
                    " ({} other connection{} ignored, the last: {last})",
                    ignored.count,
                    if ignored.count == 1 { "" } else { "s" }
                ));
            }
            return Err(rdv.error(problem));
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                if active.load(Ordering::Acquire) >= MAX_HANDLERS {
                    ignored.note(format!("{peer}: too many connections at once"));
                    continue;
                }
                active.fetch_add(1, Ordering::AcqRel);
                let (key, tx, counter) = (key.clone(), tx.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("nccl-rendezvous".into())
                    .spawn(move || {
                        let outcome = handle(stream, peer, &key, size, &id, deadline);
                        counter.fetch_sub(1, Ordering::AcqRel);
                        // The receiver is gone once rank 0 returned: nothing to tell.
                        let _ = tx.send(outcome);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::AcqRel);
                    ignored.note(format!("{peer}: no thread to serve it"));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            // A peer that gave up before accept (ECONNABORTED), or no descriptor to spare
            // now (EMFILE): both may pass.
            Err(e) => {
                ignored.note(format!("accept failed: {e}"));
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Binds the listening socket, retrying while the port is taken (an earlier channel's
/// rank 0 may still be releasing it) until the deadline.
fn listen(rdv: &Rendezvous, deadline: Instant) -> Result<TcpListener> {
    let candidates = rdv.listen_addrs();
    let mut backoff = net::attempts_backoff();
    loop {
        let mut last = None;
        for addr in &candidates {
            match TcpListener::bind(addr) {
                Ok(l) => return Ok(l),
                Err(e) => {
                    let in_use = e.kind() == ErrorKind::AddrInUse;
                    last = Some((*addr, e));
                    if in_use {
                        break;
                    }
                }
            }
        }
        let Some((addr, e)) = last else {
            return Err(rdv.error("has no address to listen on"));
        };
        if e.kind() != ErrorKind::AddrInUse || Instant::now() >= deadline {
            let problem = format!(
                "could not listen on {addr}{}",
                if e.kind() == ErrorKind::AddrInUse {
                    format!(
                        " (still taken after {:?}; choose another port {})",
                        rdv.timeout,
                        port_advice(rdv)
                    )
                } else {
                    String::new()
                }
            );
            return Err(rdv.io_error(problem, e));
        }
        std::thread::sleep(backoff.pause_until(deadline));
    }
}

/// Where another port is chosen, by where the address came from: `MASTER_PORT` is read
/// only when the address is derived from the launcher's variables.
fn port_advice(rdv: &Rendezvous) -> &'static str {
    match rdv.derived_from.as_str() {
        "code" => "in the address given to Rendezvous::tcp",
        "NCCL_CHANNEL_RENDEZVOUS" => "for every rank in NCCL_CHANNEL_RENDEZVOUS",
        _ => "for every rank with MASTER_PORT, or NCCL_CHANNEL_RENDEZVOUS=host:port",
    }
}

/// Talks to one peer (on its own thread), for at most [`STEP`] in all: a peer that
/// trickles its greeting a byte at a time cannot hold the handler longer.
fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    key: &str,
    size: usize,
    id: &UniqueId,
    deadline: Instant,
) -> Outcome {
    let deadline = deadline.min(Instant::now() + STEP);
    let limit = step_until(deadline);
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(limit)))
        .and_then(|()| stream.set_write_timeout(Some(limit)));
    if let Err(e) = setup {
        return Outcome::Ignored(format!("{peer}: {e}"));
    }
    let mut reader = BufReader::new(&stream);
    let line = match read_line(&mut reader, MAX_LINE, deadline) {
        Ok(Some(line)) => line,
        Ok(None) => return Outcome::Ignored(format!("{peer} closed without a word")),
        Err(e) => return Outcome::Ignored(format!("{peer}: {e}")),
    };
    let Some(hello) = parse_hello(&line) else {
        return Outcome::Ignored(format!("{peer} sent {}", describe(&line)));
    };
    let (reply, outcome) = if hello.key != key {
        (
            Reply::Key(key.to_string()),
            Outcome::Ignored(format!("{peer} asked for key {}", hello.key)),
        )
    } else if hello.size != size {
        (
            Reply::Size(size),
            Outcome::WrongSize {
                rank: hello.rank,
                size: hello.size,
            },
        )
    } else if hello.rank == 0 || hello.rank >= size {
        (
            Reply::Rank(size),
            Outcome::Ignored(format!("{peer} claimed rank {}", hello.rank)),
        )
    } else {
        (Reply::Id(*id), Outcome::Served(hello.rank))
    };
    if let Err(e) = (&stream).write_all(reply_line(&reply).as_bytes()) {
        return Outcome::Ignored(format!("{peer}: {e}"));
    }
    if !matches!(outcome, Outcome::Served(_)) {
        return outcome;
    }
    match read_line(&mut reader, MAX_LINE, deadline) {
        Ok(Some(line)) if parse_ack(&line) == Some(hello.rank) => outcome,
        _ => Outcome::Ignored(format!(
            "{peer} (rank {}) did not confirm the id",
            hello.rank
        )),
    }
}

/// What one attempt to reach rank 0 came to.
enum Attempt {
    Got(UniqueId),
    /// Stop: retrying cannot help.
    Fatal(crate::Error),
    /// Try again; the text says what happened, for the deadline's error.
    Retry(String),
    /// A rendezvous for another key answered: try again.
    Foreign(String),
}

/// Ranks other than 0: connect and ask until rank 0 answers or the deadline passes.
pub(super) fn receive(rdv: &Rendezvous, key: &str, rank: usize, size: usize) -> Result<UniqueId> {
    let deadline = crate::backoff::deadline_after(rdv.timeout);
    let hello = Hello {
        key: key.to_string(),
        rank,
        size,
    };
    let mut backoff = net::attempts_backoff();
    // A rendezvous of another key that answered: said in the deadline's error even when
    // later attempts met something else (it may have gone away since).
    let mut foreign: Option<String> = None;
    loop {
        let last = match attempt(rdv, &hello, deadline) {
            Attempt::Got(id) => return Ok(id),
            Attempt::Fatal(e) => return Err(e),
            Attempt::Foreign(why) => {
                foreign = Some(why.clone());
                why
            }
            Attempt::Retry(why) => why,
        };
        std::thread::sleep(backoff.pause_until(deadline));
        if !time_for_attempt(deadline) {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            let problem = match foreign {
                Some(f) if f != last => format!(
                    "did not answer within {:?} ({f}; last attempt: {last})",
                    rdv.timeout
                ),
                _ => format!(
                    "did not answer within {:?} (last attempt: {last})",
                    rdv.timeout
                ),
            };
            return Err(rdv.error(problem));
        }
    }
}

fn attempt(rdv: &Rendezvous, hello: &Hello, deadline: Instant) -> Attempt {
    let stream = match net::connect(&rdv.host, rdv.port, step_until(deadline)) {
        Ok(s) => s,
        Err(e) => return Attempt::Retry(e.to_string()),
    };
    if let Err(e) = (&stream).write_all(hello_line(hello).as_bytes()) {
        return Attempt::Retry(format!("sending the greeting: {e}"));
    }
    // Rank 0 answers at once; something silent gets one STEP, then the next attempt.
    let read_by = deadline.min(Instant::now() + STEP);
    let mut reader = BufReader::new(&stream);
    let line = match read_line(&mut reader, MAX_LINE, read_by) {
        Ok(Some(line)) => line,
        Ok(None) => {
            return Attempt::Retry(
                "something accepted the connection and closed it without a word".into(),
            );
        }
        Err(e) if net::timed_out(&e) => {
            return Attempt::Retry(
                "something accepted the connection but sent no complete answer in time".into(),
            );
        }
        Err(e) => {
            return Attempt::Retry(format!("something answered that is not a rendezvous: {e}"));
        }
    };
    match parse_reply(&line) {
        Some(Reply::Id(id)) => {
            // Rank 0 counts this rank as served only on the ack; if it is lost, rank 0
            // reports this rank missing at its deadline, which is the truth as it sees it.
            let ack = format!("{MAGIC} {VERSION} ack {}\n", hello.rank);
            let _ = (&stream).write_all(ack.as_bytes());
            Attempt::Got(id)
        }
        Some(Reply::Key(theirs)) => Attempt::Foreign(format!(
            "a rendezvous for key {theirs} answered, not {} (another job, or an earlier \
             channel still serving)",
            hello.key
        )),
        Some(Reply::Size(theirs)) => Attempt::Fatal(rdv.error(format!(
            "serves a world of {theirs} ranks, but rank {} has a world of {}; every rank must \
             see the same world size",
            hello.rank, hello.size
        ))),
        Some(Reply::Rank(theirs)) => Attempt::Fatal(rdv.error(format!(
            "refused rank {}: ranks go from 1 to {} there",
            hello.rank,
            theirs.saturating_sub(1)
        ))),
        None => Attempt::Retry(format!(
            "something answered that is not a rendezvous: {}",
            describe(&line)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_garbage_is_refused() {
        let h = Hello {
            key: "slurm-1.0#2".into(),
            rank: 2,
            size: 3,
        };
        let line = hello_line(&h);
        assert_eq!(line, "nccl-channel-rendezvous 1 hello slurm-1.0#2 2 3\n");
        assert_eq!(parse_hello(line.trim_end().as_bytes()), Some(h));
        let id = UniqueId([0xab; 128]);
        for r in [
            Reply::Id(id),
            Reply::Key("k".into()),
            Reply::Size(4),
            Reply::Rank(3),
        ] {
            let line = reply_line(&r);
            assert_eq!(parse_reply(line.trim_end().as_bytes()), Some(r));
        }
        for bad in [
            &b""[..],
            b"GET / HTTP/1.1",
            b"nccl-channel-rendezvous 2 hello k 1 3",
            b"nccl-channel-rendezvous 1 hello k 1",
            b"nccl-channel-rendezvous 1 hello k -1 3",
            b"nccl-channel-rendezvous 1 hello  1 3",
            b"nccl-channel-rendezvous 1 id 00",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_hello(bad), None, "{bad:?}");
            assert_eq!(parse_reply(bad), None, "{bad:?}");
        }
        assert_eq!(parse_ack(b"nccl-channel-rendezvous 1 ack 2"), Some(2));
    }

    /// A host that rank 0 serves on every IPv6 address (a name) waits for a port taken
    /// there (here on `[::1]`) rather than going on to IPv4's every address, which is
    /// free: ranks that reach the host over IPv6 would find the other listener.
    /// Linux only: BSDs and macOS let a wildcard bind with SO_REUSEADDR (as std binds)
    /// share the port with a listener on one address, so `[::]` is not taken there.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_port_taken_on_ipv6_is_waited_for_not_bypassed_on_ipv4() {
        let Ok(taken) = TcpListener::bind("[::1]:0") else {
            eprintln!("no IPv6 loopback here: nothing to check");
            return;
        };
        let port = taken.local_addr().unwrap().port();
        let timeout = Duration::from_millis(300);
        let rdv = Rendezvous::tcp(&format!("rank0.invalid:{port}"))
            .unwrap()
            .timeout(timeout);
        let start = Instant::now();
        let e = listen(&rdv, start + timeout).unwrap_err();
        // Waited for until the deadline, not refused at once.
        assert!(start.elapsed() >= timeout, "{:?}", start.elapsed());
        let crate::Error::Rendezvous { problem, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(
            problem,
            &format!(
                "could not listen on [::]:{port} (still taken after {timeout:?}; choose \
                 another port in the address given to Rendezvous::tcp)"
            )
        );
    }
}
