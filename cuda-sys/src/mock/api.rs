//! The simulated driver functions, one instance per world slot (const generic `W`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::state::{Alloc, Ctx, EventInfo, Op, Primary, State, StreamInfo};
use super::{MAX_WORLDS, World};
use crate::*;

crate::__mock_slots!(World);
static WORLD_IDS: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_world_id() -> u64 {
    WORLD_IDS.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    /// Per world: this thread's context stack (top = current).
    static CURRENT: RefCell<HashMap<u64, Vec<usize>>> = RefCell::new(HashMap::new());
}

pub(super) fn current_context(world_id: u64) -> Option<usize> {
    CURRENT.with(|c| c.borrow().get(&world_id).and_then(|s| s.last().copied()))
}

fn with_stack<R>(world_id: u64, f: impl FnOnce(&mut Vec<usize>) -> R) -> R {
    CURRENT.with(|c| f(c.borrow_mut().entry(world_id).or_default()))
}

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

static LOOKUPS: [fn(&[u8]) -> *const c_void; MAX_WORLDS] = crate::__mock_lookups!(lookup);

fn h2p<T>(h: usize) -> *mut T {
    std::ptr::without_provenance_mut(h)
}

fn p2h<T>(p: *mut T) -> usize {
    p.addr()
}

/// The current context of this thread in `w`, if it is alive.
fn current(w: &World, s: &State) -> Result<usize, CUresult> {
    let ctx = current_context(w.id).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if s.contexts.contains_key(&ctx) {
        Ok(ctx)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }
}

