//! NCCL's parameter registry (`ncclParam*`, 2.30.4): the keys 2.32.3 registers, their
//! types, defaults and parsing of the environment, read at each call; a leaf above the
//! world's state only (calls are counted and faults injected like every entry point).
//!
//! As NCCL 2.32.3 (checked against its library in nccl-channel's `params_real` tests):
//! `ncclParamGetAllParameterKeys` lists the published keys (with
//! `NCCL_PARAM_DUMP_ALL=true`, the private ones too); an unknown key is
//! `ncclInvalidArgument`; a typed getter of another type than the key's is
//! `ncclInvalidArgument` ("type mismatch"); `NCCL_DEBUG` (an enum) and
//! `NCCL_SET_THREAD_NAME` (a bool) have no typed getter but read as strings through
//! `ncclParamGetParameter` and as raw bytes through `ncclParamGet`. A handle that is not one
//! `ncclParamBind` gave is reported to the sanitizer.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};

use crate::macros::mock_fns;
use crate::state::fail;
use nccl_sys::{ncclParamHandle_t, ncclResult_t};

/// A parameter's type, as NCCL's registry records it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ty {
    U32,
    U64,
    Str,
    Bool,
    /// `NCCL_DEBUG`'s level, an `int`-sized enum.
    Level,
}

/// One registered parameter.
struct Param {
    key: &'static str,
    ty: Ty,
    /// Listed without `NCCL_PARAM_DUMP_ALL`.
    published: bool,
    /// Option names and bits (bitsets) or values (the enum).
    options: &'static [(&'static str, u64)],
    /// The default, as the value.
    default: u64,
    /// The default of a string parameter.
    default_str: &'static str,
}

const SUBSYS: &[(&str, u64)] = &[
    ("INIT", 0x1),
    ("COLL", 0x2),
    ("P2P", 0x4),
    ("SHM", 0x8),
    ("NET", 0x10),
    ("GRAPH", 0x20),
    ("TUNING", 0x40),
    ("ENV", 0x80),
    ("ALLOC", 0x100),
    ("ALLOC_HOST", 0x20000),
    ("CALL", 0x200),
    ("PROXY", 0x400),
    ("NVLS", 0x800),
    ("BOOTSTRAP", 0x1000),
    ("REG", 0x2000),
    ("PROFILE", 0x4000),
    ("RAS", 0x8000),
    ("DESTROY", 0x10000),
];
const LEVELS: &[(&str, u64)] = &[
    ("VERSION", 1),
    ("WARN", 2),
    ("INFO", 3),
    ("ABORT", 4),
    ("TRACE", 5),
];
const LEVEL_BITS: &[(&str, u64)] = &[
    ("VERSION", 1 << 1),
    ("WARN", 1 << 2),
    ("INFO", 1 << 3),
    ("ABORT", 1 << 4),
    ("TRACE", 1 << 5),
    ("ATTN", 1 << 6),
];

const fn p(key: &'static str, ty: Ty, published: bool) -> Param {
    Param {
        key,
        ty,
        published,
        options: &[],
        default: 0,
        default_str: "",
    }
}

/// The registry, in the order NCCL 2.32.3 lists it.
static PARAMS: [Param; 10] = [
    p("NCCL_PARAM_DUMP_ALL", Ty::Bool, false),
    p("NCCL_DEBUG_FILE", Ty::Str, true),
    Param {
        default_str: "[%F %T] ",
        ..p("NCCL_DEBUG_TIMESTAMP_FORMAT", Ty::Str, true)
    },
    Param {
        options: LEVEL_BITS,
        default: (1 << 2) | (1 << 6),
        ..p("NCCL_DEBUG_TIMESTAMP_LEVELS", Ty::U32, true)
    },
    p("NCCL_NO_CACHE", Ty::Bool, false),
    p("NCCL_SET_THREAD_NAME", Ty::Bool, true),
    p("NCCL_WARN_ENABLE_DEBUG_INFO", Ty::Bool, false),
    Param {
        options: SUBSYS,
        default: 0x1 | 0x80 | 0x1000,
        ..p("NCCL_DEBUG_SUBSYS", Ty::U64, true)
    },
    Param {
        options: LEVEL_BITS,
        ..p("NCCL_DEBUG_LEVELS", Ty::U32, true)
    },
    Param {
        options: LEVELS,
        ..p("NCCL_DEBUG", Ty::Level, true)
    },
];

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

