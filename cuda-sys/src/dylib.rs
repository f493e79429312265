//! One loader for the C libraries that this workspace resolves at run time: it finds a
//! library, opens it, fills a function table from it, and keeps the code behind the table
//! mapped for as long as the table is used.
//!
//! [`Library<T>`] is the handle and a [`Table`] says what differs from one library to the
//! next: [`Driver`](crate::Driver) is `Library<DriverFns>` (resolved through
//! `cuGetProcAddress`) and `nccl_sys::Nccl` is `Library<NcclFns>` (resolved with `dlsym`).
//! What they share is written once, here:
//!
//! * **Search** ([`Library::load`]): the library named by the table's environment variable
//!   ([`Table::PATH_ENV`]) alone when it is set; else, first, a copy already loaded in the
//!   process under one of [`Table::resident_names`] (asked with `RTLD_NOLOAD`, so one
//!   process uses one copy whichever crate loaded it first); then [`Table::search_list`] in
//!   order, most often built by [`usual_search`] (dynamic loader, pip wheels, system
//!   folders). The first usable library wins; each one rejected is an [`Attempt`] with its
//!   [`Reason`].
//! * **Open** ([`OpenLibrary`]): `RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE`, kept by the handle.
//! * **Fill**: the version is asked first, one older than [`Table::MINIMUM`] is refused,
//!   and the version gates the optional entries of a [`fn_table!`](crate::fn_table) table.
//! * **Errors**: a [`LoadError`] that names every path tried, never a panic.
//!
//! Loading a third library takes a table and its `Table` impl, nothing else. The C
//! library, for instance (a table of `getpid` and `abs`, found through the dynamic loader):
//!
//! ```
//! use cuda_sys::Resolver;
//! use cuda_sys::dylib::{Candidate, Library, Reason, Step, Table};
//!
//! cuda_sys::fn_table! {
//!     /// Two functions of the C library.
//!     pub struct LibcFns;
//!     min = 0;
//!     required { getpid: unsafe extern "C" fn() -> i32 }
//!     optional { abs: unsafe extern "C" fn(i32) -> i32 = 1 }
//! }
//!
//! // SAFETY: `libc.so.6` is the C library, whose `getpid` and `abs` have these signatures.
//! unsafe impl Table for LibcFns {
//!     const LIBRARY: &'static str = "C library";
//!     const HANDLE: &'static str = "Libc";
//!     const PATH_ENV: &'static str = "LIBC_EXAMPLE_LIBRARY";
//!     type Version = i32;
//!     const MINIMUM: i32 = 1;
//!     fn search_list() -> Vec<Candidate> {
//!         vec![Candidate::new("libc.so.6", Step::DynamicLoader)]
//!     }
//!     unsafe fn version(_: &mut Resolver<'_>) -> Result<i32, Reason> {
//!         Ok(1) // glibc has no version query of this kind
//!     }
//!     unsafe fn fill(version: i32, resolve: &mut Resolver<'_>) -> Result<Self, &'static str> {
//!         // SAFETY: forwarded; libc's `getpid` and `abs` have the signatures declared.
//!         unsafe { Self::load_with(version, resolve) }
//!     }
//! }
//!
//! let libc = Library::<LibcFns>::load()?;
//! // Every process has the C library loaded already: the first step takes that copy.
//! assert_eq!(libc.origin(), "libc.so.6 (already loaded)");
//! // SAFETY: neither function has a precondition.
//! unsafe {
//!     assert_eq!((libc.fns().getpid)() as u32, std::process::id());
//!     assert_eq!(libc.abs.map(|abs| abs(-3)), Some(3), "the handle derefs to its table");
//! }
//! # Ok::<(), cuda_sys::LoadError>(())
//! ```

use std::any::Any;
use std::ffi::{CStr, OsString, c_void};
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libc::{RTLD_NODELETE, RTLD_NOLOAD};
use libloading::os::unix::{Library as RawLibrary, RTLD_LOCAL, RTLD_NOW};

pub use crate::attempt::{Attempt, Attempts, Reason, Step};
use crate::{LoadError, Resolver};

