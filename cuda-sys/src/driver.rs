//! The CUDA driver (`libcuda.so.1`) as a [`Library`]: where to look for it, its version,
//! and its functions resolved through `cuGetProcAddress` at the pinned ABI.

use std::ffi::{CStr, c_void};
use std::fmt;
use std::path::PathBuf;

use crate::dylib::{self, Candidate, Library, OpenLibrary, Reason, Table};
use crate::fns::{DriverFns, MINIMUM_DRIVER_VERSION, PINNED_API_VERSION};
use crate::{CUresult, PFN_cuDriverGetVersion, PFN_cuGetProcAddress_v2, Resolver};

/// Environment variable naming the driver library to load instead of searching.
///
/// ```
/// assert_eq!(cuda_sys::DRIVER_PATH_ENV, "CUDA_SYS_LIBRARY");
/// ```
pub const DRIVER_PATH_ENV: &str = "CUDA_SYS_LIBRARY";

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

/// The loaded driver: its function table ([`DriverFns`]), its version and the library
/// that backs it; [`Library`] is the handle and its methods are the driver's.
///
/// Built by [`Driver::load`] (search: `$CUDA_SYS_LIBRARY` if set, then only that; else
/// `libcuda.so.1`/`libcuda.so` through the dynamic loader; else the usual system dirs),
/// [`Driver::load_from`] (one path) or [`Driver::from_resolver`] (any resolver: this is
/// how mock tables are made). The table's entries come from `cuGetProcAddress` at
/// [`PINNED_API_VERSION`], and the driver must be at least [`MINIMUM_DRIVER_VERSION`].
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_sys::{CUresult, DriverVersion};
///
/// let (driver, _world) = MockDriver::with_devices(1).version(12040).build()?;
/// assert_eq!((driver.version(), driver.origin()), (DriverVersion(12040), "mock driver"));
/// assert!(driver.library().is_none(), "a resolver's table has no library behind it");
/// // SAFETY: cuInit(0) has no preconditions.
/// assert_eq!(unsafe { (driver.fns().cuInit)(0) }, CUresult::CUDA_SUCCESS);
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
pub type Driver = Library<DriverFns>;

static_assertions::assert_impl_all!(Driver: Send, Sync);

// SAFETY: the search names only the CUDA driver's own files (`libcuda.so.1`, `libcuda.so`)
// and `$CUDA_SYS_LIBRARY`, and takes a library already loaded only under the names the
// driver's loaders use for it (ours and cudarc's); its entries are resolved at the ABI
// their signatures declare.
unsafe impl Table for DriverFns {
    const LIBRARY: &'static str = "CUDA driver";
    const HANDLE: &'static str = "Driver";
    const PATH_ENV: &'static str = DRIVER_PATH_ENV;
    type Version = DriverVersion;
    const MINIMUM: DriverVersion = DriverVersion(MINIMUM_DRIVER_VERSION);

    /// `libcuda.so.1`, `libcuda.so` through the dynamic loader, then the system dirs of
    /// the driver's packages (no pip wheel ships a driver).
    fn search_list() -> Vec<Candidate> {
        let dirs = ["/usr/local/nvidia/lib64", "/usr/lib/wsl/lib"].map(PathBuf::from);
        dylib::usual_search(&["libcuda.so.1", "libcuda.so"], &[], dirs)
    }

    /// `libcuda.so.1`, `libcuda.so`, then every name cudarc tries for the driver
    /// ([`dylib::cudarc_names`] of `cuda` and `nvcuda`): a driver the process already loaded
    /// under one of them is the one used.
    fn resident_names() -> Vec<String> {
        let ours = ["libcuda.so.1", "libcuda.so"].map(String::from);
        ours.into_iter()
            .chain(dylib::cudarc_names(&["cuda", "nvcuda"]))
            .collect()
    }

    /// `cuGetProcAddress_v2`, which returns for a name and a CUDA version the variant a
    /// program compiled against that version calls (`cuMemAlloc_v2`, not the `dlsym`
    /// symbol `cuMemAlloc`). Drivers before 12.0 lack it and are refused here.
    unsafe fn resolver(lib: &OpenLibrary) -> Result<Box<Resolver<'_>>, Reason> {
        let gpa = lib.symbol(c"cuGetProcAddress_v2");
        if gpa.is_null() {
            return Err(Reason::MissingSymbol("cuGetProcAddress_v2".into()));
        }
        // SAFETY: `lib` is libcuda (the caller's promise), which exports
        // `cuGetProcAddress_v2` with exactly this signature (the CUDA 12 header's
        // declaration, from which PFN_cuGetProcAddress_v2 is generated).
        let gpa = unsafe { std::mem::transmute::<*const c_void, PFN_cuGetProcAddress_v2>(gpa) };
        Ok(Box::new(move |name: &CStr, version: i32| {
            let mut pfn: *mut c_void = std::ptr::null_mut();
            let mut status = crate::CUdriverProcAddressQueryResult(0);
            let legacy = crate::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM;
            // SAFETY: `name` is NUL-terminated, both out-pointers are valid locals, and
            // the legacy-stream flag is a documented value.
            let rc = unsafe {
                gpa(
                    name.as_ptr(),
                    &mut pfn,
                    version,
                    legacy.0 as u64,
                    &mut status,
                )
            };
            if rc == CUresult::CUDA_SUCCESS {
                pfn
            } else {
                std::ptr::null()
            }
        }))
    }

    unsafe fn version(resolve: &mut Resolver<'_>) -> Result<DriverVersion, Reason> {
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
            let msg = format!("cuDriverGetVersion returned {}", rc.0);
            return Err(Reason::Version(msg));
        }
        Ok(DriverVersion(v))
    }

    unsafe fn fill(
        version: DriverVersion,
        resolve: &mut Resolver<'_>,
    ) -> Result<Self, &'static str> {
        // SAFETY: forwarded from the caller. Over libcuda the resolver is
        // `cuGetProcAddress`, whose answer for a name at a version is the ABI variant of
        // that version, the signature the table declares (see `PINNED_API_VERSION`).
        unsafe { Self::load_with(version.0, resolve) }
    }
}
