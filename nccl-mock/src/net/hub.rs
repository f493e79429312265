//! The hub: rank 0's coordinator in the multi-process mode (NCCL's bootstrap root plays
//! this part). Ranks connect, say who they are, and once all have come the hub matches
//! their collective parts and send/receive pairs and computes every rank's output with
//! the same [`move_data`] as the in-process clique.
//!
//! One thread owns the hub's state and handles events one at a time; an accept thread
//! and one reader thread per connection feed it. The hub serves one communicator: it
//! stops listening once every rank has come (freeing the port, so a fixed
//! `NCCL_COMM_ID` can serve the next communicator), and ends with its last rank. A hub
//! nobody joins ends after its timeout.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::exit::{self, HubWatch};
use super::thread::{spawn, stop};
use super::wire::{self, Msg};
use crate::parts::{Buffers, Contrib, disagreement, input_bytes, move_data, p2p_refusal, results};
use nccl_sys::{ncclDataType_t, ncclResult_t};

/// The most ranks a hub takes (its tables grow with the count a hello claims).
const MAX_RANKS: usize = 1 << 16;

/// The hubs running in this process: each one's token (unique to it) and address. A rank
/// of the hub's own process waits, when it leaves, until the hub has handled that (see
/// [`is_local`]). Two hubs may share an address for a moment: a fixed `NCCL_COMM_ID`
/// serves the next communicator as soon as the last one formed, while that one's hub
/// still runs; each removes only its own entry when it ends.
static LOCAL: Mutex<Vec<(u64, SocketAddr)>> = Mutex::new(Vec::new());

/// The token of the next hub started in this process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

fn local() -> std::sync::MutexGuard<'static, Vec<(u64, SocketAddr)>> {
    LOCAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers a hub listening at `addr`; its token.
fn register(addr: SocketAddr) -> u64 {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    local().push((token, addr));
    token
}

/// Removes the entry of the hub with `token` (and no other hub's, even at its address).
fn unregister(token: u64) {
    local().retain(|(t, _)| *t != token);
}

/// Whether a hub of this process listens at `addr`. The answers of an operation go out
/// one rank after the other; a rank of the hub's process that got its answer first and
/// then ended the process would take the hub, and its peers' answers, with it. So such a
/// rank's leaving waits for the hub to acknowledge it, by which time every earlier answer
/// is written.
pub(crate) fn is_local(addr: &str) -> bool {
    let Ok(addrs) = addr.to_socket_addrs() else {
        return false;
    };
    let hubs = local();
    addrs.into_iter().any(|a| hubs.iter().any(|(_, h)| *h == a))
}

/// The longest rank 0 waits for a fixed hub address (`NCCL_COMM_ID`) that is in use.
/// How long the hub of a failed init still refuses late ranks once nobody is connected.
/// Shorter than [`BIND_RETRY`], so that a fixed address (`NCCL_COMM_ID`) is free again
/// for the next init's rank 0.
const FAILED_LINGER: Duration = Duration::from_secs(1);

pub(crate) const BIND_RETRY: Duration = Duration::from_secs(2);

