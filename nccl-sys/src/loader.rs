//! Loading `libnccl.so.2` and resolving [`NcclFns`] with `dlsym`.

use std::any::Any;
use std::ffi::{CStr, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cuda_sys::LoadError;
use cuda_sys::dylib::{self, Candidate, OpenLibrary, Reason, Step};

use crate::{NcclFns, NcclVersion, PFN_ncclGetVersion, ncclResult_t};

/// Environment variable naming the NCCL library to load instead of searching.
///
/// ```
/// assert_eq!(nccl_sys::NCCL_PATH_ENV, "NCCL_SYS_LIBRARY");
/// ```
pub const NCCL_PATH_ENV: &str = "NCCL_SYS_LIBRARY";

const LIBRARY: &str = "NCCL";

/// A loaded NCCL: its function table, its version and the library that backs it.
///
/// Nothing is opened until one of the constructors is called; the safe layer calls them
/// only when a channel is asked for.
///
/// ```
/// use cuda_sys::mock::MockDriver;
/// use nccl_sys::mock::MockNccl;
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
pub struct Nccl {
    fns: NcclFns,
    version: NcclVersion,
    origin: String,
    _lib: Option<OpenLibrary>,
    // Keeps whatever backs a resolver-made table alive (e.g. a mock's slot).
    _owner: Option<Arc<dyn Any + Send + Sync>>,
}

static_assertions::assert_impl_all!(Nccl: Send, Sync);

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("version", &self.version)
            .field("origin", &self.origin)
            .field("fns", &self.fns)
            .finish()
    }
}

impl Nccl {
    /// Searches for NCCL: `$NCCL_SYS_LIBRARY` if set (then only that); else
    /// `libnccl.so.2`/`libnccl.so` through the dynamic loader; else `libnccl.so.2` of a
    /// pip-installed `nvidia-nccl-cu*` wheel in the visible Python environments; else the
    /// usual system dirs. The error lists every path tried and why it failed.
    ///
    /// `$NCCL_SYS_LIBRARY` is trusted input, like `LD_LIBRARY_PATH` or `LD_PRELOAD`: whoever
    /// sets the environment of a process already decides what code it runs. The library it
    /// names is opened and trusted to be NCCL, exactly as [`Nccl::load_from`] does.
    ///
    /// Either way the answer is typed (this runs with and without an NCCL installed):
    ///
    /// ```
    /// use nccl_sys::{LoadError, Nccl, NcclVersion};
    /// match Nccl::load() {
    ///     Ok(nccl) => assert!(nccl.version() >= NcclVersion::MINIMUM),
    ///     // The search: every candidate with why it was rejected.
    ///     Err(e @ LoadError::NotFound { .. }) => assert!(!e.attempts().is_empty()),
    ///     // `$NCCL_SYS_LIBRARY` named a library that cannot be used.
    ///     Err(e) => assert!(e.reason().is_some()),
    /// }
    /// ```
    pub fn load() -> Result<Nccl, LoadError> {
        if let Some(c) = dylib::env_path(NCCL_PATH_ENV) {
            return Self::load_candidate(&c).map_err(|reason| unusable(&c, reason));
        }
        dylib::first_usable(Self::search_list(), Self::load_candidate).map_err(|attempts| {
            LoadError::NotFound {
                library: LIBRARY,
                attempts,
            }
        })
    }

    /// Loads NCCL from exactly `path` (a file, or a soname for the dynamic loader).
    ///
    /// # Safety
    /// Opening a library runs its initialisers, and its symbols are called through NCCL's
    /// signatures: `path` must name a genuine NCCL library (or one that implements NCCL's
    /// API faithfully), as with `libloading::Library::new`.
    ///
    /// ```no_run
    /// // `no_run`: it needs an NCCL wheel installed at this path.
    /// let path = "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2";
    /// // SAFETY: the path names a genuine NCCL library.
    /// let nccl = unsafe { nccl_sys::Nccl::load_from(path) }?;
    /// println!("NCCL {} from {}", nccl.version(), nccl.origin());
    /// # Ok::<(), nccl_sys::LoadError>(())
    /// ```
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<Nccl, LoadError> {
        let c = Candidate::new(path.as_ref(), Step::Explicit);
        Self::load_candidate(&c).map_err(|reason| unusable(&c, reason))
    }

