//! Loading the CUDA driver (`libcuda.so.1`) and resolving [`DriverFns`] through
//! `cuGetProcAddress`.

use std::any::Any;
use std::ffi::{CStr, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dylib::{self, Candidate, OpenLibrary, Reason, Step};
use crate::fns::{DriverFns, MINIMUM_DRIVER_VERSION, PINNED_API_VERSION};
use crate::{CUresult, LoadError, PFN_cuDriverGetVersion, PFN_cuGetProcAddress_v2};

/// Environment variable naming the driver library to load instead of searching.
///
/// ```
/// assert_eq!(cuda_sys::DRIVER_PATH_ENV, "CUDA_SYS_LIBRARY");
/// ```
pub const DRIVER_PATH_ENV: &str = "CUDA_SYS_LIBRARY";

const LIBRARY: &str = "CUDA driver";

/// A CUDA API version as `cuDriverGetVersion` reports it (`12040` is 12.4).
///
/// Ordered like the numbers, so version gates are plain comparisons:
///
/// ```
/// use cuda_sys::{DriverVersion, MINIMUM_DRIVER_VERSION};
/// let v = DriverVersion(12040);
/// assert_eq!((v.major(), v.minor()), (12, 4));
/// assert_eq!(v.to_string(), "12.4");
/// assert!(v >= DriverVersion(MINIMUM_DRIVER_VERSION));
/// assert!(v < DriverVersion(13000));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion(pub i32);

impl DriverVersion {
    /// Major version (12 for 12040).
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// Minor version (4 for 12040).
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// The loaded driver: its function table, its version and the library that backs it.
///
/// Built by [`Driver::load`] (search), [`Driver::load_from`] (one path) or
/// [`Driver::from_resolver`] (any resolver: this is how mock tables are made). Calls go
/// straight through [`fns`](Self::fns); the table is checked for completeness when the
/// driver is built, never at the call.
///
/// ```
/// use cuda_sys::mock::MockDriver;
/// use cuda_sys::{CUdeviceptr, CUresult};
///
/// let (driver, world) = MockDriver::with_devices(1).build()?;
/// assert!(driver.library().is_none(), "a resolver's table has no library behind it");
/// let f = driver.fns();
/// let (mut ctx, mut ptr): (_, CUdeviceptr) = (std::ptr::null_mut(), 0);
/// // SAFETY: valid out-pointers; the context is current before the allocation, which is
/// // freed once.
/// unsafe {
///     assert_eq!((f.cuInit)(0), CUresult::CUDA_SUCCESS);
///     assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx, 0), CUresult::CUDA_SUCCESS);
///     assert_eq!((f.cuCtxSetCurrent)(ctx), CUresult::CUDA_SUCCESS);
///     assert_eq!((f.cuMemAlloc)(&mut ptr, 1024), CUresult::CUDA_SUCCESS);
///     assert_eq!(world.used_memory(0), 1024);
///     assert_eq!((f.cuMemFree)(ptr), CUresult::CUDA_SUCCESS);
///     assert_eq!((f.cuDevicePrimaryCtxRelease)(0), CUresult::CUDA_SUCCESS);
/// }
/// assert!(world.live().is_empty());
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
pub struct Driver {
    fns: DriverFns,
    version: DriverVersion,
    origin: String,
    // Keeps the code behind `fns` mapped.
    _lib: Option<OpenLibrary>,
    // Keeps whatever backs a resolver-made table alive (e.g. a mock driver's slot).
    _owner: Option<Arc<dyn Any + Send + Sync>>,
}

static_assertions::assert_impl_all!(Driver: Send, Sync);

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("version", &self.version)
            .field("origin", &self.origin)
            .field("fns", &self.fns)
            .finish()
    }
}

impl Driver {
    /// Searches for the driver: `$CUDA_SYS_LIBRARY` if set (then only that), else
    /// `libcuda.so.1`/`libcuda.so` through the dynamic loader, else the usual system dirs.
    ///
    /// `$CUDA_SYS_LIBRARY` is trusted input, like `LD_LIBRARY_PATH` or `LD_PRELOAD`: whoever
    /// sets the environment of a process already decides what code it runs. The library it
    /// names is opened and trusted to be a CUDA driver, exactly as [`Driver::load_from`] does.
    ///
    /// Either way the answer is typed: a driver, or an error that says what was tried
    /// (this runs on machines with and without a GPU).
    ///
    /// ```
    /// use cuda_sys::{Driver, DriverVersion, LoadError, MINIMUM_DRIVER_VERSION};
    /// match Driver::load() {
    ///     Ok(driver) => assert!(driver.version() >= DriverVersion(MINIMUM_DRIVER_VERSION)),
    ///     // The search: every candidate with why it was rejected.
    ///     Err(e @ LoadError::NotFound { .. }) => assert!(!e.attempts().is_empty()),
    ///     // `$CUDA_SYS_LIBRARY` named a library that cannot be used.
    ///     Err(e) => assert!(e.reason().is_some()),
    /// }
    /// ```
    pub fn load() -> Result<Driver, LoadError> {
        if let Some(c) = dylib::env_path(DRIVER_PATH_ENV) {
            return Self::load_candidate(&c).map_err(|reason| unusable(&c, reason));
        }
        dylib::first_usable(Self::search_list(), Self::load_candidate).map_err(|attempts| {
            LoadError::NotFound {
                library: LIBRARY,
                attempts,
            }
        })
    }

