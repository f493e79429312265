//! [`CommConfig`]: how a communicator is created. This crate's own blocking mode and
//! deadline, and every field of NCCL's `ncclConfig_t` as a typed, versioned setter.

use std::ffi::{CString, c_int};
use std::ops::BitOr;
use std::time::Duration;

use nccl_sys::{
    ConfigField, NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT, NCCL_VERSION_CODE, NcclVersion,
    ncclConfig_t, ncclHostCftMode_t, ncclNvlsHostMode_t,
};

use crate::{Error, Result};

/// NCCL's CTA policy (`NCCL_CTA_POLICY_*`), a bit set since NCCL 2.28: combine flags with
/// `|`. Any value passes through, so flags of a newer NCCL can be given as raw bits.
///
/// ```
/// use nccl_channel::{CommConfig, CtaPolicy};
/// let policy = CtaPolicy::EFFICIENCY | CtaPolicy::ZERO;
/// assert!(policy.contains(CtaPolicy::ZERO) && !CtaPolicy::ZERO.contains(policy));
/// assert_eq!(policy, CtaPolicy(3));
/// let config = CommConfig::new().cta_policy(policy);
/// assert_eq!(config.get_cta_policy(), Some(policy));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct CtaPolicy(pub i32);

impl CtaPolicy {
    /// NCCL's default policy (no flag).
    #[doc(alias = "NCCL_CTA_POLICY_DEFAULT")]
    pub const DEFAULT: CtaPolicy = CtaPolicy(nccl_sys::NCCL_CTA_POLICY_DEFAULT as i32);
    /// Fewer CTAs (SMs) for the same bandwidth where NCCL can, e.g. NVLS on registered
    /// buffers, leaving SMs to the computation.
    #[doc(alias = "NCCL_CTA_POLICY_EFFICIENCY")]
    pub const EFFICIENCY: CtaPolicy = CtaPolicy(nccl_sys::NCCL_CTA_POLICY_EFFICIENCY as i32);
    /// Zero-CTA operations where possible: NCCL moves the data with the GPU's copy
    /// engines and leaves every SM to the computation; takes precedence over
    /// [`EFFICIENCY`](Self::EFFICIENCY). It applies to all-gathers, all-to-alls, gathers and
    /// scatters whose buffers are in symmetric memory
    /// ([`Communicator::symmetric`](crate::Communicator::symmetric), or a window registered
    /// with [`WindowFlags::COLL_SYMMETRIC`](crate::WindowFlags::COLL_SYMMETRIC)) within one NVLink
    /// domain (NCCL ≥ 2.28, driver ≥ 12.5; all-gathers and all-to-alls across nodes from
    /// NCCL 2.30.6); other collectives run as without it. When it wins, measured on two
    /// H200s (BENCHMARKS.md): a 1 GiB all-gather in symmetric memory 1.39 × faster than
    /// under the default policy, while an all-gather of a few MiB costs 22–26 µs instead
    /// of 7–12; so for large gathers beside compute kernels, not for small ones.
    ///
    /// ```
    /// use nccl_channel::{CommConfig, CtaPolicy};
    /// // A communicator whose large all-gathers leave the SMs to the computation.
    /// let config = CommConfig::new().cta_policy(CtaPolicy::ZERO);
    /// # assert_eq!(config.get_cta_policy(), Some(CtaPolicy::ZERO));
    /// ```
    #[doc(alias = "NCCL_CTA_POLICY_ZERO")]
    pub const ZERO: CtaPolicy = CtaPolicy(nccl_sys::NCCL_CTA_POLICY_ZERO as i32);

