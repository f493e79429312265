//! [`Channel`]: the default channel of a process (world size, rank, device and unique id
//! from the environment, as IREE's CUDA runtime does), opening NCCL only when needed.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cuda_hal::{Cuda, Stream};
use nccl_sys::Nccl;

#[cfg(feature = "rendezvous")]
use crate::Rendezvous;
use crate::{CommConfig, Communicator, Error, Result, UniqueId, World};

static NCCL: OnceLock<Result<Arc<Nccl>, nccl_sys::LoadError>> = OnceLock::new();

/// The process-wide NCCL, searched for and loaded on the first call ([`Nccl::load`]).
pub fn nccl() -> Result<Arc<Nccl>> {
    Ok(NCCL.get_or_init(|| Nccl::load().map(Arc::new)).clone()?)
}

/// Whether [`nccl`] has been called (and so whether this crate has opened libnccl).
pub fn nccl_opened() -> bool {
    NCCL.get().is_some()
}

/// How the ranks agree on a unique id.
///
/// Non-exhaustive: more exchanges may come.
///
/// Here rank 0 serves the id on loopback and rank 1 fetches it
/// (`IdSource::Rendezvous`, feature `rendezvous`); each rank is a thread with a simulated
/// GPU.
///
#[cfg_attr(feature = "rendezvous", doc = "```")]
#[cfg_attr(not(feature = "rendezvous"), doc = "```ignore")]
/// # use std::sync::Arc;
/// use std::time::Duration;
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_channel::{ChannelBuilder, IdSource, Rendezvous, World};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// // A port free on this machine (a launcher would derive one for every rank).
/// let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))?.timeout(Duration::from_secs(30));
/// let origins = std::thread::scope(|s| {
///     let ranks: Vec<_> = (0..2)
///         .map(|rank| {
///             let (cuda, nccl, rdv) = (cuda.clone(), nccl.clone(), rdv.clone());
///             s.spawn(move || -> nccl_channel::Result<String> {
///                 let ch = ChannelBuilder::new()
///                     .world(World::new(2, rank)?)
///                     .cuda(cuda)
///                     .nccl(nccl)
///                     .unique_id(IdSource::Rendezvous(rdv))
///                     .build()?
///                     .expect("a world was given");
///                 assert_eq!((ch.comm().rank(), ch.comm().size()), (rank, 2));
///                 Ok(ch.id_origin().to_string())
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
/// })?;
/// let origin = format!(
///     "rank 0's rendezvous at 127.0.0.1:{port} (derived from code), key nccl-channel, timeout 30s"
/// );
/// assert_eq!(origins, [origin.clone(), origin]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum IdSource {
    /// One rank: a fresh id. Several: [`IdSource::CommIdEnv`] if `NCCL_COMM_ID` is set;
    /// else the launcher's rendezvous ([`Rendezvous::from_env`]: `NCCL_CHANNEL_RENDEZVOUS`,
    /// torchrun's `MASTER_ADDR`/`MASTER_PORT` or agent store, Slurm, Open MPI, MPICH),
    /// where rank 0 generates the id and hands it to the others over TCP; else an error
    /// saying how to provide one.
    #[default]
    Auto,
    /// Derived by every rank from `NCCL_COMM_ID=host:port` ([`UniqueId::from_comm_id`]).
    CommIdEnv,
    /// Given (rank 0 generated it and shared it some other way).
    Given(UniqueId),
    /// Exchanged through a file on a shared file system ([`UniqueId::exchange_via_file`]).
    File {
        /// The file.
        path: PathBuf,
        /// How long ranks other than 0 wait for it.
        timeout: Duration,
    },
    /// Handed from rank 0 to the others over TCP ([`Rendezvous::exchange`]), at an address
    /// given in code or derived from the environment (feature `rendezvous`).
    #[cfg(feature = "rendezvous")]
    Rendezvous(Rendezvous),
}

/// Builds a [`Channel`]; every part defaults to the environment.
///
/// Each part given in code is one the environment is not asked for: a program (or a
/// test) that gives the [`World`] and the [`IdSource`] reads no launcher variable, and
/// with a driver and an NCCL of its own loads no library. Two ranks, one thread each, on
/// simulated GPUs:
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{ChannelBuilder, IdSource, UniqueId, World};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let id = UniqueId::generate(&nccl)?;
/// let gathered = std::thread::scope(|s| {
///     let ranks: Vec<_> = (0..2)
///         .map(|rank| {
///             let (cuda, nccl) = (cuda.clone(), nccl.clone());
///             s.spawn(move || -> nccl_channel::Result<Vec<i32>> {
///                 let ch = ChannelBuilder::new()
///                     .world(World::new(2, rank)?)
///                     .cuda(cuda)
///                     .nccl(nccl)
///                     .unique_id(IdSource::Given(id))
///                     .build()?
///                     .expect("a world was given");
///                 // The device is the world's local rank, else its rank.
///                 assert_eq!(ch.comm().context().device().ordinal(), rank as i32);
///                 let ctx = ch.comm().context();
///                 let send = DeviceBuffer::from_slice(ctx, &[101, 102])?;
///                 let mut recv = DeviceBuffer::zeroed(ctx, 4)?;
///                 ch.comm().all_gather(&send, &mut recv, ch.stream())?;
///                 ch.stream().synchronize()?;
///                 Ok(recv.to_vec()?)
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
/// })?;
/// assert_eq!(gathered, [[101, 102, 101, 102], [101, 102, 101, 102]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ChannelBuilder {
    world: Option<World>,
    device: Option<String>,
    id: IdSource,
    nccl: Option<Arc<Nccl>>,
    cuda: Option<Cuda>,
    config: Option<CommConfig>,
}

