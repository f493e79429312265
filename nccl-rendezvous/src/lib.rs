//! How rank 0 hands the 128 bytes of an NCCL unique id to the other ranks over TCP, so
//! that ranks started by torchrun, Slurm, Open MPI or MPICH agree on an id without an
//! extra variable; authenticated and confidential with a shared [`RendezvousSecret`].
//!
//! This crate is the part of a program that faces the network while ranks agree on an
//! id, kept apart from CUDA and NCCL: it neither loads nor calls them, and the id it hands over is
//! whatever 128 bytes rank 0's `make` gives ([`Rendezvous::exchange_with`]). nccl-channel
//! uses it behind its default feature `rendezvous`; a program that gets its ids elsewhere
//! (torch, MPI, its own launcher) builds nccl-channel without it and so without the
//! cryptography and the event loop this crate brings.
//!
//! * [`Rendezvous`]: where and how (an address given in code, or derived from the
//!   launcher's environment with [`Rendezvous::from_lookup`]), then
//!   [`Rendezvous::exchange_with`].
//! * [`RendezvousSecret`]: the shared secret; with it each side proves it knows the
//!   secret before the id travels, sealed, and only proven answers are believed.
//! * [`Error`]: what went wrong, naming the address and where it came from.
//!
//! Two ranks, one thread each, agree on rank 0's id over loopback:
//!
//! ```
//! use std::time::Duration;
//! use nccl_rendezvous::{Rendezvous, RendezvousSecret};
//! # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))?
//!     .timeout(Duration::from_secs(30))
//!     .secret(RendezvousSecret::generate()?);
//! let (zero, one) = std::thread::scope(|s| {
//!     let zero = s.spawn(|| rdv.exchange_with(0, 2, || Ok([7; 128])));
//!     let one = rdv.exchange_with(1, 2, || unreachable!());
//!     (zero.join().expect("rank 0"), one)
//! });
//! assert_eq!((zero?, one?), ([7; 128], [7; 128]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backoff;
mod decimal;
mod derive;
mod error;
mod host_port;
mod hostlist;
mod net;
mod notice;
mod ours;
mod point;
mod proof;
mod secret;
mod tcpstore;

use std::collections::BTreeMap;
use std::sync::Mutex;

pub use derive::{ENCRYPT_NCCL_ENV, PORT_BASE, PORT_SPAN};
pub use error::{Error, IoError, Result};
pub use point::{DEFAULT_ROUND_TRIP, DEFAULT_TIMEOUT, Rendezvous, RendezvousKind};
pub use secret::{RendezvousSecret, SECRET_FILE_ENV};

/// The bytes of the id a rendezvous hands over (`ncclUniqueId` holds 128).
pub const ID_LEN: usize = 128;

/// The id a rendezvous hands over: [`ID_LEN`] bytes, made by rank 0.
pub type Id = [u8; ID_LEN];

// The doors that need the protocols and the rule of derive.rs; what a rendezvous is, and
// the rest of its methods, are in point.rs, below them.

impl Rendezvous {
    /// The rendezvous of a world of `size` ranks started by `launcher` as the process's
    /// environment describes it, `Ok(None)` when it describes none. See
    /// [`Rendezvous::from_lookup`] for the rule.
    pub fn from_env(launcher: &str, size: usize) -> Result<Option<Rendezvous>> {
        Self::from_lookup(launcher, size, |name| std::env::var(name).ok())
    }