    /// Whether every flag of `other` is set.
    #[must_use]
    pub const fn contains(self, other: CtaPolicy) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for CtaPolicy {
    type Output = CtaPolicy;

    fn bitor(self, rhs: CtaPolicy) -> CtaPolicy {
        CtaPolicy(self.0 | rhs.0)
    }
}

/// Host-side Compute Fabric Transport support (`ncclHostCftMode_t`). Leave
/// [`CommConfig::host_cft_mode`] unset for the library's default (`ncclHostCftDefault`).
#[doc = concat!("NCCL ", nccl_sys::config_field_since!("hostCftMode"), ".")]
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_channel::{CommConfig, Communicator, HostCftMode, UniqueId};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let nccl = Arc::new(nccl);
/// let ctx = cuda.device(0)?.primary_context()?;
/// let config = CommConfig::new().host_cft_mode(HostCftMode::FALLBACK);
/// let id = UniqueId::generate(&nccl)?;
/// let comm = Communicator::init_rank_with(&nccl, &ctx, &id, 1, 0, &config)?;
/// assert_eq!(comm.config().get_host_cft_mode(), Some(HostCftMode::FALLBACK));
/// // What the (simulated) NCCL was given: ncclHostCftFallback.
/// let seen = world.config_of(comm.as_raw()).expect("made with a config");
/// assert_eq!(seen.raw.hostCftMode, HostCftMode::FALLBACK.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(alias = "ncclHostCftMode_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct HostCftMode(pub i32);

impl HostCftMode {
    /// Create the communicator's CFT endpoints (at its first window registration).
    #[doc(alias = "ncclHostCftEnable")]
    pub const ENABLE: HostCftMode = HostCftMode(ncclHostCftMode_t::ncclHostCftEnable.0);
    /// No host-side CFT.
    #[doc(alias = "ncclHostCftDisable")]
    pub const DISABLE: HostCftMode = HostCftMode(ncclHostCftMode_t::ncclHostCftDisable.0);
    /// Try to create the endpoints; disable host-side CFT if that fails.
    #[doc(alias = "ncclHostCftFallback")]
    pub const FALLBACK: HostCftMode = HostCftMode(ncclHostCftMode_t::ncclHostCftFallback.0);
}

/// Which host-side NVLS (NVLink SHARP) components are disabled (`ncclNvlsHostMode_t`): a
/// bit set, combine with `|`. Leave [`CommConfig::nvls_host_mode`] unset for the
/// library's default (`ncclNvlsHostModeDefault`).
#[doc = concat!("NCCL ", nccl_sys::config_field_since!("nvlsHostMode"), ".")]
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_channel::{CommConfig, Communicator, Error, NvlsHostMode, UniqueId};
/// use nccl_sys::NcclVersion;
/// use nccl_mock::MockNccl;
///
/// let mode = NvlsHostMode::DISABLE_TRANSPORT | NvlsHostMode::DISABLE_SYMMETRIC_MULTIMEM;
/// assert_eq!(mode, NvlsHostMode(3));
/// let config = CommConfig::new().nvls_host_mode(mode);
/// assert_eq!(config.get_nvls_host_mode(), Some(mode));
///
/// // An NCCL older than the field refuses the config before anything is created.
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let (nccl, _world) = MockNccl::new(&gpus).version(NcclVersion::new(2, 28, 9)).build()?;
/// let nccl = Arc::new(nccl);
/// let ctx = cuda.device(0)?.primary_context()?;
/// let id = UniqueId::generate(&nccl)?;
/// let e = Communicator::init_rank_with(&nccl, &ctx, &id, 1, 0, &config).unwrap_err();
/// assert!(matches!(e, Error::Unsupported { .. }), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(alias = "ncclNvlsHostMode_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct NvlsHostMode(pub i32);

impl NvlsHostMode {
    /// Every host NVLS component enabled.
    #[doc(alias = "ncclNvlsHostModeEnable")]
    pub const ENABLE: NvlsHostMode = NvlsHostMode(ncclNvlsHostMode_t::ncclNvlsHostModeEnable.0);
    /// No NVLS transport nor its registered-buffer optimisation.
    #[doc(alias = "ncclNvlsHostModeDisableTransport")]
    pub const DISABLE_TRANSPORT: NvlsHostMode =
        NvlsHostMode(ncclNvlsHostMode_t::ncclNvlsHostModeDisableTransport.0);
    /// No multimem in NCCL's internal symmetric kernels and copy engines.
    #[doc(alias = "ncclNvlsHostModeDisableSymmetricMultimem")]
    pub const DISABLE_SYMMETRIC_MULTIMEM: NvlsHostMode =
        NvlsHostMode(ncclNvlsHostMode_t::ncclNvlsHostModeDisableSymmetricMultimem.0);
    /// Every present and future host NVLS component disabled.
    #[doc(alias = "ncclNvlsHostModeDisable")]
    pub const DISABLE: NvlsHostMode = NvlsHostMode(ncclNvlsHostMode_t::ncclNvlsHostModeDisable.0);
}

impl BitOr for NvlsHostMode {
    type Output = NvlsHostMode;

