//! `rendezvous-scale`: many ranks through one [`Rendezvous`] on 127.0.0.1, as threads of
//! this process or as processes, with the arrival patterns of large jobs; prints how long
//! it took, per rank and in all, what rank 0's process held (sockets, threads, memory, CPU)
//! and the kernel's TCP counters over the run.
//!
//! ```text
//! rendezvous-scale --threads   [--ranks 4096] [--secret] [--burst B --gap-ms G]
//!                  [--late K|P% --late-ms L] [--rank0-late-ms M] [--timeout-s T]
//!                  [--nofile N] [--own-netns]
//! rendezvous-scale --processes [--ranks 256]  (the same options)
//! ```
//!
//! Every rank calls `exchange_with` and every rank must get the same id. By default rank 0
//! starts first and the others once it listens; `--rank0-late-ms` starts it after the
//! last of them instead (they retry until it is up). `--processes` starts this program
//! once per rank and lets each start its exchange on the schedule, so process start-up is
//! not in the times. `--own-netns` (root) gives the run a network namespace of its own, so
//! that the TCP counters are its alone. The output ends with the figures as `key=value`
//! (the `summary` line) and as a row of BENCHMARKS.md's table ("Rendezvous at scale"), under
//! the table's header; `scripts/rendezvous-scale` runs every case of that table.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{CommandFactory, Parser};
use nccl_rendezvous::{Id, Rendezvous, RendezvousSecret};

/// Runs many ranks through one rendezvous and reports what it cost.
#[derive(Parser, Debug)]
#[command(name = "rendezvous-scale")]
struct Opts {
    /// The ranks are threads of this process (default 4096 ranks).
    #[arg(long, conflicts_with = "processes")]
    threads: bool,
    /// The ranks are processes, this program started once per rank (default 256 ranks).
    #[arg(long)]
    processes: bool,
    /// Ranks, rank 0 included.
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..))]
    ranks: Option<u64>,
    /// Authenticates the exchange with a fresh secret (processes: read from a 0600 file
    /// in a 0700 directory, removed at the end).
    #[arg(long)]
    secret: bool,
    /// Ranks 1.. start in bursts of this many (default: all at once).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    burst: Option<u64>,
    /// Milliseconds between the starts of two bursts.
    #[arg(long, default_value_t = 0)]
    gap_ms: u64,
    /// This many of ranks 1.. (a count, or a share such as `5%`) start `--late-ms` after
    /// the last of the others.
    #[arg(long)]
    late: Option<Late>,
    /// How late the `--late` ranks start (ms).
    #[arg(long, default_value_t = 2000)]
    late_ms: u64,
    /// Rank 0 starts this many ms after the last other rank (default: it starts first,
    /// the others once it listens).
    #[arg(long)]
    rank0_late_ms: Option<u64>,
    /// Every rank's deadline (seconds).
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Pause between two samples of rank 0's process (µs).
    #[arg(long, default_value_t = 1000)]
    sample_us: u64,
    /// The soft limit on descriptors of the ranks' processes (default: raised to the hard
    /// limit), to see a rank 0 under the common default of 1024.
    #[arg(long)]
    nofile: Option<u64>,
    /// The sampling thread's nice value (below 0 needs root): on busy cores it keeps the
    /// samples near `--sample-us` apart. 0 leaves it.
    #[arg(long, default_value_t = -20, allow_negative_numbers = true)]
    monitor_nice: i32,
    /// Runs in a network namespace of its own (needs CAP_SYS_ADMIN, as root has), so that
    /// the TCP counters count this run alone.
    #[arg(long)]
    own_netns: bool,
    /// A rank started by `--processes`: its number.
    #[arg(long, hide = true)]
    rank: Option<usize>,
    /// A rank started by `--processes`: the rendezvous's port.
    #[arg(long, hide = true)]
    port: Option<u16>,
    /// A rank started by `--processes`: when it starts after the go (µs).
    #[arg(long, hide = true, default_value_t = 0)]
    offset_us: u64,
    /// A rank started by `--processes`: the secret's file.
    #[arg(long, hide = true)]
    secret_file: Option<PathBuf>,
    /// Threads only: an attacker on loopback keeps this many connections to rank 0 open
    /// while the ranks come, each greeting as rank 1 of this exchange (rank 0 answers with
    /// a challenge when it holds a secret) and then saying nothing; one that rank 0 drops is
    /// opened again at once. 1024 take rank 0's slots, up to 4096 more its backlog.
    #[arg(long)]
    flood: Option<usize>,
}

/// The attacker of `--flood`: its connections, opened again as rank 0 drops them, until
/// `stop` or `until`. Only ever connects to 127.0.0.1.
struct Flood {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(usize, usize)>,
}

impl Flood {
    /// Opens `count` greeted connections to 127.0.0.1:`port` (each connect bounded by
    /// 200 ms), then keeps them open; returns once the first `count` were tried.
    fn start(port: u16, count: usize, size: usize, until: Instant) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(Gate::default());
        let (stop2, ready2) = (stop.clone(), ready.clone());
        let handle = std::thread::spawn(move || {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let hello = format!(
                "nccl-channel-rendezvous 2 hello nccl-channel#0 1 {size} {}\n",
                "00".repeat(32)
            );
            let open = || -> Option<std::net::TcpStream> {
                let c =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
                (&c).write_all(hello.as_bytes()).ok()?;
                c.set_nonblocking(true).ok()?;
                Some(c)
            };
            let mut conns: Vec<Option<std::net::TcpStream>> = Vec::with_capacity(count);
            for _ in 0..count {
                if stop2.load(Ordering::Relaxed) || Instant::now() >= until {
                    break;
                }
                conns.push(open());
            }
            let opened = conns.iter().flatten().count();
            ready2.open(0);
            let mut reopened = 0;
            let mut buf = [0u8; 512];
            while !stop2.load(Ordering::Relaxed) && Instant::now() < until {
                for slot in &mut conns {
                    let gone = match slot {
                        Some(c) => match c.read(&mut buf) {
                            Ok(0) => true,
                            Ok(_) => false,
                            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                        },
                        None => true,
                    };
                    if gone && !stop2.load(Ordering::Relaxed) {
                        *slot = open();
                        reopened += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (opened, reopened)
        });
        ready.wait();
        Flood { stop, handle }
    }

    /// Stops it: how many connections it first held, and how many it opened again.
    fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or((0, 0))
    }
}

/// How many ranks start late: a count, or a share of ranks 1...
#[derive(Clone, Copy, Debug)]
enum Late {
    Count(usize),
    Percent(f64),
}

impl FromStr for Late {
    type Err = String;
    fn from_str(s: &str) -> Result<Late, String> {
        let bad = || format!("{s:?} is neither a count nor a percentage such as 5%");
        match s.strip_suffix('%') {
            Some(p) => match p.parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => Ok(Late::Percent(p)),
                _ => Err(bad()),
            },
            None => s.parse().map(Late::Count).map_err(|_| bad()),
        }
    }
}