    /// The automatic search list (without the environment override), in order.
    ///
    /// ```
    /// use cuda_sys::dylib::Step;
    /// let list = nccl_sys::Nccl::search_list();
    /// assert_eq!(list[0].path.to_str(), Some("libnccl.so.2"));
    /// assert_eq!(list[0].step, Step::DynamicLoader);
    /// assert!(list.iter().any(|c| c.step == Step::SystemDir));
    /// ```
    pub fn search_list() -> Vec<Candidate> {
        let mut list = vec![
            Candidate::new("libnccl.so.2", Step::DynamicLoader),
            Candidate::new("libnccl.so", Step::DynamicLoader),
        ];
        for site in dylib::python_site_dirs() {
            // nvidia-nccl-cu11/-cu12 install into nvidia/nccl, -cu13 into nvidia/cu13.
            for sub in ["nvidia/nccl/lib", "nvidia/cu13/lib"] {
                let p = site.join(sub).join("libnccl.so.2");
                if p.exists() {
                    list.push(Candidate::new(p, Step::PythonPackage));
                }
            }
        }
        let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
        let mut dirs: Vec<PathBuf> = vec![multiarch.into(), "/usr/lib64".into()];
        if let Some(home) = std::env::var_os("CUDA_HOME").filter(|h| !h.is_empty()) {
            dirs.push(Path::new(&home).join("lib64"));
        }
        dirs.extend(
            [
                "/usr/local/cuda/lib64",
                "/usr/local/nccl/lib",
                "/opt/nccl/lib",
            ]
            .map(PathBuf::from),
        );
        for d in dirs {
            list.push(Candidate::new(d.join("libnccl.so.2"), Step::SystemDir));
        }
        list
    }

    fn load_candidate(c: &Candidate) -> Result<Nccl, Reason> {
        // SAFETY: a path the caller vouched for (`load_from`), named by the trusted
        // environment, or found under NCCL's own names where NCCL is installed.
        let lib = unsafe { OpenLibrary::open(&c.path) }?;
        let mut resolve = |name: &CStr, _version: i32| lib.symbol(name);
        // SAFETY: libnccl exports each table entry under its nccl.h name with the header's
        // signature; the table's types are generated from nccl.h, and optional entries
        // are only taken from libraries at least as new as the release that added them.
        let mut nccl = unsafe { Self::resolve_all(&mut resolve)? };
        nccl.origin = format!("{} ({})", c.path.display(), c.step);
        nccl._lib = Some(lib);
        Ok(nccl)
    }

    /// Builds an NCCL from any resolver `(symbol, version) -> address`: `ncclGetVersion`
    /// is resolved and called first, must report at least [`NcclVersion::MINIMUM`], and
    /// gates the optional entries. `name` says where the functions come from.
    ///
    /// # Safety
    /// Every non-null address the resolver returns must be a function with the signature
    /// that [`NcclFns`] declares for that name, valid for the life of the `Nccl`.
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
    pub unsafe fn from_resolver(
        name: &str,
        mut resolve: impl FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Nccl, LoadError> {
        // SAFETY: forwarded from the caller.
        let mut nccl =
            unsafe { Self::resolve_all(&mut resolve) }.map_err(|reason| LoadError::Unusable {
                library: LIBRARY,
                origin: name.to_string(),
                reason,
            })?;
        nccl.origin = name.to_string();
        Ok(nccl)
    }

    /// Like [`Nccl::from_resolver`], keeping `owner` alive as long as the `Nccl`.
    ///
    /// # Safety
    /// As for [`Nccl::from_resolver`]; the addresses may depend on `owner` being alive.
    pub unsafe fn from_resolver_owned(
        name: &str,
        owner: Arc<dyn Any + Send + Sync>,
        resolve: impl FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Nccl, LoadError> {
        // SAFETY: forwarded from the caller.
        let mut nccl = unsafe { Self::from_resolver(name, resolve) }?;
        nccl._owner = Some(owner);
        Ok(nccl)
    }

    /// # Safety
    /// As for [`Nccl::from_resolver`].
    unsafe fn resolve_all(
        resolve: &mut dyn FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Nccl, Reason> {
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
            return Err(Reason::Version(format!(
                "ncclGetVersion returned {} ({})",
                rc.0,
                rc.name().unwrap_or("unknown")
            )));
        }
        let version = NcclVersion(code);
        if version < NcclVersion::MINIMUM {
            return Err(Reason::TooOld {
                found: version.to_string(),
                minimum: NcclVersion::MINIMUM.to_string(),
            });
        }
        // SAFETY: forwarded from the caller.
        let fns = unsafe { NcclFns::load_with(code, resolve) }
            .map_err(|s| Reason::MissingSymbol(s.to_string()))?;
        Ok(Nccl {
            fns,
            version,
            origin: String::new(),
            _lib: None,
            _owner: None,
        })
    }

    /// The function table. Calls through it cost what the C call costs.
    #[inline]
    pub fn fns(&self) -> &NcclFns {
        &self.fns
    }

    /// The library's version (`ncclGetVersion`).
    pub fn version(&self) -> NcclVersion {
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

    /// `ncclGetErrorString(result)` as a Rust string.
    pub fn error_string(&self, result: ncclResult_t) -> String {
        // SAFETY: ncclGetErrorString accepts any value and returns a static string
        // (or null, checked below).
        let p = unsafe { (self.fns.ncclGetErrorString)(result) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, static storage in the library.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn unusable(c: &Candidate, reason: Reason) -> LoadError {
    LoadError::Unusable {
        library: LIBRARY,
        origin: format!("{} ({})", c.path.display(), c.step),
        reason,
    }
}
