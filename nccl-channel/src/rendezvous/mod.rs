//! [`Rendezvous`]: where and how rank 0 hands its unique id to the other ranks over TCP,
//! so that ranks started by torchrun, Slurm, Open MPI or MPICH agree on an id without an
//! extra variable.

mod derive;
mod hostlist;
mod net;
mod ours;
mod tcpstore;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use nccl_sys::Nccl;

use crate::host_port::parse_host_port;
use crate::{Error, Result, UniqueId, World};

pub use derive::{PORT_BASE, PORT_SPAN};

/// The deadline when neither code nor `NCCL_CHANNEL_RENDEZVOUS_TIMEOUT` gives one: long
/// enough for the slowest rank of a large job to start, short enough that a missing rank
/// is reported rather than waited for forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Who serves the id at a [`Rendezvous`]'s address.
///
/// ```
/// use nccl_channel::{Rendezvous, RendezvousKind};
/// // Naming an address connects to nothing yet.
/// let store = Rendezvous::torch_store("127.0.0.1:29500")?;
/// assert_eq!(store.kind(), RendezvousKind::TorchStore);
/// assert_eq!(Rendezvous::tcp("node1:29500")?.kind(), RendezvousKind::RankZero);
/// # Ok::<(), nccl_channel::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RendezvousKind {
    /// Rank 0 listens on the address and serves the id itself (nccl-channel's own small
    /// text protocol, with a key so that a server of another job is recognised).
    RankZero,
    /// torchrun's agent hosts a TCPStore there (`TORCHELASTIC_USE_AGENT_STORE=True`):
    /// rank 0 `set`s the id under a key (with a nonce, after removing what an earlier
    /// exchange under that key left), the others `wait` for it, `get` it and acknowledge
    /// it with the nonce; once all acknowledged it, rank 0 deletes it. Works with the stores of torch 2.4 and newer
    /// (libuv and legacy servers), which torchrun hosts for its static rendezvous, and from
    /// torch 2.5 for the c10d one (`--standalone`; torch 2.4 sets
    /// `TORCHELASTIC_USE_AGENT_STORE=False` there, and rank 0 serves at
    /// `MASTER_ADDR:MASTER_PORT`).
    #[doc(alias = "TCPStore")]
    TorchStore,
}

/// Where and how rank 0 hands its [`UniqueId`] to the other ranks.
///
/// Ranks must agree on one id before [`Communicator::init_rank`](crate::Communicator::init_rank);
/// NCCL leaves the sharing to the program. A `Rendezvous` does it over TCP: rank 0
/// generates the id and serves it (or stores it in torchrun's TCPStore), the others
/// fetch it, retrying while the server is not up yet, until a deadline. Get one from the
/// launcher's environment with [`Rendezvous::from_env`] (the rule is in its table), or
/// from code with [`Rendezvous::tcp`] / [`Rendezvous::torch_store`].
///
/// Several exchanges through the same rendezvous (one per channel) never mix: each rank
/// numbers its exchanges, and the n-th exchange of every rank uses the same key.
///
/// No single connection can make rank 0 fail: something that is not one of its ranks, or
/// a rank with another world size (answered, so that it fails at once), is dropped and
/// rank 0 goes on serving until its deadline, whose error names what it saw. Every read
/// has a deadline, so a slow or silent peer holds neither side past its own, with one
/// bounded exception: rank 0 of a [`RendezvousKind::TorchStore`] exchange spends at most
/// 1 s past its deadline removing the id from the store, or, when its wait ran out,
/// asking the store on a fresh connection which ranks did not take the id (when every
/// rank did, the last just then, the exchange succeeds).
///
/// The rendezvous is not authenticated, like NCCL's own bootstrap (`NCCL_COMM_ID`) and
/// torch's TCPStore: anyone who can connect to the address can read the unique id (and so
/// join or disturb the communicator's setup) or disturb the exchange. The key only tells
/// jobs apart; it is no secret. Use it on a network you trust.
///
/// ```
/// use std::time::Duration;
/// use nccl_channel::{Rendezvous, UniqueId};
/// # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))?.timeout(Duration::from_secs(30));
/// let ids: Vec<UniqueId> = std::thread::scope(|s| {
///     let ranks: Vec<_> = (0..3)
///         .map(|rank| {
///             let rdv = &rdv;
///             s.spawn(move || rdv.exchange_with(rank, 3, || Ok(UniqueId([7; 128]))))
///         })
///         .collect();
///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()
/// })?;
/// assert_eq!(ids, vec![UniqueId([7; 128]); 3]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a rendezvous does nothing until it is used for an exchange"]
pub struct Rendezvous {
    kind: RendezvousKind,
    host: String,
    port: u16,
    derived_from: String,
    key: String,
    timeout: Duration,
}

