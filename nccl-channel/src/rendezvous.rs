//! [`Rendezvous`]: nccl-rendezvous's exchange of the id, with what needs NCCL and this
//! crate's types around it: the id made by `ncclGetUniqueId` and returned as a
//! [`UniqueId`], the world read from a [`World`], NCCL's sockets encrypted with a key of
//! the secret, and errors as this crate's [`Error`]. The network side lives in the crate
//! `nccl-rendezvous` (feature `rendezvous`, on by default), which knows nothing of CUDA, so
//! that a program that gets its ids elsewhere builds nccl-channel without it and without
//! its cryptography and event loop.

use std::fmt;
use std::time::Duration;

use nccl_sys::Nccl;

use crate::{Encryption, Error, IoError, Result, UniqueId, World};

pub use nccl_rendezvous::{
    DEFAULT_TIMEOUT, PORT_BASE, PORT_SPAN, RendezvousKind, RendezvousSecret, SECRET_FILE_ENV,
};

/// Where and how rank 0 hands its [`UniqueId`] to the other ranks over TCP.
///
/// Ranks must agree on one id before
/// [`Communicator::init_rank`](crate::Communicator::init_rank); NCCL leaves the sharing to
/// the program. A `Rendezvous` does it over TCP: rank 0 generates the id and serves it
/// (or stores it in torchrun's TCPStore), the others fetch it, retrying while the server
/// is not up yet, until a deadline. Get one from the launcher's environment with
/// [`Rendezvous::from_env`], or from code with [`Rendezvous::tcp`] /
/// [`Rendezvous::torch_store`].
///
/// This is [`nccl_rendezvous::Rendezvous`] (whose page tells what the exchange protects,
/// and the rule that derives an address from the launcher's variables) with NCCL's side:
/// [`Rendezvous::exchange`] makes the id with `ncclGetUniqueId` and, on request, has NCCL
/// encrypt its sockets with a key of the secret ([`Rendezvous::encrypt_nccl`]).
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
pub struct Rendezvous(nccl_rendezvous::Rendezvous);

static_assertions::assert_impl_all!(Rendezvous: Send, Sync, std::fmt::Debug);

impl Rendezvous {
    /// The world's rendezvous as the launcher's environment describes it, `Ok(None)` when
    /// it describes none. See [`Rendezvous::from_lookup`] for the rule.
    pub fn from_env(world: &World) -> Result<Option<Rendezvous>> {
        Self::from_lookup(world, |name| std::env::var(name).ok())
    }