    /// Loads the driver from exactly `path` (a file, or a soname for the dynamic loader).
    ///
    /// # Safety
    /// Opening a library runs its initialisers, and its symbols are called through the
    /// driver API's signatures: `path` must name a genuine CUDA driver library (or one that
    /// implements the driver API faithfully), as with `libloading::Library::new`.
    ///
    /// ```
    /// use cuda_sys::dylib::Reason;
    /// use cuda_sys::Driver;
    /// // SAFETY: a path that does not exist is refused before anything is opened.
    /// let err = unsafe { Driver::load_from("/no/such/dir/libcuda.so.1") }.unwrap_err();
    /// assert_eq!(err.reason(), Some(&Reason::NoSuchFile));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "CUDA driver from /no/such/dir/libcuda.so.1 (explicit path) cannot be used: no such file"
    /// );
    /// ```
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<Driver, LoadError> {
        let c = Candidate::new(path.as_ref(), Step::Explicit);
        Self::load_candidate(&c).map_err(|reason| unusable(&c, reason))
    }

    /// The automatic search list (without the environment override), in order.
    ///
    /// ```
    /// use cuda_sys::dylib::Step;
    /// let list = cuda_sys::Driver::search_list();
    /// assert_eq!(list[0].path.to_str(), Some("libcuda.so.1"));
    /// assert_eq!(list[0].step, Step::DynamicLoader);
    /// assert!(list.iter().any(|c| c.step == Step::SystemDir));
    /// ```
    pub fn search_list() -> Vec<Candidate> {
        let mut list = vec![
            Candidate::new("libcuda.so.1", Step::DynamicLoader),
            Candidate::new("libcuda.so", Step::DynamicLoader),
        ];
        let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
        for dir in [
            multiarch.as_str(),
            "/usr/lib64",
            "/usr/local/nvidia/lib64",
            "/usr/lib/wsl/lib",
        ] {
            list.push(Candidate::new(
                PathBuf::from(dir).join("libcuda.so.1"),
                Step::SystemDir,
            ));
        }
        list
    }

    fn load_candidate(c: &Candidate) -> Result<Driver, Reason> {
        // SAFETY: a path the caller vouched for (`load_from`), named by the trusted
        // environment, or found under the driver's own names where drivers are installed.
        let lib = unsafe { OpenLibrary::open(&c.path) }?;
        let gpa = lib.symbol(c"cuGetProcAddress_v2");
        if gpa.is_null() {
            // Drivers before CUDA 12.0 export only the older cuGetProcAddress.
            return Err(Reason::MissingSymbol("cuGetProcAddress_v2".into()));
        }
        // SAFETY: libcuda exports `cuGetProcAddress_v2` with exactly this signature (the
        // CUDA 12 header's declaration, from which PFN_cuGetProcAddress_v2 is generated).
        let gpa: PFN_cuGetProcAddress_v2 =
            unsafe { std::mem::transmute::<*const c_void, PFN_cuGetProcAddress_v2>(gpa) };
        let mut resolve = move |name: &CStr, version: i32| -> *const c_void {
            let mut pfn: *mut c_void = std::ptr::null_mut();
            let mut status = crate::CUdriverProcAddressQueryResult(0);
            // SAFETY: `name` is NUL-terminated, both out-pointers are valid locals, and
            // the legacy-stream flag is a documented value.
            let rc = unsafe {
                gpa(
                    name.as_ptr(),
                    &mut pfn,
                    version,
                    crate::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM.0 as u64,
                    &mut status,
                )
            };
            if rc == CUresult::CUDA_SUCCESS {
                pfn
            } else {
                std::ptr::null()
            }
        };
        let origin = format!("{} ({})", c.path.display(), c.step);
        // SAFETY: cuGetProcAddress returns, for a name and a CUDA version, the function
        // variant a program compiled against that version calls; the table's types are
        // those variants' signatures (see `PINNED_API_VERSION`).
        let mut driver = unsafe { Self::resolve_all(&mut resolve)? };
        driver.origin = origin;
        driver._lib = Some(lib);
        Ok(driver)
    }

