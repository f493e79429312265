//! Allocating and freeing device memory under the sanitizer: below the domains that allocate it (memory, module globals, other allocators') and the queue that runs stream-ordered frees.

use std::collections::HashMap;

use crate::sanitizer::Alloc;
use crate::state::State;
use crate::world::World;
use cuda_sys::CUresult;

/// Frees the allocation starting at `p` into the quarantine; anything else (a double
/// free, an inner or unknown address) is reported, except null.
pub(super) fn free_device(s: &mut State, call: &'static str, p: usize) -> CUresult {
    if let Some(m) = s.allocs.get(&p).and_then(|a| a.module) {
        s.violation(format!(
            "{call} of {p:#x}: a global of module {m:#x}, freed only when the module is unloaded"
        ));
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(by) = s.allocs.get(&p).and_then(|a| a.foreign) {
        s.violation(format!(
            "{call} of {p:#x}: allocated by {by}, which must free it"
        ));
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    s.report_pins(call, p);
    if s.quarantine(p, call) {
        return CUresult::CUDA_SUCCESS;
    }
    if p != 0 {
        let m = s.bad_free(call, p);
        s.violation(m);
    }
    CUresult::CUDA_ERROR_INVALID_VALUE
}

/// A fresh device allocation of `bytes` in `ctx`, filled with 0xA5.
pub(super) fn alloc_device(
    w: &World,
    s: &mut State,
    ctx: usize,
    bytes: usize,
) -> Result<usize, CUresult> {
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let device = s
        .contexts
        .get(&ctx)
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?
        .device;
    let d = device as usize;
    if s.used.len() < w.devices.len() {
        s.used.resize(w.devices.len(), 0);
    }
    let total = w.devices.get(d).map(|x| x.total_memory).unwrap_or(0);
    if s.used[d].saturating_add(bytes as u64) > total {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let layout = Alloc::layout(bytes).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc(layout) };
    if ptr.is_null() {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // Uninitialised device memory reads as 0xA5 bytes, so tests catch missing writes.
    // SAFETY: `ptr` is a fresh allocation of `bytes` bytes.
    unsafe { std::ptr::write_bytes(ptr, 0xA5, bytes) };
    s.used[d] += bytes as u64;
    // Exposed: callers turn the address back into a pointer (as device addresses are).
    let addr = ptr.expose_provenance();
    s.allocs.insert(
        addr,
        Alloc {
            ptr,
            len: bytes,
            ctx,
            device,
            last_use: HashMap::new(),
            module: None,
            foreign: None,
            pins: Vec::new(),
        },
    );
    Ok(addr)
}

impl State {
    /// Reports the holds on the allocation at `start`, which `call` is freeing.
    pub(crate) fn report_pins(&mut self, call: &str, start: usize) {
        let pins = self
            .allocs
            .get(&start)
            .map(|a| a.pins.iter().map(|(_, w)| w.clone()).collect::<Vec<_>>())
            .unwrap_or_default();
        for what in pins {
            self.violation(format!("{call} of {start:#x}: still held by {what}"));
        }
    }
}
