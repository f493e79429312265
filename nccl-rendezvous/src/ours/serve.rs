//! Rank 0's server: one thread serves every connection through one poll (mio), each
//! connection a [`Conversation`] fed line by line, so that neither thousands of ranks at once
//! nor peers that send nothing, or a byte at a time, hold up the others. What one
//! connection may take is bounded: [`MAX_LINE`] bytes (and one read) of input, one reply,
//! [`STEP`] of time; at most [`MAX_CONNECTIONS`] are open at once, and further ranks wait
//! in the listen backlog ([`BACKLOG`]) until one closes — or, when every slot is taken
//! and another connection waits, until the connection silent longest makes room as soon
//! as it has been silent for a round trip's allowance ([`Rendezvous::round_trip`], a few
//! milliseconds), whether it has greeted or not (honest ranks greet as they connect and
//! answer each line at once, so they are not the longest silent): peers that connect and
//! say nothing, or greet and then say nothing, cannot hold every slot, however many they
//! open, and the backlog drains as fast as rank 0 can accept. Without a connection
//! waiting, nothing is evicted: a connection has its whole [`STEP`].

use std::collections::BTreeSet;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener as PollListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::conversation::{Conversation, Offer, Outcome};
use super::wire::MAX_LINE;
use crate::net::{self, STEP, describe};
use crate::point::Rendezvous;
use crate::proof::Keys;
use crate::{Id, Result};

/// Connections served at once; more wait in the backlog. Each holds a descriptor, up to
/// [`MAX_LINE`] bytes and a read of input, and a reply. Fewer where the process may open
/// fewer than twice as many descriptors ([`connection_cap`]).
pub(crate) const MAX_CONNECTIONS: usize = 1024;

