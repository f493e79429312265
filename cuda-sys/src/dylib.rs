//! Finding and opening a shared library at run time, recording every attempt.
//!
//! Shared by this crate (libcuda) and `nccl-sys` (libnccl), so that both search the same
//! way and fail the same way: an error that lists each path tried and why it failed.
//!
//! A search is a list of [`Candidate`]s tried in order by [`first_usable`]; each rejected
//! one becomes an [`Attempt`] with its [`Reason`]:
//!
//! ```
//! use std::path::PathBuf;
//! use cuda_sys::dylib::{Candidate, Reason, Step, first_usable};
//!
//! let candidates = [
//!     Candidate::new("/opt/none/libfoo.so.1", Step::SystemDir),
//!     Candidate::new("libfoo.so.1", Step::DynamicLoader),
//! ];
//! // Accept only what the dynamic loader would find.
//! let accept = |c: &Candidate| match c.step {
//!     Step::DynamicLoader => Ok(c.path.clone()),
//!     _ => Err(Reason::NoSuchFile),
//! };
//! assert_eq!(first_usable(candidates.clone(), accept), Ok(PathBuf::from("libfoo.so.1")));
//!
//! let nothing = |_: &Candidate| -> Result<PathBuf, Reason> { Err(Reason::NoSuchFile) };
//! let attempts = first_usable(candidates, nothing).unwrap_err();
//! assert_eq!(attempts.0.len(), 2);
//! assert_eq!(
//!     attempts.to_string(),
//!     "\n  /opt/none/libfoo.so.1 (system dir): no such file\
//!      \n  libfoo.so.1 (dynamic loader): no such file"
//! );
//! ```

use std::ffi::{CStr, OsString, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// Where a candidate path came from, so an error can say why it was tried.
///
/// ```
/// use cuda_sys::dylib::Step;
/// assert_eq!(Step::EnvOverride("CUDA_SYS_LIBRARY").to_string(), "$CUDA_SYS_LIBRARY");
/// assert_eq!(Step::PythonPackage.to_string(), "pip package");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// A path passed in code (`load_from`, a builder's `path`).
    Explicit,
    /// A path taken from the named environment variable.
    EnvOverride(&'static str),
    /// A bare soname resolved by the dynamic loader (`LD_LIBRARY_PATH`, ld.so.cache, ...).
    DynamicLoader,
    /// A library shipped inside a pip-installed wheel in a Python environment.
    PythonPackage,
    /// A conventional system directory.
    SystemDir,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Explicit => f.write_str("explicit path"),
            Step::EnvOverride(var) => write!(f, "${var}"),
            Step::DynamicLoader => f.write_str("dynamic loader"),
            Step::PythonPackage => f.write_str("pip package"),
            Step::SystemDir => f.write_str("system dir"),
        }
    }
}

/// Why one candidate library was not used.
///
/// ```
/// use cuda_sys::dylib::Reason;
/// let old = Reason::TooOld { found: "2.17.1".into(), minimum: "2.18.0".into() };
/// assert_eq!(old.to_string(), "version 2.17.1 is older than the minimum supported 2.18.0");
/// assert_eq!(
///     Reason::MissingSymbol("cuInit".into()).to_string(),
///     "required symbol `cuInit` is missing"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The file does not exist (checked before asking the loader).
    NoSuchFile,
    /// `dlopen` failed; the loader's message.
    Open(String),
    /// The library lacks a symbol that every supported version has.
    MissingSymbol(String),
    /// The library reports a version older than the minimum this crate supports.
    TooOld {
        /// The version the library reported, as text (`2.15.5`, `11.8`).
        found: String,
        /// The oldest version this crate accepts.
        minimum: String,
    },
    /// Asking the library for its version failed.
    Version(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoSuchFile => f.write_str("no such file"),
            Reason::Open(msg) => write!(f, "dlopen: {msg}"),
            Reason::MissingSymbol(s) => write!(f, "required symbol `{s}` is missing"),
            Reason::TooOld { found, minimum } => {
                write!(
                    f,
                    "version {found} is older than the minimum supported {minimum}"
                )
            }
            Reason::Version(msg) => write!(f, "version query failed: {msg}"),
        }
    }
}

/// One candidate that was tried, and why it was rejected.
///
/// ```
/// use cuda_sys::dylib::{Attempt, Reason, Step};
/// let a = Attempt {
///     path: "/usr/lib64/libcuda.so.1".into(),
///     step: Step::SystemDir,
///     reason: Reason::NoSuchFile,
/// };
/// assert_eq!(a.to_string(), "/usr/lib64/libcuda.so.1 (system dir): no such file");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The path or soname handed to the loader.
    pub path: PathBuf,
    /// The search step that produced it.
    pub step: Step,
    /// Why it was not used.
    pub reason: Reason,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.path.display(),
            self.step,
            self.reason
        )
    }
}

/// The attempts of a search, displayed one per line (see the [module](self) example).
///
/// ```
/// use cuda_sys::dylib::Attempts;
/// assert_eq!(Attempts::default().to_string(), "\n  (no candidate paths)");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempts(pub Vec<Attempt>);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("\n  (no candidate paths)");
        }
        for a in &self.0 {
            write!(f, "\n  {a}")?;
        }
        Ok(())
    }
}

/// A candidate library path with the step that produced it.
///
/// ```
/// use cuda_sys::dylib::{Candidate, Step};
/// let c = Candidate::new("libnccl.so.2", Step::DynamicLoader);
/// assert_eq!((c.path.to_str(), c.step), (Some("libnccl.so.2"), Step::DynamicLoader));
/// ```
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

/// `RTLD_NODELETE` (glibc, musl): `dlclose` never unmaps the library.
const RTLD_NODELETE: i32 = 0x1000;

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
    lib: Library,
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
        let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) }
            .map_err(|e| Reason::Open(loader_message(&e)))?;
        Ok(OpenLibrary {
            lib,
            path: path.to_path_buf(),
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
///
/// ```
/// use cuda_sys::dylib::env_path;
/// assert_eq!(env_path("CUDA_SYS_DOC_EXAMPLE_NEVER_SET"), None);
/// ```
pub fn env_path(var: &'static str) -> Option<Candidate> {
    let value: OsString = std::env::var_os(var)?;
    if value.is_empty() {
        return None;
    }
    Some(Candidate::new(PathBuf::from(value), Step::EnvOverride(var)))
}

/// The `site-packages` folders of the active Python environments this process can see,
/// without running Python: `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the user site and the
/// system's `dist-packages`.
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
/// first accepted value or every attempt with its reason.
pub fn first_usable<T>(
    candidates: impl IntoIterator<Item = Candidate>,
    mut accept: impl FnMut(&Candidate) -> Result<T, Reason>,
) -> Result<T, Attempts> {
    let mut attempts = Vec::new();
    for c in candidates {
        if attempts.iter().any(|a: &Attempt| a.path == c.path) {
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
