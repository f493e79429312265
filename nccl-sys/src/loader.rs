//! NCCL (`libnccl.so.2`) as a [`Library`]: where to look for it (pip wheels included), and
//! its version; its functions are resolved with `dlsym`.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use cuda_sys::Resolver;
use cuda_sys::dylib::{self, Candidate, Library, Reason, Table};

use crate::{NcclFns, NcclVersion, PFN_ncclGetVersion, ncclResult_t};

/// Environment variable naming the NCCL library to load instead of searching.
///
/// ```
/// assert_eq!(nccl_sys::NCCL_PATH_ENV, "NCCL_SYS_LIBRARY");
/// ```
pub const NCCL_PATH_ENV: &str = "NCCL_SYS_LIBRARY";

/// A loaded NCCL: its function table ([`NcclFns`]), its version and the library that
/// backs it; [`Library`] is the handle and its methods are NCCL's, and the table's
/// ([`NcclFns::error_string`]) too.
///
/// Built by [`Nccl::load`] (search: `$NCCL_SYS_LIBRARY` if set, then only that; else an
/// NCCL already loaded in the process under `libnccl.so.2`, `libnccl.so` or a name cudarc
/// uses (asked with `RTLD_NOLOAD`: whichever crate loads NCCL first, the process has one);
/// else `libnccl.so.2`/`libnccl.so` through the dynamic loader; else `libnccl.so.2` of a
/// pip-installed `nvidia-nccl-cu*` wheel in the visible Python environments; else the
/// usual system dirs), [`Nccl::load_from`] (one path) or [`Nccl::from_resolver`] (any
/// resolver). The library must be at least [`NcclVersion::MINIMUM`]. Nothing is opened
/// until a constructor is called; the safe layer calls one only when a channel is asked for.
///
/// ```
/// use cuda_mock::MockDriver;
/// use nccl_mock::MockNccl;
/// use nccl_sys::{NcclVersion, ncclResult_t, ncclUniqueId};
///
/// let (_driver, gpus) = MockDriver::with_devices(1).build()?;
/// let (nccl, _world) = MockNccl::new(&gpus).version(NcclVersion::new(2, 21, 5)).build()?;
/// assert_eq!(nccl.version().to_string(), "2.21.5");
/// assert_eq!(nccl.origin(), "mock NCCL");
/// assert!(nccl.library().is_none());
/// let mut id = ncclUniqueId::default();
/// // SAFETY: a valid out-pointer.
/// assert_eq!(unsafe { (nccl.fns().ncclGetUniqueId)(&mut id) }, ncclResult_t::ncclSuccess);
/// let text = nccl.error_string(ncclResult_t::ncclInvalidArgument);
/// assert_eq!(text, "invalid argument (simulated)");
/// # Ok::<(), nccl_sys::LoadError>(())
/// ```
///
/// A library older than [`NcclVersion::MINIMUM`] is refused before anything else is
/// resolved:
///
/// ```
/// use std::ffi::{CStr, c_int, c_void};
/// use cuda_sys::dylib::Reason;
/// use nccl_sys::{Nccl, ncclResult_t};
///
/// unsafe extern "C" fn get_version(version: *mut c_int) -> ncclResult_t {
///     // SAFETY: the loader passes a valid out-pointer.
///     unsafe { *version = 21705 };
///     ncclResult_t::ncclSuccess
/// }
/// let resolve = |name: &CStr, _version: i32| -> *const c_void {
///     match name.to_bytes() {
///         b"ncclGetVersion" => get_version as *const c_void,
///         _ => std::ptr::null(),
///     }
/// };
/// // SAFETY: the one address returned has `PFN_ncclGetVersion`'s signature.
/// let err = unsafe { Nccl::from_resolver("an old NCCL", resolve) }.unwrap_err();
/// assert_eq!(
///     err.reason(),
///     Some(&Reason::TooOld { found: "2.17.5".into(), minimum: "2.18.0".into() })
/// );
/// ```
///
/// Loading a wheel's library by its path (`no_run`: it needs that wheel installed):
///
/// ```no_run
/// let path = "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2";
/// // SAFETY: the path names a genuine NCCL library.
/// let nccl = unsafe { nccl_sys::Nccl::load_from(path) }?;
/// println!("NCCL {} from {}", nccl.version(), nccl.origin());
/// # Ok::<(), nccl_sys::LoadError>(())
/// ```
pub type Nccl = Library<NcclFns>;