impl Param {
    /// The value of a bitset, enum or bool parameter (`None`: unset enum).
    fn number(&self) -> Option<u64> {
        let set = env(self.key);
        match self.ty {
            Ty::Bool => Some(set.is_some_and(|v| {
                matches!(v.to_ascii_uppercase().as_str(), "1" | "TRUE" | "YES" | "ON")
            }) as u64),
            Ty::Level => match set {
                None => None,
                Some(v) => self
                    .options
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(v.trim()))
                    .map(|(_, b)| *b),
            },
            Ty::U32 | Ty::U64 => Some(match set {
                None => self.default,
                Some(v) if v.trim().eq_ignore_ascii_case("ALL") => {
                    self.options.iter().fold(0, |a, (_, b)| a | b)
                }
                Some(v) => v
                    .split(',')
                    .filter_map(|n| {
                        self.options
                            .iter()
                            .find(|(o, _)| o.eq_ignore_ascii_case(n.trim()))
                    })
                    .fold(0, |a, (_, b)| a | b),
            }),
            Ty::Str => None,
        }
    }

    /// The value as `ncclParamGetParameter` writes it.
    fn text(&self) -> String {
        match self.ty {
            Ty::Str => env(self.key).unwrap_or_else(|| self.default_str.to_string()),
            Ty::Bool => if self.number() == Some(1) {
                "TRUE"
            } else {
                "FALSE"
            }
            .to_string(),
            Ty::Level => self
                .number()
                .and_then(|v| self.options.iter().find(|(_, b)| *b == v))
                .map_or("<unknown>", |(n, _)| n)
                .to_string(),
            Ty::U32 | Ty::U64 => {
                let v = self.number().unwrap_or(0);
                // NCCL prints the option that equals the value first: "ALL".
                if v != 0 && v == self.options.iter().fold(0, |a, (_, b)| a | b) {
                    return "ALL".to_string();
                }
                let names: Vec<&str> = self
                    .options
                    .iter()
                    .filter(|(_, b)| v & b != 0)
                    .map(|(n, _)| *n)
                    .collect();
                if names.is_empty() {
                    "NONE".to_string()
                } else {
                    names.join(",")
                }
            }
        }
    }

    /// The value as `ncclParamGet` copies it.
    fn bytes(&self) -> Vec<u8> {
        match self.ty {
            Ty::Str => {
                let mut b = self.text().into_bytes();
                b.push(0);
                b
            }
            Ty::Bool => vec![self.number().unwrap_or(0) as u8],
            Ty::Level => (self.number().unwrap_or(0) as i32).to_ne_bytes().to_vec(),
            Ty::U32 => (self.number().unwrap_or(0) as u32).to_ne_bytes().to_vec(),
            Ty::U64 => self.number().unwrap_or(0).to_ne_bytes().to_vec(),
        }
    }
}

fn find(key: &CStr) -> Option<&'static Param> {
    let key = key.to_str().ok()?;
    PARAMS.iter().find(|p| p.key == key)
}

/// The parameter behind a handle `ncclParamBind` gave, or `None`.
fn unwrap(h: ncclParamHandle_t) -> Option<&'static Param> {
    PARAMS.iter().find(|p| std::ptr::eq(*p, h.cast::<Param>()))
}

fn dump_all() -> bool {
    PARAMS[0].number() == Some(1)
}

