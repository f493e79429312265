//! What a [`Rendezvous`] is: who serves the id ([`RendezvousKind`]), at which address,
//! under which key and deadline, and the errors that name it. The protocols (ours.rs,
//! tcpstore.rs) and the rule that derives one from the environment (derive.rs) build and
//! read it from here; mod.rs, above them all, puts them together (`from_env`,
//! `exchange`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::host_port::parse_host_port;
use crate::secret::RendezvousSecret;
use crate::{Error, Result};

/// The deadline when neither code nor `NCCL_CHANNEL_RENDEZVOUS_TIMEOUT` gives one: long
/// enough for the slowest rank of a large job to start, short enough that a missing rank
/// is reported rather than waited for forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Rank 0's default allowance for a round trip to a rank under pressure
/// ([`Rendezvous::round_trip`]): a loopback or LAN round trip, with room for a busy host.
pub const DEFAULT_ROUND_TRIP: Duration = Duration::from_millis(5);

/// Who serves the id at a [`Rendezvous`]'s address.
///
/// ```
/// use nccl_rendezvous::{Rendezvous, RendezvousKind};
/// // Naming an address connects to nothing yet.
/// let store = Rendezvous::torch_store("127.0.0.1:29500")?;
/// assert_eq!(store.kind(), RendezvousKind::TorchStore);
/// assert_eq!(Rendezvous::tcp("node1:29500")?.kind(), RendezvousKind::RankZero);
/// # Ok::<(), nccl_rendezvous::Error>(())
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

