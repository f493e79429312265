//! [`Cuda`]: the loaded, initialised driver, shared and cheap to clone.

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use cuda_sys::{CUresult, Driver, DriverFns, DriverVersion};

use crate::device::Device;
use crate::selector::DeviceSelector;
use crate::{DeviceUuid, Error, Result};

/// The CUDA driver, loaded once and initialised (`cuInit`). Clones share it.
///
/// The way to the devices, by ordinal, UUID, PCI bus id or selector string:
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::Cuda;
///
/// let (cuda, _world) = MockDriver::with_devices(2).version(12080).build_with(Cuda::from_driver)?;
/// assert_eq!(cuda.version().to_string(), "12.8");
/// let names: Vec<String> = cuda.devices()?.iter().map(|d| d.name()).collect::<Result<_, _>>()?;
/// assert_eq!(names, ["Mock GPU 0", "Mock GPU 1"]);
/// let second = cuda.device(1)?;
/// assert_eq!(cuda.device_by_uuid(&second.uuid()?)?, second);
/// assert_eq!(cuda.select(&format!("cuda://{}", second.pci_bus_id()?))?, second);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Driver>,
}

static_assertions::assert_impl_all!(Cuda: Send, Sync, Clone, std::fmt::Debug);

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("version", &self.inner.version())
            .field("origin", &self.inner.origin())
            .finish()
    }
}

impl Cuda {
    /// The process-wide driver: searched for and initialised on the first call (see
    /// [`Driver::load`]); later calls return the same driver, or the same error.
    ///
    /// Both answers are typed, so a program can fall back when there is no GPU (this
    /// runs on machines with and without one):
    ///
    /// ```
    /// use cuda_hal::{Cuda, Error};
    /// match Cuda::load() {
    ///     Ok(cuda) => assert!(cuda.version().major() >= 12),
    ///     // No usable libcuda: every path tried is in the message.
    ///     Err(Error::Load(e)) => assert!(!e.to_string().is_empty()),
    ///     // A driver without a device: `cuInit` says why.
    ///     Err(Error::Driver { call, .. }) => assert_eq!(call, "cuInit"),
    ///     Err(e) => panic!("unexpected: {e}"),
    /// }
    /// ```
    #[doc(alias = "cuInit")]
    pub fn load() -> Result<Cuda> {
        static SHARED: OnceLock<Result<Cuda>> = OnceLock::new();
        SHARED
            .get_or_init(|| Cuda::from_driver(Driver::load()?))
            .clone()
    }