/// What one C library adds to [`Library`]: its names, where to look for it, how to ask
/// its version and how to resolve its symbols. Implemented by the library's function
/// table, declared with [`fn_table!`](crate::fn_table) (see the [module](self) example).
///
/// # Safety
///
/// [`Library::load`] is safe and opens what [`search_list`](Self::search_list) and
/// [`PATH_ENV`](Self::PATH_ENV) name, which runs the library's initialisers and trusts its
/// symbols, and trusts the symbols of a library already loaded under one of
/// [`resident_names`](Self::resident_names): an implementation promises that every library
/// it names there is the genuine library of the table (or, for the environment variable,
/// one its user chose knowingly, as the dynamic loader trusts `LD_LIBRARY_PATH`), with the
/// signatures the table declares.
pub unsafe trait Table: Sized {
    /// The library in messages (`"CUDA driver"`, `"NCCL"`): [`LoadError`]'s `library`.
    const LIBRARY: &'static str;
    /// What callers call the handle (`"Driver"`, `"Nccl"`): the name `Debug` prints.
    const HANDLE: &'static str;
    /// The environment variable that names the one library to load instead of searching.
    const PATH_ENV: &'static str;
    /// The version the library reports, ordered like its releases.
    type Version: Copy + Ord + fmt::Display + fmt::Debug;
    /// The oldest version loaded; an older library is refused with [`Reason::TooOld`].
    const MINIMUM: Self::Version;

    /// Where [`Library::load`] looks, in order, when the environment names no library and
    /// none is already loaded under [`resident_names`](Self::resident_names).
    fn search_list() -> Vec<Candidate>;

    /// The names [`Library::load`] asks the dynamic loader first, with `RTLD_NOLOAD`: a
    /// library that the process already loaded under one of them (by that name, or whose
    /// soname it is) is taken before anything is searched, so that a process whose other
    /// crates or languages loaded the library (cudarc, torch, the program itself) uses that
    /// one copy rather than a second one that the search may find elsewhere. Nothing is
    /// loaded by this step. The default is the names that [`search_list`](Self::search_list)
    /// hands to the dynamic loader ([`Step::DynamicLoader`]); a table adds those that other
    /// loaders use ([`cudarc_names`]).
    fn resident_names() -> Vec<String> {
        Self::search_list()
            .into_iter()
            .filter(|c| c.step == Step::DynamicLoader)
            .map(|c| c.path.to_string_lossy().into_owned())
            .collect()
    }

    /// The resolver over an opened library. The default is `dlsym`, the API version
    /// ignored; a library with a resolver of its own (`cuGetProcAddress`) says so here.
    ///
    /// # Safety
    /// `lib` must be a genuine library of this table's kind.
    unsafe fn resolver(lib: &OpenLibrary) -> Result<Box<Resolver<'_>>, Reason> {
        Ok(Box::new(|name: &CStr, _version: i32| lib.symbol(name)))
    }

    /// Resolves and calls the library's version query: the first thing asked of a resolver.
    ///
    /// # Safety
    /// As for [`Library::from_resolver`].
    unsafe fn version(resolve: &mut Resolver<'_>) -> Result<Self::Version, Reason>;

    /// Fills the table at `version` (a table's `load_with`); `Err` names the first
    /// required entry that `resolve` does not find.
    ///
    /// # Safety
    /// As for [`Library::from_resolver`].
    unsafe fn fill(
        version: Self::Version,
        resolve: &mut Resolver<'_>,
    ) -> Result<Self, &'static str>;
}

/// A C library loaded at run time: its function table `T`, its version, where it came
/// from, and what keeps the code behind the table alive (the opened library, or the
/// owner of a resolver's functions).
///
/// Built by [`load`](Self::load) (search), [`load_from`](Self::load_from) (one path) or
/// [`from_resolver`](Self::from_resolver) (any resolver: this is how simulated libraries
/// plug in). The table is checked for completeness when the handle is built, never at a
/// call: a call through [`fns`](Self::fns) costs what the C call costs. The handle derefs
/// to its table, as libloading's `Symbol` does to its symbol, so the table's methods are
/// the handle's too.
pub struct Library<T: Table> {
    fns: T,
    version: T::Version,
    origin: String,
    // Keeps the code behind `fns` mapped.
    lib: Option<OpenLibrary>,
    // Keeps whatever backs a resolver-made table alive (e.g. a simulated library's slot).
    owner: Option<Arc<dyn Any + Send + Sync>>,
}

