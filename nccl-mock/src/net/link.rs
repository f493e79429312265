//! A rank's connection to its hub in the multi-process mode: it ships the rank's parts
//! (the bytes it reads of its send buffer) and writes what the hub answers into its
//! receive buffer, through the driver's checked [`MockWorld::write_device`].
//!
//! A reader thread handles the hub's answers; it ends when the link is dropped (the
//! communicator destroyed or aborted) or the hub goes, failing every operation still
//! waiting with `ncclRemoteError`.

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cuda_mock::{MockWorld, WeakMockWorld};

use super::exit;
use super::thread::{spawn, stop};
use super::wire::{self, Msg};
use crate::parts::{Contrib, Done, input_bytes, output_bytes};
use crate::rma::{Arrival, Rma};
use nccl_sys::{ncclDataType_t, ncclResult_t};

/// Where an answer's bytes go: a receive buffer of the rank's simulated device.
struct Target {
    cuda: WeakMockWorld,
    ptr: u64,
    /// The bytes the operation writes there: an answer of another size is refused.
    len: usize,
    /// How the access is named in reports, e.g. `ncclAllGather on rank 1`.
    who: String,
}

/// An operation waiting for the hub.
struct Pending {
    done: Done,
    target: Option<Target>,
}

/// The longest a hub takes to answer a hello (it answers each at once, with the ranks still
/// missing or its welcome): past it, whatever listens at the address is no hub (another
/// program holds the port, and the rank that should host the hub failed to start it).
/// Generous, so that a hub slowed down by a loaded machine is never taken for one.
pub(crate) const HELLO_ANSWER: Duration = Duration::from_secs(10);

/// The longest a rank of the hub's own process waits for the hub to acknowledge its leave.
const LINGER: Duration = Duration::from_secs(10);

/// What the reader thread and the rank's calls share.
#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    next_op: u64,
    /// The hub's last word while the ranks gather: `Ok(devices)` once all came.
    welcome: Option<Result<Vec<i32>, (ncclResult_t, String)>>,
    /// Ranks not come yet, as the hub last said.
    missing: Option<Vec<u32>>,
    /// A peer aborted or its process went (the hub fails what needs it).
    peer_gone: bool,
    /// This rank aborted: its operations fail with a remote error.
    aborted: bool,
    /// The hub's connection closed: nothing more will be answered.
    closed: bool,
    /// Grow ids the coordinator published through the hub, by grow number.
    grow_ids: HashMap<u64, Vec<u8>>,
    /// The newest collective whose ranks disagreed, by number, and how (the hub's word).
    disagreement: Option<(u64, String)>,
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    /// Set by the reader once the hub's connection closed (the exit handler reads it).
    hub_closed: Arc<AtomicBool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Completes `done` with `rc` unless it already completed.
fn complete(done: &Done, rc: ncclResult_t) {
    let mut d = done.lock().unwrap_or_else(|e| e.into_inner());
    if d.is_none() {
        *d = Some(rc);
    }
}

fn new_done(rc: Option<ncclResult_t>) -> Done {
    Arc::new(Mutex::new(rc))
}

/// One rank's connection to its hub.
pub(crate) struct Link {
    shared: Arc<Shared>,
    /// This rank's one-sided state: the reader lands the puts other processes send.
    rma: Arc<Rma>,
    stream: TcpStream,
    rank: usize,
    /// The hub runs in this process: leaving waits for its acknowledgement, at most this
    /// long ([`super::hub::is_local`] says why).
    linger: Option<Duration>,
    /// Its entry with the exit handler, which leaves for it if the process ends first.
    exit_id: u64,
}