/// When each rank starts, from the options.
struct Plan {
    ranks: usize,
    /// Per rank, its start after the go. The go is rank 0's listening when it starts first.
    offsets: Vec<Duration>,
    rank0_first: bool,
    /// The arrival pattern in words, for the report and the table.
    arrival: String,
}

impl Plan {
    fn new(o: &Opts, ranks: usize) -> Result<Plan, String> {
        let others = ranks - 1;
        let late = match o.late {
            None => 0,
            Some(Late::Count(k)) => k,
            Some(Late::Percent(p)) => (p / 100.0 * others as f64).round() as usize,
        };
        if late > others {
            return Err(format!(
                "--late {late} is more than the {others} ranks besides 0"
            ));
        }
        let on_time = others - late;
        let burst = o.burst.map_or(on_time.max(1), |b| b as usize);
        let gap = Duration::from_millis(o.gap_ms);
        let mut offsets = vec![Duration::ZERO; ranks];
        for (j, slot) in offsets[1..=on_time].iter_mut().enumerate() {
            *slot = gap * (j / burst) as u32;
        }
        let last_on_time = offsets[on_time];
        for slot in &mut offsets[on_time + 1..] {
            *slot = last_on_time + Duration::from_millis(o.late_ms);
        }
        let mut words = Vec::new();
        if o.burst.is_some() && burst < on_time {
            words.push(format!("bursts of {burst}, {} ms apart", o.gap_ms));
        } else {
            words.push("all at once".to_string());
        }
        if late > 0 {
            let share = match o.late {
                Some(Late::Percent(p)) => format!("{p}% ({late})"),
                _ => late.to_string(),
            };
            words.push(format!("{share} late by {} ms", o.late_ms));
        }
        if let Some(m) = o.rank0_late_ms {
            let last = offsets.iter().max().copied().unwrap_or_default();
            offsets[0] = last + Duration::from_millis(m);
            words.push(format!("rank 0 {m} ms after the last"));
        }
        Ok(Plan {
            ranks,
            offsets,
            rank0_first: o.rank0_late_ms.is_none(),
            arrival: words.join(", "),
        })
    }
}

/// One rank's exchange: start and end in ns since the Unix epoch, and the id (hex) or
/// the error.
struct RankTime {
    rank: usize,
    start_ns: u64,
    end_ns: u64,
    result: Result<String, String>,
}

/// What rank 0's process held during the exchange, sampled by [`Monitor`].
#[derive(Clone, Debug, Default)]
struct Rank0 {
    /// When its socket was first seen listening (ns since the Unix epoch).
    listen_ns: u64,
    /// The listening socket's backlog as `ss` reports it (Send-Q).
    backlog: u64,
    /// Socket descriptors of the process (threads: the clients' too).
    socket_fds: u64,
    /// Sockets on the rendezvous's port that a descriptor of this process holds (the
    /// listener left out): rank 0's side of the connections alone.
    server_sockets: u64,
    /// Connections the kernel completed that rank 0 had not accepted yet.
    accept_queue: u64,
    /// Handshakes in progress on the port (SYN received, not acknowledged).
    syn_recv: u64,
    /// Threads of the process, the rank threads left out, at the start and at the peak:
    /// the difference is what the server started.
    threads_before: u64,
    threads: u64,
    rss_before_kib: u64,
    rss_kib: u64,
    vm_hwm_kib: u64,
    /// CPU time of the process during the exchange (user + system), the sampling thread's
    /// own left out.
    cpu_ms: u64,
    /// The sampling thread's CPU time.
    monitor_cpu_ms: u64,
    samples: u64,
    sample_period_us: u64,
    /// What one sample took on average (µs): the rest of the period is the pause and
    /// waiting for a core.
    sample_cost_us: u64,
    /// Samples that counted the connections and handshakes (see [`FULL_SAMPLE_EVERY`]).
    full_samples: u64,
    /// 1 if the sampling thread got its `--monitor-nice`.
    nice: u64,
}

/// The names of [`Rank0::fields`], in order, for `rank0 key=value ...`.
const RANK0_FIELDS: [&str; 18] = [
    "listen_ns",
    "backlog",
    "socket_fds",
    "server_sockets",
    "accept_queue",
    "syn_recv",
    "threads_before",
    "threads",
    "rss_before_kib",
    "rss_kib",
    "vm_hwm_kib",
    "cpu_ms",
    "monitor_cpu_ms",
    "samples",
    "sample_period_us",
    "sample_cost_us",
    "full_samples",
    "nice",
];

impl Rank0 {
    fn fields(&mut self) -> [&mut u64; 18] {
        [
            &mut self.listen_ns,
            &mut self.backlog,
            &mut self.socket_fds,
            &mut self.server_sockets,
            &mut self.accept_queue,
            &mut self.syn_recv,
            &mut self.threads_before,
            &mut self.threads,
            &mut self.rss_before_kib,
            &mut self.rss_kib,
            &mut self.vm_hwm_kib,
            &mut self.cpu_ms,
            &mut self.monitor_cpu_ms,
            &mut self.samples,
            &mut self.sample_period_us,
            &mut self.sample_cost_us,
            &mut self.full_samples,
            &mut self.nice,
        ]
    }

    /// `rank0 key=value ...`, as a rank process prints it.
    fn line(&self) -> String {
        let mut me = self.clone();
        let mut line = "rank0".to_string();
        for (name, value) in RANK0_FIELDS.iter().zip(me.fields()) {
            let _ = write!(line, " {name}={value}");
        }
        line
    }

    fn parse(line: &str) -> Option<Rank0> {
        let rest = line.strip_prefix("rank0 ")?;
        let mut r = Rank0::default();
        let values: BTreeMap<&str, u64> = rest
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect();
        for (name, slot) in RANK0_FIELDS.iter().zip(r.fields()) {
            *slot = *values.get(name)?;
        }
        Some(r)
    }
}

/// Samples rank 0's process from a thread of its own, every `pause`, until stopped.
struct Monitor {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Rank0>,
    cpu_before_ms: u64,
}