    fn bitor(self, rhs: NvlsHostMode) -> NvlsHostMode {
        NvlsHostMode(self.0 | rhs.0)
    }
}

/// How a communicator is created: this crate's blocking mode and deadline, and NCCL's
/// `ncclConfig_t`, one setter per field.
///
/// [`new`](Self::new) (= `default`) is blocking with a 5-minute deadline, and leaves every
/// NCCL field unset, so NCCL (and its `NCCL_*` environment variables) chooses. Setters
/// consume and return the configuration; getters (`get_*`, as `std::process::Command`
/// names them) return `None` for an unset field. A field set on a library older than
/// the release that introduced it makes the init fail with [`Error::Unsupported`] before
/// anything is created, instead of being silently ignored by NCCL.
///
/// | setter | `ncclConfig_t` field | since NCCL |
/// | --- | --- | --- |
#[doc = concat!("| [`blocking`](Self::blocking) | `blocking` | ", nccl_sys::config_field_since!("blocking"), " |")]
#[doc = concat!("| [`cga_cluster_size`](Self::cga_cluster_size) | `cgaClusterSize` | ", nccl_sys::config_field_since!("cgaClusterSize"), " |")]
#[doc = concat!("| [`min_ctas`](Self::min_ctas) | `minCTAs` | ", nccl_sys::config_field_since!("minCTAs"), " |")]
#[doc = concat!("| [`max_ctas`](Self::max_ctas) | `maxCTAs` | ", nccl_sys::config_field_since!("maxCTAs"), " |")]
#[doc = concat!("| [`net_name`](Self::net_name) | `netName` | ", nccl_sys::config_field_since!("netName"), " |")]
#[doc = concat!("| [`split_share`](Self::split_share) | `splitShare` | ", nccl_sys::config_field_since!("splitShare"), " |")]
#[doc = concat!("| [`traffic_class`](Self::traffic_class) | `trafficClass` | ", nccl_sys::config_field_since!("trafficClass"), " |")]
#[doc = concat!("| [`comm_name`](Self::comm_name) | `commName` | ", nccl_sys::config_field_since!("commName"), " |")]
#[doc = concat!("| [`collnet`](Self::collnet) | `collnetEnable` | ", nccl_sys::config_field_since!("collnetEnable"), " |")]
#[doc = concat!("| [`cta_policy`](Self::cta_policy) | `CTAPolicy` | ", nccl_sys::config_field_since!("CTAPolicy"), " |")]
#[doc = concat!("| [`shrink_share`](Self::shrink_share) | `shrinkShare` | ", nccl_sys::config_field_since!("shrinkShare"), " |")]
#[doc = concat!("| [`nvls_ctas`](Self::nvls_ctas) | `nvlsCTAs` | ", nccl_sys::config_field_since!("nvlsCTAs"), " |")]
#[doc = concat!("| [`channels_per_net_peer`](Self::channels_per_net_peer) | `nChannelsPerNetPeer` | ", nccl_sys::config_field_since!("nChannelsPerNetPeer"), " |")]
#[doc = concat!("| [`nvlink_centric_sched`](Self::nvlink_centric_sched) | `nvlinkCentricSched` | ", nccl_sys::config_field_since!("nvlinkCentricSched"), " |")]
#[doc = concat!("| [`graph_usage_mode`](Self::graph_usage_mode) | `graphUsageMode` | ", nccl_sys::config_field_since!("graphUsageMode"), " |")]
#[doc = concat!("| [`rma_contexts`](Self::rma_contexts) | `numRmaCtx` | ", nccl_sys::config_field_since!("numRmaCtx"), " |")]
#[doc = concat!("| [`max_p2p_peers`](Self::max_p2p_peers) | `maxP2pPeers` | ", nccl_sys::config_field_since!("maxP2pPeers"), " |")]
#[doc = concat!("| [`graph_stream_ordering`](Self::graph_stream_ordering) | `graphStreamOrdering` | ", nccl_sys::config_field_since!("graphStreamOrdering"), " |")]
#[doc = concat!("| [`launch_order_implicit`](Self::launch_order_implicit) | `launchOrderImplicit` | ", nccl_sys::config_field_since!("launchOrderImplicit"), " |")]
#[doc = concat!("| [`rma_signals`](Self::rma_signals) | `numRmaSig` | ", nccl_sys::config_field_since!("numRmaSig"), " |")]
#[doc = concat!("| [`rma_eager_init`](Self::rma_eager_init) | `rmaEagerInit` | ", nccl_sys::config_field_since!("rmaEagerInit"), " |")]
#[doc = concat!("| [`host_cft_mode`](Self::host_cft_mode) | `hostCftMode` | ", nccl_sys::config_field_since!("hostCftMode"), " |")]
#[doc = concat!("| [`nvls_host_mode`](Self::nvls_host_mode) | `nvlsHostMode` | ", nccl_sys::config_field_since!("nvlsHostMode"), " |")]
///
/// The versions are [`nccl_sys::CONFIG_FIELDS`]'s, which the checks use (generated from the
/// pinned NCCL headers: [`nccl_sys::since::config`]). Splits and shrinks give the child its parent's configuration
/// (NCCL's NULL config); [`Communicator::split_with`](crate::Communicator::split_with)
/// gives one of its own.
///
/// ```
/// # use std::sync::Arc;
/// use std::time::Duration;
/// use nccl_channel::{CommConfig, Communicator, CtaPolicy, UniqueId};
/// use cuda_hal::Cuda;
/// use cuda_mock::MockDriver;
/// use nccl_mock::MockNccl;
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let nccl = Arc::new(nccl);
/// let config = CommConfig::non_blocking(Duration::from_secs(30))
///     .max_ctas(8)
///     .comm_name("tensor-parallel")
///     .cta_policy(CtaPolicy::EFFICIENCY | CtaPolicy::ZERO);
/// let ctx = cuda.device(0)?.primary_context()?;
/// let id = UniqueId::generate(&nccl)?;
/// let comm = Communicator::init_rank_with(&nccl, &ctx, &id, 1, 0, &config)?;
/// assert_eq!(comm.config().get_max_ctas(), Some(8));
/// // What NCCL (here the simulated one) was given:
/// let seen = world.config_of(comm.as_raw()).expect("made with a config");
/// assert_eq!((seen.raw.blocking, seen.raw.maxCTAs, seen.raw.CTAPolicy), (0, 8, 3));
/// assert_eq!(seen.comm_name.as_deref(), Some("tensor-parallel"));
/// assert_eq!(seen.raw.minCTAs, nccl_sys::NCCL_CONFIG_UNDEF_INT); // unset: NCCL chooses
/// comm.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(alias = "ncclConfig_t")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct CommConfig {
    blocking: bool,
    timeout: Duration,
    check_calls: Option<bool>,
    cga_cluster_size: Option<u32>,
    min_ctas: Option<u32>,
    max_ctas: Option<u32>,
    net_name: Option<String>,
    split_share: Option<bool>,
    traffic_class: Option<u32>,
    comm_name: Option<String>,
    collnet: Option<bool>,
    cta_policy: Option<CtaPolicy>,
    shrink_share: Option<bool>,
    nvls_ctas: Option<u32>,
    channels_per_net_peer: Option<u32>,
    nvlink_centric_sched: Option<bool>,
    graph_usage_mode: Option<u32>,
    rma_contexts: Option<u32>,
    max_p2p_peers: Option<u32>,
    graph_stream_ordering: Option<bool>,
    launch_order_implicit: Option<bool>,
    rma_signals: Option<u32>,
    rma_eager_init: Option<bool>,
    host_cft_mode: Option<HostCftMode>,
    nvls_host_mode: Option<NvlsHostMode>,
}