static_assertions::assert_impl_all!(Rendezvous: Send, Sync, std::fmt::Debug);

impl Rendezvous {
    /// Rank 0 serves the id at `address` (`host:port`, `[v6]:port`); the others connect
    /// there. Rank 0 listens on every interface (`[::]`, else `0.0.0.0`) unless the host
    /// is `localhost` or a loopback address, which it listens on alone; see
    /// [`Rendezvous::from_env`] for why. The key is `nccl-channel`, the deadline
    /// [`DEFAULT_TIMEOUT`]. Like torch's `init_method="tcp://host:port"`.
    #[doc(alias = "init_method")]
    pub fn tcp(address: &str) -> Result<Rendezvous> {
        Self::parsed(RendezvousKind::RankZero, address)
    }

    /// A TCPStore that already runs at `address` (as torchrun's agent hosts one): rank 0
    /// stores the id there, the others read it. Nothing listens in this process.
    #[doc(alias = "TCPStore")]
    pub fn torch_store(address: &str) -> Result<Rendezvous> {
        Self::parsed(RendezvousKind::TorchStore, address)
    }

    fn parsed(kind: RendezvousKind, address: &str) -> Result<Rendezvous> {
        let (host, port) = parse_host_port(address).map_err(|detail| Error::InvalidArgument {
            what: "Rendezvous address",
            problem: format!(
                "{address:?} is not host:port with a port from 1 to 65535 \
                 (IPv6 addresses in brackets: [::1]:29500): {detail}"
            ),
        })?;
        Ok(Self::new(
            kind,
            host,
            port,
            "code".into(),
            "nccl-channel".into(),
            DEFAULT_TIMEOUT,
        ))
    }

    pub(crate) fn new(
        kind: RendezvousKind,
        host: String,
        port: u16,
        derived_from: String,
        key: String,
        timeout: Duration,
    ) -> Rendezvous {
        Rendezvous {
            kind,
            host,
            port,
            derived_from,
            key: sanitize_key(&key),
            timeout,
        }
    }