/// The context a stream belongs to (0: the current context's default stream).
fn stream_ctx(w: &World, s: &State, stream: CUstream) -> Result<usize, CUresult> {
    let h = p2h(stream);
    if h == 0 || h == 1 || h == 2 {
        // 0: legacy default stream; 1, 2: CU_STREAM_LEGACY / CU_STREAM_PER_THREAD.
        return current(w, s);
    }
    s.streams
        .get(&h)
        .map(|st| st.ctx)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

fn device_of(w: &World, dev: CUdevice) -> Result<usize, CUresult> {
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < w.devices.len())
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

fn ok(r: Result<(), CUresult>) -> CUresult {
    match r {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e,
    }
}

fn check_ptr<T>(p: *const T) -> Result<(), CUresult> {
    if p.is_null() {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// Validates an op against the state; returns a closure-free plan or an error.
fn validate(s: &State, op: &Op) -> Result<(), CUresult> {
    match op {
        Op::Copy { dst, src, len } => {
            if *len == 0 {
                return Ok(());
            }
            // Either side may be host memory (unified addressing); device sides must be in range.
            for p in [*dst, *src] {
                if p == 0 {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                if s.is_device(p) && s.find_alloc(p, *len).is_none() {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
            }
            Ok(())
        }
        Op::Memset { dst, size, n, .. } => {
            let bytes = size
                .checked_mul(*n)
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            if bytes == 0 {
                return Ok(());
            }
            if dst % size != 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            s.find_alloc(*dst, bytes)
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
        Op::Record { event } => {
            if s.events.contains_key(event) {
                Ok(())
            } else {
                Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
            }
        }
        Op::HostFn { .. } | Op::Custom(_) => Ok(()),
    }
}

/// Runs a validated op. Ops that call out (host functions, other simulations) run with
/// the lock released, so they may block on other threads or call the driver.
fn run(w: &World, mut s: std::sync::MutexGuard<'_, State>, op: Op) -> CUresult {
    if let Err(e) = validate(&s, &op) {
        return e;
    }
    match op {
        Op::Copy { dst, src, len } => {
            if len > 0 {
                // SAFETY: device sides were checked to lie in live allocations; host sides
                // are the caller's pointers, valid for `len` bytes by the API's contract.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            }
            CUresult::CUDA_SUCCESS
        }
        Op::Memset {
            dst,
            value,
            size,
            n,
        } => {
            for i in 0..n {
                let p = dst + i * size;
                // SAFETY: the whole range was checked to lie in one live allocation and `dst`
                // is aligned to `size`.
                unsafe {
                    match size {
                        1 => *(p as *mut u8) = value as u8,
                        2 => *(p as *mut u16) = value as u16,
                        _ => *(p as *mut u32) = value,
                    }
                }
            }
            CUresult::CUDA_SUCCESS
        }
        Op::Record { event } => {
            if let Some(e) = s.events.get_mut(&event) {
                e.recorded = Some(Instant::now());
            }
            CUresult::CUDA_SUCCESS
        }
        Op::HostFn { f, data } => {
            drop(s);
            // SAFETY: the caller of cuLaunchHostFunc passed this function and argument.
            unsafe { f(h2p(data)) };
            CUresult::CUDA_SUCCESS
        }
        Op::Custom(f) => {
            drop(s);
            let _ = w;
            f()
        }
    }
}

/// Enqueues `op` on `stream`: recorded if the stream is capturing, else run now.
fn enqueue(w: &World, s: std::sync::MutexGuard<'_, State>, stream: CUstream, op: Op) -> CUresult {
    let mut s = s;
    if let Err(e) = stream_ctx(w, &s, stream) {
        return e;
    }
    if let Some(st) = s.streams.get_mut(&p2h(stream))
        && let Some(cap) = st.capture.as_mut()
    {
        cap.push(op);
        return CUresult::CUDA_SUCCESS;
    }
    run(w, s, op)
}

pub(super) fn stream_device(w: &World, stream: CUstream) -> Option<i32> {
    let s = w.lock();
    let ctx = stream_ctx(w, &s, stream).ok()?;
    s.contexts.get(&ctx).map(|c| c.device)
}

pub(super) fn enqueue_custom(
    w: &World,
    stream: CUstream,
    op: Arc<dyn Fn() -> CUresult + Send + Sync>,
) -> CUresult {
    let s = w.lock();
    enqueue(w, s, stream, Op::Custom(op))
}

fn destroy_context(s: &mut State, ctx: usize) {
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
    if !(streams.is_empty() && events.is_empty() && allocs.is_empty()) {
        s.order_violations += 1;
    }
    for h in streams {
        s.streams.remove(&h);
    }
    for h in events {
        s.events.remove(&h);
    }
    for p in allocs {
        free_alloc(s, p);
    }
}

fn free_alloc(s: &mut State, p: usize) -> bool {
    let Some(a) = s.allocs.remove(&p) else {
        return false;
    };
    if let Some(u) = s.used.get_mut(a.device as usize) {
        *u = u.saturating_sub(a.len as u64);
    }
    if let Some(layout) = Alloc::layout(a.len) {
        // SAFETY: allocated with this layout in `alloc_device` and removed from the map, so
        // freed exactly once.
        unsafe { std::alloc::dealloc(a.ptr, layout) };
    }
    true
}

fn alloc_device(w: &World, s: &mut State, ctx: usize, bytes: usize) -> Result<usize, CUresult> {
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
        },
    );
    Ok(addr)
}

fn write_str(dst: *mut c_char, len: c_int, text: &str) -> Result<(), CUresult> {
    check_ptr(dst)?;
    let len = usize::try_from(len).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if len == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), dst as *mut u8, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

/// Static, NUL-terminated name and message for a code, for cuGetErrorName/String.
fn error_text(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    static TEXTS: std::sync::OnceLock<HashMap<u32, (std::ffi::CString, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    let map = TEXTS.get_or_init(|| {
        let mut m = HashMap::new();
        for v in 0..1000u32 {
            if let Some(name) = CUresult(v).name() {
                let words = name
                    .trim_start_matches("CUDA_ERROR_")
                    .trim_start_matches("CUDA_");
                let msg = format!(
                    "simulated driver: {}",
                    words.to_lowercase().replace('_', " ")
                );
                if let (Ok(n), Ok(m2)) = (std::ffi::CString::new(name), std::ffi::CString::new(msg))
                {
                    m.insert(v, (n, m2));
                }
            }
        }
        m
    });
    map.get(&code.0).map(|(n, m)| (n.as_c_str(), m.as_c_str()))
}

macro_rules! mock_fns {
    ($(
        fn $cname:ident = $rname:ident ($w:ident, $s:ident $(, $a:ident : $t:ty)*) [$init:tt] $body:block
    )*) => {
        $(
            #[allow(non_snake_case, clippy::needless_return)]
            unsafe extern "C" fn $rname<const W: usize>($($a: $t),*) -> CUresult {
                let Some(world) = slot_world(W) else {
                    return CUresult::CUDA_ERROR_DEINITIALIZED;
                };
                let $w: &World = &world;
                #[allow(unused_mut)]
                let mut $s = $w.lock();
                if let Some(e) = $s.enter(stringify!($cname)) {
                    return e;
                }
                if mock_fns!(@needs_init $init) && !$s.initialized {
                    return CUresult::CUDA_ERROR_NOT_INITIALIZED;
                }
                $body
            }
        )*

        fn lookup<const W: usize>(name: &[u8]) -> *const c_void {
            $(
                if name == stringify!($cname).as_bytes() {
                    let f: crate::fns::signatures::$cname = $rname::<W>;
                    return f as *const c_void;
                }
            )*
            std::ptr::null()
        }
    };
    (@needs_init init) => { true };
    (@needs_init any) => { false };
}

mock_fns! {
    fn cuInit = cu_init(w, s, flags: c_uint) [any] {
        if flags != 0 {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        if w.devices.is_empty() {
            return CUresult::CUDA_ERROR_NO_DEVICE;
        }
        s.initialized = true;
        s.used.resize(w.devices.len(), 0);
        CUresult::CUDA_SUCCESS
    }
    fn cuDriverGetVersion = cu_driver_get_version(w, s, v: *mut c_int) [any] {
        let _ = &s;
        if v.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { *v = w.version };
        CUresult::CUDA_SUCCESS
    }
    fn cuGetErrorName = cu_get_error_name(w, s, code: CUresult, out: *mut *const c_char) [any] {
        let _ = (w, &s);
        match (error_text(code), out.is_null()) {
            (Some((name, _)), false) => {
                // SAFETY: checked non-null out-pointer; the string is static.
                unsafe { *out = name.as_ptr() };
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn cuGetErrorString = cu_get_error_string(w, s, code: CUresult, out: *mut *const c_char) [any] {
        let _ = (w, &s);
        match (error_text(code), out.is_null()) {
            (Some((_, msg)), false) => {
                // SAFETY: checked non-null out-pointer; the string is static.
                unsafe { *out = msg.as_ptr() };
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn cuDeviceGetCount = cu_device_get_count(w, s, n: *mut c_int) [init] {
        if n.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *n = w.devices.len() as c_int };
        CUresult::CUDA_SUCCESS
    }
    fn cuDeviceGet = cu_device_get(w, s, dev: *mut CUdevice, ordinal: c_int) [init] {
        if dev.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        match device_of(w, ordinal) {
            Ok(d) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *dev = d as CUdevice };
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuDeviceGetName = cu_device_get_name(w, s, name: *mut c_char, len: c_int, dev: CUdevice) [init] {
        ok(device_of(w, dev).and_then(|d| write_str(name, len, &w.devices[d].name)))
    }
    fn cuDeviceGetUuid = cu_device_get_uuid(w, s, uuid: *mut CUuuid, dev: CUdevice) [init] {
        ok(device_of(w, dev).and_then(|d| {
            check_ptr(uuid)?;
            let bytes = w.devices[d].uuid_bytes();
            // SAFETY: checked non-null out-pointer to a CUuuid (16 bytes).
            unsafe { (*uuid).bytes = bytes.map(|b| b as c_char) };
            Ok(())
        }))
    }
    fn cuDeviceGetPCIBusId = cu_device_get_pci_bus_id(w, s, out: *mut c_char, len: c_int, dev: CUdevice) [init] {
        ok(device_of(w, dev).and_then(|d| {
            let (dom, bus, device) = w.devices[d].pci_triple();
            write_str(out, len, &format!("{dom:08X}:{bus:02X}:{device:02X}.0"))
        }))
    }
    fn cuDeviceGetByPCIBusId = cu_device_get_by_pci_bus_id(w, s, dev: *mut CUdevice, id: *const c_char) [init] {
        if dev.is_null() || id.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(id) }.to_string_lossy().to_lowercase();
        let parsed: Vec<u32> = text
            .split([':', '.'])
            .map(|p| u32::from_str_radix(p, 16))
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        let triple = match parsed.as_slice() {
            [d, b, v, _f] => (*d, *b, *v),
            [b, v, _f] => (0, *b, *v),
            _ => return CUresult::CUDA_ERROR_INVALID_VALUE,
        };
        match w.devices.iter().position(|x| x.pci_triple() == triple) {
            Some(i) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *dev = i as CUdevice };
                CUresult::CUDA_SUCCESS
            }
            None => CUresult::CUDA_ERROR_INVALID_DEVICE,
        }
    }
    fn cuDeviceGetAttribute = cu_device_get_attribute(w, s, pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) [init] {
        ok(device_of(w, dev).and_then(|d| {
            check_ptr(pi)?;
            if attrib.0 >= CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX.0 || attrib.0 == 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let x = &w.devices[d];
            let (dom, bus, device) = x.pci_triple();
            let v = match attrib {
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => x.compute_capability.0,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => x.compute_capability.1,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => x.multiprocessors,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => dom as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => bus as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => device as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
                | CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
                | CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS => 1,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
                _ => 0,
            };
            // SAFETY: checked non-null out-pointer.
            unsafe { *pi = v };
            Ok(())
        }))
    }
    fn cuDeviceTotalMem = cu_device_total_mem(w, s, bytes: *mut usize, dev: CUdevice) [init] {
        ok(device_of(w, dev).and_then(|d| {
            check_ptr(bytes)?;
            // SAFETY: checked non-null out-pointer.
            unsafe { *bytes = w.devices[d].total_memory as usize };
            Ok(())
        }))
    }
    fn cuDeviceCanAccessPeer = cu_device_can_access_peer(w, s, can: *mut c_int, dev: CUdevice, peer: CUdevice) [init] {
        ok(device_of(w, dev).and_then(|a| {
            let b = device_of(w, peer)?;
            check_ptr(can)?;
            // SAFETY: checked non-null out-pointer.
            unsafe { *can = c_int::from(a != b) };
            Ok(())
        }))
    }
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
                destroy_context(&mut s, ctx);
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
        ok(current(w, &s).map(|_| ()))
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
    fn cuStreamCreate = cu_stream_create(w, s, out: *mut CUstream, flags: c_uint) [init] {
        create_stream(w, &mut s, out, flags)
    }
    fn cuStreamCreateWithPriority = cu_stream_create_with_priority(w, s, out: *mut CUstream, flags: c_uint, priority: c_int) [init] {
        let _ = priority;
        create_stream(w, &mut s, out, flags)
    }
    fn cuStreamDestroy = cu_stream_destroy(w, s, stream: CUstream) [init] {
        let _ = w;
        match s.streams.remove(&p2h(stream)) {
            Some(_) => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuStreamSynchronize = cu_stream_synchronize(w, s, stream: CUstream) [init] {
        if let Err(e) = stream_ctx(w, &s, stream) {
            return e;
        }
        // As on a real device: synchronising a capturing stream fails and spoils the capture.
        if let Some(st) = s.streams.get_mut(&p2h(stream))
            && st.capture.is_some() {
                st.capture_invalid = true;
                return CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            }
        CUresult::CUDA_SUCCESS
    }
    fn cuStreamQuery = cu_stream_query(w, s, stream: CUstream) [init] {
        ok(stream_ctx(w, &s, stream).map(|_| ()))
    }
    fn cuStreamWaitEvent = cu_stream_wait_event(w, s, stream: CUstream, event: CUevent, flags: c_uint) [init] {
        let _ = flags;
        ok(stream_ctx(w, &s, stream).and_then(|_| {
            if s.events.contains_key(&p2h(event)) { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_HANDLE) }
        }))
    }
    fn cuStreamGetCtx = cu_stream_get_ctx(w, s, stream: CUstream, pctx: *mut CUcontext) [init] {
        ok(stream_ctx(w, &s, stream).and_then(|c| {
            check_ptr(pctx)?;
            // SAFETY: checked non-null out-pointer.
            unsafe { *pctx = h2p(c) };
            Ok(())
        }))
    }
    fn cuStreamBeginCapture = cu_stream_begin_capture(w, s, stream: CUstream, mode: CUstreamCaptureMode) [init] {
        let _ = (w, mode);
        match s.streams.get_mut(&p2h(stream)) {
            Some(st) if st.capture.is_none() => {
                st.capture = Some(Vec::new());
                CUresult::CUDA_SUCCESS
            }
            Some(_) => CUresult::CUDA_ERROR_ILLEGAL_STATE,
            // The legacy default stream cannot be captured.
            None => CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        }
    }
    fn cuStreamEndCapture = cu_stream_end_capture(w, s, stream: CUstream, graph: *mut CUgraph) [init] {
        if graph.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let ops = match s.streams.get_mut(&p2h(stream)) {
            Some(st) => match st.capture.take() {
                Some(_) if std::mem::take(&mut st.capture_invalid) => {
                    return CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
                }
                Some(ops) => ops,
                None => return CUresult::CUDA_ERROR_ILLEGAL_STATE,
            },
            None => return CUresult::CUDA_ERROR_INVALID_HANDLE,
        };
        let h = s.handle(w.id);
        s.graphs.insert(h, ops);
        // SAFETY: checked non-null out-pointer.
        unsafe { *graph = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuStreamIsCapturing = cu_stream_is_capturing(w, s, stream: CUstream, status: *mut CUstreamCaptureStatus) [init] {
        if status.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        if let Err(e) = stream_ctx(w, &s, stream) {
            return e;
        }
        let capturing = s.streams.get(&p2h(stream)).is_some_and(|st| st.capture.is_some());
        // SAFETY: checked non-null out-pointer.
        unsafe {
            *status = if capturing {
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            } else {
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
            }
        };
        CUresult::CUDA_SUCCESS
    }
    fn cuLaunchHostFunc = cu_launch_host_func(w, s, stream: CUstream, f: CUhostFn, data: *mut c_void) [init] {
        match f {
            Some(f) => enqueue(w, s, stream, Op::HostFn { f, data: p2h(data) }),
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn cuEventCreate = cu_event_create(w, s, out: *mut CUevent, flags: c_uint) [init] {
        let ctx = match current(w, &s) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if out.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let timing = flags & CUevent_flags::CU_EVENT_DISABLE_TIMING.0 == 0;
        let h = s.handle(w.id);
        s.events.insert(h, EventInfo { ctx, timing, recorded: None });
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuEventDestroy = cu_event_destroy(w, s, event: CUevent) [init] {
        let _ = w;
        match s.events.remove(&p2h(event)) {
            Some(_) => CUresult::CUDA_SUCCESS,
            None => CUresult::CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuEventRecord = cu_event_record(w, s, event: CUevent, stream: CUstream) [init] {
        let h = p2h(event);
        let Some(ev_ctx) = s.events.get(&h).map(|e| e.ctx) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        match stream_ctx(w, &s, stream) {
            Ok(c) if c == ev_ctx => enqueue(w, s, stream, Op::Record { event: h }),
            Ok(_) => CUresult::CUDA_ERROR_INVALID_HANDLE,
            Err(e) => e,
        }
    }
    fn cuEventSynchronize = cu_event_synchronize(w, s, event: CUevent) [init] {
        let _ = w;
        if s.events.contains_key(&p2h(event)) { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_INVALID_HANDLE }
    }
    fn cuEventQuery = cu_event_query(w, s, event: CUevent) [init] {
        let _ = w;
        if s.events.contains_key(&p2h(event)) { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_INVALID_HANDLE }
    }
    fn cuEventElapsedTime = cu_event_elapsed_time(w, s, ms: *mut f32, start: CUevent, end: CUevent) [init] {
        let _ = w;
        if ms.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let (Some(a), Some(b)) = (s.events.get(&p2h(start)), s.events.get(&p2h(end))) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        if !a.timing || !b.timing {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        let (Some(ta), Some(tb)) = (a.recorded, b.recorded) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        let d = if tb >= ta { (tb - ta).as_secs_f32() } else { -(ta - tb).as_secs_f32() };
        // SAFETY: checked non-null out-pointer.
        unsafe { *ms = d * 1000.0 };
        CUresult::CUDA_SUCCESS
    }
    fn cuMemGetInfo = cu_mem_get_info(w, s, free: *mut usize, total: *mut usize) [init] {
        ok(current(w, &s).and_then(|c| {
            check_ptr(free)?;
            check_ptr(total)?;
            let d = s.contexts.get(&c).map(|x| x.device as usize).unwrap_or(0);
            let t = w.devices.get(d).map(|x| x.total_memory).unwrap_or(0);
            let u = s.used.get(d).copied().unwrap_or(0);
            // SAFETY: checked non-null out-pointers.
            unsafe {
                *free = t.saturating_sub(u) as usize;
                *total = t as usize;
            }
            Ok(())
        }))
    }
    fn cuMemAlloc = cu_mem_alloc(w, s, dptr: *mut CUdeviceptr, bytes: usize) [init] {
        ok(current(w, &s).and_then(|c| {
            check_ptr(dptr)?;
            let p = alloc_device(w, &mut s, c, bytes)?;
            // SAFETY: checked non-null out-pointer.
            unsafe { *dptr = p as CUdeviceptr };
            Ok(())
        }))
    }
    fn cuMemFree = cu_mem_free(w, s, dptr: CUdeviceptr) [init] {
        let _ = w;
        if free_alloc(&mut s, dptr as usize) { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_INVALID_VALUE }
    }
    fn cuMemAllocAsync = cu_mem_alloc_async(w, s, dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) [init] {
        ok(stream_ctx(w, &s, stream).and_then(|c| {
            check_ptr(dptr)?;
            let p = alloc_device(w, &mut s, c, bytes)?;
            // SAFETY: checked non-null out-pointer.
            unsafe { *dptr = p as CUdeviceptr };
            Ok(())
        }))
    }
    fn cuMemFreeAsync = cu_mem_free_async(w, s, dptr: CUdeviceptr, stream: CUstream) [init] {
        if let Err(e) = stream_ctx(w, &s, stream) {
            return e;
        }
        if free_alloc(&mut s, dptr as usize) { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_INVALID_VALUE }
    }
    fn cuMemAllocHost = cu_mem_alloc_host(w, s, pp: *mut *mut c_void, bytes: usize) [init] {
        ok(current(w, &s).and_then(|_| alloc_host(&mut s, pp, bytes)))
    }
    fn cuMemHostAlloc = cu_mem_host_alloc(w, s, pp: *mut *mut c_void, bytes: usize, flags: c_uint) [init] {
        let _ = flags;
        ok(current(w, &s).and_then(|_| alloc_host(&mut s, pp, bytes)))
    }
    fn cuMemFreeHost = cu_mem_free_host(w, s, p: *mut c_void) [init] {
        let _ = w;
        match s.host.remove(&p2h(p)) {
            Some((addr, layout)) => {
                // SAFETY: allocated in alloc_host with this layout; removed, so freed once.
                unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
                CUresult::CUDA_SUCCESS
            }
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn cuMemcpy = cu_memcpy(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize) [init] {
        sync_copy(w, s, dst as usize, src as usize, n)
    }
    fn cuMemcpyAsync = cu_memcpy_async(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) [init] {
        enqueue(w, s, stream, Op::Copy { dst: dst as usize, src: src as usize, len: n })
    }
    fn cuMemcpyHtoD = cu_memcpy_htod(w, s, dst: CUdeviceptr, src: *const c_void, n: usize) [init] {
        directed_copy(w, s, dst as usize, src.addr(), n, (true, false), None)
    }
    fn cuMemcpyDtoH = cu_memcpy_dtoh(w, s, dst: *mut c_void, src: CUdeviceptr, n: usize) [init] {
        directed_copy(w, s, dst.addr(), src as usize, n, (false, true), None)
    }
    fn cuMemcpyDtoD = cu_memcpy_dtod(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize) [init] {
        directed_copy(w, s, dst as usize, src as usize, n, (true, true), None)
    }
    fn cuMemcpyHtoDAsync = cu_memcpy_htod_async(w, s, dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, dst as usize, src.addr(), n, (true, false), Some(stream))
    }
    fn cuMemcpyDtoHAsync = cu_memcpy_dtoh_async(w, s, dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, dst.addr(), src as usize, n, (false, true), Some(stream))
    }
    fn cuMemcpyDtoDAsync = cu_memcpy_dtod_async(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, dst as usize, src as usize, n, (true, true), Some(stream))
    }
    fn cuMemcpyPeer = cu_memcpy_peer(w, s, dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) [init] {
        if !s.contexts.contains_key(&p2h(dctx)) || !s.contexts.contains_key(&p2h(sctx)) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        directed_copy(w, s, dst as usize, src as usize, n, (true, true), None)
    }
    fn cuMemcpyPeerAsync = cu_memcpy_peer_async(w, s, dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, stream: CUstream) [init] {
        if !s.contexts.contains_key(&p2h(dctx)) || !s.contexts.contains_key(&p2h(sctx)) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        directed_copy(w, s, dst as usize, src as usize, n, (true, true), Some(stream))
    }
    fn cuMemsetD8 = cu_memset_d8(w, s, dst: CUdeviceptr, v: u8, n: usize) [init] {
        memset(w, s, dst as usize, u32::from(v), 1, n, None)
    }
    fn cuMemsetD16 = cu_memset_d16(w, s, dst: CUdeviceptr, v: u16, n: usize) [init] {
        memset(w, s, dst as usize, u32::from(v), 2, n, None)
    }
    fn cuMemsetD32 = cu_memset_d32(w, s, dst: CUdeviceptr, v: c_uint, n: usize) [init] {
        memset(w, s, dst as usize, v, 4, n, None)
    }
    fn cuMemsetD8Async = cu_memset_d8_async(w, s, dst: CUdeviceptr, v: u8, n: usize, stream: CUstream) [init] {
        memset(w, s, dst as usize, u32::from(v), 1, n, Some(stream))
    }
    fn cuMemsetD16Async = cu_memset_d16_async(w, s, dst: CUdeviceptr, v: u16, n: usize, stream: CUstream) [init] {
        memset(w, s, dst as usize, u32::from(v), 2, n, Some(stream))
    }
    fn cuMemsetD32Async = cu_memset_d32_async(w, s, dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream) [init] {
        memset(w, s, dst as usize, v, 4, n, Some(stream))
    }
    fn cuPointerGetAttribute = cu_pointer_get_attribute(w, s, data: *mut c_void, attr: CUpointer_attribute, ptr: CUdeviceptr) [init] {
        let _ = w;
        if data.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let Some(a) = s.find_alloc(ptr as usize, 1) else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: checked non-null; the attribute decides the out type, as documented.
        unsafe {
            match attr {
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT => *(data as *mut CUcontext) = h2p(a.ctx),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => *(data as *mut c_int) = a.device,
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                    *(data as *mut c_uint) = CUmemorytype::CU_MEMORYTYPE_DEVICE.0
                }
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => *(data as *mut CUdeviceptr) = ptr,
                _ => return CUresult::CUDA_ERROR_NOT_SUPPORTED,
            }
        }
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphInstantiateWithFlags = cu_graph_instantiate(w, s, exec: *mut CUgraphExec, graph: CUgraph, flags: u64) [init] {
        let _ = flags;
        if exec.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let Some(ops) = s.graphs.get(&p2h(graph)).cloned() else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        let h = s.handle(w.id);
        s.execs.insert(h, ops);
        // SAFETY: checked non-null out-pointer.
        unsafe { *exec = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphLaunch = cu_graph_launch(w, s, exec: CUgraphExec, stream: CUstream) [init] {
        let Some(ops) = s.execs.get(&p2h(exec)).cloned() else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        let mut s = s;
        for op in ops {
            let rc = enqueue(w, s, stream, op);
            if rc != CUresult::CUDA_SUCCESS {
                return rc;
            }
            s = w.lock();
        }
        CUresult::CUDA_SUCCESS
    }
    fn cuGraphExecDestroy = cu_graph_exec_destroy(w, s, exec: CUgraphExec) [init] {
        let _ = w;
        if s.execs.remove(&p2h(exec)).is_some() { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_INVALID_VALUE }
    }
    fn cuGraphDestroy = cu_graph_destroy(w, s, graph: CUgraph) [init] {
        let _ = w;
        if s.graphs.remove(&p2h(graph)).is_some() { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_INVALID_VALUE }
    }
    fn cuCtxRecordEvent = cu_ctx_record_event(w, s, ctx: CUcontext, event: CUevent) [init] {
        let _ = w;
        let h = p2h(event);
        match s.events.get_mut(&h) {
            Some(e) if e.ctx == p2h(ctx) => {
                e.recorded = Some(Instant::now());
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_HANDLE,
        }
    }
    fn cuCtxWaitEvent = cu_ctx_wait_event(w, s, ctx: CUcontext, event: CUevent) [init] {
        let _ = w;
        if s.contexts.contains_key(&p2h(ctx)) && s.events.contains_key(&p2h(event)) {
            CUresult::CUDA_SUCCESS
        } else {
            CUresult::CUDA_ERROR_INVALID_HANDLE
        }
    }
    fn cuStreamGetDevice = cu_stream_get_device(w, s, stream: CUstream, dev: *mut CUdevice) [init] {
        ok(stream_ctx(w, &s, stream).and_then(|c| {
            check_ptr(dev)?;
            let d = s.contexts.get(&c).map(|x| x.device).unwrap_or(0);
            // SAFETY: checked non-null out-pointer.
            unsafe { *dev = d };
            Ok(())
        }))
    }
}

fn create_stream(w: &World, s: &mut State, out: *mut CUstream, flags: c_uint) -> CUresult {
    let ctx = match current(w, s) {
        Ok(c) => c,
        Err(e) => return e,
    };
    if out.is_null() || flags > 1 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let h = s.handle(w.id);
    s.streams.insert(
        h,
        StreamInfo {
            ctx,
            capture: None,
            capture_invalid: false,
        },
    );
    // SAFETY: checked non-null out-pointer.
    unsafe { *out = h2p(h) };
    CUresult::CUDA_SUCCESS
}

fn alloc_host(s: &mut State, pp: *mut *mut c_void, bytes: usize) -> Result<(), CUresult> {
    check_ptr(pp)?;
    let layout = std::alloc::Layout::from_size_align(bytes.max(1), 4096)
        .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let addr = p.expose_provenance();
    s.host.insert(addr, (addr, layout));
    // SAFETY: checked non-null out-pointer.
    unsafe { *pp = p.cast() };
    Ok(())
}

/// A copy whose sides must be device (`true`) or host (`false`) memory.
fn directed_copy(
    w: &World,
    s: std::sync::MutexGuard<'_, State>,
    dst: usize,
    src: usize,
    len: usize,
    device_sides: (bool, bool),
    stream: Option<CUstream>,
) -> CUresult {
    if len > 0 {
        for (p, must) in [(dst, device_sides.0), (src, device_sides.1)] {
            if p == 0 || (must && s.find_alloc(p, len).is_none()) {
                return CUresult::CUDA_ERROR_INVALID_VALUE;
            }
        }
    }
    let op = Op::Copy { dst, src, len };
    match stream {
        Some(st) => enqueue(w, s, st, op),
        None => sync_run(w, s, op),
    }
}

fn sync_copy(
    w: &World,
    s: std::sync::MutexGuard<'_, State>,
    dst: usize,
    src: usize,
    len: usize,
) -> CUresult {
    sync_run(w, s, Op::Copy { dst, src, len })
}

/// Synchronous work needs a current context, like the real driver.
fn sync_run(w: &World, s: std::sync::MutexGuard<'_, State>, op: Op) -> CUresult {
    if let Err(e) = current(w, &s) {
        return e;
    }
    run(w, s, op)
}

fn memset(
    w: &World,
    s: std::sync::MutexGuard<'_, State>,
    dst: usize,
    value: u32,
    size: usize,
    n: usize,
    stream: Option<CUstream>,
) -> CUresult {
    let op = Op::Memset {
        dst,
        value,
        size,
        n,
    };
    if let Err(e) = validate(&s, &op) {
        return e;
    }
    match stream {
        Some(st) => enqueue(w, s, st, op),
        None => sync_run(w, s, op),
    }
}
