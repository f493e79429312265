//! [`Rendezvous`]: where and how rank 0 hands its unique id to the other ranks over TCP,
//! so that ranks started by torchrun, Slurm, Open MPI or MPICH agree on an id without an
//! extra variable.

mod derive;
mod hostlist;
mod net;
mod ours;
mod point;
mod proof;
mod secret;
mod tcpstore;

use std::collections::BTreeMap;
use std::sync::Mutex;

use nccl_sys::Nccl;

use crate::{Error, Result, UniqueId, World};

pub use derive::{PORT_BASE, PORT_SPAN};
pub use point::{DEFAULT_TIMEOUT, Rendezvous, RendezvousKind};
pub use secret::{RendezvousSecret, SECRET_FILE_ENV};

// The doors that need the protocols and the rule of derive.rs; what a rendezvous is, and
// the rest of its methods, are in point.rs, below them.

impl Rendezvous {
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
        if self.encrypt_nccl {
            let Some(secret) = &self.secret else {
                return Err(Error::InvalidArgument {
                    what: "Rendezvous::encrypt_nccl",
                    problem: "NCCL's key is derived from the rendezvous's secret, and this \
                              rendezvous has none (Rendezvous::secret)"
                        .into(),
                });
            };
            // Before the id: a rank whose NCCL cannot encrypt fails before the others
            // count on it.
            crate::set_encryption(nccl, &secret.nccl_encryption())?;
        }
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
        // Every wait below (connecting, serving, reading) is watched as one.
        let _watch =
            crate::notice::watch(crate::notice::Deadline::Rendezvous(self.timeout), || {
                format!(
                    "the rendezvous at {} (rank {rank} of {size})",
                    self.address()
                )
            });
        match (self.kind, rank) {
            (RendezvousKind::RankZero, 0) => ours::serve(self, &key, size, make),
            (RendezvousKind::RankZero, _) => ours::receive(self, &key, rank, size),
            (RendezvousKind::TorchStore, 0) => tcpstore::publish(self, &key, size, make),
            (RendezvousKind::TorchStore, _) => tcpstore::fetch(self, &key, rank, size),
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