    /// As [`Rendezvous::from_env`], reading variables through `lookup`: the rule of
    /// [`nccl_rendezvous::Rendezvous::from_lookup`], for the world's
    /// [`source`](World::source) and size.
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
        Ok(nccl_rendezvous::Rendezvous::from_lookup(world.source, world.size, lookup)?.map(Self))
    }

    /// Rank 0 serves the id at `address` (`host:port`, `[v6]:port`); the others connect
    /// there ([`nccl_rendezvous::Rendezvous::tcp`]). Like torch's
    /// `init_method="tcp://host:port"`.
    #[doc(alias = "init_method")]
    pub fn tcp(address: &str) -> Result<Rendezvous> {
        Ok(Self(nccl_rendezvous::Rendezvous::tcp(address)?))
    }

    /// A TCPStore that already runs at `address` (as torchrun's agent hosts one): rank 0
    /// stores the id there, the others read it ([`nccl_rendezvous::Rendezvous::torch_store`]).
    #[doc(alias = "TCPStore")]
    pub fn torch_store(address: &str) -> Result<Rendezvous> {
        Ok(Self(nccl_rendezvous::Rendezvous::torch_store(address)?))
    }

    /// Authenticates the exchange with `secret`, which every rank must hold
    /// ([`nccl_rendezvous::Rendezvous::secret`]). A rank without it, or with another, is
    /// refused with [`Error::RendezvousRefused`] and learns nothing of the id. From the
    /// environment: `NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE` ([`Rendezvous::from_env`]).
    pub fn secret(self, secret: RendezvousSecret) -> Self {
        Self(self.0.secret(secret))
    }

    /// The address the job's ranks name for this rendezvous, where this rank listens at
    /// or connects to another one (a port forwarded, a relay of the job's own): the proofs
    /// bind it ([`nccl_rendezvous::Rendezvous::reached_as`]).
    pub fn reached_as(self, address: &str) -> Result<Self> {
        Ok(Self(self.0.reached_as(address)?))
    }

    /// Whether the exchange is authenticated by a secret ([`Rendezvous::secret`]).
    #[must_use]
    pub fn has_secret(&self) -> bool {
        self.0.has_secret()
    }

    /// With `true`, [`Rendezvous::exchange`] also asks NCCL to encrypt its own sockets
    /// with a key derived from the rendezvous's secret ([`Encryption::derived_from`],
    /// through [`set_encryption`](crate::set_encryption), NCCL ≥ 2.32.3) on every rank,
    /// before the id is exchanged (so a rank whose NCCL cannot fails before the others
    /// count on it). Without a secret, or on an older NCCL, the exchange fails
    /// ([`Error::InvalidArgument`], [`Error::Unsupported`]). [`Rendezvous::exchange_with`],
    /// which has no NCCL, leaves NCCL as it is. From the environment:
    /// `NCCL_CHANNEL_RENDEZVOUS_ENCRYPT_NCCL=1`.
    pub fn encrypt_nccl(self, on: bool) -> Self {
        Self(self.0.encrypt_nccl(on))
    }

    /// Whether NCCL's sockets are encrypted with the secret ([`Rendezvous::encrypt_nccl`]).
    #[must_use]
    pub fn encrypts_nccl(&self) -> bool {
        self.0.encrypts_nccl()
    }

    /// How long a rank waits for the others, in all.
    pub fn timeout(self, timeout: Duration) -> Self {
        Self(self.0.timeout(timeout))
    }

    /// The key that tells this job's (and this channel's) rendezvous from another one on
    /// the same address ([`nccl_rendezvous::Rendezvous::key`]).
    pub fn key(self, key: impl Into<String>) -> Self {
        Self(self.0.key(key))
    }

    /// What serves the id.
    #[must_use]
    pub fn kind(&self) -> RendezvousKind {
        self.0.kind()
    }

    /// `host:port` (an IPv6 host in brackets).
    #[must_use]
    pub fn address(&self) -> String {
        self.0.address()
    }

    /// The host part of the address.
    #[must_use]
    pub fn host(&self) -> &str {
        self.0.host()
    }

    /// The port part of the address.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// The variables the address came from (`"code"` for [`Rendezvous::tcp`]).
    #[must_use]
    pub fn derived_from(&self) -> &str {
        self.0.derived_from()
    }

    /// The key (before the per-exchange sequence number).
    #[must_use]
    pub fn get_key(&self) -> &str {
        self.0.get_key()
    }

    /// The deadline of an exchange.
    #[must_use]
    pub fn get_timeout(&self) -> Duration {
        self.0.get_timeout()
    }

    /// The rendezvous of nccl-rendezvous this one is.
    pub fn as_inner(&self) -> &nccl_rendezvous::Rendezvous {
        &self.0
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
    /// use cuda_hal::Cuda;
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, Rendezvous};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
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
        if self.0.encrypts_nccl() {
            let Some(secret) = self.0.get_secret() else {
                return Err(Error::InvalidArgument {
                    what: "Rendezvous::encrypt_nccl",
                    problem: "NCCL's key is derived from the rendezvous's secret, and this \
                              rendezvous has none (Rendezvous::secret)"
                        .into(),
                });
            };
            // Before the id: a rank whose NCCL cannot encrypt fails before the others
            // count on it.
            crate::set_encryption(nccl, &Encryption::derived_from(secret))?;
        }
        self.exchange_with(rank, size, || UniqueId::generate(nccl))
    }

    /// As [`Rendezvous::exchange`], with rank 0's id made by `make` (called once, on rank
    /// 0 only, after it is ready to serve): for tests and for ids made elsewhere. The
    /// error `make` returns comes back as it was.
    pub fn exchange_with(
        &self,
        rank: usize,
        size: usize,
        make: impl FnOnce() -> Result<UniqueId>,
    ) -> Result<UniqueId> {
        self.0
            .exchange_with_error(rank, size, || make().map(|id| id.0))
            .map(UniqueId)
    }
}

impl From<nccl_rendezvous::Rendezvous> for Rendezvous {
    fn from(inner: nccl_rendezvous::Rendezvous) -> Rendezvous {
        Rendezvous(inner)
    }
}

impl fmt::Display for Rendezvous {
    /// `rank 0's rendezvous at node1:27296 (derived from SLURM_JOB_NODELIST, …), key …,
    /// timeout 300s`, and `, authenticated by a secret` when it is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<nccl_rendezvous::Error> for Error {
    /// Each variant as this crate's variant of the same name and fields.
    fn from(e: nccl_rendezvous::Error) -> Error {
        use nccl_rendezvous::Error as R;
        let io = |e: nccl_rendezvous::IoError| IoError::shared(e.shared());
        match e {
            R::Env {
                variable,
                value,
                problem,
            } => Error::Env {
                variable,
                value,
                problem,
            },
            R::InvalidArgument { what, problem } => Error::InvalidArgument { what, problem },
            R::InvalidRank { what, rank, size } => Error::InvalidRank { what, rank, size },
            R::Io { what, path, source } => Error::Io {
                what,
                path,
                source: io(source),
            },
            R::Rendezvous {
                service,
                address,
                derived_from,
                problem,
                source,
            } => Error::Rendezvous {
                service,
                address,
                derived_from,
                problem,
                source: source.map(io),
            },
            R::RendezvousRefused {
                service,
                address,
                derived_from,
                problem,
            } => Error::RendezvousRefused {
                service,
                address,
                derived_from,
                problem,
            },
            other => Error::InvalidArgument {
                what: "Rendezvous",
                problem: other.to_string(),
            },
        }
    }
}