    /// How long a rank waits for the others, in all (rank 0 for every peer to take the id,
    /// the others for rank 0 to serve it).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The key that tells this job's (and this channel's) rendezvous from another one on
    /// the same address: every rank must use the same. Bytes other than ASCII letters,
    /// digits and `-_.:/+@` become `_`; it is cut to 200 bytes; an empty key becomes
    /// `nccl-channel`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = sanitize_key(&key.into());
        self
    }

    /// The world's rendezvous as the launcher's environment describes it, `Ok(None)` when
    /// it describes none. See [`Rendezvous::from_lookup`] for the rule.
    pub fn from_env(world: &World) -> Result<Option<Rendezvous>> {
        Self::from_lookup(world, |name| std::env::var(name).ok())
    }

    /// As [`Rendezvous::from_env`], reading variables through `lookup` (tests, programs
    /// that keep their configuration elsewhere). The first row that applies decides:
    ///
    /// | Launcher ([`World::source`]) | Condition | Address | Kind |
    /// |---|---|---|---|
    /// | any | `NCCL_CHANNEL_RENDEZVOUS=host:port` (and `NCCL_CHANNEL_RENDEZVOUS_KEY`, the key) | that | rank 0 serves |
    /// | torchrun | `TORCHELASTIC_USE_AGENT_STORE=True` | `MASTER_ADDR:MASTER_PORT` | torchrun's TCPStore |
    /// | torchrun, Slurm, Open MPI, PMI | `MASTER_ADDR` and `MASTER_PORT` | `MASTER_ADDR:MASTER_PORT` | rank 0 serves |
    /// | Slurm | | first host of `SLURM_STEP_NODELIST`, else `SLURM_JOB_NODELIST`, else `SLURM_NODELIST` : Slurm port | rank 0 serves |
    /// | Open MPI | `OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE` (one node) | `127.0.0.1` : Open MPI port | rank 0 serves |
    /// | Open MPI | several nodes | `MASTER_ADDR`, else first host of the Slurm node list (mpirun inside Slurm), else an error asking for `MASTER_ADDR` : Open MPI port | rank 0 serves |
    /// | PMI (MPICH Hydra) | `MPI_LOCALNRANKS == PMI_SIZE` (one node); the ranks must be direct children of Hydra's proxy | `127.0.0.1` : PMI port | rank 0 serves |
    /// | PMI | several nodes | `MASTER_ADDR` : Slurm port (`MASTER_ADDR` without `MASTER_PORT` needs a Slurm job id), else first host of the Slurm node list : Slurm port, else an error asking for `MASTER_ADDR` and `MASTER_PORT` | rank 0 serves |
    /// | nccl-channel, IREE, code | (no `NCCL_CHANNEL_RENDEZVOUS`) | none: these use `NCCL_COMM_ID` | |
    ///
    /// Ports, all in `PORT_BASE .. PORT_BASE + PORT_SPAN` (20000–31999: unprivileged and
    /// below Linux's ephemeral range, so outgoing connections do not take them), where a
    /// value that is not a decimal number counts as its 64-bit FNV-1a hash:
    ///
    /// * Slurm port = `20000 + (16 × SLURM_JOB_ID + SLURM_STEP_ID mod 16) mod 12000`
    ///   (`SLURM_STEP_ID` unset counts as 0): steps of one job, and consecutive jobs,
    ///   get different ports.
    /// * Open MPI port = `20000 + OMPI_MCA_ess_base_jobid mod 12000`, else
    ///   `20000 + FNV-1a(PMIX_NAMESPACE) mod 12000`.
    /// * PMI port = `20000 + (parent process id) mod 12000`: Hydra starts all ranks of a
    ///   node from one proxy, so they share their parent. Only if the ranks are the
    ///   proxy's direct children: a wrapper (`mpiexec -n 4 sh -c '…; ./prog'`, a script
    ///   that does not `exec` the program) gives each rank another parent, hence another
    ///   port, and the ranks never meet; set `MASTER_ADDR` and `MASTER_PORT` then.
    /// * `MASTER_PORT` alone replaces the derived port of the Slurm, Open MPI and PMI rows
    ///   (the way out when the derived one is taken); the host stays the derived one.
    ///
    /// Task 0 of a Slurm step runs on the first node of the step (with Slurm's default
    /// block distribution; set `MASTER_ADDR` and `MASTER_PORT` for another), and mpirun
    /// places rank 0 on the first node of the allocation, hence the first host. Rank 0 listens on
    /// every interface rather than on the derived host: names often resolve differently
    /// on the node itself (`/etc/hosts` maps a node's own name to 127.0.1.1 on many
    /// distributions), and the others reach rank 0 through whatever address their name
    /// gives; a loopback host is listened on alone, so one-node jobs expose nothing.
    ///
    /// The key (telling this job from another on the same port) is
    /// `NCCL_CHANNEL_RENDEZVOUS_KEY` when set alongside `NCCL_CHANNEL_RENDEZVOUS` (a
    /// launcher of your own can pass a key unique to each launch there; it is not read
    /// without `NCCL_CHANNEL_RENDEZVOUS`), else it comes from `TORCHELASTIC_RUN_ID` and
    /// `TORCHELASTIC_RESTART_COUNT`, `SLURM_JOB_ID` and `SLURM_STEP_ID`,
    /// `OMPI_MCA_ess_base_jobid`, `PMIX_NAMESPACE` or the parent process (one-node PMI),
    /// whichever the row's launcher has, else it is `nccl-channel`. The deadline is
    /// `NCCL_CHANNEL_RENDEZVOUS_TIMEOUT` seconds, else [`DEFAULT_TIMEOUT`]. Malformed
    /// values (a port that is not 1–65535, an unparsable host list) are
    /// [`Error::Env`] naming the variable.
    ///
    /// ```
    /// use nccl_channel::{Rendezvous, RendezvousKind, World};
    /// let env = [
    ///     ("SLURM_NTASKS", "8"), ("SLURM_PROCID", "3"),
    ///     ("SLURM_JOB_NODELIST", "gpu[07-10],login1"),
    ///     ("SLURM_JOB_ID", "123456"), ("SLURM_STEP_ID", "0"),
    /// ];
    /// let lookup = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
    /// let world = World::from_lookup(lookup)?.expect("a Slurm world");
    /// let rdv = Rendezvous::from_lookup(&world, lookup)?.expect("Slurm gives one");
    /// assert_eq!(rdv.kind(), RendezvousKind::RankZero);
    /// assert_eq!(rdv.address(), "gpu07:27296");
    /// assert_eq!(rdv.derived_from(), "SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID");
    /// # Ok::<(), nccl_channel::Error>(())
    /// ```
    #[doc(alias = "MASTER_ADDR")]
    #[doc(alias = "MASTER_PORT")]
    pub fn from_lookup(
        world: &World,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Rendezvous>> {
        derive::derive(world, &lookup)
    }

    /// Agrees on a unique id with the other ranks: rank 0 generates one with
    /// `ncclGetUniqueId` and hands it over; the others receive it. One rank: a fresh id,
    /// no network.
    ///
    /// Two ranks, one thread each, agree on an id over loopback and join with it:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use std::time::Duration;
    /// use cuda_hal::{Cuda, mock::MockDriver};
    /// use nccl_channel::{Communicator, Rendezvous};
    /// use nccl_sys::mock::MockNccl;
    ///
    /// let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(2))?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    /// let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))?.timeout(Duration::from_secs(30));
    /// let joined = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..2)
    ///         .map(|rank| {
    ///             let (cuda, nccl, rdv) = (&cuda, &nccl, &rdv);
    ///             s.spawn(move || -> nccl_channel::Result<(usize, usize)> {
    ///                 let id = rdv.exchange(nccl, rank, 2)?; // rank 0 serves, rank 1 fetches
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 2, rank)?;
    ///                 Ok((comm.rank(), comm.size()))
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(joined, [(0, 2), (1, 2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclGetUniqueId")]
    pub fn exchange(&self, nccl: &Nccl, rank: usize, size: usize) -> Result<UniqueId> {
        self.exchange_with(rank, size, || UniqueId::generate(nccl))
    }

    /// As [`Rendezvous::exchange`], with rank 0's id made by `make` (called once, on rank
    /// 0 only, after it is ready to serve): for tests and for ids made elsewhere.
    pub fn exchange_with(
        &self,
        rank: usize,
        size: usize,
        make: impl FnOnce() -> Result<UniqueId>,
    ) -> Result<UniqueId> {
        if size == 0 || rank >= size {
            return Err(Error::InvalidRank {
                what: "Rendezvous::exchange",
                rank,
                size,
            });
        }
        if size == 1 {
            return make();
        }
        let key = format!("{}#{}", self.key, next_sequence(self, rank));
        match (self.kind, rank) {
            (RendezvousKind::RankZero, 0) => ours::serve(self, &key, size, make),
            (RendezvousKind::RankZero, _) => ours::receive(self, &key, rank, size),
            (RendezvousKind::TorchStore, 0) => tcpstore::publish(self, &key, size, make),
            (RendezvousKind::TorchStore, _) => tcpstore::fetch(self, &key, rank, size),
        }
    }

    /// What serves the id.
    #[must_use]
    pub fn kind(&self) -> RendezvousKind {
        self.kind
    }

    /// `host:port` (an IPv6 host in brackets).
    #[must_use]
    pub fn address(&self) -> String {
        if self.host.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The host part of the address.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port part of the address.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The variables the address came from (`"code"` for [`Rendezvous::tcp`]).
    #[must_use]
    pub fn derived_from(&self) -> &str {
        &self.derived_from
    }

    /// The key (before the per-exchange sequence number).
    #[must_use]
    pub fn get_key(&self) -> &str {
        &self.key
    }

    /// The deadline of an exchange.
    #[must_use]
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    fn service(&self) -> &'static str {
        match self.kind {
            RendezvousKind::RankZero => "rank 0's rendezvous",
            RendezvousKind::TorchStore => "torchrun's TCPStore",
        }
    }

    /// An [`Error::Rendezvous`] about this rendezvous.
    fn error(&self, problem: impl Into<String>) -> Error {
        self.error_from(problem.into(), None)
    }

    /// An [`Error::Rendezvous`] caused by the operating system's error `e`, kept as its
    /// source (so `problem` does not repeat its text).
    fn io_error(&self, problem: impl Into<String>, e: std::io::Error) -> Error {
        self.error_from(problem.into(), Some(e.into()))
    }

    fn error_from(&self, problem: String, source: Option<crate::IoError>) -> Error {
        Error::Rendezvous {
            service: self.service(),
            address: self.address(),
            derived_from: self.derived_from.clone(),
            problem,
            source,
        }
    }

    /// Where rank 0 listens, in order of preference: a loopback host on itself alone (no
    /// other machine can reach it), an IPv4 host on every IPv4 address, any other host
    /// (a name, an IPv6 address) on every IPv6 address (which takes IPv4 too where the
    /// system maps it), else every IPv4 address (IPv6 disabled).
    fn listen_addrs(&self) -> Vec<SocketAddr> {
        let at = |ip: IpAddr| SocketAddr::new(ip, self.port);
        if self.host.eq_ignore_ascii_case("localhost") {
            return vec![at(Ipv4Addr::LOCALHOST.into())];
        }
        match self.host.parse::<IpAddr>() {
            Ok(ip) if ip.is_loopback() => vec![at(ip)],
            Ok(IpAddr::V4(_)) => vec![at(Ipv4Addr::UNSPECIFIED.into())],
            _ => vec![
                at(Ipv6Addr::UNSPECIFIED.into()),
                at(Ipv4Addr::UNSPECIFIED.into()),
            ],
        }
    }
}

impl fmt::Display for Rendezvous {
    /// `rank 0's rendezvous at node1:27296 (derived from SLURM_JOB_NODELIST, …), key …,
    /// timeout 300s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {} (derived from {}), key {}, timeout {:?}",
            self.service(),
            self.address(),
            self.derived_from,
            self.key,
            self.timeout
        )
    }
}