impl Default for CommConfig {
    /// Blocking, a 5-minute deadline for waits, every NCCL field unset.
    fn default() -> Self {
        CommConfig {
            blocking: true,
            timeout: Duration::from_secs(300),
            check_calls: None,
            cga_cluster_size: None,
            min_ctas: None,
            max_ctas: None,
            net_name: None,
            split_share: None,
            traffic_class: None,
            comm_name: None,
            collnet: None,
            cta_policy: None,
            shrink_share: None,
            nvls_ctas: None,
            channels_per_net_peer: None,
            nvlink_centric_sched: None,
            graph_usage_mode: None,
            rma_contexts: None,
            max_p2p_peers: None,
            graph_stream_ordering: None,
            launch_order_implicit: None,
            rma_signals: None,
            rma_eager_init: None,
            host_cft_mode: None,
            nvls_host_mode: None,
        }
    }
}

impl CommConfig {
    /// Blocking, a 5-minute deadline for waits, every NCCL field unset (NCCL chooses).
    pub fn new() -> Self {
        Self::default()
    }

    /// Non-blocking with this deadline: the mode in which a dead peer becomes an error.
    pub fn non_blocking(timeout: Duration) -> Self {
        Self::new().blocking(false).timeout(timeout)
    }

    /// `false`: NCCL's non-blocking mode (`blocking = 0`). Init, operations, group ends
    /// and finalize return at once; this crate then polls `ncclCommGetAsyncError` until
    /// they are done, an error shows, the deadline passes or an
    /// [`AbortHandle`](crate::AbortHandle) fires, and aborts the communicator in the last
    /// three cases. Default `true`.
    #[doc = concat!("In `ncclConfig_t` since NCCL ", nccl_sys::config_field_since!("blocking"), ".")]
    pub fn blocking(mut self, blocking: bool) -> Self {
        self.blocking = blocking;
        self
    }

    /// How long any one wait may take (init, an operation's launch,
    /// [`Communicator::wait`](crate::Communicator::wait), finalize): this crate's
    /// deadline, not an NCCL field. Default 5 minutes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest [`timeout`](Self::timeout) accepted: one year. A longer one fails the
    /// init with [`Error::InvalidArgument`] (it would be a wait without end in all but
    /// name, and deadlines computed from it could overflow the clock).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::Cuda;
    /// # use cuda_mock::MockDriver;
    /// # use nccl_mock::MockNccl;
    /// use std::time::Duration;
    /// use nccl_channel::{CommConfig, Communicator, Error, UniqueId};
    /// # let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// # let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let id = UniqueId::generate(&nccl)?;
    /// let config = CommConfig::non_blocking(Duration::MAX);
    /// let r = Communicator::init_rank_with(&nccl, &ctx, &id, 1, 0, &config);
    /// assert!(matches!(r, Err(Error::InvalidArgument { what: "CommConfig::timeout", .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

    pub(crate) fn check_timeout(&self) -> Result<()> {
        if self.timeout > Self::MAX_TIMEOUT {
            return Err(Error::InvalidArgument {
                what: "CommConfig::timeout",
                problem: format!(
                    "{:?} is longer than the longest accepted, {:?} (one year)",
                    self.timeout,
                    Self::MAX_TIMEOUT
                ),
            });
        }
        Ok(())
    }

