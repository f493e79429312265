//! The symbol lookup, which asks every domain module's `lookup` in turn: the top module, above every domain, used only by lib.rs's builder.
//!
//! The functions themselves live by domain: `init`, `query`, `collective`, `group`,
//! `redop` and `registry` each declare theirs with `mock_fns!` and get their own
//! `lookup`.

use std::ffi::{CStr, c_void};

use crate::{
    collective, encryption, group, grow, init, onesided, params, query, redop, registry, simulate,
    suspend,
};
use nccl_sys::NcclFns;

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
    let modules: [fn(&[u8]) -> *const c_void; 14] = [
        registry::lookup::<W>,
        init::lookup::<W>,
        query::lookup::<W>,
        query::strings_lookup::<W>,
        collective::lookup::<W>,
        group::lookup::<W>,
        redop::lookup::<W>,
        grow::lookup::<W>,
        onesided::lookup::<W>,
        suspend::lookup::<W>,
        simulate::lookup::<W>,
        params::lookup::<W>,
        params::void_lookup::<W>,
        encryption::lookup::<W>,
    ];
    modules
        .iter()
        .map(|f| f(name))
        .find(|p| !p.is_null())
        .unwrap_or(std::ptr::null())
}
