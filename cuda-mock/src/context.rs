//! Contexts: primary-context retain/release, the calls on each thread's current-context
//! stack (kept in [`crate::current`]), and the teardown that frees whatever a context
//! still owns.

use std::ffi::{c_int, c_uint};

use crate::current::{current, current_context, with_stack};
use crate::handle::{check_ptr, h2p, ok, p2h};
use crate::init::device_of;
use crate::macros::mock_fns;
use crate::state::{Ctx, Primary, State};
use cuda_sys::*;

/// Destroys `ctx` and whatever still lives in it (counted as an order violation: the
/// children should have gone first). Its memory goes to the quarantine, freed by `call`.
fn destroy_context(s: &mut State, ctx: usize, call: &'static str) {
    // Teardown waits for the context's work, as the driver does.
    s.host_sync_all();
    // Modules first: their globals are freed with them, not counted as leaked memory.
    let modules_left = crate::module::drop_context_modules(s, ctx, call);
    s.contexts.remove(&ctx);
    let streams: Vec<usize> = s
        .streams
        .iter()
        .filter(|(_, v)| v.ctx == ctx)
        .map(|(k, _)| *k)
        .collect();
    let events: Vec<usize> = s
        .events
        .iter()
        .filter(|(_, v)| v.ctx == ctx)
        .map(|(k, _)| *k)
        .collect();
    let allocs: Vec<usize> = s
        .allocs
        .iter()
        .filter(|(_, v)| v.ctx == ctx)
        .map(|(k, _)| *k)
        .collect();
    if modules_left || !(streams.is_empty() && events.is_empty() && allocs.is_empty()) {
        s.order_violations += 1;
    }
    for h in streams {
        s.streams.remove(&h);
    }
    for h in events {
        s.events.remove(&h);
    }
    for p in allocs {
        s.quarantine(p, call);
    }
    s.legacy.remove(&ctx);
}

mock_fns! {
    fn cuDevicePrimaryCtxRetain = cu_primary_ctx_retain(w, s, pctx: *mut CUcontext, dev: CUdevice) [init] {
        let d = match device_of(w, dev) {
            Ok(d) => d as i32,
            Err(e) => return e,
        };
        if pctx.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let existing = s.primary.get(&d).and_then(|p| p.ctx);
        let ctx = match existing {
            Some(c) => c,
            None => {
                let c = s.handle(w.id);
                s.contexts.insert(c, Ctx { device: d });
                c
            }
        };
        let p = s.primary.entry(d).or_insert(Primary { refcount: 0, ctx: None });
        p.refcount += 1;
        p.ctx = Some(ctx);
        // SAFETY: checked non-null out-pointer.
        unsafe { *pctx = h2p(ctx) };
        CUresult::CUDA_SUCCESS
    }
    fn cuDevicePrimaryCtxRelease = cu_primary_ctx_release(w, s, dev: CUdevice) [init] {
        let d = match device_of(w, dev) {
            Ok(d) => d as i32,
            Err(e) => return e,
        };
        let Some(p) = s.primary.get_mut(&d) else {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        };
        if p.refcount == 0 {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        p.refcount -= 1;
        if p.refcount == 0
            && let Some(ctx) = p.ctx.take() {
                destroy_context(&mut s, ctx, "cuDevicePrimaryCtxRelease");
            }
        CUresult::CUDA_SUCCESS
    }
    fn cuDevicePrimaryCtxGetState = cu_primary_ctx_get_state(w, s, dev: CUdevice, flags: *mut c_uint, active: *mut c_int) [init] {
        let d = match device_of(w, dev) {
            Ok(d) => d as i32,
            Err(e) => return e,
        };
        if flags.is_null() || active.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let is_active = s.primary.get(&d).is_some_and(|p| p.refcount > 0);
        // SAFETY: checked non-null out-pointers.
        unsafe {
            *flags = 0;
            *active = c_int::from(is_active);
        }
        CUresult::CUDA_SUCCESS
    }
    fn cuCtxSetCurrent = cu_ctx_set_current(w, s, ctx: CUcontext) [init] {
        let h = p2h(ctx);
        if h != 0 && !s.contexts.contains_key(&h) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        with_stack(w.id, |st| {
            st.pop();
            if h != 0 {
                st.push(h);
            }
        });
        CUresult::CUDA_SUCCESS
    }
    fn cuCtxGetCurrent = cu_ctx_get_current(w, s, pctx: *mut CUcontext) [init] {
        if pctx.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let cur = current_context(w.id).unwrap_or(0);
        // SAFETY: checked non-null out-pointer.
        unsafe { *pctx = h2p(cur) };
        CUresult::CUDA_SUCCESS
    }
    fn cuCtxPushCurrent = cu_ctx_push_current(w, s, ctx: CUcontext) [init] {
        let h = p2h(ctx);
        if !s.contexts.contains_key(&h) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        with_stack(w.id, |st| st.push(h));
        CUresult::CUDA_SUCCESS
    }
    fn cuCtxPopCurrent = cu_ctx_pop_current(w, s, pctx: *mut CUcontext) [init] {
        match with_stack(w.id, |st| st.pop()) {
            Some(h) => {
                if !pctx.is_null() {
                    // SAFETY: checked non-null out-pointer.
                    unsafe { *pctx = h2p(h) };
                }
                CUresult::CUDA_SUCCESS
            }
            None => CUresult::CUDA_ERROR_INVALID_CONTEXT,
        }
    }
    fn cuCtxGetDevice = cu_ctx_get_device(w, s, dev: *mut CUdevice) [init] {
        ok(current(w, &s).and_then(|c| {
            check_ptr(dev)?;
            let d = s.contexts.get(&c).map(|x| x.device).unwrap_or(0);
            // SAFETY: checked non-null out-pointer.
            unsafe { *dev = d };
            Ok(())
        }))
    }
    fn cuCtxSynchronize = cu_ctx_synchronize(w, s) [init] {
        // A host synchronisation a running capture forbids this thread fails and spoils
        // that capture, as on a real device.
        if let Some(origin) = crate::queue::forbidding_capture(&s)
            && let Some(st) = s.streams.get_mut(&origin)
        {
            st.capture_invalid = true;
            return CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        match current(w, &s) {
            Ok(_) => {
                // Device-wide: the host is now ordered after all work (over-approximated
                // to every device, so correct programs never get false reports).
                s.host_sync_all();
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuCtxEnablePeerAccess = cu_ctx_enable_peer_access(w, s, peer: CUcontext, flags: c_uint) [init] {
        let cur = match current(w, &s) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let p = p2h(peer);
        if flags != 0 || !s.contexts.contains_key(&p) || p == cur {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        if !s.peers.insert((cur, p)) {
            return CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        }
        CUresult::CUDA_SUCCESS
    }
}