    /// The checked mode, for finding a program whose ranks call different collectives
    /// (like torch's `TORCH_DISTRIBUTED_DEBUG=DETAIL`): before each collective the ranks
    /// compare what they are about to call (the collective, count, element type,
    /// reduction, root, which symmetric window its buffers lie in and at what offset, and
    /// the number of the comparison among the communicator's exchanges), and a difference
    /// is [`Error::CallMismatch`] on every rank, naming both calls, instead of the hang or
    /// the corrupt data that real NCCL gives. The crate's own collectives are compared too
    /// (a symmetric allocation, a window's registration, a barrier). Every rank must check,
    /// or none: turn it on for a whole job with
    /// [`NCCL_CHANNEL_CHECK_CALLS=1`](crate::CHECK_CALLS_ENV), which communicators made
    /// without this setting follow (unset: off). Each checked collective costs an
    /// all-gather of 80 bytes per rank on the communicator's private channel and a wait
    /// for it (BENCHMARKS.md has the figures); off, it costs one test per call. Not
    /// checked: sends and receives (pairwise), the counts of
    /// [`all_to_all_v`](crate::Communicator::all_to_all_v) (they differ by rank),
    /// collectives inside an open group or on a capturing stream, which cannot wait for the
    /// comparison (the send/receive forms of `all_to_all`, `gather`, `scatter` and
    /// `all_to_all_v` compare before the group they open). While another capture forbids
    /// this thread host waits, a checked collective fails with
    /// [`cuda_hal::Error::Capturing`] before anything is issued.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::{Cuda, DeviceBuffer, Stream};
    /// # use cuda_mock::MockDriver;
    /// # use nccl_mock::MockNccl;
    /// use nccl_channel::{CommConfig, Communicator, Error, UniqueId};
    /// # let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// # let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let config = CommConfig::new().check_calls(true);
    /// // Two ranks whose all-gathers disagree on the count: 4 elements and 6.
    /// let errors = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..2)
    ///         .map(|r| {
    ///             let (cuda, nccl, id, config) = (&cuda, &nccl, &id, &config);
    ///             s.spawn(move || -> Result<Error, Box<dyn std::error::Error + Send + Sync>> {
    ///                 let ctx = cuda.device(r)?.primary_context()?;
    ///                 let comm = Communicator::init_rank_with(nccl, &ctx, id, 2, r, config)?;
    ///                 let stream = Stream::new(&ctx)?;
    ///                 let send = DeviceBuffer::from_slice(&ctx, &vec![1i32; 4 + 2 * r])?;
    ///                 let mut recv = DeviceBuffer::<i32>::zeroed(&ctx, 2 * send.len())?;
    ///                 let e = comm.all_gather(&send, &mut recv, &stream).unwrap_err();
    ///                 comm.close()?;
    ///                 Ok(e)
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(
    ///     errors[1].to_string(),
    ///     "all_gather: the ranks' calls differ: this rank (1) calls all_gather of 6 int32 \
    ///      (call 0), rank 0 calls all_gather of 4 int32 (call 0)"
    /// );
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// ```
    pub fn check_calls(mut self, on: bool) -> Self {
        self.check_calls = Some(on);
        self
    }

    /// The checked mode as set with [`check_calls`](Self::check_calls); `None`: unset,
    /// [`NCCL_CHANNEL_CHECK_CALLS`](crate::CHECK_CALLS_ENV) decides.
    #[must_use]
    pub fn get_check_calls(&self) -> Option<bool> {
        self.check_calls
    }

    /// Whether the communicator is blocking (see [`blocking`](Self::blocking)).
    #[must_use]
    pub fn is_blocking(&self) -> bool {
        self.blocking
    }

    /// The deadline for each wait (see [`timeout`](Self::timeout)).
    #[must_use]
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The network module NCCL uses, matched case-insensitively: `"IB"` (verbs),
    /// `"Socket"` (TCP), or an external plugin's name; unset, NCCL picks one. A name with
    /// a NUL byte fails the init with [`Error::InvalidArgument`].
    #[doc = concat!("NCCL ", nccl_sys::config_field_since!("netName"), ".")]
    #[doc(alias = "netName")]
    pub fn net_name(mut self, name: impl Into<String>) -> Self {
        self.net_name = Some(name.into());
        self
    }

    /// The network module set with [`net_name`](Self::net_name).
    #[must_use]
    pub fn get_net_name(&self) -> Option<&str> {
        self.net_name.as_deref()
    }

    /// A name for the communicator, which NCCL puts in its logs and profiler events. A
    /// name with a NUL byte fails the init with [`Error::InvalidArgument`].
    #[doc = concat!("NCCL ", nccl_sys::config_field_since!("commName"), ".")]
    #[doc(alias = "commName")]
    pub fn comm_name(mut self, name: impl Into<String>) -> Self {
        self.comm_name = Some(name.into());
        self
    }

    /// The name set with [`comm_name`](Self::comm_name).
    #[must_use]
    pub fn get_comm_name(&self) -> Option<&str> {
        self.comm_name.as_deref()
    }

    /// Whether any `ncclConfig_t` field besides the blocking mode is set (the init then
    /// needs `ncclCommInitRankConfig`).
    pub(crate) fn sets_nccl_fields(&self) -> bool {
        let bare = CommConfig {
            blocking: self.blocking,
            timeout: self.timeout,
            check_calls: self.check_calls,
            ..CommConfig::new()
        };
        *self != bare
    }
}

/// One setter and one getter per integer, flag or enum field: `setter / getter: type =>
/// "C name"`, after the setter's documentation.
macro_rules! nccl_fields {
    ($(
        $(#[doc = $doc:literal])*
        $set:ident / $get:ident : $t:ty => $c:tt;
    )*) => {
        impl CommConfig {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("NCCL ", nccl_sys::config_field_since!($c), ".")]
                #[doc(alias = $c)]
                pub fn $set(mut self, value: $t) -> Self {
                    self.$set = Some(value);
                    self
                }

                #[doc = concat!("`", $c, "` as set with [`", stringify!($set), "`](Self::",
                    stringify!($set), "); `None`: unset, NCCL chooses.")]
                pub fn $get(&self) -> Option<$t> {
                    self.$set
                }
            )*
        }
    };
}