impl Monitor {
    /// `inodes`: count rank 0's sockets by their descriptors' inodes (a process of its
    /// own); else by descriptors opened since (threads: all sockets are the process's).
    /// `ranks`: rank threads in the process, which the thread count leaves out.
    /// Returns once the first sample is taken. `nice`: the sampling thread's (0 leaves it).
    fn start(port: u16, pause: Duration, nice: i32, inodes: bool, ranks: u64) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let cpu_before_ms = cpu_ms();
        let flag = stop.clone();
        let (sampled, first_sample) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let nice = nice != 0 && set_nice(nice);
            let mut r = sample(port, pause, inodes, ranks, &flag, || {
                let _ = sampled.send(());
            });
            r.nice = u64::from(nice);
            r
        });
        let _ = first_sample.recv();
        Monitor {
            stop,
            thread,
            cpu_before_ms,
        }
    }

    fn finish(self) -> Rank0 {
        self.stop.store(true, Ordering::Release);
        let mut r = self.thread.join().unwrap_or_default();
        r.vm_hwm_kib = proc_status().get("VmHWM").copied().unwrap_or(0);
        r.cpu_ms = cpu_ms()
            .saturating_sub(self.cpu_before_ms)
            .saturating_sub(r.monitor_cpu_ms);
        r
    }
}

/// How often the connections on the port are counted: that walks the kernel's whole
/// table of connected sockets (1-4 ms here), where the listener alone costs 20-40 µs.
const FULL_SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// The monitor's loop; `first` is called after the first sample, which [`Monitor::start`]
/// waits for: what it reads comes before the exchange.
fn sample(
    port: u16,
    pause: Duration,
    inodes: bool,
    ranks: u64,
    stop: &AtomicBool,
    first: impl FnOnce(),
) -> Rank0 {
    let started = Instant::now();
    let threads = |status: &BTreeMap<String, u64>| {
        let all = status.get("Threads").copied().unwrap_or(0);
        all.saturating_sub(ranks)
    };
    let status = proc_status();
    let mut r = Rank0 {
        threads_before: threads(&status),
        rss_before_kib: status.get("VmRSS").copied().unwrap_or(0),
        ..Rank0::default()
    };
    let base = if inodes { 0 } else { socket_fds(false, 0).0 };
    let mut first = Some(first);
    let mut cost = Duration::ZERO;
    let mut last_full: Option<Instant> = None;
    loop {
        // Read before the sample, so that one always follows the stop.
        let last = stop.load(Ordering::Acquire);
        let t = Instant::now();
        let (fds, owned) = socket_fds(inodes, base);
        r.socket_fds = r.socket_fds.max(fds);
        let listener = port_sockets(port, None, true);
        r.accept_queue = r.accept_queue.max(listener.accept_queue);
        r.backlog = r.backlog.max(listener.backlog);
        if listener.listening && r.listen_ns == 0 {
            r.listen_ns = unix_ns();
        }
        if last || last_full.is_none_or(|f| f.elapsed() >= FULL_SAMPLE_EVERY) {
            let net = port_sockets(port, owned.as_ref(), false);
            r.server_sockets = r.server_sockets.max(net.open);
            r.syn_recv = r.syn_recv.max(net.syn_recv);
            r.full_samples += 1;
            last_full = Some(Instant::now());
        }
        let status = proc_status();
        r.threads = r.threads.max(threads(&status));
        r.rss_kib = r.rss_kib.max(status.get("VmRSS").copied().unwrap_or(0));
        r.samples += 1;
        cost += t.elapsed();
        if let Some(f) = first.take() {
            f();
        }
        if last {
            break;
        }
        std::thread::sleep(pause);
    }
    r.sample_period_us = (started.elapsed().as_micros() as u64) / r.samples.max(1);
    r.sample_cost_us = (cost.as_micros() as u64) / r.samples.max(1);
    r.monitor_cpu_ms = thread_cpu_ms();
    r
}

/// This process's socket descriptors and, when `inodes`, their inodes. Without, the
/// count is of every descriptor less `base` (those open before the ranks started): one
/// `readlink` per descriptor is too slow for 1 ms samples of 8000.
fn socket_fds(inodes: bool, base: u64) -> (u64, Option<HashSet<u64>>) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return (0, None);
    };
    if !inodes {
        return ((dir.count() as u64).saturating_sub(base), None);
    }
    let set: HashSet<u64> = dir
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|t| {
            t.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    (set.len() as u64, Some(set))
}

/// The IPv4 TCP sockets of one local port, from the kernel's socket diagnostics.
#[derive(Default)]
struct PortSockets {
    listening: bool,
    /// The listener's backlog (what `ss -ltn` shows as Send-Q).
    backlog: u64,
    /// Connections the kernel completed that the listener has not accepted (Recv-Q).
    accept_queue: u64,
    syn_recv: u64,
    /// Connections held by a descriptor (of `owned`, when given).
    open: u64,
}

/// `listener_only`: the listening socket alone (cheap: no walk of the connections).
fn port_sockets(port: u16, owned: Option<&HashSet<u64>>, listener_only: bool) -> PortSockets {
    let mut s = PortSockets::default();
    for m in diag::tcp4(port, listener_only).unwrap_or_default() {
        if u16::from_be(m.id.sport) != port {
            continue;
        }
        match m.state {
            diag::LISTEN => {
                s.listening = true;
                s.accept_queue += u64::from(m.rqueue);
                s.backlog = s.backlog.max(u64::from(m.wqueue));
            }
            diag::SYN_RECV => s.syn_recv += 1,
            // Inode 0: still in the accept queue, or closed.
            _ => {
                let inode = u64::from(m.inode);
                if inode != 0 && owned.is_none_or(|o| o.contains(&inode)) {
                    s.open += 1;
                }
            }
        }
    }
    s
}

/// The kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, what `ss` reads): the sockets of
/// one port without formatting every socket of the machine, as /proc/net/tcp does.
mod diag {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    pub(crate) const SYN_RECV: u8 = 3;
    pub(crate) const LISTEN: u8 = 10;
    const TIME_WAIT: u8 = 6;
    const CLOSE: u8 = 7;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const NETLINK_SOCK_DIAG: i32 = 4;

    /// `struct inet_diag_sockid` (ports and addresses in network order).
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub(crate) struct SockId {
        pub(crate) sport: u16,
        dport: u16,
        src: [u32; 4],
        dst: [u32; 4],
        ifindex: u32,
        cookie: [u32; 2],
    }

