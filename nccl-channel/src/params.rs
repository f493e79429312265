//! NCCL's parameters (`ncclParam*`, NCCL ≥ 2.30.4): the settings NCCL reads from the
//! environment and its configuration file, read back typed, as strings, or listed.
//! No GPU is needed: these calls only consult NCCL's parameter registry.

use std::ffi::{CStr, CString, c_char, c_int};
use std::marker::PhantomData;

use nccl_sys::{Nccl, ncclParamHandle_t, ncclResult_t};

use crate::{Error, Result, check};

mod sealed {
    pub trait Sealed {}

    /// A handle `ncclParamBind` gave: only this module makes one, so the trait's reader
    /// cannot be called with anything else.
    #[derive(Clone, Copy, Debug)]
    pub struct Handle(pub(super) nccl_sys::ncclParamHandle_t);
}
use sealed::Handle;

/// A type an NCCL parameter can be read as: `i8` to `i64`, `u8` to `u64`, and `String`.
/// Each parameter has one type; reading it as another is [`Error::ParamType`].
pub trait ParamValue: sealed::Sealed + Sized {
    /// The Rust name, for errors.
    const NAME: &'static str;
    #[doc(hidden)]
    fn read(nccl: &Nccl, h: Handle) -> Result<Option<Self>>;
}

macro_rules! numbers {
    ($($t:ty => $f:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl ParamValue for $t {
            const NAME: &'static str = stringify!($t);
            fn read(nccl: &Nccl, h: Handle) -> Result<Option<Self>> {
                let (f, call) = optional!(nccl, $f)?;
                let mut v: $t = 0;
                // SAFETY: a handle ncclParamBind gave (owned by NCCL's registry for the
                // process's life) and a valid out-pointer of the getter's type.
                let rc = unsafe { f(h.0, &mut v) };
                typed(nccl, rc, call).map(|ok| ok.then_some(v))
            }
        }
    )*};
}

numbers!(
    i8 => ncclParamGetI8, i16 => ncclParamGetI16, i32 => ncclParamGetI32, i64 => ncclParamGetI64,
    u8 => ncclParamGetU8, u16 => ncclParamGetU16, u32 => ncclParamGetU32, u64 => ncclParamGetU64,
);

impl sealed::Sealed for String {}
impl ParamValue for String {
    const NAME: &'static str = "String";
    fn read(nccl: &Nccl, h: Handle) -> Result<Option<Self>> {
        let (f, call) = optional!(nccl, ncclParamGetStr)?;
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: a handle ncclParamBind gave and a valid out-pointer.
        let rc = unsafe { f(h.0, &mut p) };
        if !typed(nccl, rc, call)? {
            return Ok(None);
        }
        Ok(Some(copy(p)))
    }
}

/// `Ok(true)` on success, `Ok(false)` on NCCL's "type mismatch" (`ncclInvalidArgument`
/// for a handle NCCL gave and a valid pointer), else the error.
fn typed(nccl: &Nccl, rc: ncclResult_t, call: &'static str) -> Result<bool> {
    match rc {
        ncclResult_t::ncclSuccess => Ok(true),
        ncclResult_t::ncclInvalidArgument => Ok(false),
        _ => check(nccl, rc, call, None).map(|()| true),
    }
}

/// Copies a string NCCL returned in its per-thread buffer (valid until the next such call
/// on this thread, so copied at once); NULL is empty.
fn copy(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL and NUL-terminated, valid until the next call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn c_key(key: &str) -> Result<CString> {
    CString::new(key).map_err(|_| Error::UnknownParam { key: key.into() })
}

/// One NCCL parameter, bound to its key and checked to be of type `T`.
///
/// ```
/// use nccl_channel::{Error, Param};
/// # let (_cuda, gpus) = cuda_mock::MockDriver::with_devices(1).build()?;
/// # let (nccl, _sim) = nccl_mock::MockNccl::new(&gpus).build()?;
/// // NCCL_DEBUG_SUBSYS is a bit set of u64 (unset here: NCCL's default INIT,ENV,BOOTSTRAP).
/// # // SAFETY: a doctest's own process, no other thread reads the environment.
/// # unsafe { std::env::remove_var("NCCL_DEBUG_SUBSYS") };
/// let subsys = Param::<u64>::bind(&nccl, "NCCL_DEBUG_SUBSYS")?;
/// assert_eq!(subsys.get()?, 0x1 | 0x80 | 0x1000);
/// assert_eq!(subsys.key(), "NCCL_DEBUG_SUBSYS");
/// assert_eq!(Param::value_string(&nccl, "NCCL_DEBUG_SUBSYS")?, "INIT,ENV,BOOTSTRAP");
/// // Another type, or a key NCCL does not have, is a typed error.
/// let e = Param::<u32>::bind(&nccl, "NCCL_DEBUG_SUBSYS").unwrap_err();
/// assert_eq!(e, Error::ParamType { key: "NCCL_DEBUG_SUBSYS".into(), asked: "u32" });
/// let e = Param::<u64>::get_value(&nccl, "NCCL_NO_SUCH_THING").unwrap_err();
/// assert_eq!(e, Error::UnknownParam { key: "NCCL_NO_SUCH_THING".into() });
/// assert!(Param::keys(&nccl)?.iter().any(|k| k == "NCCL_DEBUG"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Param<'n, T: ParamValue> {
    nccl: &'n Nccl,
    handle: Handle,
    key: String,
    _t: PhantomData<fn() -> T>,
}