/// Binds `addr`; while it is in use (`AddrInUse`), retries until `retry_until` (`None`:
/// fails at once). The error says how long it waited.
fn bind(addr: impl ToSocketAddrs, retry_until: Option<Instant>) -> std::io::Result<TcpListener> {
    let started = Instant::now();
    loop {
        match TcpListener::bind(&addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let Some(until) = retry_until else {
                    return Err(e);
                };
                let now = Instant::now();
                if now >= until {
                    let waited = now - started;
                    let msg = format!("{e} (still, after retrying for {waited:.1?})");
                    return Err(std::io::Error::new(e.kind(), msg));
                }
                std::thread::sleep((until - now).min(Duration::from_millis(20)));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Starts a hub listening on `addr`; its actual address (port 0 picks one). Parts are
/// waited for without end (each rank honours its own timeout); `timeout` bounds how long
/// a hub without ranks, or a connection that says nothing, is kept.
///
/// `retry_until`: while `addr` is in use, binding is retried until then (`None`: it fails
/// at once). Rank 0 of a fixed `NCCL_COMM_ID` retries briefly: the address may still be
/// held by a listener that is closing, the previous hub's there (of this process, or of
/// a process that is ending), or that of a hub whose communicator never formed, which
/// closes at its timeout. Ports left in `TIME_WAIT` by earlier connections are no
/// obstacle: `std` sets `SO_REUSEADDR` on listeners on Unix.
pub(crate) fn start(
    addr: impl ToSocketAddrs,
    timeout: Duration,
    retry_until: Option<Instant>,
) -> std::io::Result<SocketAddr> {
    let listener = bind(addr, retry_until)?;
    let local_addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let (tx, rx) = mpsc::channel();
    let accepting = Arc::new(AtomicBool::new(true));
    let acceptor = {
        let (tx, accepting) = (tx.clone(), accepting.clone());
        spawn("mock-nccl-hub-accept", move || {
            accept(&listener, &tx, &accepting)
        })?
    };
    let hub = Hub {
        timeout,
        events: tx,
        accepting,
        conns: HashMap::new(),
        next_conn: 0,
        nranks: None,
        ranks: Vec::new(),
        formed: false,
        failed: None,
        gone: Vec::new(),
        colls: HashMap::new(),
        sends: HashMap::new(),
        recvs: HashMap::new(),
        acceptor: Some(acceptor),
        threads: Vec::new(),
        watch: exit::note_hub(timeout),
    };
    let token = register(local_addr);
    let started = spawn("mock-nccl-hub", move || {
        hub.run(&rx);
        unregister(token);
    });
    if let Err(e) = started {
        unregister(token);
        return Err(e);
    }
    Ok(local_addr)
}

/// What the hub's thread is told.
enum Event {
    Conn(TcpStream),
    Msg(usize, Msg),
    Closed(usize),
}

/// Accepts connections until the hub stops it (then the listener closes).
fn accept(listener: &TcpListener, tx: &Sender<Event>, accepting: &AtomicBool) {
    while accepting.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(false).is_err() || tx.send(Event::Conn(stream)).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Reads a connection's frames until it closes or sends garbage (which closes it).
/// `first` bounds the wait for its first frame, so a silent connection goes.
fn read(id: usize, mut stream: TcpStream, tx: &Sender<Event>, first: Duration) {
    let _ = stream.set_read_timeout(Some(first));
    let mut hello = true;
    while let Ok(msg) = wire::recv(&mut stream) {
        if hello {
            hello = false;
            let _ = stream.set_read_timeout(None);
        }
        if tx.send(Event::Msg(id, msg)).is_err() {
            return;
        }
    }
    let _ = tx.send(Event::Closed(id));
}

/// One connection: a rank once its hello was accepted.
struct Conn {
    stream: TcpStream,
    rank: Option<usize>,
}

/// A rank's part of a collective waiting for its peers.
struct Part {
    conn: usize,
    op: u64,
    contrib: Contrib,
    withdrawn: bool,
    input: Vec<u8>,
}

/// A send or receive waiting for its other side.
struct P2p {
    conn: usize,
    op: u64,
    count: usize,
    dtype: ncclDataType_t,
    withdrawn: bool,
    data: Vec<u8>,
}

struct Hub {
    timeout: Duration,
    /// Kept so the channel never disconnects while the hub runs (recv_timeout's idle wait).
    events: Sender<Event>,
    accepting: Arc<AtomicBool>,
    conns: HashMap<usize, Conn>,
    next_conn: usize,
    /// The ranks the first hello asked for.
    nranks: Option<usize>,
    /// Each rank's connection and device, once its hello was accepted.
    ranks: Vec<Option<(usize, i32)>>,
    /// Every rank came; collectives run.
    formed: bool,
    /// The ranks disagreed and their init failed, why: the id is spent, a later hello is
    /// refused with the same reason, and the hub ends once the connections are gone.
    failed: Option<String>,
    /// Ranks that aborted, left or whose connection closed after the communicator formed.
    gone: Vec<usize>,
    colls: HashMap<u64, Vec<Option<Part>>>,
    sends: HashMap<(usize, usize), VecDeque<P2p>>,
    recvs: HashMap<(usize, usize), VecDeque<P2p>>,
    acceptor: Option<JoinHandle<()>>,
    /// The connections' reader threads.
    threads: Vec<JoinHandle<()>>,
    /// What the process's exit waits for (see `exit`).
    watch: Arc<HubWatch>,
}

impl Hub {
    fn run(mut self, rx: &Receiver<Event>) {
        let mut idle_since = Some(Instant::now());
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Event::Conn(stream)) => self.connected(stream),
                Ok(Event::Msg(id, msg)) => self.message(id, msg),
                Ok(Event::Closed(id)) => self.closed(id),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if !self.conns.is_empty() {
                idle_since = None;
            } else if self.formed {
                break;
            } else {
                // A failed init lingers briefly, to refuse its late ranks with the reason
                // (a grow's ranks come at once from several processes) rather than leave
                // them to time out on a closed port.
                let idle = match self.failed {
                    Some(_) => self.timeout.min(FAILED_LINGER),
                    None => self.timeout,
                };
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= idle {
                    break;
                }
            }
        }
        self.stop_accepting();
        for c in self.conns.values() {
            stop(&c.stream);
        }
        drop(self.events);
        for t in self.threads {
            let _ = t.join();
        }
        self.watch.ended.store(true, Ordering::Release);
    }

    /// Closes the listener: stops the accept thread and joins it.
    fn stop_accepting(&mut self) {
        self.accepting.store(false, Ordering::Release);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }

    fn connected(&mut self, stream: TcpStream) {
        let id = self.next_conn;
        self.next_conn += 1;
        let (Ok(reader), Ok(())) = (
            stream.try_clone(),
            stream.set_write_timeout(Some(self.timeout)),
        ) else {
            stop(&stream);
            return;
        };
        let tx = self.events.clone();
        let first = self.timeout;
        match spawn("mock-nccl-hub-conn", move || read(id, reader, &tx, first)) {
            Ok(t) => self.threads.push(t),
            Err(_) => {
                stop(&stream);
                return;
            }
        }
        // Threads of connections that already went are joined as they pile up.
        self.threads.retain(|t| !t.is_finished());
        self.conns.insert(id, Conn { stream, rank: None });
    }

    /// Sends `msg` to connection `id`; a connection that cannot take it is closed (its
    /// reader then reports it gone).
    fn tell(&self, id: usize, msg: &Msg) {
        if let Some(c) = self.conns.get(&id)
            && wire::send(&c.stream, msg).is_err()
        {
            stop(&c.stream);
        }
    }

    fn rank_of(&self, id: usize) -> Option<usize> {
        self.conns.get(&id).and_then(|c| c.rank)
    }

    fn message(&mut self, id: usize, msg: Msg) {
        match (self.rank_of(id), msg) {
            (
                None,
                Msg::Hello {
                    nranks,
                    rank,
                    device,
                },
            ) => self.hello(id, nranks as usize, rank as usize, device),
            (
                Some(r),
                Msg::Coll {
                    op,
                    seq,
                    part,
                    withdrawn,
                    input,
                },
            ) => self.coll(
                r,
                seq,
                Part {
                    conn: id,
                    op,
                    contrib: part,
                    withdrawn,
                    input,
                },
            ),
            (
                Some(r),
                Msg::P2p {
                    op,
                    is_send,
                    peer,
                    count,
                    dtype,
                    withdrawn,
                    data,
                },
            ) => {
                let p = P2p {
                    conn: id,
                    op,
                    count: count as usize,
                    dtype,
                    withdrawn,
                    data,
                };
                self.p2p(r, is_send, peer as usize, p);
            }
            (
                Some(r),
                Msg::Put {
                    peer,
                    withdrawn,
                    data,
                },
            ) => self.put(r, peer as usize, withdrawn, data),
            (Some(r), Msg::Abort) => self.lose(r, true),
            // The coordinator's grow id, for every rank (NCCL's `bcastGrowHandle`).
            (Some(_), msg @ Msg::GrowId { .. }) => self.tell_ranks(&msg),
            (Some(r), Msg::Leave) => {
                self.lose(r, false);
                // The acknowledgement: every answer before it is written (see `is_local`).
                if let Some(c) = self.conns.get(&id) {
                    stop(&c.stream);
                }
            }
            // Anything else is not how a rank talks: the connection goes.
            _ => {
                if let Some(c) = self.conns.get(&id) {
                    stop(&c.stream);
                }
            }
        }
    }

    fn refuse(&self, id: usize, rc: ncclResult_t, msg: String) {
        self.tell(id, &Msg::Refused { rc: rc.0, msg });
        if let Some(c) = self.conns.get(&id) {
            stop(&c.stream);
        }
    }

    fn missing(&self) -> Vec<u32> {
        (0..self.ranks.len())
            .filter(|&r| self.ranks[r].is_none())
            .map(|r| r as u32)
            .collect()
    }

    fn tell_ranks(&self, msg: &Msg) {
        for (conn, _) in self.ranks.iter().flatten() {
            self.tell(*conn, msg);
        }
    }

    fn hello(&mut self, id: usize, nranks: usize, rank: usize, device: i32) {
        if let Some(why) = &self.failed {
            let msg = format!("this id's init already failed: {why}");
            return self.refuse(id, ncclResult_t::ncclInvalidUsage, msg);
        }
        if self.formed {
            let msg = "the communicator of this id already formed".to_string();
            return self.refuse(id, ncclResult_t::ncclInvalidUsage, msg);
        }
        if nranks == 0 || nranks > MAX_RANKS {
            let msg = format!("invalid rank {rank} or nranks {nranks}");
            return self.refuse(id, ncclResult_t::ncclInvalidArgument, msg);
        }
        let expected = *self.nranks.get_or_insert(nranks);
        if nranks != expected {
            let msg = format!("rank {rank} asked for {nranks} ranks, another rank for {expected}");
            return self.fail_init(id, msg);
        }
        if self.ranks.len() != nranks {
            self.ranks = vec![None; nranks];
        }
        match self.ranks.get(rank) {
            None => {
                let msg = format!("invalid rank {rank} or nranks {nranks}");
                return self.refuse(id, ncclResult_t::ncclInvalidArgument, msg);
            }
            Some(Some(_)) => {
                let msg = format!("rank {rank} joined twice");
                return self.fail_init(id, msg);
            }
            Some(None) => {}
        }
        self.ranks[rank] = Some((id, device));
        if let Some(c) = self.conns.get_mut(&id) {
            c.rank = Some(rank);
        }
        let missing = self.missing();
        if missing.is_empty() {
            self.formed = true;
            self.watch.formed.store(true, Ordering::Release);
            // Nobody else may join, and the port is free again before any rank learns
            // the communicator formed (so the next one may bind it).
            self.stop_accepting();
            let devices = self.ranks.iter().flatten().map(|r| r.1).collect();
            self.tell_ranks(&Msg::Welcome { devices });
        } else {
            self.tell_ranks(&Msg::Waiting { missing });
        }
    }

    /// Ranks disagree (on the size, or two say they are the same rank): the init fails for
    /// every rank that came, as NCCL's bootstrap root gives up, rather than the others
    /// waiting out their deadline for a rank that did come.
    fn fail_init(&mut self, id: usize, msg: String) {
        let rc = ncclResult_t::ncclInvalidUsage;
        let joined: Vec<usize> = self.ranks.iter().flatten().map(|r| r.0).collect();
        for conn in joined.into_iter().chain([id]) {
            self.refuse(conn, rc, msg.clone());
            if let Some(c) = self.conns.get_mut(&conn) {
                c.rank = None;
            }
        }
        self.ranks.clear();
        self.nranks = None;
        self.failed = Some(msg);
        // Still accepting for a moment (see `FAILED_LINGER`): late ranks are refused
        // with the reason.
    }

    fn closed(&mut self, id: usize) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        stop(&c.stream);
        let Some(r) = c.rank else { return };
        if self.formed {
            // Gone without a word: its process died or it aborted.
            if !self.gone.contains(&r) {
                self.lose(r, true);
            }
        } else {
            // A rank that gave up before everyone came frees its place.
            if let Some(place) = self.ranks.get_mut(r) {
                *place = None;
            }
            if self.ranks.iter().all(Option::is_none) {
                self.nranks = None;
                self.ranks.clear();
            } else {
                let missing = self.missing();
                self.tell_ranks(&Msg::Waiting { missing });
            }
        }
    }

    fn done(&self, conn: usize, op: u64, rc: ncclResult_t, data: Option<Vec<u8>>) {
        self.tell(conn, &Msg::Done { op, rc: rc.0, data });
    }

    /// Rank `r` will take part in nothing more: everything waiting for it fails with a
    /// remote error, and so will everything that would need it. `loud`: it aborted or
    /// died, so its peers' asynchronous errors report it (a destroy does not).
    fn lose(&mut self, r: usize, loud: bool) {
        if !self.formed || self.gone.contains(&r) {
            return;
        }
        self.gone.push(r);
        if loud {
            // First, so a peer's failed operation finds its asynchronous error set.
            self.tell_ranks(&Msg::Gone { rank: r as u32 });
        }
        let remote = ncclResult_t::ncclRemoteError;
        for (_, parts) in std::mem::take(&mut self.colls) {
            for p in parts.iter().flatten() {
                self.done(p.conn, p.op, remote, None);
            }
        }
        for q in [&mut self.sends, &mut self.recvs] {
            let involved: Vec<(usize, usize)> = q
                .keys()
                .filter(|(s, d)| *s == r || *d == r)
                .copied()
                .collect();
            for k in involved {
                for p in q.remove(&k).unwrap_or_default() {
                    if let Some(c) = self.conns.get(&p.conn) {
                        let m = Msg::Done {
                            op: p.op,
                            rc: remote.0,
                            data: None,
                        };
                        if wire::send(&c.stream, &m).is_err() {
                            stop(&c.stream);
                        }
                    }
                }
            }
        }
    }

    fn coll(&mut self, r: usize, seq: u64, mut part: Part) {
        if !self.gone.is_empty() {
            return self.done(part.conn, part.op, ncclResult_t::ncclRemoteError, None);
        }
        let n = self.ranks.len();
        if part.input.len() != input_bytes(&part.contrib, r, n) {
            // Not what its part reads (a broken peer): the collective fails for all.
            part.withdrawn = true;
            part.input = Vec::new();
        }
        let parts = self
            .colls
            .entry(seq)
            .or_insert_with(|| std::iter::repeat_with(|| None).take(n).collect());
        let Some(place) = parts.get_mut(r) else {
            return;
        };
        if place.is_some() {
            // A rank's n-th collective twice: only a broken peer sends that.
            return self.done(part.conn, part.op, ncclResult_t::ncclInvalidUsage, None);
        }
        *place = Some(part);
        if !parts.iter().all(Option::is_some) {
            return;
        }
        let parts: Vec<Part> = self
            .colls
            .remove(&seq)
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        let (answers, why) = run(&parts);
        for (p, (rc, out)) in parts.iter().zip(answers) {
            if let Some(why) = &why {
                let why = why.clone();
                self.tell(p.conn, &Msg::Disagree { seq, why });
            }
            self.done(p.conn, p.op, rc, out);
        }
    }

    /// Forwards rank `r`'s one-sided put or signal to rank `to`'s process, in the order
    /// it came. A rank that is gone takes nothing (as in one process, the put still
    /// succeeds for its sender: nobody will wait for it there).
    fn put(&mut self, r: usize, to: usize, withdrawn: bool, data: Option<(u64, u64, Vec<u8>)>) {
        if self.gone.contains(&to) {
            return;
        }
        if let Some(Some((conn, _))) = self.ranks.get(to) {
            let msg = Msg::Put {
                peer: r as u32,
                withdrawn,
                data,
            };
            self.tell(*conn, &msg);
        }
    }

    fn p2p(&mut self, r: usize, is_send: bool, peer: usize, me: P2p) {
        let (src, dst) = if is_send { (r, peer) } else { (peer, r) };
        if peer >= self.ranks.len() {
            return self.done(me.conn, me.op, ncclResult_t::ncclInvalidArgument, None);
        }
        if self.gone.contains(&src) || self.gone.contains(&dst) {
            return self.done(me.conn, me.op, ncclResult_t::ncclRemoteError, None);
        }
        let other = if is_send {
            self.recvs
                .get_mut(&(src, dst))
                .and_then(VecDeque::pop_front)
        } else {
            self.sends
                .get_mut(&(src, dst))
                .and_then(VecDeque::pop_front)
        };
        let Some(other) = other else {
            let q = if is_send {
                &mut self.sends
            } else {
                &mut self.recvs
            };
            q.entry((src, dst)).or_default().push_back(me);
            return;
        };
        let (s, rv) = if is_send { (me, other) } else { (other, me) };
        let refusal = p2p_refusal(
            (s.count, s.dtype, s.withdrawn),
            (rv.count, rv.dtype, rv.withdrawn),
        );
        match refusal {
            Some(rc) => {
                self.done(s.conn, s.op, rc, None);
                self.done(rv.conn, rv.op, rc, None);
            }
            None => {
                self.done(s.conn, s.op, ncclResult_t::ncclSuccess, None);
                self.done(rv.conn, rv.op, ncclResult_t::ncclSuccess, Some(s.data));
            }
        }
    }
}

/// The bytes the ranks shipped, as the collective's [`Buffers`]: what each rank read of
/// its send buffer, and what each is to write to its receive buffer.
struct Shipped<'a> {
    parts: &'a [Part],
    outputs: Vec<Option<Vec<u8>>>,
    failed: Vec<bool>,
}