/// The connections rank 0 keeps open at once: [`MAX_CONNECTIONS`], or half the
/// descriptors the process may open (its soft limit, often 1024) when that is fewer, so
/// that the rendezvous never takes the descriptors the program and NCCL need (and never
/// meets "too many open files" itself); at least 16.
fn connection_cap() -> usize {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit`, which `limit` is, and keeps no pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            // `rlim_t` is `u64` on Linux, another width elsewhere.
            #[allow(clippy::useless_conversion)]
            return cap_for(u64::try_from(limit.rlim_cur).unwrap_or(u64::MAX));
        }
    }
    MAX_CONNECTIONS
}

/// [`connection_cap`] for a soft descriptor limit of `soft`.
fn cap_for(soft: u64) -> usize {
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .clamp(16, MAX_CONNECTIONS)
}
/// The listen backlog asked of the kernel (which caps it at `net.core.somaxconn`, 4096 on
/// Linux since 5.4): a burst of ranks waits there instead of being refused.
const BACKLOG: i32 = 4096;
/// The most refusals for the secret rank 0 says on stderr in one exchange; the deadline's
/// error counts them all.
const REFUSALS_SAID: usize = 8;
/// How often rank 0 retries accepting when it stopped (no descriptor to spare, every
/// connection slot taken): the listener's readiness is signalled once per new connection.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// The allowance of a connection that was sent the id without a secret and has not
/// acked it yet, when a newer connection needs its slot: the rank has its id and does not
/// come back, so rank 0 waits longer than a round trip for the ack it counts. (A rank that
/// proved the secret and was sent the id keeps its slot for its whole [`STEP`].)
const EVICT_AFTER: Duration = Duration::from_secs(1);
/// The most connections one wakeup accepts before it reads what the open ones sent.
const ACCEPTS_PER_WAKEUP: usize = MAX_CONNECTIONS;

const LISTENER: Token = Token(usize::MAX);

/// Rank 0: listens, makes the id, serves it until every other rank confirmed.
pub(crate) fn serve<E: From<crate::Error>>(
    rdv: &Rendezvous,
    key: &str,
    size: usize,
    make: impl FnOnce() -> Result<Id, E>,
) -> Result<Id, E> {
    let deadline = crate::backoff::deadline_after(rdv.timeout);
    let listener = listen(rdv, deadline)?;
    let id = make()?;
    let offer = Offer {
        address: Arc::from(rdv.bound_address()),
        key: Arc::from(key),
        size,
        id,
        keys: rdv.secret.as_ref().map(Keys::new),
    };
    let io = |what: &str, e| rdv.io_error(format!("could not {what}"), e);
    listener
        .set_nonblocking(true)
        .map_err(|e| io("poll its socket", e))?;
    let mut listener = PollListener::from_std(listener);
    let poll = Poll::new().map_err(|e| io("make a poll", e))?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(|e| io("poll its socket", e))?;
    let mut server = Server {
        rdv,
        offer: &offer,
        poll,
        listener,
        conns: Vec::new(),
        free: Vec::new(),
        live: 0,
        cap: connection_cap(),
        round_trip: rdv.round_trip,
        silence: BTreeSet::new(),
        accept_pending: true,
        served: BTreeSet::new(),
        tally: Tally::default(),
    };
    server.run(deadline)?;
    Ok(id)
}

/// One open connection.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    talk: Conversation,
    input: Vec<u8>,
    output: Vec<u8>,
    /// When it last completed a line (or was accepted): since then rank 0 waits on it.
    /// Kept in [`Server::silence`] too.
    heard: Instant,
    /// When it is dropped, finished or not.
    until: Instant,
    /// Its outcome, once it has one: it closes when its reply is written.
    outcome: Option<Outcome>,
}

struct Server<'a> {
    rdv: &'a Rendezvous,
    offer: &'a Offer,
    poll: Poll,
    listener: PollListener,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    live: usize,
    /// The most connections open at once ([`connection_cap`]).
    cap: usize,
    /// How long a connection may be silent before it gives its slot to a waiting one.
    round_trip: Duration,
    /// Every open connection as (`heard`, slot): the longest silent first.
    silence: BTreeSet<(Instant, usize)>,
    /// Connections may wait in the backlog unaccepted.
    accept_pending: bool,
    served: BTreeSet<usize>,
    tally: Tally,
}

impl Server<'_> {
    fn run(&mut self, deadline: Instant) -> Result<()> {
        let offer = self.offer;
        let mut events = Events::with_capacity(256);
        loop {
            if self.served.len() == offer.size - 1 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.rdv.error(self.tally.deadline_problem(
                    offer.size,
                    &self.served,
                    self.rdv.timeout,
                )));
            }
            self.expire(now);
            if self.accept_pending {
                self.accept();
            }
            let mut wait = deadline - now;
            for c in self.conns.iter().flatten() {
                wait = wait.min(c.until.saturating_duration_since(now));
            }
            if self.accept_pending {
                // Every slot taken: the longest silent may make room within a round trip.
                wait = wait.min(ACCEPT_RETRY.min(self.round_trip));
            }
            match self.poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.rdv.io_error("could not poll its sockets", e)),
            }
            for event in &events {
                match event.token() {
                    LISTENER => self.accept_pending = true,
                    Token(i) => self.on_ready(i),
                }
            }
            if self.accept_pending {
                self.accept();
            }
        }
    }

    /// Accepts while the backlog has connections and a slot is free, or one can be freed
    /// ([`Server::make_room`]); at most [`ACCEPTS_PER_WAKEUP`] at once.
    fn accept(&mut self) {
        for _ in 0..ACCEPTS_PER_WAKEUP {
            let now = Instant::now();
            if self.live > self.cap && !self.make_room(now) {
                return;
            }
            if self.live >= self.cap && self.longest_silent(now).is_none() {
                // Retried after a pause: someone may have been silent long enough then.
                return;
            }
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    let i = self.free.pop().unwrap_or_else(|| {
                        self.conns.push(None);
                        self.conns.len() - 1
                    });
                    let _ = stream.set_nodelay(true);
                    if let Err(e) =
                        self.poll
                            .registry()
                            .register(&mut stream, Token(i), Interest::READABLE)
                    {
                        self.free.push(i);
                        self.tally.note(format!("{peer}: {e}"));
                        continue;
                    }
                    self.live += 1;
                    let now = Instant::now();
                    self.conns[i] = Some(Conn {
                        stream,
                        peer,
                        talk: Conversation::new(peer),
                        input: Vec::new(),
                        output: Vec::new(),
                        heard: now,
                        until: now + STEP,
                        outcome: None,
                    });
                    self.silence.insert((now, i));
                    if self.live > self.cap {
                        // A connection waited, and got a slot: the longest silent gives
                        // up its own (or, when it has just spoken, this one is over the
                        // cap until one closes: no more are accepted until then).
                        self.make_room(now);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.accept_pending = false;
                    return;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // A peer that gave up before accept (ECONNABORTED), or no descriptor to
                // spare now (EMFILE): retried after a pause.
                Err(e) => {
                    self.tally.note(format!("accept failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Reads what connection `i` sent, answers, writes what is pending, closes it once it
    /// has an outcome and nothing left to write.
    fn on_ready(&mut self, i: usize) {
        let offer = self.offer;
        let Some(Some(c)) = self.conns.get_mut(i) else {
            return;
        };
        let before = c.heard;
        if c.outcome.is_none() {
            read_lines(c, offer);
        }
        if c.heard != before {
            self.silence.remove(&(before, i));
            self.silence.insert((c.heard, i));
        }
        if let Err(e) = flush(c) {
            if c.outcome.is_none() {
                c.outcome = Some(c.talk.on_end(&e.to_string()));
            }
            c.output.clear();
        }
        if c.outcome.is_some() && c.output.is_empty() {
            self.close(i);
        } else if !c.output.is_empty() {
            let _ = self.poll.registry().reregister(
                &mut c.stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            );
        }
    }

    /// The connection that may give its slot to a waiting one at `now`: the one silent
    /// longest (no complete line since it was accepted or last spoke), once silent for a
    /// round trip's allowance, whatever its state (not greeted yet, or challenged and with
    /// no proof since), except one that was sent the id: a rank that proved the secret
    /// keeps its slot, one without a secret gets [`EVICT_AFTER`] to ack.
    fn longest_silent(&self, now: Instant) -> Option<usize> {
        for &(heard, i) in &self.silence {
            let silent = now.saturating_duration_since(heard);
            if silent < self.round_trip {
                return None;
            }
            let Some(c) = self.conns.get(i).and_then(Option::as_ref) else {
                continue;
            };
            if c.outcome.is_some() {
                continue;
            }
            match c.talk.awaits_ack() {
                None => return Some(i),
                Some(false) if silent >= EVICT_AFTER => return Some(i),
                Some(_) => {}
            }
        }
        None
    }

    /// Every slot taken and a newer connection waiting: closes the connection that has
    /// kept rank 0 waiting longest ([`Server::longest_silent`]), once it has been silent
    /// for a round trip's allowance. An honest rank answers each line of rank 0's at once,
    /// so the newer connection (an honest rank, whose greeting came with its connection)
    /// gets a slot, and a flood of connections that greet, then go silent, holds a slot
    /// for little more than a round trip each while others wait. What a connection sent
    /// is read before it is closed: one that has spoken is not silent. False when none
    /// may go.
    fn make_room(&mut self, now: Instant) -> bool {
        // Each pass closes a connection, or finds the one it looked at speaking (it is
        // then the newest heard): at most one pass per connection.
        for _ in 0..=self.conns.len() {
            let Some(i) = self.longest_silent(now) else {
                return false;
            };
            let live = self.live;
            let heard = self.conns[i].as_ref().map(|c| c.heard);
            self.on_ready(i);
            if self.live < live {
                return true;
            }
            let Some(c) = &mut self.conns[i] else {
                return true;
            };
            if Some(c.heard) != heard || c.outcome.is_some() {
                continue;
            }
            let silent = now.saturating_duration_since(c.heard);
            let why = format!(
                "gave its slot to a newer connection: {} for {silent:?} (over the round \
                 trip's {:?}), the longest silent of all {} slots",
                if c.talk.greeting() {
                    "no greeting"
                } else {
                    "no answer to rank 0"
                },
                self.round_trip,
                self.cap
            );
            c.outcome = Some(c.talk.on_end(&why));
            self.close(i);
            return true;
        }
        false
    }

    /// Drops the connections past their time.
    fn expire(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let Some(c) = &mut self.conns[i] else {
                continue;
            };
            if c.until > now {
                continue;
            }
            if c.outcome.is_none() {
                let why = format!("did not finish its lines within {STEP:?}");
                c.outcome = Some(c.talk.on_end(&why));
            }
            self.close(i);
        }
    }

    fn close(&mut self, i: usize) {
        let Some(mut c) = self.conns[i].take() else {
            return;
        };
        self.silence.remove(&(c.heard, i));
        let _ = self.poll.registry().deregister(&mut c.stream);
        self.free.push(i);
        self.live -= 1;
        // A slot is free: a connection may wait in the backlog.
        self.accept_pending = true;
        match c.outcome.take() {
            Some(Outcome::Served(r)) => {
                self.served.insert(r);
            }
            Some(Outcome::WrongSize { rank, size }) => self.tally.wrong_size(rank, size),
            Some(Outcome::Ignored(why)) => self.tally.note(why),
            Some(Outcome::Refused(why)) => {
                if self.tally.refused < REFUSALS_SAID {
                    eprintln!(
                        "nccl-channel: {} refused {why}{}",
                        self.rdv.address(),
                        if self.tally.refused + 1 == REFUSALS_SAID {
                            " (further refusals are only counted)"
                        } else {
                            ""
                        }
                    );
                }
                self.tally.refused += 1;
                self.tally.note(why);
            }
            None => self.tally.note(format!("{}: dropped", c.peer)),
        }
    }
}

/// Reads until the socket has no more, feeding complete lines to its conversation.
fn read_lines(c: &mut Conn, offer: &Offer) {
    let mut buf = [0u8; 1024];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => {
                let why = if c.input.is_empty() {
                    "closed the connection".to_string()
                } else {
                    format!("closed the connection after {}", describe(&c.input))
                };
                c.outcome = Some(c.talk.on_end(&why));
                return;
            }
            Ok(n) => {
                c.input.extend_from_slice(&buf[..n]);
                while let Some(end) = c.input.iter().position(|b| *b == b'\n') {
                    if end > MAX_LINE {
                        break;
                    }
                    let step = c.talk.on_line(&c.input[..end], offer);
                    c.input.drain(..=end);
                    c.heard = Instant::now();
                    if let Some(reply) = step.reply {
                        c.output.extend_from_slice(reply.as_bytes());
                    }
                    if step.outcome.is_some() {
                        c.outcome = step.outcome;
                        return;
                    }
                }
                if c.input.len() > MAX_LINE {
                    let why = format!("sent an over-long line: {}", describe(&c.input));
                    c.outcome = Some(c.talk.on_end(&why));
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                c.outcome = Some(c.talk.on_end(&e.to_string()));
                return;
            }
        }
    }
}

/// Writes what is pending until the socket takes no more.
fn flush(c: &mut Conn) -> io::Result<()> {
    while !c.output.is_empty() {
        match c.stream.write(&c.output) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                c.output.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Rank 0's tally of connections it did not serve.
#[derive(Default)]
struct Tally {
    count: usize,
    last: Option<String>,
    /// Greetings with this rendezvous's key but another world size: (rank, size), the
    /// first few.
    sizes: Vec<(usize, usize)>,
    other_sizes: usize,
    /// Connections refused for the secret.
    refused: usize,
}

impl Tally {
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

    /// What the deadline's error says: who is missing, and what came instead.
    fn deadline_problem(&self, size: usize, served: &BTreeSet<usize>, timeout: Duration) -> String {
        let missing: Vec<String> = (1..size)
            .filter(|r| !served.contains(r))
            .map(|r| r.to_string())
            .collect();
        let mut problem = format!(
            "did not hear from rank{} {} within {timeout:?}",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
        );
        if !self.sizes.is_empty() {
            let seen: Vec<String> = self
                .sizes
                .iter()
                .map(|(r, n)| format!("rank {r} of {n}"))
                .collect();
            problem.push_str(&format!(
                "; {} greeting{} with another world size than rank 0's {size} ({}{}): \
                 every rank must see the same world size",
                self.other_sizes,
                if self.other_sizes == 1 { "" } else { "s" },
                seen.join(", "),
                if self.other_sizes > seen.len() {
                    ", …"
                } else {
                    ""
                }
            ));
        }
        if self.refused > 0 {
            problem.push_str(&format!(
                "; {} connection{} refused for the rendezvous's secret (a rank without it, \
                 or with another)",
                self.refused,
                if self.refused == 1 { "" } else { "s" }
            ));
        }
        if let Some(last) = &self.last {
            problem.push_str(&format!(
                " ({} other connection{} ignored, the last: {last})",
                self.count,
                if self.count == 1 { "" } else { "s" }
            ));
        }
        problem
    }
}

/// Binds the listening socket, retrying while the port is taken (an earlier channel's
/// rank 0 may still be releasing it) until the deadline.
pub(crate) fn listen(rdv: &Rendezvous, deadline: Instant) -> Result<TcpListener> {
    let candidates = rdv.listen_addrs();
    let mut backoff = net::attempts_backoff();
    loop {
        let mut last = None;
        for addr in &candidates {
            match bind(*addr) {
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

/// A listener as std binds one (address reuse on Unix, both IP versions on `[::]` where
/// the system allows), with a backlog of [`BACKLOG`] rather than std's 128.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Every rank is served, with a secret and without, through one poll.
    /// refusal is counted for the deadline's error.
    #[test]
    fn every_rank_is_served_with_a_secret_and_without() {
        use crate::secret::RendezvousSecret;
        for secret in [None, Some(RendezvousSecret::new([3u8; 16]).unwrap())] {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
                .unwrap()
                .timeout(Duration::from_secs(20));
            if let Some(s) = &secret {
                rdv = rdv.secret(s.clone());
            }
            let id = [1; 128];
            let got: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..6)
                    .map(|rank| {
                        let rdv = &rdv;
                        s.spawn(move || rdv.exchange_with(rank, 6, || Ok(id)))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(got.iter().all(|r| r.as_ref().ok() == Some(&id)), "{got:?}");
        }
    }

    #[test]
    fn the_deadline_names_the_missing_the_other_sizes_and_the_refused() {
        let mut t = Tally::default();
        let served: BTreeSet<usize> = [1, 3].into();
        assert_eq!(
            t.deadline_problem(5, &served, Duration::from_secs(2)),
            "did not hear from ranks 2, 4 within 2s"
        );
        let one: BTreeSet<usize> = [1, 2, 3].into();
        assert_eq!(
            t.deadline_problem(5, &one, Duration::from_secs(2)),
            "did not hear from rank 4 within 2s"
        );
        for r in 0..5 {
            t.wrong_size(r, 9);
        }
        t.refused = 1;
        t.note("x".into());
        assert_eq!(
            t.deadline_problem(5, &one, Duration::from_secs(2)),
            "did not hear from rank 4 within 2s; 5 greetings with another world size than \
             rank 0's 5 (rank 0 of 9, rank 1 of 9, rank 2 of 9, rank 3 of 9, …): every rank \
             must see the same world size; 1 connection refused for the rendezvous's secret \
             (a rank without it, or with another) (1 other connection ignored, the last: x)"
        );
        t.refused = 2;
        t.note("y".into());
        let text = t.deadline_problem(5, &one, Duration::from_secs(2));
        assert!(text.contains("2 connections refused"), "{text}");
        assert!(
            text.contains("(2 other connections ignored, the last: y)"),
            "{text}"
        );
    }

    /// A server over a fresh loopback listener, keeping at most `cap` connections, for
    /// ranks of 3 of the key `k`, without a secret.
    fn server(rdv: &Rendezvous, cap: usize) -> (Server<'_>, SocketAddr) {
        let offer = Box::leak(Box::new(Offer {
            address: Arc::from("127.0.0.1:1"),
            key: Arc::from("k"),
            size: 3,
            id: [0; 128],
            keys: None,
        }));
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let mut listener = PollListener::from_std(l);
        let poll = Poll::new().unwrap();
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .unwrap();
        let server = Server {
            rdv,
            offer,
            poll,
            listener,
            conns: Vec::new(),
            free: Vec::new(),
            live: 0,
            cap,
            round_trip: rdv.round_trip,
            silence: BTreeSet::new(),
            accept_pending: true,
            served: BTreeSet::new(),
            tally: Tally::default(),
        };
        (server, addr)
    }

    /// `n` connections to `addr`, left a moment to reach its backlog.
    fn connections(addr: SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
        let c = (0..n)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        c
    }

    /// Accepting takes connections up to the cap and leaves the rest in the backlog; a
    /// drained backlog stops the accepting until the listener says more came.
    #[test]
    fn accepting_stops_at_the_cap_and_at_an_empty_backlog() {
        let rdv = Rendezvous::tcp("127.0.0.1:1").unwrap();
        let (mut server, addr) = server(&rdv, 2);
        let clients = connections(addr, 3);
        server.accept();
        assert_eq!(server.live, 2);
        assert!(server.accept_pending, "the third waits in the backlog");
        server.close(0);
        server.accept();
        assert_eq!(server.live, 2);
        let (mut roomy, addr) = self::server(&rdv, 5);
        let more = connections(addr, 3);
        roomy.accept();
        assert_eq!(roomy.live, 3);
        assert!(!roomy.accept_pending, "the backlog is empty");
        drop((clients, more));
    }

    /// Rank 0 last heard connection `i` at `at`.
    fn heard_at(server: &mut Server<'_>, i: usize, at: Instant) {
        let c = server.conns[i].as_mut().unwrap();
        server.silence.remove(&(c.heard, i));
        c.heard = at;
        server.silence.insert((at, i));
    }

    /// Every slot held by a silent connection and a newer one waiting: the one silent
    /// longest makes room once silent past the round trip's allowance; younger ones do
    /// not.
    #[test]
    fn silent_connections_make_room_at_the_cap_once_past_a_round_trip() {
        let rdv = Rendezvous::tcp("127.0.0.1:1")
            .unwrap()
            .round_trip(Duration::from_secs(3));
        let (mut server, addr) = server(&rdv, 2);
        let silent = connections(addr, 2);
        server.accept();
        assert_eq!(server.live, 2);
        let mut honest = std::net::TcpStream::connect(addr).unwrap();
        honest
            .write_all(b"nccl-channel-rendezvous 1 hello k 1 2\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Young: nobody makes room.
        server.accept();
        assert_eq!(server.live, 2);
        assert!(server.accept_pending);
        // Silent for 2.9 s of 3: not yet.
        let not_yet = Instant::now() - Duration::from_millis(2900);
        heard_at(&mut server, 0, not_yet);
        server.accept();
        assert_eq!(server.conns[0].as_ref().map(|c| c.heard), Some(not_yet));
        assert_eq!(server.tally.last, None);
        // Silent for 3 s: it makes room, the one silent longest.
        heard_at(&mut server, 1, Instant::now() - Duration::from_millis(3100));
        heard_at(&mut server, 0, Instant::now() - Duration::from_secs(3));
        server.accept();
        assert_eq!(server.live, 2);
        assert!(server.conns[1].is_none() || server.conns[1].as_ref().unwrap().heard > not_yet);
        assert_eq!(
            server.conns[0].as_ref().map(|c| c.heard < not_yet),
            Some(true)
        );
        let last = server.tally.last.clone().unwrap_or_default();
        assert!(
            last.contains("gave its slot to a newer connection"),
            "{last}"
        );
        drop((silent, honest));
    }

    /// Every slot held by connections silent for 100 ms, far past a loopback round trip
    /// and far short of a second: the newer connections waiting in the backlog get their
    /// slots at once, the longest silent going first. Without one waiting, nobody goes.
    #[test]
    fn under_pressure_the_longest_silent_goes_once_past_a_round_trip() {
        let rdv = Rendezvous::tcp("127.0.0.1:1").unwrap();
        let (mut server, addr) = server(&rdv, 4);
        let silent = connections(addr, 4);
        server.accept();
        assert_eq!(server.live, 4);
        // Nobody waits: silent ones keep their slots.
        std::thread::sleep(Duration::from_millis(100));
        server.accept();
        assert_eq!(server.live, 4);
        assert_eq!(server.tally.count, 0);
        // Two newer ones wait: the two silent longest make room for them, at once.
        let newer = connections(addr, 2);
        server.accept();
        assert_eq!(server.live, 4);
        assert_eq!(server.tally.count, 2, "{:?}", server.tally.last);
        assert!(!server.accept_pending, "the backlog is drained");
        let last = server.tally.last.clone().unwrap_or_default();
        assert!(
            last.contains("gave its slot to a newer connection: no greeting"),
            "{last}"
        );
        drop((silent, newer));
    }

    /// A connection that greeted and was answered, then went silent, makes room like one
    /// that never greeted; one that spoke since it was last read is read first, and is
    /// no longer the longest silent; a rank sent the id without a secret is left
    /// EVICT_AFTER to ack it.
    #[test]
    fn a_greeted_then_silent_connection_makes_room_at_the_cap() {
        let rdv = Rendezvous::tcp("127.0.0.1:1").unwrap();
        let (mut server, addr) = server(&rdv, 2);
        let mut squatters = connections(addr, 2);
        for c in &mut squatters {
            c.write_all(b"nccl-channel-rendezvous 1 hello k 1 3\n")
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        server.accept();
        server.on_ready(0);
        server.on_ready(1);
        assert_eq!(server.live, 2);
        for c in server.conns.iter().flatten() {
            assert!(!c.talk.greeting(), "both greeted (and were sent the id)");
            assert_eq!(c.talk.awaits_ack(), Some(false));
        }
        let honest = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Sent the id 100 ms ago: their acks may still be on the way.
        server.accept();
        assert_eq!(server.live, 2);
        assert_eq!(server.tally.count, 0);
        heard_at(&mut server, 1, Instant::now() - EVICT_AFTER);
        server.accept();
        assert_eq!(server.live, 2);
        let last = server.tally.last.clone().unwrap_or_default();
        assert!(
            last.contains("gave its slot to a newer connection: no answer to rank 0"),
            "{last}"
        );
        // The one left acks now, unread: read before it could go, it is served.
        squatters[0]
            .write_all(b"nccl-channel-rendezvous 1 ack 1\n")
            .unwrap();
        let another = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        heard_at(&mut server, 0, Instant::now() - EVICT_AFTER);
        server.accept();
        assert!(server.served.contains(&1), "{:?}", server.tally.last);
        drop((squatters, honest, another));
    }

    /// A line of MAX_LINE bytes is read as a line (here: garbage, so ignored); one byte
    /// more is an over-long line, cut off unread.
    #[test]
    fn a_line_is_read_up_to_its_limit_and_cut_off_past_it() {
        let rdv = Rendezvous::tcp("127.0.0.1:1").unwrap();
        for (len, says) in [
            (MAX_LINE, "sent \"xxxx"),
            (MAX_LINE + 1, "sent an over-long line"),
        ] {
            let (mut server, addr) = server(&rdv, 4);
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            let mut line = vec![b'x'; len];
            line.push(b'\n');
            c.write_all(&line).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            server.accept();
            server.on_ready(0);
            assert_eq!(server.live, 0, "{len}");
            let last = server.tally.last.clone().unwrap_or_default();
            assert!(last.contains(says), "{len}: {last}");
        }
    }

    /// A line of exactly the limit waits for its end (it may still be a line); a peer that
    /// resets its connection is done with at once, not when its step runs out.
    #[test]
    fn a_line_at_the_limit_waits_for_its_end_and_a_reset_ends_at_once() {
        let rdv = Rendezvous::tcp("127.0.0.1:1").unwrap();
        let (mut server, addr) = server(&rdv, 4);
        let mut c = connections(addr, 1).remove(0);
        c.write_all(&[b'x'; MAX_LINE]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        server.accept();
        server.on_ready(0);
        assert_eq!(server.live, 1, "{:?}", server.tally.last);
        c.write_all(b"\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        server.on_ready(0);
        assert_eq!(server.live, 0);
        assert!(
            server
                .tally
                .last
                .as_deref()
                .unwrap_or_default()
                .contains("sent \"xxxx")
        );

        let reset = connections(addr, 1).remove(0);
        server.accept();
        assert_eq!(server.live, 1);
        socket2::SockRef::from(&reset)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(reset);
        std::thread::sleep(Duration::from_millis(100));
        server.on_ready(0);
        assert_eq!(server.live, 0, "{:?}", server.tally.last);
    }

    /// A connection that says nothing is dropped after STEP, and said so.
    #[test]
    fn a_silent_connection_is_dropped_after_its_step() {
        let rdv = Rendezvous::tcp("127.0.0.1:1").unwrap();
        let (mut server, addr) = server(&rdv, 4);
        let _silent = connections(addr, 1);
        server.accept();
        assert_eq!(server.live, 1);
        server.expire(Instant::now() + STEP - Duration::from_millis(500));
        assert_eq!(server.live, 1);
        server.expire(Instant::now() + STEP);
        assert_eq!(server.live, 0);
        let last = server.tally.last.clone().unwrap_or_default();
        assert!(
            last.ends_with("did not finish its lines within 5s"),
            "{last}"
        );
    }

    #[test]
    fn the_connections_open_at_once_leave_half_the_descriptors() {
        assert_eq!(cap_for(1024), 512);
        assert_eq!(cap_for(20000), 1024);
        assert_eq!(cap_for(2048), 1024);
        assert_eq!(cap_for(2046), 1023);
        assert_eq!(cap_for(10), 16);
        assert_eq!(cap_for(u64::MAX), MAX_CONNECTIONS);
        assert!((16..=MAX_CONNECTIONS).contains(&connection_cap()));
    }

    /// The backlog asked for is the one the socket gets (up to the kernel's cap): a
    /// burst of connections beyond std's 128 waits there, none refused.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_burst_beyond_128_connections_waits_in_the_backlog() {
        // The kernel caps every backlog at somaxconn (128 before Linux 5.4): there, ours
        // is std's, and there is nothing to tell apart.
        let somaxconn: i32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn < 512 {
            eprintln!("somaxconn is {somaxconn}: every backlog is capped there; nothing to check");
            return;
        }
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let streams: Vec<_> = (0..300)
            .map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)))
            .collect();
        let refused = streams.iter().filter(|s| s.is_err()).count();
        assert_eq!(refused, 0);
    }
}
