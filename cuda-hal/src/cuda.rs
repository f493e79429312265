//! [`Cuda`]: the loaded, initialised driver, shared and cheap to clone.

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use cuda_sys::{CUresult, Driver, DriverFns, DriverVersion};

use crate::{Error, Result};

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

    /// Which driver this is, for the state a driver keeps per process (its captures):
    /// every load of the same library resolves the same functions, and each simulated
    /// driver has functions of its own.
    pub(crate) fn key(&self) -> usize {
        self.fns().cuStreamBeginCapture as usize
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
}
