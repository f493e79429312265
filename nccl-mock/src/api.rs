//! Plumbing of the simulated NCCL functions: world slots, symbol lookup, handle casts, and
//! the macro that declares one instance of each function per slot (const generic `W`).
//!
//! The functions themselves live by domain: `init`, `query`, `collective`, `group` and
//! `redop` each declare theirs with [`nccl_mock!`] and get their own `lookup`.

use std::ffi::{CStr, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{NWorld, collective, group, init, query, redop, registry};
use nccl_sys::NcclFns;

cuda_mock::__mock_slots!(NWorld);
static WORLD_IDS: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_world_id() -> u64 {
    WORLD_IDS.fetch_add(1, Ordering::Relaxed)
}

/// The world of slot `slot`, while it is claimed (for the functions of every module).
pub(super) fn world(slot: usize) -> Option<Arc<NWorld>> {
    slot_world(slot)
}

/// The world as an `Arc`, for work that outlives the call (non-blocking init, split).
pub(super) fn slot_of(w: &NWorld) -> Option<Arc<NWorld>> {
    (0..cuda_mock::MAX_WORLDS)
        .filter_map(slot_world)
        .find(|x| x.id == w.id)
}

pub(super) fn resolver(slot: usize, version: i32) -> impl FnMut(&CStr, i32) -> *const c_void {
    move |name: &CStr, _| {
        if NcclFns::OPTIONAL
            .iter()
            .any(|(n, v)| n.as_bytes() == name.to_bytes() && *v > version)
        {
            return std::ptr::null();
        }
        match LOOKUPS.get(slot) {
            Some(f) => f(name.to_bytes()),
            None => std::ptr::null(),
        }
    }
}

static LOOKUPS: [fn(&[u8]) -> *const c_void; cuda_mock::MAX_WORLDS] =
    cuda_mock::__mock_lookups!(lookup);

/// Slot `W`'s function named `name`, from whichever module declares it.
fn lookup<const W: usize>(name: &[u8]) -> *const c_void {
    let modules: [fn(&[u8]) -> *const c_void; 7] = [
        registry::lookup::<W>,
        init::lookup::<W>,
        query::lookup::<W>,
        query::strings_lookup::<W>,
        collective::lookup::<W>,
        group::lookup::<W>,
        redop::lookup::<W>,
    ];
    modules
        .iter()
        .map(|f| f(name))
        .find(|p| !p.is_null())
        .unwrap_or(std::ptr::null())
}

/// A handle value as the opaque pointer NCCL hands out (it is never dereferenced).
pub(super) fn h2p<T>(h: usize) -> *mut T {
    std::ptr::without_provenance_mut(h)
}

/// An opaque handle pointer back to its value.
pub(super) fn p2h<T>(p: *mut T) -> usize {
    p.addr()
}

/// Declares simulated NCCL functions and a `lookup` that finds them by C name.
///
/// Each `fn ncclName = rust_name(w, s, args...) { body }` becomes an
/// `unsafe extern "C" fn rust_name<const W: usize>(args...) -> ncclResult_t` that finds
/// slot `W`'s world (`w`), locks its state (`s`), counts the call and applies injected
/// faults before `body` runs; `CALL` is the C name, for reports. `lookup` checks each
/// function against its table type.
macro_rules! nccl_mock {
    ($(
        fn $cname:ident = $rname:ident ($w:ident, $s:ident $(, $a:ident : $t:ty)*) $body:block
    )*) => {
        $(
            #[allow(non_snake_case)]
            unsafe extern "C" fn $rname<const W: usize>($($a: $t),*) -> nccl_sys::ncclResult_t {
                let Some(world) = $crate::api::world(W) else {
                    return nccl_sys::ncclResult_t::ncclInternalError;
                };
                /// The C name, for reports.
                #[allow(dead_code)]
                const CALL: &str = stringify!($cname);
                let $w: &$crate::NWorld = &world;
                #[allow(unused_mut)]
                let mut $s = $w.lock();
                if let Some(e) = $s.enter(stringify!($cname)) {
                    $crate::group::after_fault($w, &mut $s, stringify!($cname), e);
                    return e;
                }
                $body
            }
        )*

        /// This module's function named `name` for slot `W`, or null.
        pub(super) fn lookup<const W: usize>(name: &[u8]) -> *const ::std::ffi::c_void {
            $(
                if name == stringify!($cname).as_bytes() {
                    let f: nccl_sys::signatures::$cname = $rname::<W>;
                    return f as *const ::std::ffi::c_void;
                }
            )*
            ::std::ptr::null()
        }
    };
}
pub(super) use nccl_mock;