thread_local! {
    /// What the string getters return: valid until the next such call on the thread.
    static STR: RefCell<CString> = RefCell::new(CString::default());
    static VALUE: RefCell<CString> = RefCell::new(CString::default());
    static KEYS: RefCell<(Vec<CString>, Vec<*const c_char>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Reads a typed getter's value: the handle must be one of ours, the type `ty`, and
/// `out` non-NULL; writes `size` bytes of the value.
///
/// # Safety
///
/// `out`, when non-NULL, is valid for `size` bytes.
unsafe fn typed(
    w: &crate::world::NWorld,
    s: &mut crate::state::State,
    call: &str,
    h: ncclParamHandle_t,
    out: *mut c_void,
    ty: Option<Ty>,
    size: usize,
) -> ncclResult_t {
    if h.is_null() || out.is_null() {
        return fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{call}: NULL argument"),
        );
    }
    let Some(p) = unwrap(h) else {
        w.cuda
            .report(format!("{call}: {h:p} is not a handle ncclParamBind gave"));
        return fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("{call}: invalid handle"),
        );
    };
    if Some(p.ty) != ty {
        return fail(
            s,
            ncclResult_t::ncclInvalidArgument,
            format!("PARAM: type mismatch for key \"{}\"", p.key),
        );
    }
    let b = p.bytes();
    // SAFETY: `out` is valid for `size` bytes (the caller's type), and `b` holds `size`.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), size.min(b.len())) };
    ncclResult_t::ncclSuccess
}

macro_rules! getters {
    ($($c:ident = $r:ident($t:ty, $ty:expr)),* $(,)?) => {
        mock_fns! {
            $(
                fn $c = $r(w, s, h: ncclParamHandle_t, out: *mut $t) {
                    // SAFETY: `out` is the caller's pointer to one `$t`.
                    unsafe { typed(w, &mut s, CALL, h, out.cast(), $ty, size_of::<$t>()) }
                }
            )*
            fn ncclParamBind = param_bind(w, s, out: *mut ncclParamHandle_t, key: *const c_char) {
                if out.is_null() || key.is_null() {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamBind: NULL argument".into());
                }
                // SAFETY: a NUL-terminated string by the API's contract.
                let key = unsafe { CStr::from_ptr(key) };
                let Some(p) = find(key) else {
                    let _ = w;
                    return fail(
                        &mut s,
                        ncclResult_t::ncclInvalidArgument,
                        format!("PARAM: key {key:?} not found in registry"),
                    );
                };
                // SAFETY: checked non-NULL; the handle is the static entry's address.
                unsafe { *out = std::ptr::from_ref(p).cast_mut().cast() };
                ncclResult_t::ncclSuccess
            }
            fn ncclParamGetStr = param_get_str(w, s, h: ncclParamHandle_t, out: *mut *const c_char) {
                if h.is_null() || out.is_null() {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamGetStr: NULL argument".into());
                }
                let Some(p) = unwrap(h) else {
                    w.cuda.report(format!("ncclParamGetStr: {h:p} is not a handle ncclParamBind gave"));
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamGetStr: invalid handle".into());
                };
                if p.ty != Ty::Str {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("PARAM: type mismatch for key \"{}\"", p.key));
                }
                let text = CString::new(p.text()).unwrap_or_default();
                STR.with(|b| *b.borrow_mut() = text);
                // SAFETY: checked non-NULL; the string lives in this thread's buffer
                // until the next call, as NCCL's does.
                STR.with(|b| unsafe { *out = b.borrow().as_ptr() });
                ncclResult_t::ncclSuccess
            }
            fn ncclParamGet = param_get(w, s, h: ncclParamHandle_t, out: *mut c_void, max: c_int, len: *mut c_int) {
                if h.is_null() || out.is_null() {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamGet: NULL argument".into());
                }
                let Some(p) = unwrap(h) else {
                    w.cuda.report(format!("ncclParamGet: {h:p} is not a handle ncclParamBind gave"));
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamGet: invalid handle".into());
                };
                let b = p.bytes();
                if max < 0 || (max as usize) < b.len() {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("ncclParamGet: {} needs {} bytes", p.key, b.len()));
                }
                // SAFETY: `out` holds `max` >= b.len() bytes by the caller's word.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), b.len()) };
                if !len.is_null() {
                    // SAFETY: non-NULL out-pointer.
                    unsafe { *len = b.len() as c_int };
                }
                ncclResult_t::ncclSuccess
            }
            fn ncclParamGetParameter = param_get_parameter(w, s, key: *const c_char, value: *mut *const c_char, len: *mut c_int) {
                let _ = w;
                if key.is_null() || value.is_null() || len.is_null() {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamGetParameter: NULL argument".into());
                }
                // SAFETY: a NUL-terminated string by the API's contract.
                let key = unsafe { CStr::from_ptr(key) };
                let Some(p) = find(key) else {
                    // SAFETY: checked non-NULL out-pointers.
                    unsafe {
                        *value = std::ptr::null();
                        *len = 0;
                    }
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, format!("PARAM: key {key:?} not found in registry"));
                };
                let text = CString::new(p.text()).unwrap_or_default();
                let n = text.as_bytes().len() as c_int;
                VALUE.with(|b| *b.borrow_mut() = text);
                // SAFETY: checked non-NULL; the string lives in this thread's buffer until
                // the next call, as NCCL's does.
                VALUE.with(|b| unsafe {
                    *value = b.borrow().as_ptr();
                    *len = n;
                });
                ncclResult_t::ncclSuccess
            }
            fn ncclParamGetAllParameterKeys = param_keys(w, s, table: *mut *mut *const c_char, len: *mut c_int) {
                let _ = w;
                if table.is_null() || len.is_null() {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument, "ncclParamGetAllParameterKeys: NULL argument".into());
                }
                let all = dump_all();
                KEYS.with(|k| {
                    let mut k = k.borrow_mut();
                    k.0 = PARAMS
                        .iter()
                        .filter(|p| all || p.published)
                        .filter_map(|p| CString::new(p.key).ok())
                        .collect();
                    k.1 = k.0.iter().map(|c| c.as_ptr()).collect();
                    // SAFETY: checked non-NULL out-pointers; the table lives in this
                    // thread's buffer until the next call, as NCCL's does.
                    unsafe {
                        *table = k.1.as_mut_ptr();
                        *len = k.1.len() as c_int;
                    }
                });
                ncclResult_t::ncclSuccess
            }
        }
    };
}