/// Where and how rank 0 hands its [`Id`](crate::Id) to the other ranks.
///
/// Ranks must agree on one id before they join a communicator (`ncclCommInitRank`);
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
/// With a [secret](Rendezvous::secret) (`NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE`), the
/// exchange is authenticated and the id confidential: rank 0 and each rank prove to each
/// other that they hold the secret, on fresh random numbers of both, before the id travels,
/// sealed under a key of that exchange alone; a peer without the secret, with another, or
/// replaying a recording, learns nothing of the id and is refused
/// ([`Error::RendezvousRefused`]). What it does not protect: the key and the world size
/// travel in the clear; anyone who can reach the port can still keep ranks waiting (hold
/// connections, answer first; each rank's deadline bounds it); NCCL's own traffic after
/// the id is NCCL's to protect ([`Rendezvous::encrypt_nccl`]). Through a TCPStore the id
/// is sealed and the acknowledgements proved, but the store is passive: a recording of an
/// earlier exchange under the same key and secret could be stored again, so use a secret
/// per job (the examples' launcher makes one per launch).
///
/// Without a secret, the rendezvous is not authenticated, like NCCL's own bootstrap
/// (`NCCL_COMM_ID`) and torch's TCPStore: anyone who can connect to the address can read
/// the unique id (and so join or disturb the communicator's setup) or disturb the
/// exchange. The key only tells jobs apart; it is no secret. Use it on a network you
/// trust.
///
/// ```
/// use std::time::Duration;
/// use nccl_rendezvous::{Rendezvous, Id};
/// # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))?.timeout(Duration::from_secs(30));
/// let ids: Vec<Id> = std::thread::scope(|s| {
///     let ranks: Vec<_> = (0..3)
///         .map(|rank| {
///             let rdv = &rdv;
///             s.spawn(move || rdv.exchange_with(rank, 3, || Ok([7; 128])))
///         })
///         .collect();
///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()
/// })?;
/// assert_eq!(ids, vec![[7; 128]; 3]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a rendezvous does nothing until it is used for an exchange"]
pub struct Rendezvous {
    pub(crate) kind: RendezvousKind,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) derived_from: String,
    pub(crate) key: String,
    pub(crate) timeout: Duration,
    pub(crate) secret: Option<RendezvousSecret>,
    pub(crate) encrypt_nccl: bool,
    pub(crate) reached_as: Option<String>,
    pub(crate) round_trip: Duration,
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
            secret: None,
            encrypt_nccl: false,
            reached_as: None,
            round_trip: DEFAULT_ROUND_TRIP,
        }
    }

    /// Authenticates the exchange with `secret`, which every rank must hold: each side
    /// proves it knows it before rank 0 hands the id over, and the id travels encrypted
    /// (see [`RendezvousSecret`]). A rank without it, or with another, is refused with
    /// [`Error::RendezvousRefused`] and learns nothing of the id. From the environment:
    /// `NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE` ([`Rendezvous::from_env`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nccl_rendezvous::{Error, Rendezvous, RendezvousSecret, Id};
    /// # let free = || std::net::TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port());
    /// # let (port, other_port) = (free()?, free()?);
    /// let secret = RendezvousSecret::generate()?;
    /// let at = |port: u16| Rendezvous::tcp(&format!("127.0.0.1:{port}"));
    /// let id = [7; 128];
    ///
    /// // Two ranks holding the secret agree on rank 0's id.
    /// let rdv = at(port)?.timeout(Duration::from_secs(20)).secret(secret.clone());
    /// let (zero, one) = std::thread::scope(|s| {
    ///     let zero = s.spawn(|| rdv.exchange_with(0, 2, || Ok(id)));
    ///     let one = rdv.exchange_with(1, 2, || unreachable!());
    ///     (zero.join().unwrap(), one)
    /// });
    /// assert_eq!((zero?, one?), (id, id));
    ///
    /// // A peer without it is refused at once and sees nothing of the id (rank 0, left
    /// // without its rank 1, fails at its deadline).
    /// let guarded = at(other_port)?.timeout(Duration::from_secs(1)).secret(secret);
    /// let stranger = std::thread::scope(|s| {
    ///     let zero = s.spawn(|| guarded.exchange_with(0, 2, || Ok(id)));
    ///     let stranger = at(other_port)?.exchange_with(1, 2, || unreachable!());
    ///     let _ = zero.join();
    ///     Ok::<_, Error>(stranger)
    /// })?;
    /// assert!(matches!(stranger, Err(Error::RendezvousRefused { .. })), "{stranger:?}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn secret(mut self, secret: RendezvousSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Whether the exchange is authenticated by a secret ([`Rendezvous::secret`]).
    #[must_use]
    pub fn has_secret(&self) -> bool {
        self.secret.is_some()
    }

    /// With `true`, the program that uses the id is asked to encrypt NCCL's own sockets
    /// with a key derived from the rendezvous's secret ([`RendezvousSecret::nccl_psk`]):
    /// one secret protects the id's exchange and NCCL's traffic. This crate only carries
    /// the wish; nccl-channel's `Rendezvous::exchange` fulfils it on every rank before the
    /// id is exchanged, and fails without a secret or on an NCCL older than 2.32.3. From
    /// the environment: `NCCL_CHANNEL_RENDEZVOUS_ENCRYPT_NCCL=1`.
    pub fn encrypt_nccl(mut self, on: bool) -> Self {
        self.encrypt_nccl = on;
        self
    }

    /// Whether NCCL's sockets are encrypted with the secret ([`Rendezvous::encrypt_nccl`]).
    #[must_use]
    pub fn encrypts_nccl(&self) -> bool {
        self.encrypt_nccl
    }

    /// How long a rank waits for the others, in all (rank 0 for every peer to take the id,
    /// the others for rank 0 to serve it).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Rank 0's allowance for a round trip to a rank, [`DEFAULT_ROUND_TRIP`] unless set:
    /// when every connection slot rank 0 serves at once is taken and another connection
    /// waits in the listen backlog, the connection silent longest gives its slot to it as
    /// soon as it has been silent this long (a rank sent the id after proving the secret
    /// keeps its slot). Honest ranks answer each line at once, so they are seldom the
    /// longest silent, and one that loses its slot connects again before its deadline;
    /// connections that greet and then say nothing hold a slot for little more than this.
    /// Without a connection waiting, a silent connection keeps its slot for 5 s. Raise it
    /// above the ranks' round trip to rank 0 on a slow network where more ranks than
    /// slots (1024) arrive at once; ranks other than 0 do not use it.
    pub fn round_trip(mut self, allowance: Duration) -> Self {
        self.round_trip = allowance;
        self
    }

    /// Rank 0's allowance for a round trip ([`Rendezvous::round_trip`]).
    #[must_use]
    pub fn get_round_trip(&self) -> Duration {
        self.round_trip
    }

    /// The key that tells this job's (and this channel's) rendezvous from another one on
    /// the same address: every rank must use the same. Bytes other than ASCII letters,
    /// digits and `-_.:/+@` become `_`; it is cut to 200 bytes; an empty key becomes
    /// `nccl-channel`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = sanitize_key(&key.into());
        self
    }

    /// What serves the id.
    #[must_use]
    pub fn kind(&self) -> RendezvousKind {
        self.kind
    }

    /// `host:port` (an IPv6 host in brackets).
    #[must_use]
    pub fn address(&self) -> String {
        join_host_port(&self.host, self.port)
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

    /// The address the job's ranks name for this rendezvous, where this rank listens at
    /// (rank 0) or connects to (a rank, or rank 0 of a TCPStore exchange) another one: a
    /// port forwarded, a relay of the job's own. With a secret, every proof and the sealed
    /// id bind the address the job names, so that ranks of one address cannot be spliced to
    /// the rank 0 of another (two jobs sharing a key and a secret). Without it, the address
    /// is the one named ([`address`](Rendezvous::address)).
    ///
    /// ```
    /// use nccl_rendezvous::Rendezvous;
    /// let rank_0 = Rendezvous::tcp("127.0.0.1:29500")?.reached_as("gateway:29500")?;
    /// assert_eq!(rank_0.address(), "127.0.0.1:29500");
    /// assert_eq!(rank_0.get_reached_as(), Some("gateway:29500"));
    /// # Ok::<(), nccl_rendezvous::Error>(())
    /// ```
    pub fn reached_as(mut self, address: &str) -> Result<Self> {
        let (host, port) = parse_host_port(address).map_err(|detail| Error::InvalidArgument {
            what: "Rendezvous::reached_as",
            problem: format!("{address:?} is not host:port: {detail}"),
        })?;
        self.reached_as = Some(join_host_port(&host, port));
        Ok(self)
    }

    /// The address the other ranks name ([`Rendezvous::reached_as`]), when set.
    #[must_use]
    pub fn get_reached_as(&self) -> Option<&str> {
        self.reached_as.as_deref()
    }

    /// The address the proofs bind: [`Rendezvous::reached_as`], else the address.
    pub(crate) fn bound_address(&self) -> String {
        self.reached_as.clone().unwrap_or_else(|| self.address())
    }

    /// The secret, when the exchange is authenticated ([`Rendezvous::secret`]).
    #[must_use]
    pub fn get_secret(&self) -> Option<&RendezvousSecret> {
        self.secret.as_ref()
    }

    pub(crate) fn service(&self) -> &'static str {
        match self.kind {
            RendezvousKind::RankZero => "rank 0's rendezvous",
            RendezvousKind::TorchStore => "torchrun's TCPStore",
        }
    }

    /// An [`Error::Rendezvous`] about this rendezvous.
    pub(crate) fn error(&self, problem: impl Into<String>) -> Error {
        self.error_from(problem.into(), None)
    }

    /// An [`Error::Rendezvous`] caused by the operating system's error `e`, kept as its
    /// source (so `problem` does not repeat its text).
    pub(crate) fn io_error(&self, problem: impl Into<String>, e: std::io::Error) -> Error {
        self.error_from(problem.into(), Some(e.into()))
    }

    /// An [`Error::RendezvousRefused`] about this rendezvous.
    pub(crate) fn refused(&self, problem: impl Into<String>) -> Error {
        Error::RendezvousRefused {
            service: self.service(),
            address: self.address(),
            derived_from: self.derived_from.clone(),
            problem: problem.into(),
        }
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
    pub(crate) fn listen_addrs(&self) -> Vec<SocketAddr> {
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
    /// timeout 300s`, and `, authenticated by a secret` when it is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {} (derived from {}), key {}, timeout {:?}{}",
            self.service(),
            self.address(),
            self.derived_from,
            self.key,
            self.timeout,
            if self.secret.is_some() {
                ", authenticated by a secret"
            } else {
                ""
            }
        )
    }
}

/// `host:port`, an IPv6 host in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
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