impl<T: Table> Library<T> {
    /// Searches for the library: the one `$`[`T::PATH_ENV`](Table::PATH_ENV) names if it is
    /// set and not empty (then only that); else [`search_list`](Self::search_list) in order,
    /// the first usable one winning: a library already loaded in the process under one of
    /// [`T::resident_names`](Table::resident_names) (asked with `RTLD_NOLOAD`, which loads
    /// nothing; the attempts say [`Step::AlreadyLoaded`]), then
    /// [`T::search_list`](Table::search_list).
    ///
    /// The environment variable is trusted input, like `LD_LIBRARY_PATH` or `LD_PRELOAD`:
    /// whoever sets the environment of a process already decides what code it runs. The
    /// library it names is opened and trusted to be `T`'s, exactly as
    /// [`load_from`](Self::load_from) does; so is what the search finds under the
    /// library's own names, as the dynamic linker would for a program linked against it.
    ///
    /// Either way the answer is typed: a library, or an error that says what was tried
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
    pub fn load() -> Result<Self, LoadError> {
        if let Some(c) = env_path(T::PATH_ENV) {
            // SAFETY: the environment is trusted input, as `T`'s `unsafe impl` promises.
            return unsafe { Self::open(&c) }.map_err(|reason| unusable::<T>(&c, reason));
        }
        first_usable(Self::search_list(), |c| {
            // SAFETY: what the search finds under `T`'s own names, or what is loaded under
            // its resident names, is `T`'s library, as `T`'s `unsafe impl` promises.
            unsafe { Self::open(c) }
        })
        .map_err(|attempts| LoadError::NotFound {
            library: T::LIBRARY,
            attempts,
        })
    }