fn sanitize_key(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:/+@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.truncate(200);
    if out.is_empty() {
        "nccl-channel".into()
    } else {
        out
    }
}

/// The number of exchanges `rank` made before through a rendezvous with this address and
/// key, in this process: the n-th channel of every rank gets the n-th key. Counted per rank
/// so that ranks run as threads of one process (tests) number alike.
fn next_sequence(rdv: &Rendezvous, rank: usize) -> u64 {
    type Counters = BTreeMap<(String, String, usize), u64>;
    static COUNTERS: Mutex<Counters> = Mutex::new(BTreeMap::new());
    let mut map = COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
    let n = map
        .entry((rdv.address(), rdv.key.clone(), rank))
        .or_insert(0);
    let seq = *n;
    *n += 1;
    seq
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback host listens on itself alone; an IPv4 host on every IPv4 address; a
    /// name or an IPv6 address on every IPv6 address, then every IPv4 one.
    #[test]
    fn rank_0_listens_where_the_host_can_be_reached() {
        let table: &[(&str, &[&str])] = &[
            ("localhost:7000", &["127.0.0.1:7000"]),
            ("LOCALHOST:7000", &["127.0.0.1:7000"]),
            ("127.0.0.1:7000", &["127.0.0.1:7000"]),
            ("127.1.2.3:7000", &["127.1.2.3:7000"]),
            ("[::1]:7000", &["[::1]:7000"]),
            ("10.1.2.3:7000", &["0.0.0.0:7000"]),
            ("node1:7000", &["[::]:7000", "0.0.0.0:7000"]),
            ("[fe80::1]:7000", &["[::]:7000", "0.0.0.0:7000"]),
        ];
        for (addr, want) in table {
            let got: Vec<String> = Rendezvous::tcp(addr)
                .unwrap()
                .listen_addrs()
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(got, *want, "{addr}");
        }
    }
}