    /// `struct nlmsghdr` and `struct inet_diag_req_v2`.
    #[repr(C)]
    struct Request {
        len: u32,
        kind: u16,
        flags: u16,
        seq: u32,
        pid: u32,
        family: u8,
        protocol: u8,
        ext: u8,
        pad: u8,
        states: u32,
        id: SockId,
    }

    /// `struct inet_diag_msg`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(crate) struct Msg {
        family: u8,
        pub(crate) state: u8,
        timer: u8,
        retrans: u8,
        pub(crate) id: SockId,
        expires: u32,
        pub(crate) rqueue: u32,
        pub(crate) wqueue: u32,
        uid: u32,
        pub(crate) inode: u32,
    }

    /// Every IPv4 TCP socket of local port `port` but those closed or in TIME_WAIT, or
    /// its listener alone.
    pub(crate) fn tcp4(port: u16, listener_only: bool) -> io::Result<Vec<Msg>> {
        // SAFETY: a plain socket(2) call; the result is checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just opened and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let req = Request {
            len: size_of::<Request>() as u32,
            kind: SOCK_DIAG_BY_FAMILY,
            flags: NLM_F_REQUEST | NLM_F_DUMP,
            seq: 1,
            pid: 0,
            family: libc::AF_INET as u8,
            protocol: libc::IPPROTO_TCP as u8,
            ext: 0,
            pad: 0,
            states: if listener_only {
                1 << LISTEN
            } else {
                0xffff & !(1 << TIME_WAIT) & !(1 << CLOSE)
            },
            id: SockId {
                sport: port.to_be(),
                ..SockId::default()
            },
        };
        // SAFETY: `req` is a live, initialised value of `size_of::<Request>()` bytes; an
        // unconnected netlink socket sends to the kernel.
        let sent = unsafe {
            libc::send(
                fd.as_raw_fd(),
                (&raw const req).cast(),
                size_of::<Request>(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is writable for its whole length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                if len < 16 || len > rest.len() {
                    return Err(io::Error::other("a truncated netlink message"));
                }
                match kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => return Err(io::Error::other("sock_diag refused the dump")),
                    _ if len >= 16 + size_of::<Msg>() => {
                        // SAFETY: the message holds at least `size_of::<Msg>()` bytes after
                        // its 16-byte header, and `Msg` is plain integers (any bits valid).
                        let m = unsafe { rest[16..].as_ptr().cast::<Msg>().read_unaligned() };
                        out.push(m);
                    }
                    _ => {}
                }
                rest = &rest[((len + 3) & !3).min(rest.len())..];
            }
        }
    }
}

/// The numeric fields of /proc/self/status (kB values in kB).
fn proc_status() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), n))
        })
        .collect()
}

/// Sets the calling thread's nice value; whether it could (below 0 needs CAP_SYS_NICE).
fn set_nice(nice: i32) -> bool {
    // SAFETY: gettid(2) and setpriority(2) on plain integers; setpriority with a thread id
    // sets that thread's nice value on Linux.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) == 0 }
}

/// CPU time of the calling thread (ms).
fn thread_cpu_ms() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable `timespec` for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