static_assertions::assert_impl_all!(Nccl: Send, Sync);

// SAFETY: the search names only NCCL's own files (`libnccl.so.2`, `libnccl.so`, NCCL's
// wheels) and `$NCCL_SYS_LIBRARY`, and takes a library already loaded only under the names
// NCCL's loaders use for it (ours and cudarc's); every entry's signature is its header's.
unsafe impl Table for NcclFns {
    const LIBRARY: &'static str = "NCCL";
    const HANDLE: &'static str = "Nccl";
    const PATH_ENV: &'static str = NCCL_PATH_ENV;
    type Version = NcclVersion;
    const MINIMUM: NcclVersion = NcclVersion::MINIMUM;

    /// `libnccl.so.2`, `libnccl.so` through the dynamic loader; the NCCL wheels'
    /// `libnccl.so.2` (`nvidia-nccl-cu11`/`-cu12` install into `nvidia/nccl/lib`, `-cu13`
    /// into `nvidia/cu13/lib`); then the system dirs, `$CUDA_HOME/lib64` among them.
    fn search_list() -> Vec<Candidate> {
        let cuda_home = std::env::var_os("CUDA_HOME").filter(|h| !h.is_empty());
        let dirs = cuda_home
            .map(|h| Path::new(&h).join("lib64"))
            .into_iter()
            .chain(
                [
                    "/usr/local/cuda/lib64",
                    "/usr/local/nccl/lib",
                    "/opt/nccl/lib",
                ]
                .map(PathBuf::from),
            );
        let wheels = ["nvidia/nccl/lib", "nvidia/cu13/lib"];
        dylib::usual_search(&["libnccl.so.2", "libnccl.so"], &wheels, dirs)
    }

    /// `libnccl.so.2`, `libnccl.so`, then every name cudarc tries for NCCL
    /// ([`dylib::cudarc_names`] of `nccl`): an NCCL the process already loaded under one of
    /// them (cudarc's, torch's, the program's own) is the one used.
    fn resident_names() -> Vec<String> {
        let ours = ["libnccl.so.2", "libnccl.so"].map(String::from);
        ours.into_iter()
            .chain(dylib::cudarc_names(&["nccl"]))
            .collect()
    }

    unsafe fn version(resolve: &mut Resolver<'_>) -> Result<NcclVersion, Reason> {
        let p = resolve(c"ncclGetVersion", NcclVersion::MINIMUM.0);
        if p.is_null() {
            return Err(Reason::MissingSymbol("ncclGetVersion".into()));
        }
        // SAFETY: the caller promises non-null addresses have the declared signature.
        let get_version = unsafe { std::mem::transmute::<*const c_void, PFN_ncclGetVersion>(p) };
        let mut code = 0;
        // SAFETY: `code` is a valid out-pointer.
        let rc = unsafe { get_version(&mut code) };
        if rc != ncclResult_t::ncclSuccess {
            let name = rc.name().unwrap_or("unknown");
            let msg = format!("ncclGetVersion returned {} ({name})", rc.0);
            return Err(Reason::Version(msg));
        }
        Ok(NcclVersion(code))
    }

    unsafe fn fill(version: NcclVersion, resolve: &mut Resolver<'_>) -> Result<Self, &'static str> {
        // SAFETY: forwarded from the caller. libnccl exports each entry under its nccl.h
        // name with the header's signature, from which the table's types are generated;
        // optional entries are only asked of libraries as new as the release that added them.
        unsafe { Self::load_with(version.0, resolve) }
    }
}