    /// As [`Rendezvous::from_env`], reading variables through `lookup` (tests, programs
    /// that keep their configuration elsewhere). `launcher` is the family whose variables
    /// gave the world (nccl-channel's `World::source`: `"torchrun"`, `"Slurm"`,
    /// `"Open MPI"`, `"PMI"`, anything else for none of those), `size` its number of
    /// ranks. The first row that applies decides:
    ///
    /// | Launcher (`launcher`) | Condition | Address | Kind |
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
    /// use nccl_rendezvous::{Rendezvous, RendezvousKind};
    /// let env = [
    ///     ("SLURM_NTASKS", "8"), ("SLURM_PROCID", "3"),
    ///     ("SLURM_JOB_NODELIST", "gpu[07-10],login1"),
    ///     ("SLURM_JOB_ID", "123456"), ("SLURM_STEP_ID", "0"),
    /// ];
    /// let lookup = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
    /// let rdv = Rendezvous::from_lookup("Slurm", 8, lookup)?.expect("Slurm gives one");
    /// assert_eq!(rdv.kind(), RendezvousKind::RankZero);
    /// assert_eq!(rdv.address(), "gpu07:27296");
    /// assert_eq!(rdv.derived_from(), "SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID");
    /// # Ok::<(), nccl_rendezvous::Error>(())
    /// ```
    #[doc(alias = "MASTER_ADDR")]
    #[doc(alias = "MASTER_PORT")]
    pub fn from_lookup(
        launcher: &str,
        size: usize,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Rendezvous>> {
        derive::derive(launcher, size, &lookup)
    }

    /// Agrees on an id with the other ranks: rank 0 (`rank == 0`) calls `make` once,
    /// after it is ready to serve, and hands what it made to the others, which receive
    /// it. One rank (`size == 1`): `make`'s id, no network. `E` is the caller's error type,
    /// which `make` returns and this crate's [`Error`] converts into (nccl-channel passes
    /// its own; `nccl_rendezvous::Error` itself will do).
    ///
    /// Every wait below (connecting, serving, reading) is bounded by the rendezvous's
    /// [timeout](Rendezvous::timeout); one that lasts says so once on stderr after 10 s
    /// (the variable `NCCL_CHANNEL_WAIT_NOTICE_SECS` gives another delay; `0`, none),
    /// naming what it learnt (rank 0 answered and could not prove the secret).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nccl_rendezvous::Rendezvous;
    /// # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    /// let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))?.timeout(Duration::from_secs(30));
    /// let ids = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             let rdv = &rdv;
    ///             s.spawn(move || rdv.exchange_with(rank, 3, || Ok([7; 128])))
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|h| h.join().expect("a rank")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(ids, vec![[7; 128]; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exchange_with(
        &self,
        rank: usize,
        size: usize,
        make: impl FnOnce() -> Result<Id>,
    ) -> Result<Id> {
        self.exchange_with_error(rank, size, make)
    }

    /// As [`Rendezvous::exchange_with`], with `make`'s error of the caller's type `E`,
    /// which this crate's [`Error`] converts into: the error `make` returned comes back as
    /// it was (nccl-channel's rank 0 passes NCCL's failure to make an id through).
    pub fn exchange_with_error<E: From<Error>>(
        &self,
        rank: usize,
        size: usize,
        make: impl FnOnce() -> Result<Id, E>,
    ) -> Result<Id, E> {
        if size == 0 || rank >= size {
            return Err(Error::InvalidRank {
                what: "Rendezvous::exchange",
                rank,
                size,
            }
            .into());
        }
        if size == 1 {
            return make();
        }
        let key = format!("{}#{}", self.key, next_sequence(self, rank));
        let watch = notice::watch(self.timeout, || {
            format!(
                "the rendezvous at {} (rank {rank} of {size})",
                self.address()
            )
        });
        let found = watch.found();
        match (self.kind, rank) {
            (RendezvousKind::RankZero, 0) => ours::serve(self, &key, size, make),
            (RendezvousKind::RankZero, _) => Ok(ours::receive(self, &key, rank, size, found)?),
            (RendezvousKind::TorchStore, 0) => tcpstore::publish(self, &key, size, make),
            (RendezvousKind::TorchStore, _) => Ok(tcpstore::fetch(self, &key, rank, size, found)?),
        }
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

// The README (the crate's registry page) runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