    /// Builds a driver from any resolver `(symbol, api_version) -> address`.
    ///
    /// `cuDriverGetVersion` is resolved and called first; the version gates the optional
    /// entries and must be at least 12.0. `name` says where the functions come from in
    /// messages (e.g. "mock driver").
    ///
    /// # Safety
    /// Every non-null address the resolver returns must be a function with the signature
    /// that [`DriverFns`] declares for that name, valid for the life of the `Driver`.
    ///
    /// A resolver that knows only `cuDriverGetVersion` gives a driver that is refused,
    /// naming the first required entry it lacks:
    ///
    /// ```
    /// use std::ffi::{CStr, c_int, c_void};
    /// use cuda_sys::dylib::Reason;
    /// use cuda_sys::{CUresult, Driver};
    ///
    /// unsafe extern "C" fn get_version(version: *mut c_int) -> CUresult {
    ///     // SAFETY: the loader passes a valid out-pointer.
    ///     unsafe { *version = 12040 };
    ///     CUresult::CUDA_SUCCESS
    /// }
    /// let resolve = |name: &CStr, _api_version: i32| -> *const c_void {
    ///     match name.to_bytes() {
    ///         b"cuDriverGetVersion" => get_version as *const c_void,
    ///         _ => std::ptr::null(),
    ///     }
    /// };
    /// // SAFETY: the one address returned has `PFN_cuDriverGetVersion`'s signature.
    /// let err = unsafe { Driver::from_resolver("half a driver", resolve) }.unwrap_err();
    /// assert_eq!(err.reason(), Some(&Reason::MissingSymbol("cuInit".into())));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "CUDA driver from half a driver cannot be used: required symbol `cuInit` is missing"
    /// );
    /// ```
    pub unsafe fn from_resolver(
        name: &str,
        mut resolve: impl FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Driver, LoadError> {
        // SAFETY: forwarded from the caller.
        let mut driver =
            unsafe { Self::resolve_all(&mut resolve) }.map_err(|reason| LoadError::Unusable {
                library: LIBRARY,
                origin: name.to_string(),
                reason,
            })?;
        driver.origin = name.to_string();
        Ok(driver)
    }

    /// Like [`Driver::from_resolver`], keeping `owner` alive as long as the driver: for
    /// tables whose functions depend on some state (a mock's simulated machine).
    ///
    /// # Safety
    /// As for [`Driver::from_resolver`]; the addresses may depend on `owner` being alive.
    pub unsafe fn from_resolver_owned(
        name: &str,
        owner: Arc<dyn Any + Send + Sync>,
        resolve: impl FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Driver, LoadError> {
        // SAFETY: forwarded from the caller.
        let mut driver = unsafe { Self::from_resolver(name, resolve) }?;
        driver._owner = Some(owner);
        Ok(driver)
    }

    /// # Safety
    /// As for [`Driver::from_resolver`].
    unsafe fn resolve_all(
        resolve: &mut dyn FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Driver, Reason> {
        let p = resolve(c"cuDriverGetVersion", PINNED_API_VERSION);
        if p.is_null() {
            return Err(Reason::MissingSymbol("cuDriverGetVersion".into()));
        }
        // SAFETY: the caller promises non-null addresses have the declared signature.
        let get_version =
            unsafe { std::mem::transmute::<*const c_void, PFN_cuDriverGetVersion>(p) };
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer; the call needs no cuInit.
        let rc = unsafe { get_version(&mut v) };
        if rc != CUresult::CUDA_SUCCESS {
            return Err(Reason::Version(format!(
                "cuDriverGetVersion returned {}",
                rc.0
            )));
        }
        let version = DriverVersion(v);
        if v < MINIMUM_DRIVER_VERSION {
            return Err(Reason::TooOld {
                found: version.to_string(),
                minimum: DriverVersion(MINIMUM_DRIVER_VERSION).to_string(),
            });
        }
        // SAFETY: forwarded from the caller.
        let fns = unsafe { DriverFns::load_with(v, resolve) }
            .map_err(|s| Reason::MissingSymbol(s.to_string()))?;
        Ok(Driver {
            fns,
            version,
            origin: String::new(),
            _lib: None,
            _owner: None,
        })
    }

    /// The function table. Calls through it cost what the C call costs.
    #[inline]
    pub fn fns(&self) -> &DriverFns {
        &self.fns
    }

    /// The driver's CUDA API version (`cuDriverGetVersion`).
    pub fn version(&self) -> DriverVersion {
        self.version
    }

    /// Where the functions came from: a path and how it was found, or a resolver's name.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The opened library, when the functions came from one.
    pub fn library(&self) -> Option<&OpenLibrary> {
        self._lib.as_ref()
    }
}

fn unusable(c: &Candidate, reason: Reason) -> LoadError {
    LoadError::Unusable {
        library: LIBRARY,
        origin: format!("{} ({})", c.path.display(), c.step),
        reason,
    }
}