impl Link {
    /// Connects to the hub at `addr`, retrying while it is not there yet, until
    /// `deadline` or until `cancelled` says so (checked between attempts, each at most
    /// [`CONNECT_ATTEMPT`]); a write waits at most `write_timeout`.
    /// `Err`: why (for the last error).
    pub(crate) fn connect(
        addr: &str,
        rank: usize,
        (deadline, write_timeout): (Instant, Duration),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Link, ConnectError> {
        let stream = loop {
            match connect_once(addr, deadline) {
                // Retrying a local port nobody listens on can connect a socket to itself
                // (TCP simultaneous open): that is no hub.
                Ok(s) if s.local_addr().ok() == s.peer_addr().ok() => {
                    stop(&s);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(s) => break s,
                Err(e) => {
                    if cancelled() {
                        return Err(ConnectError::Cancelled);
                    }
                    if Instant::now() >= deadline {
                        return Err(ConnectError::Unreachable(e.to_string()));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        let _ = stream.set_nodelay(true);
        // A hub that stopped reading (its process stopped) must not block a rank forever.
        let _ = stream.set_write_timeout(Some(write_timeout));
        let reader_stream = stream
            .try_clone()
            .map_err(|e| ConnectError::Unreachable(e.to_string()))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            hub_closed: Arc::new(AtomicBool::new(false)),
        });
        let (s2, rma) = (shared.clone(), Arc::new(Rma::default()));
        let rma2 = rma.clone();
        spawn("mock-nccl-link", move || {
            serve(reader_stream, &s2, &rma2, rank)
        })
        .map_err(|e| ConnectError::Unreachable(e.to_string()))?;
        let linger = super::hub::is_local(addr).then(|| write_timeout.min(LINGER));
        let exit_id = exit::note_link(&stream, shared.hub_closed.clone());
        Ok(Link {
            shared,
            rma,
            stream,
            rank,
            linger,
            exit_id,
        })
    }

    /// Says hello and waits for every rank: each rank's device, or the refusal, the
    /// timeout (with the ranks still missing) or the cancellation.
    pub(crate) fn gather(
        &self,
        nranks: usize,
        device: i32,
        deadline: Instant,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Vec<i32>, GatherError> {
        let hello = Msg::Hello {
            nranks: nranks as u32,
            rank: self.rank as u32,
            device,
        };
        if let Err(e) = wire::send(&self.stream, &hello) {
            return Err(GatherError::Lost(e.to_string()));
        }
        let unanswered = Instant::now() + HELLO_ANSWER;
        loop {
            {
                let st = self.shared.lock();
                if let Some(w) = st.welcome.clone() {
                    return w.map_err(|(rc, msg)| GatherError::Refused(rc, msg));
                }
                if st.closed && st.missing.is_none() {
                    // Closed before the hub said a word: a listener that was closing (its
                    // communicator had just formed). The caller connects again.
                    return Err(GatherError::Unheard);
                }
                if st.closed {
                    return Err(GatherError::Lost("the hub closed the connection".into()));
                }
                let now = Instant::now();
                if st.missing.is_none() && now >= unanswered {
                    return Err(GatherError::NotAHub);
                }
                if now >= deadline {
                    return Err(GatherError::Timeout(st.missing.clone()));
                }
                // Short waits: a cancellation is only seen by polling.
                let wait = (deadline - now).min(Duration::from_millis(20));
                drop(self.shared.cond.wait_timeout(st, wait));
            }
            // Asked without this link's lock: it takes the world's.
            if cancelled() {
                return Err(GatherError::Cancelled);
            }
        }
    }

    /// Registers an operation; its number, or `None` (and `done` failed) when the link
    /// is broken.
    fn register(&self, done: &Done, target: Option<Target>) -> Option<u64> {
        let mut st = self.shared.lock();
        if st.aborted || st.closed {
            complete(done, ncclResult_t::ncclRemoteError);
            return None;
        }
        let op = st.next_op;
        st.next_op += 1;
        st.pending.insert(
            op,
            Pending {
                done: done.clone(),
                target,
            },
        );
        Some(op)
    }

    /// Sends `msg` for operation `op`; a failed send fails it (the hub is gone).
    fn ship(&self, op: u64, msg: &Msg) {
        if wire::send(&self.stream, msg).is_err() {
            let mut st = self.shared.lock();
            st.closed = true;
            if let Some(p) = st.pending.remove(&op) {
                complete(&p.done, ncclResult_t::ncclRemoteError);
            }
            self.shared.cond.notify_all();
        }
    }

    /// Submits this rank's part of collective `seq` (of `n` ranks): reads its input on
    /// `cuda` now and ships it. `cuda` is `None` to withdraw the part (refused by the
    /// sanitizer): the collective then fails for every rank. An illegal input fails this
    /// rank with `ncclUnhandledCudaError` (the driver reported why) and withdraws it.
    pub(crate) fn submit(
        &self,
        seq: u64,
        rank: usize,
        n: usize,
        c: Contrib,
        cuda: Option<&MockWorld>,
    ) -> Done {
        let done = new_done(None);
        let who = format!("{} on rank {rank}", c.call);
        let (input, withdrawn) = match cuda {
            None => (Vec::new(), true),
            Some(cuda) => match read_input(cuda, &who, c.send, input_bytes(&c, rank, n)) {
                Some(v) => (v, false),
                None => {
                    complete(&done, ncclResult_t::ncclUnhandledCudaError);
                    (Vec::new(), true)
                }
            },
        };
        let target = cuda.filter(|_| !withdrawn).map(|cuda| Target {
            cuda: cuda.downgrade(),
            ptr: c.recv as u64,
            len: output_bytes(&c, rank, n),
            who,
        });
        // A part failed here still goes to the hub, withdrawn, so its peers fail too;
        // its answer then completes a copy nobody waits for.
        let tracked = if withdrawn {
            new_done(None)
        } else {
            done.clone()
        };
        let Some(op) = self.register(&tracked, target) else {
            complete(&done, ncclResult_t::ncclRemoteError);
            return done;
        };
        let msg = Msg::Coll {
            op,
            seq,
            part: c,
            withdrawn,
            input,
        };
        self.ship(op, &msg);
        done
    }

    /// Posts a send to `peer` (reading it on `cuda` now) or a receive from `peer`;
    /// `cuda` is `None` to withdraw it, as for [`Link::submit`].
    #[allow(clippy::too_many_arguments)] // the transfer's arguments and the driver
    pub(crate) fn post(
        &self,
        is_send: bool,
        me: usize,
        peer: usize,
        ptr: usize,
        count: usize,
        dtype: ncclDataType_t,
        cuda: Option<&MockWorld>,
    ) -> Done {
        let done = new_done(None);
        let call = if is_send { "ncclSend" } else { "ncclRecv" };
        let who = format!("{call} on rank {me}");
        let len = count.saturating_mul(crate::dtype::size_of(dtype).unwrap_or(1));
        let (data, withdrawn) = match cuda {
            None => (Vec::new(), true),
            Some(_) if !is_send => (Vec::new(), false),
            Some(cuda) => match read_input(cuda, &who, ptr, len) {
                Some(v) => (v, false),
                None => {
                    complete(&done, ncclResult_t::ncclUnhandledCudaError);
                    (Vec::new(), true)
                }
            },
        };
        let target = cuda.filter(|_| !is_send && !withdrawn).map(|cuda| Target {
            cuda: cuda.downgrade(),
            ptr: ptr as u64,
            len,
            who,
        });
        let tracked = if withdrawn {
            new_done(None)
        } else {
            done.clone()
        };
        let Some(op) = self.register(&tracked, target) else {
            complete(&done, ncclResult_t::ncclRemoteError);
            return done;
        };
        let msg = Msg::P2p {
            op,
            is_send,
            peer: peer as u32,
            count: count as u64,
            dtype,
            withdrawn,
            data,
        };
        self.ship(op, &msg);
        done
    }

    /// This rank's one-sided state, shared with the reader.
    pub(crate) fn rma(&self) -> Arc<Rma> {
        self.rma.clone()
    }

    /// Ships a put (its window place, offset and bytes) or a plain signal to rank `to`
    /// (`withdrawn`: refused by this rank's sanitizer). It completes once shipped: the
    /// receiver's process lands it and counts its signal, in this rank's order.
    pub(crate) fn put(
        &self,
        to: usize,
        data: Option<(u64, u64, Vec<u8>)>,
        withdrawn: bool,
    ) -> ncclResult_t {
        {
            let st = self.shared.lock();
            if st.aborted || st.closed {
                return ncclResult_t::ncclRemoteError;
            }
        }
        let msg = Msg::Put {
            peer: to as u32,
            withdrawn,
            data,
        };
        if wire::send(&self.stream, &msg).is_err() {
            self.shared.lock().closed = true;
            self.shared.cond.notify_all();
            return ncclResult_t::ncclRemoteError;
        }
        ncclResult_t::ncclSuccess
    }

    /// Wakes the waits on this link (a one-sided operation completed one).
    pub(crate) fn wake(&self) {
        let _st = self.shared.lock();
        self.shared.cond.notify_all();
    }

    /// The newest collective whose ranks disagreed, by number, and how.
    pub(crate) fn disagreement(&self) -> Option<(u64, String)> {
        self.shared.lock().disagreement.clone()
    }

    /// Waits for `done` until `deadline` (`ncclSystemError` then, as in one process).
    pub(crate) fn wait(&self, done: &Done, deadline: Instant) -> ncclResult_t {
        let mut st = self.shared.lock();
        loop {
            if let Some(rc) = *done.lock().unwrap_or_else(|e| e.into_inner()) {
                return rc;
            }
            let now = Instant::now();
            if now >= deadline {
                return ncclResult_t::ncclSystemError;
            }
            st = self
                .shared
                .cond
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// This rank's communicator was aborted: the hub fails its peers' operations that
    /// need it, and this rank's own waiting operations fail now.
    pub(crate) fn abort(&self) {
        // Still known to the exit handler: a leave said at exit makes the hub close the
        // connection, which its process waits for.
        let _ = wire::send(&self.stream, &Msg::Abort);
        let mut st = self.shared.lock();
        st.aborted = true;
        fail_all(&mut st);
        self.shared.cond.notify_all();
    }

    /// Whether a peer aborted or went, or the hub went (the asynchronous error reports it).
    pub(crate) fn is_broken(&self) -> bool {
        let st = self.shared.lock();
        st.peer_gone || st.aborted || st.closed
    }

    /// Publishes the coordinator's grow id for grow number `seq` to every rank, through
    /// the hub (which echoes it to this rank too).
    pub(crate) fn publish_grow_id(&self, seq: u64, id: &[u8]) {
        self.shared.lock().grow_ids.insert(seq, id.to_vec());
        let _ = wire::send(
            &self.stream,
            &Msg::GrowId {
                seq,
                id: id.to_vec(),
            },
        );
    }

    /// Waits until `deadline` for the grow id of grow number `seq`; `None` then, or once
    /// the hub's connection closed or this rank aborted.
    pub(crate) fn grow_id(&self, seq: u64, deadline: Instant) -> Option<Vec<u8>> {
        let mut st = self.shared.lock();
        loop {
            if let Some(id) = st.grow_ids.get(&seq) {
                return Some(id.clone());
            }
            let now = Instant::now();
            if now >= deadline || st.closed || st.aborted {
                return None;
            }
            st = self
                .shared
                .cond
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Operations waiting for the hub's answer.
    pub(crate) fn pending(&self) -> usize {
        self.shared.lock().pending.len()
    }
}

impl Drop for Link {
    /// A destroyed communicator leaves (its peers' operations that need it fail) and
    /// closes the connection, which ends the reader thread at once. It is not joined: the
    /// last clique may go while the driver's lock is held (a graph dropping its captured
    /// work), and the reader may be waiting for that lock to write an answer.
    fn drop(&mut self) {
        exit::forget_link(self.exit_id);
        if !self.shared.lock().aborted
            && wire::send(&self.stream, &Msg::Leave).is_ok()
            && let Some(linger) = self.linger
        {
            // The hub closes the connection once it handled the leave.
            let deadline = Instant::now() + linger;
            let mut st = self.shared.lock();
            while !st.closed {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st = self
                    .shared
                    .cond
                    .wait_timeout(st, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
        }
        stop(&self.stream);
    }
}

/// The longest one connection attempt waits: a host that drops SYNs would otherwise keep
/// `connect` for minutes (the kernel's SYN retries), past the deadline and deaf to a
/// cancellation, which the caller checks between attempts.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// One attempt to connect to `addr`: each address it resolves to in turn, each for at
/// most the time left before `deadline` and [`CONNECT_ATTEMPT`]. The last error if none
/// connects.
fn connect_once(addr: &str, deadline: Instant) -> std::io::Result<TcpStream> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        let left = deadline.saturating_duration_since(Instant::now());
        // A zero timeout is refused: the last moment still gets one short try.
        let wait = left.min(CONNECT_ATTEMPT).max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&a, wait) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        let msg = format!("{addr} resolves to no address");
        std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
    }))
}

/// Why a rank could not reach its hub.
pub(crate) enum ConnectError {
    Unreachable(String),
    Cancelled,
}

/// Why a rank's hello did not end in a communicator.
pub(crate) enum GatherError {
    Refused(ncclResult_t, String),
    Lost(String),
    /// The connection closed before the hub answered the hello.
    Unheard,
    Timeout(Option<Vec<u32>>),
    /// Nothing answered the hello within [`HELLO_ANSWER`]: what listens is no hub.
    NotAHub,
    Cancelled,
}

/// Reads `len` bytes at `ptr` through the driver (which reports an illegal range).
fn read_input(cuda: &MockWorld, who: &str, ptr: usize, len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    cuda.read_device(who, ptr as u64, len).ok()
}

/// Fails every waiting operation with a remote error.
fn fail_all(st: &mut State) {
    for (_, p) in st.pending.drain() {
        complete(&p.done, ncclResult_t::ncclRemoteError);
    }
}

/// The reader thread: handles the hub's messages until the connection closes. `rank`:
/// this link's rank, whose puts from other processes land in `rma`.
fn serve(mut stream: TcpStream, shared: &Shared, rma: &Rma, rank: usize) {
    loop {
        let msg = match wire::recv(&mut stream) {
            Ok(m) => m,
            Err(e) => {
                let mut st = shared.lock();
                st.closed = true;
                shared.hub_closed.store(true, Ordering::Release);
                if e.kind() == std::io::ErrorKind::InvalidData && st.welcome.is_none() {
                    let why = format!("the hub sent a bad message ({e})");
                    st.welcome = Some(Err((ncclResult_t::ncclSystemError, why)));
                }
                fail_all(&mut st);
                drop(st);
                rma.cut();
                let _st = shared.lock();
                shared.cond.notify_all();
                return;
            }
        };
        match msg {
            Msg::Waiting { missing } => shared.lock().missing = Some(missing),
            Msg::Welcome { devices } => shared.lock().welcome = Some(Ok(devices)),
            Msg::Refused { rc, msg } => {
                shared.lock().welcome = Some(Err((ncclResult_t(rc), msg)));
            }
            Msg::Gone { rank: gone } => {
                shared.lock().peer_gone = true;
                rma.abort(gone as usize);
                // Taken once more so no waiter misses the wake-up below.
                drop(shared.lock());
            }
            // Landed outside the link's lock: the driver takes its own.
            Msg::Put {
                peer,
                withdrawn,
                data,
            } => {
                rma.arrive(Arrival {
                    to: rank,
                    from: peer as usize,
                    data,
                    withdrawn,
                });
                drop(shared.lock());
            }
            Msg::GrowId { seq, id } => {
                shared.lock().grow_ids.insert(seq, id);
            }
            Msg::Disagree { seq, why } => {
                shared.lock().disagreement = Some((seq, why));
            }
            Msg::Done { op, rc, data } => {
                let Some(p) = shared.lock().pending.remove(&op) else {
                    continue;
                };
                let mut rc = ncclResult_t(rc);
                // Written outside the lock: the driver takes its own.
                if let (Some(t), Some(data)) = (&p.target, &data)
                    && rc == ncclResult_t::ncclSuccess
                    && !data.is_empty()
                {
                    if data.len() != t.len {
                        // Not what the operation writes: a broken hub; nothing is written.
                        rc = ncclResult_t::ncclInternalError;
                    } else {
                        let written = t
                            .cuda
                            .upgrade()
                            .is_some_and(|cuda| cuda.write_device(&t.who, t.ptr, data).is_ok());
                        if !written {
                            rc = ncclResult_t::ncclUnhandledCudaError;
                        }
                    }
                }
                let _st = shared.lock();
                complete(&p.done, rc);
            }
            // Only a hub's messages are expected here; anything else is ignored.
            Msg::Hello { .. } | Msg::Coll { .. } | Msg::P2p { .. } | Msg::Abort | Msg::Leave => {}
        }
        shared.cond.notify_all();
    }
}