    /// Loads the library from exactly `path` (a file, or a soname for the dynamic loader).
    ///
    /// # Safety
    /// Opening a library runs its initialisers, and its symbols are called through `T`'s
    /// signatures: `path` must name a genuine library of `T`'s kind (or one that
    /// implements its API faithfully), as with `libloading::Library::new`.
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
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let c = Candidate::new(path.as_ref(), Step::Explicit);
        // SAFETY: the caller promises that `path` is a genuine library of `T`'s kind.
        unsafe { Self::open(&c) }.map_err(|reason| unusable::<T>(&c, reason))
    }

    /// The automatic search list (without the environment override), in order: each of
    /// [`T::resident_names`](Table::resident_names) once, as [`Step::AlreadyLoaded`], then
    /// [`T::search_list`](Table::search_list).
    ///
    /// ```
    /// use cuda_sys::dylib::{Candidate, Step};
    /// let list = cuda_sys::Driver::search_list();
    /// assert_eq!(list[..2], [
    ///     Candidate::new("libcuda.so.1", Step::AlreadyLoaded),
    ///     Candidate::new("libcuda.so", Step::AlreadyLoaded),
    /// ]);
    /// let search = list.iter().position(|c| c.step != Step::AlreadyLoaded).unwrap();
    /// assert_eq!(list[search], Candidate::new("libcuda.so.1", Step::DynamicLoader));
    /// assert!(list[search..].iter().all(|c| c.step != Step::AlreadyLoaded));
    /// assert!(list.iter().any(|c| c.step == Step::SystemDir));
    /// ```
    pub fn search_list() -> Vec<Candidate> {
        let mut names: Vec<String> = Vec::new();
        for name in T::resident_names() {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let resident = names
            .into_iter()
            .map(|n| Candidate::new(n, Step::AlreadyLoaded));
        resident.chain(T::search_list()).collect()
    }

    /// Builds the handle from any resolver `(symbol, api_version) -> address`.
    ///
    /// The version query is resolved and called first ([`Table::version`]); the version
    /// must be at least [`Table::MINIMUM`] and gates the optional entries. `name` says
    /// where the functions come from in messages (e.g. "mock driver").
    ///
    /// # Safety
    /// Every non-null address the resolver returns must be a function with the signature
    /// that `T` declares for that name, valid for the life of the handle.
    ///
    /// A resolver that knows only the version query gives a library that is refused,
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
    ) -> Result<Self, LoadError> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::fill(name.to_string(), &mut resolve) }
            .map_err(|reason| unusable::<T>(name, reason))
    }

    /// Like [`from_resolver`](Self::from_resolver), keeping `owner` alive as long as the
    /// handle: for tables whose functions depend on some state (a simulated machine).
    ///
    /// # Safety
    /// As for [`from_resolver`](Self::from_resolver); the addresses may depend on `owner`
    /// being alive.
    pub unsafe fn from_resolver_owned(
        name: &str,
        owner: Arc<dyn Any + Send + Sync>,
        resolve: impl FnMut(&CStr, i32) -> *const c_void,
    ) -> Result<Self, LoadError> {
        // SAFETY: forwarded from the caller.
        let mut library = unsafe { Self::from_resolver(name, resolve) }?;
        library.owner = Some(owner);
        Ok(library)
    }

    /// Opens `c` and fills the table from it.
    ///
    /// # Safety
    /// `c` must name a genuine library of `T`'s kind.
    unsafe fn open(c: &Candidate) -> Result<Self, Reason> {
        let lib = match c.step {
            Step::AlreadyLoaded => OpenLibrary::open_loaded(&c.path)?,
            // SAFETY: a genuine library is safe to load (the caller's promise).
            _ => unsafe { OpenLibrary::open(&c.path) }?,
        };
        let mut library = {
            // SAFETY: `lib` is a genuine library of `T`'s kind (the caller's promise).
            let mut resolve = unsafe { T::resolver(&lib) }?;
            // SAFETY: a genuine library's symbols, resolved the way `T` says, have the
            // signatures that `T` declares for them; they stay mapped while `lib` lives
            // (and after: RTLD_NODELETE), and the handle keeps `lib`.
            unsafe { Self::fill(c.to_string(), &mut *resolve) }?
        };
        library.lib = Some(lib);
        Ok(library)
    }

    /// Asks the version, refuses one older than the minimum, and fills the table.
    ///
    /// # Safety
    /// As for [`from_resolver`](Self::from_resolver).
    unsafe fn fill(origin: String, resolve: &mut Resolver<'_>) -> Result<Self, Reason> {
        // SAFETY: forwarded from the caller.
        let version = unsafe { T::version(resolve) }?;
        if version < T::MINIMUM {
            return Err(Reason::TooOld {
                found: version.to_string(),
                minimum: T::MINIMUM.to_string(),
            });
        }
        // SAFETY: forwarded from the caller.
        let fns = unsafe { T::fill(version, resolve) }
            .map_err(|name| Reason::MissingSymbol(name.to_string()))?;
        let (lib, owner) = (None, None);
        Ok(Library {
            fns,
            version,
            origin,
            lib,
            owner,
        })
    }

    /// The function table. Calls through it cost what the C call costs.
    #[inline]
    pub fn fns(&self) -> &T {
        &self.fns
    }

    /// The version the library reported.
    pub fn version(&self) -> T::Version {
        self.version
    }

    /// Where the functions came from: a path and how it was found, or a resolver's name.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The opened library, when the functions came from one.
    pub fn library(&self) -> Option<&OpenLibrary> {
        self.lib.as_ref()
    }
}

impl<T: Table> Deref for Library<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.fns
    }
}

impl<T: Table + fmt::Debug> fmt::Debug for Library<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(T::HANDLE)
            .field("version", &self.version)
            .field("origin", &self.origin)
            .field("fns", &self.fns)
            .finish()
    }
}

fn unusable<T: Table>(origin: impl ToString, reason: Reason) -> LoadError {
    let (library, origin) = (T::LIBRARY, origin.to_string());
    LoadError::Unusable {
        library,
        origin,
        reason,
    }
}

/// A candidate library path with the step that produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Path (absolute) or bare soname (resolved by the dynamic loader).
    pub path: PathBuf,
    /// Where it came from.
    pub step: Step,
}

impl Candidate {
    /// A candidate from `step`.
    pub fn new(path: impl Into<PathBuf>, step: Step) -> Self {
        Candidate {
            path: path.into(),
            step,
        }
    }
}

/// `path (step)`: a loaded library's [`origin`](Library::origin).
impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path.display(), self.step)
    }
}