impl<T: ParamValue> std::fmt::Debug for Param<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Param")
            .field("key", &self.key)
            .field("type", &T::NAME)
            .finish()
    }
}

/// The handle of `key` (`ncclParamBind`).
fn bind(nccl: &Nccl, key: &str) -> Result<Handle> {
    let (f, call) = optional!(nccl, ncclParamBind)?;
    let c = c_key(key)?;
    let mut h: ncclParamHandle_t = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and a NUL-terminated key.
    let rc = unsafe { f(&mut h, c.as_ptr()) };
    match rc {
        ncclResult_t::ncclInvalidArgument => Err(Error::UnknownParam { key: key.into() }),
        _ => check(nccl, rc, call, None).map(|()| Handle(h)),
    }
}

impl<'n, T: ParamValue> Param<'n, T> {
    /// Binds `key` (`ncclParamBind`) and checks that it is of type `T` by reading it:
    /// [`Error::UnknownParam`] or [`Error::ParamType`] otherwise.
    #[doc(alias = "ncclParamBind")]
    pub fn bind(nccl: &'n Nccl, key: &str) -> Result<Param<'n, T>> {
        let p = Param {
            nccl,
            handle: bind(nccl, key)?,
            key: key.into(),
            _t: PhantomData,
        };
        p.get()?;
        Ok(p)
    }

    /// The parameter's value now (`ncclParamGetI8` ... `ncclParamGetStr`).
    pub fn get(&self) -> Result<T> {
        T::read(self.nccl, self.handle)?.ok_or_else(|| Error::ParamType {
            key: self.key.clone(),
            asked: T::NAME,
        })
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `key`'s value as a `T`: [`bind`](Self::bind) and [`get`](Self::get) in one.
    pub fn get_value(nccl: &Nccl, key: &str) -> Result<T> {
        Param::<T>::bind(nccl, key)?.get()
    }
}

impl Param<'_, String> {
    /// `key`'s value as NCCL prints it, whatever its type (`ncclParamGetParameter`):
    /// `"INIT,ENV,BOOTSTRAP"`, `"TRUE"`, `"WARN"`. [`Error::UnknownParam`] for a key NCCL
    /// does not have.
    #[doc(alias = "ncclParamGetParameter")]
    pub fn value_string(nccl: &Nccl, key: &str) -> Result<String> {
        let (f, call) = optional!(nccl, ncclParamGetParameter)?;
        let c = c_key(key)?;
        let (mut p, mut len): (*const c_char, c_int) = (std::ptr::null(), 0);
        // SAFETY: a NUL-terminated key and valid out-pointers.
        let rc = unsafe { f(c.as_ptr(), &mut p, &mut len) };
        match rc {
            ncclResult_t::ncclInvalidArgument => Err(Error::UnknownParam { key: key.into() }),
            _ => check(nccl, rc, call, None).map(|()| copy(p)),
        }
    }

    /// The keys NCCL lists (`ncclParamGetAllParameterKeys`): the documented ones, or all
    /// with `NCCL_PARAM_DUMP_ALL=true`.
    #[doc(alias = "ncclParamGetAllParameterKeys")]
    pub fn keys(nccl: &Nccl) -> Result<Vec<String>> {
        let (f, call) = optional!(nccl, ncclParamGetAllParameterKeys)?;
        let (mut table, mut len): (*mut *const c_char, c_int) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers.
        let rc = unsafe { f(&mut table, &mut len) };
        check(nccl, rc, call, None)?;
        if table.is_null() || len <= 0 {
            return Ok(Vec::new());
        }
        // SAFETY: NCCL's per-thread table of `len` string pointers, valid until the next
        // call on this thread; copied at once.
        let ptrs = unsafe { std::slice::from_raw_parts(table, len as usize) };
        Ok(ptrs.iter().map(|&p| copy(p)).collect())
    }

    /// Prints every listed parameter to NCCL's standard output (`ncclParamDumpAll`).
    #[doc(alias = "ncclParamDumpAll")]
    pub fn dump_all(nccl: &Nccl) -> Result<()> {
        let (f, _) = optional!(nccl, ncclParamDumpAll)?;
        // SAFETY: no arguments; NCCL prints under its registry's lock.
        unsafe { f() };
        Ok(())
    }
}