nccl_fields! {
    /// The size of the CUDA thread-block clusters (cooperative group arrays) of NCCL's
    /// kernels, 0 to 8; NCCL's default is 4 from sm90 on, 0 before.
    cga_cluster_size / get_cga_cluster_size: u32 => "cgaClusterSize";
    /// The fewest CTAs (thread blocks, one per channel) NCCL uses per kernel; default 1.
    /// NCCL refuses a minimum without a [`max_ctas`](Self::max_ctas) at least as large,
    /// which this crate checks first ([`Error::InvalidArgument`]).
    min_ctas / get_min_ctas: u32 => "minCTAs";
    /// The most CTAs NCCL uses per kernel (NCCL caps it at its channel limit, `MAXCHANNELS`);
    /// NCCL's default is that limit. Lower it to leave SMs to overlapping computation:
    /// registered buffers then lose the least (BENCHMARKS.md).
    max_ctas / get_max_ctas: u32 => "maxCTAs";
    /// Whether communicators split from this one share its internal resources: cheaper
    /// splits, but aborting one of the family can make the others unusable. Default
    /// off. Its private channel (split from it at its init) then shares them too, and NCCL
    /// 2.29.7 and later refuse [`Communicator::suspend`](crate::Communicator::suspend) of
    /// its memory (`ncclInvalidUsage`).
    split_share / get_split_share: bool => "splitShare";
    /// The network traffic class of this communicator, in the network plugin's terms (IB
    /// service level, RoCE type of service), to separate overlapping communicators.
    /// `NCCL_IB_SL` / `NCCL_IB_TC` take precedence.
    traffic_class / get_traffic_class: u32 => "trafficClass";
    /// Enables IB SHARP (CollNet) on this communicator; default off.
    collnet / get_collnet: bool => "collnetEnable";
    /// The CTA policy, a [`CtaPolicy`] bit set; default [`CtaPolicy::DEFAULT`].
    cta_policy / get_cta_policy: CtaPolicy => "CTAPolicy";
    /// As [`split_share`](Self::split_share), for shrinks (ignored by shrinks with
    /// `NCCL_SHRINK_ABORT`). Default off.
    shrink_share / get_shrink_share: bool => "shrinkShare";
    /// The total CTAs of NVLS (NVLink SHARP) kernels; unset, NCCL picks from the system.
    nvls_ctas / get_nvls_ctas: u32 => "nvlsCTAs";
    /// Network channels per peer for point-to-point traffic, rounded up to a power of
    /// two; the default suits all-to-all, raise it for send/recv bandwidth.
    channels_per_net_peer / get_channels_per_net_peer: u32 => "nChannelsPerNetPeer";
    /// NVLink-utilisation-centric scheduling of NCCL's kernels (the CUDA 13 launch
    /// attribute, on sm100 and newer).
    nvlink_centric_sched / get_nvlink_centric_sched: bool => "nvlinkCentricSched";
    /// How the communicator meets CUDA graphs: 0 no graphs, 1 one graph, 2 several graphs
    /// or graphs mixed with direct launches (NCCL's default).
    graph_usage_mode / get_graph_usage_mode: u32 => "graphUsageMode";
    /// One-sided RMA contexts to provision: the `ctx` of `ncclPutSignal`, `ncclSignal`
    /// and `ncclWaitSignal` lies in `0..n`; default 1. NCCL's documentation lists it from
    /// 2.31; its header declares it from
    rma_contexts / get_rma_contexts: u32 => "numRmaCtx";
    /// The most peers a rank talks to at once in point-to-point traffic (send/recv and
    /// the collectives built on it: all-to-all, gather, scatter), at least 1 (NCCL refuses
    /// 0); more than the rank count means the rank count.
    max_p2p_peers / get_max_p2p_peers: u32 => "maxP2pPeers";
    /// `false`: NCCL no longer serialises this communicator's kernels at capture time;
    /// they go on the capture stream and the application orders them (needs
    /// [`graph_usage_mode`](Self::graph_usage_mode) 0 or 1). `true` keeps NCCL's order;
    /// unset, `NCCL_GRAPH_STREAM_ORDERING` decides.
    graph_stream_ordering / get_graph_stream_ordering: bool => "graphStreamOrdering";
    /// Implicit launch ordering (`NCCL_LAUNCH_ORDER_IMPLICIT`, which overrides it):
    /// operations of such communicators may overlap one another when the host orders
    /// their launches, and must not overlap those of other communicators. Default off.
    launch_order_implicit / get_launch_order_implicit: bool => "launchOrderImplicit";
    /// Signal indexes per one-sided RMA context: the `sigIdx` of `ncclPutSignal`,
    /// `ncclSignal` and `ncclWaitSignal` lies in `0..n`; default 1.
    rma_signals / get_rma_signals: u32 => "numRmaSig";
    /// Sets up one-sided RMA signalling at init instead of at the first window
    /// registration; needed for `ncclSignal` / `ncclWaitSignal` without a registered
    /// window. `NCCL_RMA_EAGER_INIT` overrides it.
    rma_eager_init / get_rma_eager_init: bool => "rmaEagerInit";
    /// Host-side Compute Fabric Transport support, a [`HostCftMode`].
    host_cft_mode / get_host_cft_mode: HostCftMode => "hostCftMode";
    /// Which host-side NVLS components are disabled, an [`NvlsHostMode`] bit set.
    nvls_host_mode / get_nvls_host_mode: NvlsHostMode => "nvlsHostMode";
}

/// A value as NCCL's `int`, or [`Error::InvalidArgument`] naming the field.
trait ToCInt: Copy {
    fn to_c_int(self, field: &'static str) -> Result<c_int>;
}

impl ToCInt for u32 {
    fn to_c_int(self, field: &'static str) -> Result<c_int> {
        c_int::try_from(self).map_err(|_| Error::InvalidArgument {
            what: field,
            problem: format!("{self} does not fit NCCL's int"),
        })
    }
}

impl ToCInt for bool {
    fn to_c_int(self, _: &'static str) -> Result<c_int> {
        Ok(c_int::from(self))
    }
}

/// The enum newtypes: any value but `NCCL_CONFIG_UNDEF_INT`, which would read as unset.
fn code(field: &'static str, v: i32) -> Result<c_int> {
    if v == NCCL_CONFIG_UNDEF_INT {
        return Err(Error::InvalidArgument {
            what: field,
            problem: "NCCL_CONFIG_UNDEF_INT means unset; leave the field unset instead".into(),
        });
    }
    Ok(v)
}

impl ToCInt for CtaPolicy {
    fn to_c_int(self, field: &'static str) -> Result<c_int> {
        code(field, self.0)
    }
}

impl ToCInt for HostCftMode {
    fn to_c_int(self, field: &'static str) -> Result<c_int> {
        code(field, self.0)
    }
}

impl ToCInt for NvlsHostMode {
    fn to_c_int(self, field: &'static str) -> Result<c_int> {
        code(field, self.0)
    }
}

/// [`Error::Unsupported`] when the loaded NCCL is older than the release that introduced
/// `field` ([`nccl_sys::CONFIG_FIELDS`]). `feature` is `"ncclConfig_t.<field>"`.
fn check_since(field: &str, feature: &'static str, loaded: NcclVersion) -> Result<()> {
    let since = ConfigField::named(field).map_or(NcclVersion(i32::MAX), |f| f.since);
    if loaded < since {
        return Err(Error::Unsupported {
            feature,
            needed: if since.0 == i32::MAX {
                "newer".into()
            } else {
                since.to_string()
            },
            found: loaded.to_string(),
        });
    }
    Ok(())
}

/// A config string as a `CString`, or [`Error::InvalidArgument`] for a NUL byte.
fn c_string(feature: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|e| Error::InvalidArgument {
        what: feature,
        problem: format!("{s:?} has a NUL byte at {}", e.nul_position()),
    })
}