/// An opened shared library.
///
/// Opened with `RTLD_NODELETE`: dropping it releases the handle but never unmaps the code.
/// libcuda and libnccl start threads of their own (NCCL's bootstrap root thread runs after
/// `ncclGetUniqueId` returns) and register exit handlers; unmapping them under those would
/// crash the process. Loading the same path again returns the same mapped library.
///
/// ```
/// use std::path::Path;
/// use cuda_sys::dylib::{OpenLibrary, Reason};
///
/// // SAFETY: the C library is loaded in every process already (glibc's soname).
/// let libc = unsafe { OpenLibrary::open(Path::new("libc.so.6")) }.map_err(|r| r.to_string())?;
/// assert!(!libc.symbol(c"getpid").is_null());
/// assert!(libc.symbol(c"no_such_symbol_here").is_null());
/// assert_eq!(libc.path(), Path::new("libc.so.6"));
///
/// // SAFETY: a path that does not exist is refused before the loader is asked.
/// let missing = unsafe { OpenLibrary::open(Path::new("/no/such/libcuda.so.1")) }.unwrap_err();
/// assert_eq!(missing, Reason::NoSuchFile);
/// // SAFETY: a bare name the loader cannot find opens nothing; its message comes back.
/// let unknown = unsafe { OpenLibrary::open(Path::new("libno-such-library.so.0")) }.unwrap_err();
/// assert!(matches!(unknown, Reason::Open(msg) if msg.contains("libno-such-library.so.0")));
/// # Ok::<(), String>(())
/// ```
#[derive(Debug)]
pub struct OpenLibrary {
    lib: RawLibrary,
    path: PathBuf,
}

impl OpenLibrary {
    /// Opens `path` with `RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE`; a bare name goes through
    /// the loader's search.
    ///
    /// # Safety
    /// Opening a library runs its initialisers (and those of what it needs), which may do
    /// anything: `path` must name a library that is safe to load into this process, as
    /// with `libloading::Library::new`. (libcuda and libnccl are: the CUDA runtime and
    /// NCCL itself `dlopen` them.)
    pub unsafe fn open(path: &Path) -> Result<Self, Reason> {
        if path.components().count() > 1 && !path.exists() {
            return Err(Reason::NoSuchFile);
        }
        // SAFETY: the caller promises that `path` is safe to load; RTLD_LOCAL keeps its
        // symbols out of the global scope.
        let lib = unsafe { RawLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) }
            .map_err(|e| Reason::Open(loader_message(&e)))?;
        Ok(OpenLibrary {
            lib,
            path: path.to_path_buf(),
        })
    }

    /// The library already loaded in this process under `name` (a soname, or a path it was
    /// loaded from), asked with `RTLD_NOLOAD`: nothing is loaded and no initialiser runs;
    /// [`Reason::NotLoaded`] when the process has no library of that name. The handle is
    /// promoted to `RTLD_NODELETE`, as [`open`](Self::open)'s are.
    ///
    /// ```
    /// use std::path::Path;
    /// use cuda_sys::dylib::{OpenLibrary, Reason};
    ///
    /// let libc = OpenLibrary::open_loaded(Path::new("libc.so.6")).map_err(|r| r.to_string())?;
    /// assert!(!libc.symbol(c"getpid").is_null());
    /// let none = OpenLibrary::open_loaded(Path::new("libno-such-library.so.0")).unwrap_err();
    /// assert_eq!(none, Reason::NotLoaded);
    /// # Ok::<(), String>(())
    /// ```
    pub fn open_loaded(name: &Path) -> Result<Self, Reason> {
        let flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE | RTLD_NOLOAD;
        // SAFETY: with RTLD_NOLOAD the loader maps nothing and runs no initialiser: it
        // returns a library that is already loaded (its initialisers ran when it was) with a
        // new reference, or fails. Trusting that library's symbols is the caller's business
        // (`Table`'s promise), not this call's: `symbol` only hands out addresses.
        // A failure means only that nothing loaded matches `name`, whatever the loader adds
        // (glibc: no message when a file of that name exists but is not loaded, "cannot
        // open shared object file" when none does).
        let lib = unsafe { RawLibrary::open(Some(name), flags) }.map_err(|_| Reason::NotLoaded)?;
        Ok(OpenLibrary {
            lib,
            path: name.to_path_buf(),
        })
    }

    /// The path the library was opened from, as given to the loader.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address of `symbol`, or null when the library does not export it.
    pub fn symbol(&self, symbol: &CStr) -> *const c_void {
        // SAFETY: we read the symbol's address as a plain pointer and never call it here;
        // a `*const c_void` has no validity requirements.
        match unsafe { self.lib.get::<*const c_void>(symbol.to_bytes_with_nul()) } {
            Ok(sym) => *sym,
            Err(_) => std::ptr::null(),
        }
    }
}