impl Buffers for Shipped<'_> {
    fn input(&mut self, rank: usize, len: usize) -> Option<Vec<u8>> {
        match self.parts.get(rank) {
            Some(p) if p.input.len() == len => Some(p.input.clone()),
            // Not what the collective reads: a peer that disagrees on its size.
            _ => {
                if let Some(f) = self.failed.get_mut(rank) {
                    *f = true;
                }
                None
            }
        }
    }

    fn output(&mut self, rank: usize, data: &[u8]) {
        if let Some(o) = self.outputs.get_mut(rank) {
            *o = Some(data.to_vec());
        }
    }
}

/// A rank's result and output.
type Answer = (ncclResult_t, Option<Vec<u8>>);

/// Runs a collective whose parts are all in (rank order): each rank's result and output,
/// and how the ranks disagree if they do ([`disagreement`]).
fn run(parts: &[Part]) -> (Vec<Answer>, Option<String>) {
    let n = parts.len();
    if parts.iter().any(|p| p.withdrawn) {
        return (vec![(ncclResult_t::ncclRemoteError, None); n], None);
    }
    let contribs: Vec<Contrib> = parts.iter().map(|p| p.contrib).collect();
    if let Some(why) = disagreement(&contribs) {
        return (vec![(ncclResult_t::ncclInvalidUsage, None); n], Some(why));
    }
    let mut mem = Shipped {
        parts,
        outputs: vec![None; n],
        failed: vec![false; n],
    };
    move_data(&mut mem, &contribs);
    let rcs = results(&mem.failed);
    let failed = rcs.iter().any(|rc| *rc != ncclResult_t::ncclSuccess);
    let answers = rcs
        .into_iter()
        .zip(mem.outputs)
        .map(|(rc, out)| (rc, if failed { None } else { out }))
        .collect();
    (answers, None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::parts::{Kind, Op};
    use nccl_sys::ncclRedOp_t;

    /// A hand-driven rank: speaks the wire protocol directly, as a broken peer could.
    fn client(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn hello(s: &TcpStream, nranks: u32, rank: u32) {
        let m = Msg::Hello {
            nranks,
            rank,
            device: 0,
        };
        wire::send(s, &m).unwrap();
    }

    /// The next message other than a `Waiting`.
    fn answer(s: &TcpStream) -> Msg {
        loop {
            match wire::recv(s).unwrap() {
                Msg::Waiting { .. } => {}
                m => return m,
            }
        }
    }

    fn sum(count: usize) -> Contrib {
        Contrib {
            call: "ncclAllReduce",
            kind: Kind::AllReduce,
            send: 0,
            recv: 0,
            count,
            dtype: ncclDataType_t::ncclInt32,
            op: Op::Builtin(ncclRedOp_t::ncclSum),
            root: 0,
            placed: Default::default(),
        }
    }

    fn coll(s: &TcpStream, op: u64, seq: u64, input: Vec<u8>) {
        let m = Msg::Coll {
            op,
            seq,
            part: sum(1),
            withdrawn: false,
            input,
        };
        wire::send(s, &m).unwrap();
    }

    #[test]
    fn a_hub_survives_broken_ranks_and_computes_for_good_ones() {
        let addr = start(("127.0.0.1", 0), Duration::from_secs(10), None).unwrap();

        // A hello claiming four billion ranks is refused, not allocated for.
        let greedy = client(addr);
        hello(&greedy, u32::MAX, 0);
        let refused = ncclResult_t::ncclInvalidArgument.0;
        assert!(matches!(answer(&greedy), Msg::Refused { rc, .. } if rc == refused));

        let (a, b) = (client(addr), client(addr));
        hello(&a, 2, 0);
        hello(&b, 2, 1);
        let welcome = Msg::Welcome {
            devices: vec![0, 0],
        };
        assert_eq!(answer(&a), welcome);
        assert_eq!(answer(&b), welcome);

        // A part whose bytes are not what it reads fails the collective for everyone.
        coll(&a, 1, 0, 5i32.to_le_bytes().to_vec());
        coll(&b, 7, 0, vec![1, 2, 3]);
        let remote = ncclResult_t::ncclRemoteError.0;
        let failed = |op| Msg::Done {
            op,
            rc: remote,
            data: None,
        };
        assert_eq!(answer(&a), failed(1));
        assert_eq!(answer(&b), failed(7));

        // Good parts: each rank gets the sum.
        coll(&a, 2, 1, 5i32.to_le_bytes().to_vec());
        coll(&b, 8, 1, 37i32.to_le_bytes().to_vec());
        let sum = |op| Msg::Done {
            op,
            rc: 0,
            data: Some(42i32.to_le_bytes().to_vec()),
        };
        assert_eq!(answer(&a), sum(2));
        assert_eq!(answer(&b), sum(8));

        // A rank that sends what no rank sends after its hello loses its connection;
        // its peer hears it is gone and its waiting part fails.
        coll(&a, 3, 2, 1i32.to_le_bytes().to_vec());
        wire::send(&b, &Msg::Welcome { devices: vec![] }).unwrap();
        assert_eq!(answer(&a), Msg::Gone { rank: 1 });
        assert_eq!(answer(&a), failed(3));
        // Later ones fail at once.
        coll(&a, 4, 3, 1i32.to_le_bytes().to_vec());
        assert_eq!(answer(&a), failed(4));
    }

    /// Regression: a hub that ended removed every hub's entry at its address, so a hub
    /// started there after the last one's communicator formed (a fixed `NCCL_COMM_ID`)
    /// was no longer known as local once the old one ended, and its own ranks' leaves
    /// stopped waiting for it.
    #[test]
    fn an_old_hub_ending_leaves_the_new_hub_at_its_address_registered() {
        let entries = |addr: SocketAddr| local().iter().filter(|(_, a)| *a == addr).count();
        let timeout = Duration::from_secs(10);
        let old = start(("127.0.0.1", 0), timeout, None).unwrap();
        let a = client(old);
        hello(&a, 1, 0);
        assert_eq!(answer(&a), Msg::Welcome { devices: vec![0] });
        // Formed: the old hub no longer listens, and still runs while its rank is there.
        let until = Instant::now() + Duration::from_secs(2);
        let new = start(old, timeout, Some(until)).unwrap();
        assert_eq!(new, old);
        assert_eq!(entries(old), 2);
        assert!(is_local(&old.to_string()));

        // The old hub's rank goes, and so does the old hub.
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(10);
        while entries(old) == 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(entries(old), 1, "the new hub's entry went with the old hub");
        assert!(is_local(&old.to_string()));

        // The new hub serves its own communicator, then ends with it.
        let b = client(new);
        hello(&b, 1, 0);
        assert_eq!(answer(&b), Msg::Welcome { devices: vec![0] });
        drop(b);
        while entries(old) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(entries(old), 0);
    }

    /// A rank connected before the ranks disagreed but says hello after: it is refused
    /// with the reason at once, rather than starting a new gathering on the spent hub and
    /// waiting out its deadline for "missing" ranks (found in review).
    #[test]
    fn a_hello_after_the_init_failed_is_refused_with_the_reason() {
        let addr = start(("127.0.0.1", 0), Duration::from_secs(10), None).unwrap();
        let a = client(addr);
        let late = client(addr);
        hello(&a, 3, 0);
        std::thread::sleep(Duration::from_millis(100));
        let b = client(addr);
        hello(&b, 2, 1);
        let refused = |msg: &str| Msg::Refused {
            rc: ncclResult_t::ncclInvalidUsage.0,
            msg: msg.into(),
        };
        assert_eq!(
            answer(&b),
            refused("rank 1 asked for 2 ranks, another rank for 3")
        );
        assert_eq!(
            answer(&a),
            refused("rank 1 asked for 2 ranks, another rank for 3")
        );
        hello(&late, 3, 2);
        match wire::recv(&late) {
            Ok(Msg::Refused { rc, msg }) => {
                assert_eq!(rc, ncclResult_t::ncclInvalidUsage.0);
                assert_eq!(
                    msg,
                    "this id's init already failed: rank 1 asked for 2 ranks, another rank for 3"
                );
            }
            other => panic!("the late rank got {other:?} instead of the refusal"),
        }
    }
}