/// Sets `raw.<field>` from an `Option` after the version and value checks.
macro_rules! lower {
    ($raw:ident . $field:ident = $value:expr, $loaded:expr) => {
        if let Some(v) = $value {
            const FEATURE: &str = concat!("ncclConfig_t.", stringify!($field));
            check_since(stringify!($field), FEATURE, $loaded)?;
            $raw.$field = ToCInt::to_c_int(v, FEATURE)?;
        }
    };
}

/// An `ncclConfig_t` ready for NCCL, with the strings its `netName` and `commName` point
/// to: they stay valid (heap buffers that do not move) while it lives.
pub(crate) struct RawConfig {
    raw: ncclConfig_t,
    _names: [Option<CString>; 2],
}

impl RawConfig {
    /// The pointer to pass to NCCL; valid while `self` is neither moved nor dropped.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut ncclConfig_t {
        &mut self.raw
    }

    /// The fields as lowered.
    #[cfg(test)]
    pub(crate) fn raw(&self) -> &ncclConfig_t {
        &self.raw
    }
}

impl CommConfig {
    /// NCCL's rule for CTA counts, checked before NCCL sees them: each at least 1, and a
    /// minimum only with a maximum at least as large (NCCL compares the minimum with an
    /// unset maximum as `INT_MIN` and refuses the config).
    fn check_ctas(&self) -> Result<()> {
        let problem = match (self.min_ctas, self.max_ctas) {
            (Some(0), _) => Some("min_ctas must be at least 1".to_string()),
            (_, Some(0)) => Some("max_ctas must be at least 1".to_string()),
            (Some(min), None) => Some(format!(
                "min_ctas({min}) needs max_ctas too (NCCL refuses a minimum without a maximum)"
            )),
            (Some(min), Some(max)) if min > max => {
                Some(format!("min_ctas({min}) is above max_ctas({max})"))
            }
            _ => None,
        };
        match problem {
            Some(problem) => Err(Error::InvalidArgument {
                what: "CommConfig",
                problem,
            }),
            None => Ok(()),
        }
    }