/// libloading's error says "dlopen failed" and keeps `dlerror()`'s text as its source.
fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => src.to_string(),
        None => e.to_string(),
    }
}

/// Reads an environment variable that names a library; empty counts as unset.
fn env_path(var: &'static str) -> Option<Candidate> {
    let value: OsString = std::env::var_os(var)?;
    if value.is_empty() {
        return None;
    }
    Some(Candidate::new(PathBuf::from(value), Step::EnvOverride(var)))
}

/// The search most libraries want, in order: each of `names` through the dynamic loader;
/// then the first name in each of `wheel_dirs` (relative to a `site-packages` folder) of
/// each [`python_site_dirs`] folder, where that file exists: for libraries that pip
/// wheels ship, such as NCCL's `nvidia-nccl-cu12` (`nvidia/nccl/lib`); then the first name
/// in the system's library folders (`/usr/lib/<arch>-linux-gnu`, `/usr/lib64`) and in `dirs`.
///
/// ```
/// use cuda_sys::dylib::{Candidate, Step, usual_search};
/// let list = usual_search(&["libfoo.so.1", "libfoo.so"], &[], ["/opt/foo/lib".into()]);
/// assert_eq!(list[..2], [
///     Candidate::new("libfoo.so.1", Step::DynamicLoader),
///     Candidate::new("libfoo.so", Step::DynamicLoader),
/// ]);
/// assert_eq!(list[2].to_string(), format!(
///     "/usr/lib/{}-linux-gnu/libfoo.so.1 (system dir)", std::env::consts::ARCH
/// ));
/// assert_eq!(list[3..], [
///     Candidate::new("/usr/lib64/libfoo.so.1", Step::SystemDir),
///     Candidate::new("/opt/foo/lib/libfoo.so.1", Step::SystemDir),
/// ]);
/// ```
pub fn usual_search(
    names: &[&str],
    wheel_dirs: &[&str],
    dirs: impl IntoIterator<Item = PathBuf>,
) -> Vec<Candidate> {
    let mut list: Vec<Candidate> = names
        .iter()
        .map(|n| Candidate::new(n, Step::DynamicLoader))
        .collect();
    let Some(file) = names.first() else {
        return list;
    };
    if !wheel_dirs.is_empty() {
        for site in python_site_dirs() {
            for dir in wheel_dirs {
                let p = site.join(dir).join(file);
                if p.exists() {
                    list.push(Candidate::new(p, Step::PythonPackage));
                }
            }
        }
    }
    let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    let system = [PathBuf::from(multiarch), PathBuf::from("/usr/lib64")];
    for dir in system.into_iter().chain(dirs) {
        list.push(Candidate::new(dir.join(file), Step::SystemDir));
    }
    list
}

/// The CUDA versions cudarc 0.19 builds for (its `build.rs`): major, minor.
const CUDARC_VERSIONS: [(u32, u32); 19] = [
    (13, 4),
    (13, 3),
    (13, 2),
    (13, 1),
    (13, 0),
    (12, 9),
    (12, 8),
    (12, 6),
    (12, 5),
    (12, 4),
    (12, 3),
    (12, 2),
    (12, 1),
    (12, 0),
    (11, 8),
    (11, 7),
    (11, 6),
    (11, 5),
    (11, 4),
];