    /// Initialises a driver loaded some other way (a path, a mock) with `cuInit(0)`.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::Cuda;
    /// let (driver, world) = MockDriver::with_devices(1).build()?;
    /// let cuda = Cuda::from_driver(driver)?;
    /// assert_eq!(cuda.driver().origin(), "mock driver");
    /// assert_eq!(world.calls("cuInit"), 1);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn from_driver(driver: Driver) -> Result<Cuda> {
        let cuda = Cuda {
            inner: Arc::new(driver),
        };
        // SAFETY: cuInit(0) has no preconditions.
        unsafe { call!(cuda, cuInit(0)) }?;
        Ok(cuda)
    }

    /// The raw driver (function table, version, origin).
    #[must_use]
    pub fn driver(&self) -> &Driver {
        &self.inner
    }

    /// The raw function table.
    #[inline]
    #[must_use]
    pub fn fns(&self) -> &DriverFns {
        self.inner.fns()
    }

    /// The driver's CUDA version.
    #[doc(alias = "cuDriverGetVersion")]
    #[must_use]
    pub fn version(&self) -> DriverVersion {
        self.inner.version()
    }

    /// Turns a status into a `Result`, with the driver's name and message for failures:
    /// for calls made through the raw table.
    ///
    /// ```
    /// use cuda_hal::cuda_sys::CUresult;
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, Error};
    /// let (cuda, _world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// let mut n = 0;
    /// // SAFETY: a valid out-pointer.
    /// cuda.check(unsafe { (cuda.fns().cuDeviceGetCount)(&mut n) }, "cuDeviceGetCount")?;
    /// assert_eq!(n, 1);
    /// let e = cuda.check(CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc").unwrap_err();
    /// assert_eq!(
    ///     e,
    ///     Error::Driver {
    ///         call: "cuMemAlloc",
    ///         code: CUresult::CUDA_ERROR_OUT_OF_MEMORY,
    ///         name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
    ///         message: "simulated driver: out of memory".into(),
    ///     }
    /// );
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[inline]
    pub fn check(&self, rc: CUresult, call: &'static str) -> Result<()> {
        if rc == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(rc, call))
        }
    }

    /// The [`Error::Driver`] for a failed status.
    #[cold]
    #[must_use]
    pub fn error(&self, code: CUresult, call: &'static str) -> Error {
        let text = |f: cuda_sys::PFN_cuGetErrorName| {
            let mut p: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: `p` is a valid out-pointer; the driver stores a static string or fails.
            let ok = unsafe { f(code, &mut p) } == CUresult::CUDA_SUCCESS && !p.is_null();
            // SAFETY: on success `p` points at a NUL-terminated static string.
            ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        let name = text(self.fns().cuGetErrorName)
            .or_else(|| code.name().map(str::to_string))
            .unwrap_or_else(|| format!("CUresult({})", code.0));
        let message =
            text(self.fns().cuGetErrorString).unwrap_or_else(|| "unknown error".to_string());
        Error::Driver {
            call,
            code,
            name,
            message,
        }
    }

    /// An optional table entry, or [`Error::Unsupported`] naming the version it needs.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, Error};
    /// // cuStreamGetDevice came with CUDA 12.8.
    /// let (old, _w) = MockDriver::with_devices(1).version(12040).build_with(Cuda::from_driver)?;
    /// let missing = old.require(old.fns().cuStreamGetDevice, "cuStreamGetDevice");
    /// assert!(matches!(missing, Err(Error::Unsupported { .. })));
    /// let (new, _w) = MockDriver::with_devices(1).version(12080).build_with(Cuda::from_driver)?;
    /// assert!(new.require(new.fns().cuStreamGetDevice, "cuStreamGetDevice").is_ok());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn require<F: Copy>(&self, entry: Option<F>, function: &'static str) -> Result<F> {
        entry.ok_or_else(|| {
            let needed = DriverFns::OPTIONAL
                .iter()
                .find(|(n, _)| *n == function)
                .map(|(_, v)| DriverVersion(*v).to_string())
                .unwrap_or_else(|| "newer".into());
            Error::Unsupported {
                feature: function,
                needed,
                found: self.version().to_string(),
            }
        })
    }

    /// Number of devices.
    #[doc(alias = "cuDeviceGetCount")]
    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        unsafe { call!(self, cuDeviceGetCount(&mut n)) }?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The device with this ordinal ([`Error::NoSuchDevice`], listing the devices there
    /// are, past the last).
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, Error};
    /// let (cuda, _world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// assert_eq!(cuda.device(0)?.ordinal(), 0);
    /// let Err(Error::NoSuchDevice { selector, available }) = cuda.device(3) else {
    ///     panic!("there is one device");
    /// };
    /// assert_eq!(selector, "ordinal 3");
    /// assert_eq!(available, ["GPU 0: Mock GPU 0 (UUID: GPU-5fdb056c-537e-3bd5-1c80-b2039499e800)"]);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuDeviceGet")]
    pub fn device(&self, ordinal: usize) -> Result<Device> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(self.no_such_device(format!("ordinal {ordinal}")));
        }
        Device::get(self, ordinal as i32)
    }

    /// All devices, by ordinal.
    pub fn devices(&self) -> Result<Vec<Device>> {
        (0..self.device_count()?).map(|i| self.device(i)).collect()
    }

    /// The device whose UUID is `uuid` (all 16 bytes compared).
    pub fn device_by_uuid(&self, uuid: &DeviceUuid) -> Result<Device> {
        for d in self.devices()? {
            if d.uuid()? == *uuid {
                return Ok(d);
            }
        }
        Err(self.no_such_device(uuid.to_string()))
    }

    /// The device a selector string names: `cuda://`, `cuda://<ordinal>`,
    /// `cuda://GPU-<uuid>`, `cuda://MIG-<uuid>` or `cuda://<pci bus id>`.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, Error};
    /// let (cuda, _world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let one = cuda.device(1)?;
    /// assert_eq!(cuda.select("cuda://")?.ordinal(), 0);
    /// assert_eq!(cuda.select("cuda://1")?, one);
    /// assert_eq!(cuda.select("cuda://GPU-5fdb056c-537e-3bd5-1c80-b2039499e801")?, one);
    /// assert_eq!(cuda.select("cuda://0000:19:00.0")?, one);
    /// // Malformed, or well formed but absent: typed errors that say which.
    /// assert!(matches!(cuda.select("gpu:1"), Err(Error::InvalidSelector { .. })));
    /// assert!(matches!(cuda.select("cuda://7"), Err(Error::NoSuchDevice { .. })));
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn select(&self, selector: &str) -> Result<Device> {
        // The error names the selector as written (`MIG-`, the case and dashes given).
        self.select_parsed(&selector.parse::<DeviceSelector>()?)
            .map_err(|e| match e {
                Error::NoSuchDevice { available, .. } => Error::NoSuchDevice {
                    selector: selector.to_string(),
                    available,
                },
                e => e,
            })
    }

    /// The device a parsed selector names.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, DeviceSelector};
    /// let (cuda, _world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let wanted: DeviceSelector = "cuda://1".parse()?;
    /// assert_eq!(cuda.select_parsed(&wanted)?.ordinal(), 1);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn select_parsed(&self, selector: &DeviceSelector) -> Result<Device> {
        match selector {
            DeviceSelector::Default => {
                if self.device_count()? == 0 {
                    return Err(self.no_such_device("cuda:// (default device)".into()));
                }
                self.device(0)
            }
            DeviceSelector::Ordinal(i) => self
                .device(*i)
                .map_err(|_| self.no_such_device(selector.to_string())),
            DeviceSelector::Uuid(u) => self
                .device_by_uuid(u)
                .map_err(|_| self.no_such_device(selector.to_string())),
            DeviceSelector::PciBusId(p) => {
                for d in self.devices()? {
                    if d.pci_bus_id()? == *p {
                        return Ok(d);
                    }
                }
                Err(self.no_such_device(selector.to_string()))
            }
        }
    }

    #[cold]
    fn no_such_device(&self, selector: String) -> Error {
        let available = match self.devices() {
            Ok(ds) => ds
                .iter()
                .map(|d| {
                    d.describe()
                        .unwrap_or_else(|e| format!("{}: {e}", d.ordinal()))
                })
                .collect(),
            Err(e) => vec![format!("(the devices could not be listed: {e})")],
        };
        Error::NoSuchDevice {
            selector,
            available,
        }
    }
}