// No key of 2.32.3 is of the types given `None`: their getters always say "type mismatch".
getters!(
    ncclParamGetI8 = param_get_i8(i8, None),
    ncclParamGetI16 = param_get_i16(i16, None),
    ncclParamGetI32 = param_get_i32(i32, None),
    ncclParamGetI64 = param_get_i64(i64, None),
    ncclParamGetU8 = param_get_u8(u8, None),
    ncclParamGetU16 = param_get_u16(u16, None),
    ncclParamGetU32 = param_get_u32(u32, Some(Ty::U32)),
    ncclParamGetU64 = param_get_u64(u64, Some(Ty::U64)),
);

/// `ncclParamDumpAll` (returns nothing, so it is declared outside `mock_fns!`): one
/// line per listed parameter on stdout, `KEY=value`.
unsafe extern "C" fn param_dump_all<const W: usize>() {
    if let Some(w) = crate::world::world(W) {
        let _ = w.lock().enter("ncclParamDumpAll");
    }
    let all = dump_all();
    println!("=== ncclParam Registry Dump ===");
    for p in PARAMS.iter().filter(|p| all || p.published) {
        println!("{}={}", p.key, p.text());
    }
}

/// `ncclParamDumpAll` for slot `W`, or null.
pub(super) fn void_lookup<const W: usize>(name: &[u8]) -> *const c_void {
    if name == b"ncclParamDumpAll" {
        let f: nccl_sys::signatures::ncclParamDumpAll = param_dump_all::<W>;
        return f as *const c_void;
    }
    std::ptr::null()
}