/// The names the `cudarc` crate (0.19, `get_lib_name_candidates`) hands to the dynamic
/// loader for each of `stems` (`"nccl"`; `"cuda"` and `"nvcuda"`) on Linux, for every CUDA
/// version it builds for, each once, in its order: what a [`Table::resident_names`] adds
/// so that a library cudarc loaded is the one this loader takes.
///
/// ```
/// let names = cuda_sys::dylib::cudarc_names(&["nccl"]);
/// assert_eq!(names[..2], ["libnccl.so", "libnccl64.so"]);
/// for name in ["libnccl.so.12", "libnccl.so.13", "libnccl64_128.so", "libnccl.so.1"] {
///     assert!(names.iter().any(|n| n == name), "{name}");
/// }
/// assert!(!names.iter().any(|n| n == "libnccl.so.2"), "cudarc never asks for NCCL's soname");
/// ```
pub fn cudarc_names(stems: &[&str]) -> Vec<String> {
    let width = if cfg!(target_pointer_width = "32") {
        "32"
    } else {
        "64"
    };
    let mut names: Vec<String> = Vec::new();
    for stem in stems {
        let lib = format!("lib{stem}");
        for (major, minor) in CUDARC_VERSIONS {
            let list = [
                format!("{lib}.so"),
                format!("{lib}{width}.so"),
                format!("{lib}{width}_{major}.so"),
                format!("{lib}{width}_{major}{minor}.so"),
                format!("{lib}{width}_{major}{minor}_0.so"),
                format!("{lib}{width}_{major}0_{minor}.so"),
                format!("{lib}{width}_10.so"),
                format!("{lib}{width}_11.so"),
                format!("{lib}{width}_12.so"),
                format!("{lib}{width}_{major}0_0.so"),
                format!("{lib}{width}_9.so"),
                format!("{lib}.so.{major}"),
                format!("{lib}.so.12"),
                format!("{lib}.so.11"),
                format!("{lib}.so.10"),
                format!("{lib}.so.9"),
                format!("{lib}.so.1"),
            ];
            for name in list {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
    }
    names
}

/// The `site-packages` folders of the active Python environments this process can see,
/// without running Python, where [`usual_search`] looks for pip wheels that ship a
/// library: those of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local`, `/usr/local` and `/usr`,
/// each prefix's `lib/python3*` folders in reverse name order.
pub fn python_site_dirs() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            prefixes.push(PathBuf::from(p));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    let mut sites = Vec::new();
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons.into_iter().rev() {
            for sub in ["site-packages", "dist-packages"] {
                let site = py.join(sub);
                if site.is_dir() {
                    sites.push(site);
                }
            }
        }
    }
    sites.dedup();
    sites
}

/// Tries `candidates` in order with `accept`, which opens and validates one; returns the
/// first accepted value or every attempt with its reason. A candidate with the path and the
/// step of one already tried is skipped (a folder listed twice); the same name at another
/// step (already loaded, then through the dynamic loader) is tried again.
///
/// ```
/// use std::path::PathBuf;
/// use cuda_sys::dylib::{Candidate, Reason, Step, first_usable};
///
/// let candidates = [
///     Candidate::new("/opt/none/libfoo.so.1", Step::SystemDir),
///     Candidate::new("libfoo.so.1", Step::DynamicLoader),
/// ];
/// // Accept only what the dynamic loader would find.
/// let accept = |c: &Candidate| match c.step {
///     Step::DynamicLoader => Ok(c.path.clone()),
///     _ => Err(Reason::NoSuchFile),
/// };
/// assert_eq!(first_usable(candidates.clone(), accept), Ok(PathBuf::from("libfoo.so.1")));
///
/// let nothing = |_: &Candidate| -> Result<PathBuf, Reason> { Err(Reason::NoSuchFile) };
/// let attempts = first_usable(candidates, nothing).unwrap_err();
/// assert_eq!(attempts.0.len(), 2);
/// assert_eq!(
///     attempts.to_string(),
///     "\n  /opt/none/libfoo.so.1 (system dir): no such file\
///      \n  libfoo.so.1 (dynamic loader): no such file"
/// );
/// ```
pub fn first_usable<T>(
    candidates: impl IntoIterator<Item = Candidate>,
    mut accept: impl FnMut(&Candidate) -> Result<T, Reason>,
) -> Result<T, Attempts> {
    let mut attempts = Vec::new();
    for c in candidates {
        if attempts
            .iter()
            .any(|a: &Attempt| a.path == c.path && a.step == c.step)
        {
            continue;
        }
        match accept(&c) {
            Ok(v) => return Ok(v),
            Err(reason) => attempts.push(Attempt {
                path: c.path,
                step: c.step,
                reason,
            }),
        }
    }
    Err(Attempts(attempts))
}
