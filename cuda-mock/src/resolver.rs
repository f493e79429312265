//! The table resolver, which asks every domain module's `lookup` in turn: the top module, above every domain, used only by lib.rs's builder.

use std::ffi::{CStr, c_void};

use crate::slots::MAX_WORLDS;
use crate::{
    context, event, function, graph, init, launch, library, memory, module, occupancy, stream,
    user_object,
};
use cuda_sys::DriverFns;

/// A resolver for the table: the slot's functions, and null for functions newer than the
/// simulated driver (as `cuGetProcAddress` of a real driver of that version would).
pub(super) fn resolver(slot: usize, version: i32) -> impl FnMut(&CStr, i32) -> *const c_void {
    move |name: &CStr, _asked: i32| {
        if DriverFns::OPTIONAL
            .iter()
            .any(|(n, v)| n.as_bytes() == name.to_bytes() && *v > version)
        {
            return std::ptr::null();
        }
        match LOOKUPS.get(slot) {
            Some(lookup) => lookup(name.to_bytes()),
            None => std::ptr::null(),
        }
    }
}

static LOOKUPS: [fn(&[u8]) -> *const c_void; MAX_WORLDS] = __mock_lookups!(lookup);

/// The function named `name` for slot `W`: each domain module's lookup in turn.
fn lookup<const W: usize>(name: &[u8]) -> *const c_void {
    let modules: [fn(&[u8]) -> *const c_void; 12] = [
        init::lookup::<W>,
        context::lookup::<W>,
        memory::lookup::<W>,
        stream::lookup::<W>,
        event::lookup::<W>,
        graph::lookup::<W>,
        user_object::lookup::<W>,
        module::lookup::<W>,
        library::lookup::<W>,
        launch::lookup::<W>,
        function::lookup::<W>,
        occupancy::lookup::<W>,
    ];
    modules
        .iter()
        .map(|f| f(name))
        .find(|p| !p.is_null())
        .unwrap_or(std::ptr::null())
}