impl ChannelBuilder {
    /// Everything from the environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// The world (else [`World::from_env`]).
    pub fn world(mut self, world: World) -> Self {
        self.world = Some(world);
        self
    }

    /// The device, as a selector (`cuda://1`, `cuda://GPU-<uuid>`); else the world's
    /// local rank.
    pub fn device(mut self, selector: impl Into<String>) -> Self {
        self.device = Some(selector.into());
        self
    }

    /// How the ranks agree on the unique id.
    pub fn unique_id(mut self, source: IdSource) -> Self {
        self.id = source;
        self
    }

    /// The NCCL to use (else [`nccl`], loaded on demand).
    pub fn nccl(mut self, nccl: Arc<Nccl>) -> Self {
        self.nccl = Some(nccl);
        self
    }

    /// The communicator's configuration (e.g. non-blocking with a deadline).
    pub fn config(mut self, config: CommConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// The CUDA driver to use (else [`Cuda::load`]).
    pub fn cuda(mut self, cuda: Cuda) -> Self {
        self.cuda = Some(cuda);
        self
    }

    /// Opens the channel: `Ok(None)` when no world is configured (NCCL is then not
    /// opened), else agrees on a unique id with the other ranks (see [`IdSource`]; by
    /// default `NCCL_COMM_ID`, else the launcher's [`Rendezvous`]) and joins the
    /// communicator on the chosen device.
    pub fn build(self) -> Result<Option<Channel>> {
        let world = match self.world {
            Some(w) => w,
            None => match World::from_env()? {
                Some(w) => w,
                None => return Ok(None),
            },
        };
        let cuda = match self.cuda {
            Some(c) => c,
            None => Cuda::load()?,
        };
        let selector = self
            .device
            .unwrap_or_else(|| format!("cuda://{}", world.default_device()));
        let device = cuda.select(&selector)?;
        let ctx = device.primary_context()?;
        let nccl = match self.nccl {
            Some(n) => n,
            None => nccl()?,
        };
        let comm_id = || std::env::var("NCCL_COMM_ID").unwrap_or_default();
        let (id, id_origin) = match self.id {
            IdSource::Given(id) => (id, "given in code".to_string()),
            IdSource::CommIdEnv => (
                refuse_secret_with_comm_id(&comm_id())
                    .and_then(|()| UniqueId::from_comm_id(&nccl))?,
                format!("derived from NCCL_COMM_ID={}", comm_id()),
            ),
            IdSource::File { path, timeout } => (
                UniqueId::exchange_via_file(&nccl, &path, world.rank, timeout)?,
                format!("exchanged through {}", path.display()),
            ),
            IdSource::Auto if world.size == 1 => {
                (UniqueId::generate(&nccl)?, "generated (one rank)".into())
            }
            #[cfg(feature = "rendezvous")]
            IdSource::Rendezvous(rdv) => (
                rdv.exchange(&nccl, world.rank, world.size)?,
                rdv.to_string(),
            ),
            IdSource::Auto => {
                if !comm_id().trim().is_empty() {
                    refuse_secret_with_comm_id(&comm_id())?;
                    (
                        UniqueId::from_comm_id(&nccl)?,
                        format!("derived from NCCL_COMM_ID={}", comm_id()),
                    )
                } else if let Some((id, origin)) = launchers_rendezvous(&nccl, &world)? {
                    (id, origin)
                } else {
                    return Err(Error::InvalidArgument {
                        what: "ChannelBuilder::build",
                        problem: format!(
                            "{} ranks ({} world) need a shared unique id and the environment \
                             names no rendezvous: set NCCL_COMM_ID=host:port (rank 0's \
                             address) or NCCL_CHANNEL_RENDEZVOUS=host:port (rank 0 serves the \
                             id there), launch with torchrun, srun, mpirun or mpiexec (their \
                             variables give one), or pass one with IdSource::Given / \
                             IdSource::File / IdSource::Rendezvous",
                            world.size, world.source
                        ),
                    });
                }
            }
        };
        let config = self.config.unwrap_or_default();
        let comm = Communicator::init_rank_with(&nccl, &ctx, &id, world.size, world.rank, &config)?;
        let stream = Stream::non_blocking(&ctx)?;
        Ok(Some(Channel {
            comm,
            stream,
            world,
            id_origin,
        }))
    }
}

/// The variable naming the rendezvous's secret file (`SECRET_FILE_ENV`), known here with
/// or without the rendezvous: a secret set beside `NCCL_COMM_ID` is refused either way.
const SECRET_FILE_VARIABLE: &str = "NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE";

/// `NCCL_COMM_ID` gives every rank the id without any exchange, so no secret protects it:
/// a secret file set beside it would be ignored, and the program would believe itself
/// protected. Refused instead, naming both variables.
fn refuse_secret_with_comm_id(comm_id: &str) -> Result<()> {
    match std::env::var_os(SECRET_FILE_VARIABLE) {
        Some(path) if !path.is_empty() => Err(Error::Env {
            variable: SECRET_FILE_VARIABLE.into(),
            value: path.to_string_lossy().into_owned(),
            problem: format!(
                "set together with NCCL_COMM_ID={comm_id}, which gives every rank the id                  without an exchange, so the secret would protect nothing: unset                  NCCL_COMM_ID to exchange the id through the launcher's rendezvous with the                  secret, or unset {SECRET_FILE_VARIABLE}"
            ),
        }),
        _ => Ok(()),
    }
}

/// The launcher's rendezvous, when the environment names one: the id and where it came
/// from.
#[cfg(feature = "rendezvous")]
fn launchers_rendezvous(nccl: &Nccl, world: &World) -> Result<Option<(UniqueId, String)>> {
    match Rendezvous::from_env(world)? {
        Some(rdv) => Ok(Some((
            rdv.exchange(nccl, world.rank, world.size)?,
            rdv.to_string(),
        ))),
        None => Ok(None),
    }
}

/// Without the rendezvous (feature `rendezvous` off) the environment names none.
#[cfg(not(feature = "rendezvous"))]
fn launchers_rendezvous(_nccl: &Nccl, _world: &World) -> Result<Option<(UniqueId, String)>> {
    Ok(None)
}

/// A process's communicator with a stream of its own: what IREE calls the default channel.
///
/// [`Channel::from_env`] opens it from the launcher's environment (see the crate's
/// front page); [`ChannelBuilder`] from code. A world of one rank needs no id exchange:
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{ChannelBuilder, ReduceOp, World};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let (nccl, _world) = MockNccl::new(&gpus).build()?;
/// let ch = ChannelBuilder::new()
///     .world(World::new(1, 0)?)
///     .cuda(cuda)
///     .nccl(Arc::new(nccl))
///     .build()?
///     .expect("a world was given");
/// assert_eq!(ch.id_origin(), "generated (one rank)");
/// let mut buf = DeviceBuffer::from_slice(ch.comm().context(), &[1.5f64])?;
/// ch.comm().all_reduce_in_place(&mut buf, ReduceOp::Sum, ch.stream())?;
/// ch.stream().synchronize()?;
/// assert_eq!(buf.to_vec()?, [1.5]);
/// ch.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Channel {
    comm: Communicator,
    stream: Stream,
    world: World,
    id_origin: String,
}

