//! What one try to open a library found: where the path came from ([`Step`]) and why it
//! was not used ([`Reason`]). Below both the loader (dylib.rs) and its error (error.rs),
//! which each name them; [`dylib`](crate::dylib) re-exports them.

use std::fmt;
use std::path::PathBuf;

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
    /// A name asked of the dynamic loader with `RTLD_NOLOAD`: the library another part of
    /// the process (another crate, Python, the program itself) already loaded under it.
    AlreadyLoaded,
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
            Step::AlreadyLoaded => f.write_str("already loaded"),
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
    /// No library is loaded in this process under that name ([`Step::AlreadyLoaded`]).
    NotLoaded,
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
            Reason::NotLoaded => f.write_str("not loaded in this process"),
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
        let (path, step) = (self.path.display(), &self.step);
        write!(f, "{path} ({step}): {}", self.reason)
    }
}

/// The attempts of a search, displayed one per line (see the [module](crate::dylib) example);
/// a run of names that were [not loaded](Reason::NotLoaded) in the process (the
/// [`Step::AlreadyLoaded`] step asks dozens of names) is one line that counts them.
///
/// ```
/// use cuda_sys::dylib::{Attempt, Attempts, Reason, Step};
/// assert_eq!(Attempts::default().to_string(), "\n  (no candidate paths)");
///
/// let not_loaded = |name: &str| Attempt {
///     path: name.into(),
///     step: Step::AlreadyLoaded,
///     reason: Reason::NotLoaded,
/// };
/// let attempts = Attempts(vec![
///     not_loaded("libfoo.so.1"),
///     not_loaded("libfoo.so"),
///     not_loaded("libfoo64.so"),
///     Attempt { path: "libfoo.so.1".into(), step: Step::DynamicLoader, reason: Reason::NoSuchFile },
/// ]);
/// assert_eq!(
///     attempts.to_string(),
///     "\n  libfoo.so.1, libfoo.so and 1 other name (already loaded): not loaded in this process\
///      \n  libfoo.so.1 (dynamic loader): no such file"
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempts(pub Vec<Attempt>);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("\n  (no candidate paths)");
        }
        let not_loaded =
            |a: &Attempt| a.step == Step::AlreadyLoaded && a.reason == Reason::NotLoaded;
        let mut rest = self.0.as_slice();
        while let Some(first) = rest.first() {
            let run = rest.iter().take_while(|a| not_loaded(a)).count();
            if run < 2 {
                write!(f, "\n  {first}")?;
                rest = &rest[1..];
                continue;
            }
            let names: Vec<_> = rest[..run.min(2)]
                .iter()
                .map(|a| a.path.display())
                .collect();
            let others = match run - 2 {
                0 => String::new(),
                1 => " and 1 other name".to_string(),
                n => format!(" and {n} other names"),
            };
            let (step, reason) = (Step::AlreadyLoaded, Reason::NotLoaded);
            write!(
                f,
                "\n  {}, {}{others} ({step}): {reason}",
                names[0], names[1]
            )?;
            rest = &rest[run..];
        }
        Ok(())
    }
}