/// User + system CPU time of this process (ms).
fn cpu_ms() -> u64 {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage` for the call to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(u.ru_utime) + ms(u.ru_stime)
}

/// The TCP counters that tell retries and drops apart (/proc/net/snmp's `Tcp`,
/// /proc/net/netstat's `TcpExt`): of the whole network namespace, not of this run alone.
const COUNTERS: &[&str] = &[
    "ActiveOpens",
    "PassiveOpens",
    "AttemptFails",
    "EstabResets",
    "OutRsts",
    "RetransSegs",
    "ListenOverflows",
    "ListenDrops",
    "TCPSynRetrans",
    "TCPTimeouts",
    "TCPAbortOnClose",
    "TCPAbortOnData",
    "TCPReqQFullDrop",
    "TCPBacklogDrop",
    "TCPLossProbes",
    "DelayedACKs",
    "TCPReqQFullDoCookies",
    "SyncookiesSent",
    "SyncookiesRecv",
    "SyncookiesFailed",
];

fn tcp_counters() -> BTreeMap<String, i64> {
    let mut all = BTreeMap::new();
    for (file, prefix) in [("/proc/net/snmp", "Tcp:"), ("/proc/net/netstat", "TcpExt:")] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
        for pair in rows.chunks(2) {
            if let [names, values] = pair {
                for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
                    if let Ok(v) = v.parse() {
                        all.insert(n.to_string(), v);
                    }
                }
            }
        }
    }
    all.retain(|k, _| COUNTERS.contains(&k.as_str()));
    all
}

/// Sets the soft limit on descriptors to `soft`, else raises it to the hard one: (soft
/// before, soft, hard).
fn set_nofile(soft: Option<u64>) -> (u64, u64, u64) {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid, writable `rlimit` for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return (0, 0, 0);
    }
    let before = l.rlim_cur;
    l.rlim_cur = soft.map_or(l.rlim_max, |s| s.min(l.rlim_max));
    // SAFETY: `l` is a valid `rlimit`; a soft limit up to the hard one is allowed.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } == 0;
    (before, if set { l.rlim_cur } else { before }, l.rlim_max)
}

/// Moves this process into a new network namespace and brings its loopback up. Before
/// any thread starts: unshare(2) moves the calling thread only. The namespace gets a
/// table of connected sockets of its own, of [`OWN_EHASH`] buckets, where the kernel
/// allows it (Linux 6.1 and later): a walk of the machine's (262144 buckets here) makes
/// each count of the connections cost milliseconds. Whether it did is returned.
fn own_netns() -> Result<bool, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: unshare(2) with a flag; it touches no memory of ours.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(os("unshare(CLONE_NEWNET)"));
    }
    // Read by the kernel when a namespace is made from this one: the second one has it.
    let own_table = std::fs::write(
        "/proc/sys/net/ipv4/tcp_child_ehash_entries",
        OWN_EHASH.to_string(),
    )
    .is_ok();
    // SAFETY: as above.
    if own_table && unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(os("unshare(CLONE_NEWNET)"));
    }
    // SAFETY: a plain socket(2) call; the result is checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(os("a socket for ioctl"));
    }
    // SAFETY: `raw` is a descriptor just opened and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero `ifreq` is a valid value of the plain C struct.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, c) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *d = *c as libc::c_char;
    }
    // SAFETY: `ifr` is a valid `ifreq` naming "lo", which SIOCGIFFLAGS fills.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr) } != 0 {
        return Err(os("SIOCGIFFLAGS lo"));
    }
    // SAFETY: SIOCGIFFLAGS set the union's flags member, which is read and written here.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: `ifr` is a valid `ifreq` naming "lo" with its flags set.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr) } != 0 {
        return Err(os("SIOCSIFFLAGS lo"));
    }
    Ok(own_table)
}

/// Buckets of [`own_netns`]'s table: twice the sockets of 4096 ranks as threads.
const OWN_EHASH: u32 = 16384;

/// A port nobody listens on, below Linux's ephemeral range (32768 and up): a client's
/// connection never takes it, so ranks retrying before rank 0 listens cannot connect to
/// themselves on it.
fn free_port() -> Result<u16, String> {
    let start = 20000 + (std::process::id() % 12000) as u16;
    (0..12000u16)
        .map(|i| 20000 + (start - 20000 + i) % 12000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .ok_or_else(|| "no free port in 20000-31999".to_string())
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn sleep_until_ns(t: u64) {
    let now = unix_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], String> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(b)
}

/// An id as hex digits: how the ranks' ids are compared, and the processes report theirs.
fn hex(id: &Id) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Rank 0's id, fresh per run.
fn fresh_id() -> nccl_rendezvous::Result<Id> {
    random_bytes::<128>().map_err(|problem| nccl_rendezvous::Error::InvalidArgument {
        what: "rendezvous-scale",
        problem,
    })
}

/// Waits until rank 0 listens on `port` or `limit` passes: the others' go.
fn wait_listening(port: u16, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if port_sockets(port, None, true).listening {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// A start signal: the go's time (ns since the Unix epoch), set once, waited for by many.
#[derive(Default)]
struct Gate {
    at: Mutex<Option<u64>>,
    opened: Condvar,
}

impl Gate {
    fn open(&self, at: u64) {
        *self.at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        self.opened.notify_all();
    }

    fn wait(&self) -> u64 {
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = *at {
                return t;
            }
            at = self.opened.wait(at).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What one run gave, whichever the mode.
struct Run {
    ranks: Vec<RankTime>,
    rank0: Option<Rank0>,
    rank0_start_ns: u64,
    /// Rank processes that exited unsuccessfully or said nothing.
    bad_exits: Vec<String>,
    counters: BTreeMap<String, i64>,
    /// Lines for the report's header.
    notes: Vec<String>,
}

fn run_threads(o: &Opts, plan: &Plan, port: u16) -> Result<Run, String> {
    let n = plan.ranks;
    let mut rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .map_err(|e| e.to_string())?
        .timeout(Duration::from_secs(o.timeout_s));
    if o.secret {
        rdv = rdv.secret(RendezvousSecret::generate().map_err(|e| e.to_string())?);
    }
    let rdv = Arc::new(rdv);
    let rss_empty = proc_status().get("VmRSS").copied().unwrap_or(0);
    let (gate0, gate) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
    // Rank threads stay until every rank is done, so that the process's thread count
    // less the ranks is what the server started.
    let done = Arc::new(Gate::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::with_capacity(n);
    for rank in 0..n {
        let (rdv, gate) = (rdv.clone(), if rank == 0 { &gate0 } else { &gate }.clone());
        let (done, tx) = (done.clone(), tx.clone());
        let offset = plan.offsets[rank].as_nanos() as u64;
        let h = std::thread::Builder::new()
            .name(format!("rank-{rank}"))
            .spawn(move || {
                sleep_until_ns(gate.wait() + offset);
                let start_ns = unix_ns();
                let r = rdv.exchange_with(rank, n, fresh_id);
                let end_ns = unix_ns();
                let _ = tx.send(RankTime {
                    rank,
                    start_ns,
                    end_ns,
                    result: r.map(|id| hex(&id)).map_err(|e| e.to_string()),
                });
                drop(tx);
                done.wait();
            })
            .map_err(|e| format!("starting rank {rank}'s thread: {e}"))?;
        handles.push(h);
    }
    drop(tx);
    let rss_spawned = proc_status().get("VmRSS").copied().unwrap_or(0);
    let counters = tcp_counters();
    let pause = Duration::from_micros(o.sample_us);
    let monitor = Monitor::start(port, pause, o.monitor_nice, false, n as u64);
    let go = unix_ns();
    let mut notes = vec![format!(
        "RSS {} MiB before the rank threads, {} MiB once they wait",
        rss_empty / 1024,
        rss_spawned / 1024
    )];
    let mut flood = None;
    if plan.rank0_first {
        gate0.open(go);
        let limit = Duration::from_secs(o.timeout_s);
        if !wait_listening(port, limit) {
            notes.push("rank 0 never listened; the others started anyway".into());
        }
        if let Some(count) = o.flood {
            let until = Instant::now() + limit;
            flood = Some(Flood::start(port, count, n, until));
        }
        gate.open(unix_ns());
    } else {
        gate0.open(go);
        gate.open(go);
    }
    // Ends when every rank thread has sent its time (or died).
    let mut ranks: Vec<RankTime> = rx.iter().collect();
    ranks.sort_by_key(|t| t.rank);
    let rank0 = monitor.finish();
    if let Some(f) = flood {
        let (held, reopened) = f.finish();
        notes.push(format!(
            "flood: {held} greeted-then-silent connections held from before the ranks \
             started, {reopened} opened again as rank 0 dropped them"
        ));
    }
    done.open(0);
    for h in handles {
        let _ = h.join();
    }
    let counters = diff(&counters, &tcp_counters());
    let rank0_start_ns = ranks
        .iter()
        .find(|t| t.rank == 0)
        .map_or(go, |t| t.start_ns);
    Ok(Run {
        ranks,
        rank0: Some(rank0),
        rank0_start_ns,
        bad_exits: Vec::new(),
        counters,
        notes,
    })
}

/// A private directory holding the secret's file; removed when dropped.
struct SecretDir(PathBuf);

impl SecretDir {
    fn create() -> Result<(SecretDir, PathBuf), String> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let tag: String = random_bytes::<8>()?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = std::env::temp_dir().join(format!("rendezvous-scale-{tag}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let guard = SecretDir(dir.clone());
        let file = dir.join("secret");
        let hex: String = random_bytes::<32>()?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| writeln!(f, "{hex}"))
            .map_err(|e| format!("{}: {e}", file.display()))?;
        Ok((guard, file))
    }
}

impl Drop for SecretDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A rank process, started and waiting for its go.
struct RankProcess {
    rank: usize,
    child: Child,
    stdout: BufReader<ChildStdout>,
    ready: bool,
}

fn run_processes(o: &Opts, plan: &Plan, port: u16) -> Result<Run, String> {
    let n = plan.ranks;
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let secret = if o.secret {
        Some(SecretDir::create()?)
    } else {
        None
    };
    let spawning = Instant::now();
    let mut procs = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(["--ranks", &n.to_string(), "--rank", &rank.to_string()])
            .args(["--port", &port.to_string()])
            .args(["--timeout-s", &o.timeout_s.to_string()])
            .args(["--sample-us", &o.sample_us.to_string()])
            .args(["--monitor-nice", &o.monitor_nice.to_string()])
            .args(o.nofile.map(|n| format!("--nofile={n}")))
            .args(["--offset-us", &plan.offsets[rank].as_micros().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((_, file)) = &secret {
            cmd.arg("--secret-file").arg(file);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        let Some(stdout) = child.stdout.take() else {
            return Err(format!("rank {rank} has no standard output"));
        };
        procs.push(RankProcess {
            rank,
            child,
            stdout: BufReader::new(stdout),
            ready: false,
        });
    }
    // Every rank has set up its rendezvous and waits for its go.
    for p in &mut procs {
        let mut line = String::new();
        p.ready = p.stdout.read_line(&mut line).is_ok() && line.trim() == "ready";
    }
    let mut notes = vec![format!(
        "{n} rank processes started and ready in {} ms (not in the times below)",
        spawning.elapsed().as_millis()
    )];
    if let Some((dir, _)) = &secret {
        notes.push(format!(
            "secret: a 0600 file in {} (0700), removed at the end",
            dir.0.display()
        ));
    }
    let counters = tcp_counters();
    let go = |p: &mut RankProcess, at: u64| {
        if let Some(mut stdin) = p.child.stdin.take() {
            let _ = writeln!(stdin, "{at}");
        }
    };
    if plan.rank0_first {
        go(&mut procs[0], unix_ns());
        if !wait_listening(port, Duration::from_secs(o.timeout_s)) {
            notes.push("rank 0 never listened; the others started anyway".into());
        }
    }
    let at = unix_ns();
    for p in &mut procs {
        go(p, at);
    }
    let mut ranks = Vec::with_capacity(n);
    let mut rank0 = None;
    let mut bad_exits = Vec::new();
    for mut p in procs {
        let mut text = String::new();
        let _ = p.stdout.read_to_string(&mut text);
        let status = p.child.wait();
        let mut said = false;
        for line in text.lines() {
            if let Some(r) = Rank0::parse(line) {
                rank0 = Some(r);
            } else if let Some(t) = parse_rank_line(line) {
                said = true;
                ranks.push(t);
            }
        }
        match status {
            Ok(s) if s.success() && said && p.ready => {}
            Ok(s) => bad_exits.push(format!(
                "rank {} ({s}{}{})",
                p.rank,
                if said { "" } else { ", no result" },
                if p.ready { "" } else { ", never ready" }
            )),
            Err(e) => bad_exits.push(format!("rank {}: {e}", p.rank)),
        }
    }
    drop(secret);
    let counters = diff(&counters, &tcp_counters());
    let rank0_start_ns = ranks
        .iter()
        .find(|r| r.rank == 0)
        .map_or(at, |r| r.start_ns);
    Ok(Run {
        ranks,
        rank0,
        rank0_start_ns,
        bad_exits,
        counters,
        notes,
    })
}

/// `rank=R start_ns=S end_ns=E id=HEX` or `rank=R start_ns=S end_ns=E error=TEXT`.
fn rank_line(t: &RankTime) -> String {
    let head = format!(
        "rank={} start_ns={} end_ns={}",
        t.rank, t.start_ns, t.end_ns
    );
    match &t.result {
        Ok(id) => format!("{head} id={id}"),
        Err(e) => format!("{head} error={}", e.replace('\n', " ")),
    }
}

fn parse_rank_line(line: &str) -> Option<RankTime> {
    let mut rest = line.strip_prefix("rank=")?;
    let mut num = |key: &str| -> Option<u64> {
        let (v, r) = rest.split_once(' ')?;
        rest = r.strip_prefix(key).unwrap_or(r);
        v.parse().ok()
    };
    let rank = num("start_ns=")? as usize;
    let start_ns = num("end_ns=")?;
    let end_ns = num("")?;
    let result = if let Some(id) = rest.strip_prefix("id=") {
        Ok(id.to_string())
    } else {
        Err(rest.strip_prefix("error=")?.to_string())
    };
    Some(RankTime {
        rank,
        start_ns,
        end_ns,
        result,
    })
}

/// One rank of `--processes`: sets up, says `ready`, reads its go from standard input,
/// starts at its offset after it, exchanges, prints its line (rank 0 also its figures).
fn run_rank(o: &Opts, rank: usize) -> ExitCode {
    set_nofile(o.nofile);
    let (Some(n), Some(port)) = (o.ranks, o.port) else {
        eprintln!("rendezvous-scale: a rank needs --ranks and --port");
        return ExitCode::FAILURE;
    };
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}")).and_then(|r| {
        let r = r.timeout(Duration::from_secs(o.timeout_s));
        match &o.secret_file {
            Some(f) => Ok(r.secret(RendezvousSecret::from_file(f)?)),
            None => Ok(r),
        }
    });
    let rdv = match rdv {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rendezvous-scale: rank {rank}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let Ok(go) = line.trim().parse::<u64>() else {
        eprintln!("rendezvous-scale: rank {rank}: no go");
        return ExitCode::FAILURE;
    };
    sleep_until_ns(go + o.offset_us * 1000);
    let start_ns = unix_ns();
    let monitor = (rank == 0).then(|| {
        let pause = Duration::from_micros(o.sample_us);
        Monitor::start(port, pause, o.monitor_nice, true, 0)
    });
    let r = rdv.exchange_with(rank, n as usize, fresh_id);
    let end_ns = unix_ns();
    let t = RankTime {
        rank,
        start_ns,
        end_ns,
        result: r.map(|id| hex(&id)).map_err(|e| e.to_string()),
    };
    println!("{}", rank_line(&t));
    if let Some(m) = monitor {
        println!("{}", m.finish().line());
    }
    if t.result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn diff(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .collect()
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[i - 1]
}

/// The header of BENCHMARKS.md's table, which [`report`]'s last line is a row of.
const TABLE_HEADER: &str = "\
| mode | ranks | secret | arrival | wall (ms) | ranks 1..: p50 / p99 / max (ms) | connects (retries) | listen overflows / SYN retransmits / resets unread | rank 0: connections open / accept queue, peaks | rank 0: threads started, peak | rank 0: VmHWM (MiB) (+ during) | rank 0: CPU (ms) | failures |
| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";

/// Ranks done per `bin` since the first start: steps of 1 s, 3 s, 7 s are SYN
/// retransmissions (a full listen queue), steady runs are the server's pace.
fn timeline(ranks: &[RankTime], first: u64, bin: Duration) -> String {
    let bin = bin.as_nanos() as u64;
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for t in ranks {
        *counts
            .entry(t.end_ns.saturating_sub(first) / bin)
            .or_default() += 1;
    }
    let last = counts.keys().max().copied().unwrap_or(0);
    (0..=last)
        .map(|b| counts.get(&b).copied().unwrap_or(0).to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints the report; whether every rank got the one id.
fn report(o: &Opts, plan: &Plan, run: &Run) -> bool {
    let n = plan.ranks;
    let mode = match (o.threads, o.nofile) {
        (true, None) if o.flood.is_some() => {
            format!("threads, flood of {}", o.flood.unwrap_or(0))
        }
        (true, None) => "threads".to_string(),
        (false, None) => "processes".to_string(),
        (true, Some(n)) => format!("threads, {n} descriptors"),
        (false, Some(n)) => format!("processes, {n} descriptors"),
    };
    let failed: Vec<&RankTime> = run.ranks.iter().filter(|t| t.result.is_err()).collect();
    let ids: HashSet<&String> = run
        .ranks
        .iter()
        .filter_map(|t| t.result.as_ref().ok())
        .collect();
    let missing = n - run.ranks.len();
    let failures = failed.len() + missing;
    let ok = failures == 0 && ids.len() == 1 && run.bad_exits.is_empty();
    let first = run.ranks.iter().map(|t| t.start_ns).min().unwrap_or(0);
    let last_start = run.ranks.iter().map(|t| t.start_ns).max().unwrap_or(0);
    let last = run.ranks.iter().map(|t| t.end_ns).max().unwrap_or(0);
    let wall_ms = last.saturating_sub(first) as f64 / 1e6;
    let ms = |t: &RankTime| t.end_ns.saturating_sub(t.start_ns) as f64 / 1e6;
    // Rank 0 waits for the last rank: its time is the wall's, told apart.
    let mut times: Vec<f64> = run.ranks.iter().filter(|t| t.rank != 0).map(ms).collect();
    let rank0_ms = run.ranks.iter().find(|t| t.rank == 0).map_or(f64::NAN, ms);
    times.sort_by(f64::total_cmp);
    let (p50, p99, max) = (
        percentile(&times, 50.0),
        percentile(&times, 99.0),
        percentile(&times, 100.0),
    );
    let c = |k: &str| run.counters.get(k).copied().unwrap_or(0);
    let connects = c("ActiveOpens");
    let retries = connects - (n as i64 - 1);
    for note in &run.notes {
        println!("# {note}");
    }
    println!(
        "wall: {wall_ms:.1} ms (first rank's start to last rank's end); the ranks started \
         over {:.1} ms",
        last_start.saturating_sub(first) as f64 / 1e6
    );
    println!(
        "per rank (1..): p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms (one exchange_with \
         call); rank 0 {rank0_ms:.1} ms"
    );
    println!(
        "ranks done per 100 ms since the first start: {}",
        timeline(&run.ranks, first, Duration::from_millis(100))
    );
    println!(
        "failures: {failures} of {n}{}; {} distinct id{} among the ranks that got one",
        if missing > 0 {
            format!(" ({missing} said nothing)")
        } else {
            String::new()
        },
        ids.len(),
        if ids.len() == 1 { "" } else { "s" }
    );
    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &failed {
        if let Err(e) = &t.result {
            *errors.entry(e.as_str()).or_default() += 1;
        }
    }
    for (e, k) in errors.iter().take(5) {
        println!("  {k} × {e}");
    }
    for b in run.bad_exits.iter().take(5) {
        println!("  exit: {b}");
    }
    if run.bad_exits.len() > 5 {
        println!("  ... {} more bad exits", run.bad_exits.len() - 5);
    }
    println!(
        "tcp over the run ({}): {connects} connects, {:.2} per rank ({retries} retries), {} \
         refused, {} listen overflows, {} SYN retransmits, {} SYN cookies, {} reset unread \
         on close (a connection closed before its greeting was read)",
        if o.own_netns {
            "this run's own network namespace"
        } else {
            "the whole network namespace"
        },
        connects as f64 / (n - 1) as f64,
        c("AttemptFails"),
        c("ListenOverflows"),
        c("TCPSynRetrans"),
        c("SyncookiesSent"),
        c("TCPAbortOnClose"),
    );
    let counters: Vec<String> = run
        .counters
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("tcp counters: {}", counters.join(" "));
    let r0 = run.rank0.clone().unwrap_or_default();
    let mib = |kib: u64| kib as f64 / 1024.0;
    let threads_started = r0.threads.saturating_sub(r0.threads_before);
    println!(
        "rank 0: listening {:.1} ms after its start, backlog {} (ss -ltn's Send-Q); peaks: {} \
         socket descriptors{}, {} connections open on port {} (rank 0's side alone), accept \
         queue {}, SYN_RECV {}, {} threads started (beyond the {} at its start{}; one is \
         the library's wait-notice watchdog); VmHWM \
         {:.1} MiB{}, RSS {:.1} -> {:.1} MiB during the exchange (+{:.1}); CPU {} ms{} (the \
         sampling's {} ms left out); {} \
         samples, one per {} µs (each took {} µs; {} counted the connections; nice {})",
        r0.listen_ns.saturating_sub(run.rank0_start_ns) as f64 / 1e6,
        r0.backlog,
        r0.socket_fds,
        if o.threads {
            " (the clients' too: one process)"
        } else {
            ""
        },
        r0.server_sockets,
        o.port.unwrap_or(0),
        r0.accept_queue,
        r0.syn_recv,
        threads_started,
        r0.threads_before,
        if o.threads {
            ", rank threads left out"
        } else {
            ""
        },
        mib(r0.vm_hwm_kib),
        if o.threads {
            " (the whole process, every rank's)"
        } else {
            ""
        },
        mib(r0.rss_before_kib),
        mib(r0.rss_kib),
        mib(r0.rss_kib.saturating_sub(r0.rss_before_kib)),
        r0.cpu_ms,
        if o.threads { " (every rank's)" } else { "" },
        r0.monitor_cpu_ms,
        r0.samples,
        r0.sample_period_us,
        r0.sample_cost_us,
        r0.full_samples,
        if r0.nice == 1 {
            o.monitor_nice.to_string()
        } else {
            "0".to_string()
        },
    );
    let secret = if o.secret { "yes" } else { "no" };
    println!(
        "summary mode={mode} ranks={n} secret={secret} wall_ms={wall_ms:.1} p50_ms={p50:.1} \
         p99_ms={p99:.1} max_ms={max:.1} rank0_ms={rank0_ms:.1} failures={failures} connects={connects} \
         retries={retries} refused={} listen_overflows={} syn_retrans={} reset_unread={} \
         rank0_socket_fds={} rank0_connections={} accept_queue={} backlog={} \
         rank0_threads_started={threads_started} rank0_vm_hwm_kib={} rank0_rss_growth_kib={} \
         rank0_cpu_ms={} arrival=\"{}\"",
        c("AttemptFails"),
        c("ListenOverflows"),
        c("TCPSynRetrans"),
        c("TCPAbortOnClose"),
        r0.socket_fds,
        r0.server_sockets,
        r0.accept_queue,
        r0.backlog,
        r0.vm_hwm_kib,
        r0.rss_kib.saturating_sub(r0.rss_before_kib),
        r0.cpu_ms,
        plan.arrival
    );
    println!("{TABLE_HEADER}");
    println!(
        "| {mode} | {n} | {secret} | {} | {wall_ms:.0} | {p50:.0} / {p99:.0} / {max:.0} | \
         {connects} ({retries}) | {} / {} / {} | {} / {} | {threads_started} | {:.1} (+{:.1}) \
         | {} | {failures} |",
        plan.arrival,
        c("ListenOverflows"),
        c("TCPSynRetrans"),
        c("TCPAbortOnClose"),
        r0.server_sockets,
        r0.accept_queue,
        mib(r0.vm_hwm_kib),
        mib(r0.rss_kib.saturating_sub(r0.rss_before_kib)),
        r0.cpu_ms,
    );
    ok
}

fn main() -> ExitCode {
    let mut o = Opts::parse();
    if let Some(rank) = o.rank {
        return run_rank(&o, rank);
    }
    let own_table = match o.own_netns.then(own_netns).transpose() {
        Ok(t) => t.unwrap_or(false),
        Err(e) => {
            eprintln!("rendezvous-scale: --own-netns: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !o.threads && !o.processes {
        Opts::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "one of --threads and --processes is needed",
            )
            .exit();
    }
    let ranks = o
        .ranks
        .map_or(if o.threads { 4096 } else { 256 }, |n| n as usize);
    let plan = match Plan::new(&o, ranks) {
        Ok(p) => p,
        Err(e) => Opts::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit(),
    };
    // The parent of rank processes holds two pipes per rank: --nofile is for the ranks.
    let (before, soft, hard) = set_nofile(o.nofile.filter(|_| o.threads));
    let port = match free_port() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rendezvous-scale: {e}");
            return ExitCode::FAILURE;
        }
    };
    o.port = Some(port);
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("$ rendezvous-scale {}", args.join(" "));
    println!(
        "# {ranks} ranks as {}, rendezvous at 127.0.0.1:{port}, secret {}, deadline {} s, \
         {} cores",
        if o.threads {
            "threads of one process"
        } else {
            "processes"
        },
        if o.secret { "yes" } else { "no" },
        o.timeout_s,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "# arrival: {}; rank 0 {}",
        plan.arrival,
        if plan.rank0_first {
            "first, the others once it listens"
        } else {
            "last, the others retrying until it listens"
        }
    );
    println!(
        "# RLIMIT_NOFILE: soft {before} set to {soft}, hard {hard}{}",
        match o.nofile {
            Some(n) if o.processes => format!("; the rank processes' soft limit {n}"),
            _ => String::new(),
        }
    );
    println!(
        "# network namespace: {}",
        if own_table {
            "its own (the TCP counters are this run's), with a socket table of its own"
        } else if o.own_netns {
            "its own (the TCP counters are this run's)"
        } else {
            "shared (the TCP counters include anything else on it)"
        }
    );
    let run = if o.threads {
        run_threads(&o, &plan, port)
    } else {
        run_processes(&o, &plan, port)
    };
    match run {
        Ok(run) if report(&o, &plan, &run) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rendezvous-scale: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str], ranks: usize) -> Plan {
        let mut all = vec!["rendezvous-scale", "--threads"];
        all.extend_from_slice(args);
        Plan::new(&Opts::parse_from(all), ranks).unwrap_or_else(|e| unreachable!("{e}"))
    }

    #[test]
    fn bursts_and_late_ranks_start_on_their_schedule() {
        let ms = |p: &Plan| -> Vec<u128> { p.offsets.iter().map(Duration::as_millis).collect() };
        let p = plan(&["--burst", "2", "--gap-ms", "50", "--late", "2"], 8);
        assert_eq!(ms(&p), [0, 0, 0, 50, 50, 100, 2100, 2100]);
        assert!(p.rank0_first);
        let p = plan(
            &["--late", "50%", "--late-ms", "10", "--rank0-late-ms", "5"],
            5,
        );
        assert_eq!(ms(&p), [15, 0, 0, 10, 10]);
        assert!(!p.rank0_first);
        assert_eq!(
            p.arrival,
            "all at once, 50% (2) late by 10 ms, rank 0 5 ms after the last"
        );
    }

    #[test]
    fn a_rank_line_reads_back() {
        let t = RankTime {
            rank: 3,
            start_ns: 10,
            end_ns: 20,
            result: Err("it failed: no".into()),
        };
        let back = parse_rank_line(&rank_line(&t)).unwrap_or_else(|| unreachable!());
        assert_eq!((back.rank, back.start_ns, back.end_ns), (3, 10, 20));
        assert_eq!(back.result, Err("it failed: no".to_string()));
        let r0 = Rank0 {
            server_sockets: 64,
            vm_hwm_kib: 9,
            ..Rank0::default()
        };
        let back = Rank0::parse(&r0.line()).unwrap_or_default();
        assert_eq!((back.server_sockets, back.vm_hwm_kib), (64, 9));
    }
}