impl Channel {
    /// The default channel from the environment (`Ok(None)` when no world is configured).
    ///
    /// Not run here: it reads the process's environment and needs GPUs and libnccl.
    ///
    /// ```no_run
    /// // NCCL_CHANNEL_NPROCS=2 NCCL_CHANNEL_PROCID=0 NCCL_COMM_ID=127.0.0.1:8000 ./prog
    /// match nccl_channel::Channel::from_env()? {
    ///     Some(ch) => println!("rank {} of {}, id {}", ch.world().rank, ch.world().size, ch.id_origin()),
    ///     None => println!("no world configured: running alone, NCCL not loaded"),
    /// }
    /// # Ok::<(), nccl_channel::Error>(())
    /// ```
    pub fn from_env() -> Result<Option<Channel>> {
        ChannelBuilder::new().build()
    }

    /// The communicator.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// The channel's stream (on the communicator's device).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The world it was built for.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// How the ranks agreed on the unique id, for logs: e.g. `derived from
    /// NCCL_COMM_ID=127.0.0.1:8000`, or the [`Rendezvous`] used (`torchrun's TCPStore at
    /// 127.0.0.1:29500 (derived from MASTER_ADDR, MASTER_PORT, ...), key ..., timeout 300s`).
    pub fn id_origin(&self) -> &str {
        &self.id_origin
    }

    /// Closes the communicator, reporting errors.
    pub fn close(self) -> Result<()> {
        self.stream.synchronize()?;
        self.comm.close()
    }
}