    /// Lowers to `ncclConfig_t` for a library of `nccl_version`: every set field checked
    /// against the release that introduced it ([`Error::Unsupported`] naming
    /// `ncclConfig_t.<field>`) and converted to NCCL's `int` ([`Error::InvalidArgument`]
    /// for values that do not fit and names with a NUL byte); `version` is the older of
    /// this crate's header and the library, whose layout NCCL then reads.
    pub(crate) fn to_raw(&self, nccl_version: NcclVersion) -> Result<RawConfig> {
        self.check_ctas()?;
        self.check_timeout()?;
        let loaded = nccl_version;
        let mut raw = NCCL_CONFIG_INITIALIZER;
        raw.version =
            u32::try_from(loaded.0).map_or(NCCL_VERSION_CODE, |l| l.min(NCCL_VERSION_CODE));
        lower!(raw.blocking = Some(self.blocking), loaded);
        lower!(raw.cgaClusterSize = self.cga_cluster_size, loaded);
        lower!(raw.minCTAs = self.min_ctas, loaded);
        lower!(raw.maxCTAs = self.max_ctas, loaded);
        let net = match &self.net_name {
            Some(name) => {
                const FEATURE: &str = "ncclConfig_t.netName";
                check_since("netName", FEATURE, loaded)?;
                Some(c_string(FEATURE, name)?)
            }
            None => None,
        };
        lower!(raw.splitShare = self.split_share, loaded);
        lower!(raw.trafficClass = self.traffic_class, loaded);
        let comm = match &self.comm_name {
            Some(name) => {
                const FEATURE: &str = "ncclConfig_t.commName";
                check_since("commName", FEATURE, loaded)?;
                Some(c_string(FEATURE, name)?)
            }
            None => None,
        };
        lower!(raw.collnetEnable = self.collnet, loaded);
        lower!(raw.CTAPolicy = self.cta_policy, loaded);
        lower!(raw.shrinkShare = self.shrink_share, loaded);
        lower!(raw.nvlsCTAs = self.nvls_ctas, loaded);
        lower!(raw.nChannelsPerNetPeer = self.channels_per_net_peer, loaded);
        lower!(raw.nvlinkCentricSched = self.nvlink_centric_sched, loaded);
        lower!(raw.graphUsageMode = self.graph_usage_mode, loaded);
        lower!(raw.numRmaCtx = self.rma_contexts, loaded);
        lower!(raw.maxP2pPeers = self.max_p2p_peers, loaded);
        lower!(raw.graphStreamOrdering = self.graph_stream_ordering, loaded);
        lower!(raw.launchOrderImplicit = self.launch_order_implicit, loaded);
        lower!(raw.numRmaSig = self.rma_signals, loaded);
        lower!(raw.rmaEagerInit = self.rma_eager_init, loaded);
        lower!(raw.hostCftMode = self.host_cft_mode, loaded);
        lower!(raw.nvlsHostMode = self.nvls_host_mode, loaded);
        raw.netName = net.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        raw.commName = comm.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        Ok(RawConfig {
            raw,
            _names: [net, comm],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_sys::CONFIG_FIELDS;

    #[test]
    fn every_config_field_has_a_setter() {
        // Every setter, each with a value that is not "unset": then every field of the raw
        // config differs from the initializer's (a field new in nccl-sys fails here).
        let all = CommConfig::new()
            .blocking(false)
            .cga_cluster_size(2)
            .min_ctas(1)
            .max_ctas(2)
            .net_name("IB")
            .split_share(true)
            .traffic_class(1)
            .comm_name("all")
            .collnet(true)
            .cta_policy(CtaPolicy::EFFICIENCY)
            .shrink_share(true)
            .nvls_ctas(1)
            .channels_per_net_peer(1)
            .nvlink_centric_sched(true)
            .graph_usage_mode(1)
            .rma_contexts(1)
            .max_p2p_peers(1)
            .graph_stream_ordering(true)
            .launch_order_implicit(true)
            .rma_signals(1)
            .rma_eager_init(true)
            .host_cft_mode(HostCftMode::ENABLE)
            .nvls_host_mode(NvlsHostMode::DISABLE_TRANSPORT);
        let r = all.to_raw(NcclVersion(NCCL_VERSION_CODE as i32));
        let Ok(r) = r else {
            unreachable!("{:?}", r.err())
        };
        let (set, unset) = (r.raw(), &NCCL_CONFIG_INITIALIZER);
        for f in &CONFIG_FIELDS {
            let bytes = |c: &ncclConfig_t| {
                // SAFETY: `offset` and `size` describe one field of `ncclConfig_t` (nccl-sys
                // checks them against the header), initialized in any value of it.
                unsafe {
                    std::slice::from_raw_parts((&raw const *c).cast::<u8>().add(f.offset), f.size)
                }
                .to_vec()
            };
            assert_ne!(
                bytes(set),
                bytes(unset),
                "ncclConfig_t.{} has no setter",
                f.name
            );
        }
    }

    #[test]
    fn unset_fields_stay_unset_and_version_is_the_older() {
        let v = NcclVersion::new(2, 27, 3);
        let r = CommConfig::new().to_raw(v).map(|r| *r.raw());
        let Ok(raw) = r else { unreachable!("{r:?}") };
        let mut expected = NCCL_CONFIG_INITIALIZER;
        expected.blocking = 1;
        expected.version = 22703;
        assert_eq!(raw, expected);
        let newer = NcclVersion::new(2, 40, 1);
        let r = CommConfig::new().to_raw(newer).map(|r| r.raw().version);
        assert_eq!(r.ok(), Some(NCCL_VERSION_CODE));
    }

    #[test]
    fn too_large_values_and_undef_codes_are_refused() {
        let v = NcclVersion(NCCL_VERSION_CODE as i32);
        // With a maximum: a minimum alone is refused first (NCCL's rule, `check_ctas`).
        let e = CommConfig::new()
            .min_ctas(1 << 31)
            .max_ctas(1 << 31)
            .to_raw(v)
            .err();
        assert_eq!(
            e,
            Some(Error::InvalidArgument {
                what: "ncclConfig_t.minCTAs",
                problem: "2147483648 does not fit NCCL's int".into()
            })
        );
        let e = CommConfig::new()
            .cta_policy(CtaPolicy(NCCL_CONFIG_UNDEF_INT))
            .to_raw(v)
            .err();
        assert!(
            matches!(
                &e,
                Some(Error::InvalidArgument {
                    what: "ncclConfig_t.CTAPolicy",
                    ..
                })
            ),
            "{e:?}"
        );
        let ok = CommConfig::new()
            .max_p2p_peers(i32::MAX as u32)
            .to_raw(v)
            .map(|r| r.raw().maxP2pPeers);
        assert_eq!(ok.ok(), Some(i32::MAX));
    }

    #[test]
    fn names_point_into_the_raw_config_and_stay_valid_after_a_move() {
        let v = NcclVersion(NCCL_VERSION_CODE as i32);
        let r = CommConfig::new()
            .net_name("Socket")
            .comm_name("dp")
            .to_raw(v);
        let Ok(r) = r else { unreachable!() };
        let moved = Box::new(r);
        // SAFETY: both point to NUL-terminated strings owned by `moved`.
        let (net, comm) = unsafe {
            (
                std::ffi::CStr::from_ptr(moved.raw().netName),
                std::ffi::CStr::from_ptr(moved.raw().commName),
            )
        };
        assert_eq!((net.to_str(), comm.to_str()), (Ok("Socket"), Ok("dp")));
    }

    #[test]
    fn flags_combine() {
        let p = CtaPolicy::EFFICIENCY | CtaPolicy::ZERO;
        assert_eq!(p, CtaPolicy(3));
        assert!(p.contains(CtaPolicy::ZERO) && !CtaPolicy::ZERO.contains(p));
        assert_eq!(CtaPolicy::default(), CtaPolicy::DEFAULT);
        let m = NvlsHostMode::DISABLE_TRANSPORT | NvlsHostMode::DISABLE_SYMMETRIC_MULTIMEM;
        assert_eq!(m, NvlsHostMode(3));
        assert_eq!(NvlsHostMode::DISABLE, NvlsHostMode(i32::MAX));
        assert_eq!(
            (
                HostCftMode::ENABLE,
                HostCftMode::DISABLE,
                HostCftMode::FALLBACK
            ),
            (HostCftMode(1), HostCftMode(2), HostCftMode(3))
        );
    }

    #[test]
    fn only_nccl_fields_count_as_set() {
        assert!(!CommConfig::new().sets_nccl_fields());
        assert!(!CommConfig::non_blocking(Duration::from_secs(1)).sets_nccl_fields());
        assert!(CommConfig::new().rma_signals(2).sets_nccl_fields());
        assert!(CommConfig::new().net_name("IB").sets_nccl_fields());
    }
}
