//! Modules: code loaded into one context. A module's functions are the bound kernels its
//! image declares ([`Image`]); its globals are the bound globals, zeroed device memory of
//! the module's context allocated at load and freed (into the quarantine) at unload.
//!
//! Unloading is checked like a free: every launch of the module's functions must be
//! ordered before it (the host synchronised with the launch's stream); a launch of a
//! function of an unloaded module, also at graph replay, is reported.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};

use crate::alloc::alloc_device;
use crate::current::current;
use crate::handle::{h2p, p2h};
use crate::image::{self, Image};
use crate::macros::mock_fns;
use crate::state::{Dead, FuncInfo, ModuleInfo, State};
use crate::world::World;
use cuda_sys::*;

/// Loads a module of `image` into `ctx`, allocating the bound globals (zeroed).
pub(super) fn load(
    w: &World,
    s: &mut State,
    ctx: usize,
    image: Image,
    library: Option<usize>,
) -> Result<usize, CUresult> {
    if !s.contexts.contains_key(&ctx) {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    let h = s.handle(w.id);
    let wanted: Vec<(String, usize)> = s.globals.iter().map(|(n, b)| (n.clone(), *b)).collect();
    let mut globals = HashMap::new();
    for (name, bytes) in wanted {
        match alloc_device(w, s, ctx, bytes.max(1)) {
            Ok(addr) => {
                if let Some(a) = s.allocs.get_mut(&addr) {
                    a.module = Some(h);
                    // SAFETY: a fresh allocation of at least `bytes` bytes, owned by the state.
                    unsafe { std::ptr::write_bytes(a.ptr, 0, a.len) };
                }
                globals.insert(name, (addr, bytes));
            }
            Err(e) => {
                // Give back what was allocated: nothing of a failed load survives it.
                for (addr, _) in globals.into_values() {
                    if let Some(a) = s.allocs.get_mut(&addr) {
                        a.module = None;
                    }
                    s.quarantine(addr, "cuModuleLoadData");
                }
                return Err(e);
            }
        }
    }
    s.modules.insert(
        h,
        ModuleInfo {
            ctx,
            image,
            globals,
            functions: HashMap::new(),
            library,
            last_use: HashMap::new(),
        },
    );
    Ok(h)
}

/// Unloads module `h`: reports launches not ordered before it, frees its globals into
/// the quarantine and retires its functions. `call` names the unloading call.
pub(super) fn unload(s: &mut State, h: usize, call: &'static str) {
    let Some(m) = s.modules.remove(&h) else {
        return;
    };
    let mut late: Vec<(usize, String)> = m
        .last_use
        .iter()
        .filter(|(k, u)| s.host_clock.get(**k) < u.stamp)
        .map(|(k, u)| (*k, u.call.clone()))
        .collect();
    late.sort();
    for (k, what) in late {
        let msg = format!(
            "{call} unloads module {h:#x} while work enqueued on {} ({what}) is not ordered before it",
            s.stream_name(k)
        );
        s.violation(msg);
    }
    for (addr, _) in m.globals.values() {
        if let Some(a) = s.allocs.get_mut(addr) {
            a.module = None;
        }
        s.quarantine(*addr, call);
    }
    for (name, f) in m.functions {
        s.functions.remove(&f);
        s.dead_functions.insert(f, Dead { name, by: call });
    }
}

/// The function named `name` of module `h` (the same handle every time), if the image
/// declares it and it is bound; else `CUDA_ERROR_NOT_FOUND`.
pub(super) fn function(w: &World, s: &mut State, h: usize, name: &str) -> Result<usize, CUresult> {
    let m = s
        .modules
        .get(&h)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(f) = m.functions.get(name) {
        return Ok(*f);
    }
    let bound = s.kernels.contains_key(name);
    if !m.image.declares(name) || !bound {
        let why = crate::image::missing_kernel(&m.image, bound, name);
        crate::init::note_lookup(Some((CUresult::CUDA_ERROR_NOT_FOUND, why)));
        return Err(CUresult::CUDA_ERROR_NOT_FOUND);
    }
    let ctx = m.ctx;
    let f = s.handle(w.id);
    s.functions.insert(
        f,
        FuncInfo {
            module: h,
            ctx,
            name: name.to_string(),
            max_dynamic_shared: crate::limits::DEFAULT_DYNAMIC_SHARED,
        },
    );
    if let Some(m) = s.modules.get_mut(&h) {
        m.functions.insert(name.to_string(), f);
    }
    Ok(f)
}

/// The global `name` of module `h`: (address, size), or `CUDA_ERROR_NOT_FOUND`.
pub(super) fn global(s: &State, h: usize, name: &str) -> Result<(usize, usize), CUresult> {
    let m = s
        .modules
        .get(&h)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let g = m.globals.get(name).copied();
    crate::init::note_lookup(g.is_none().then(|| {
        let why = format!(
            "the module has no global {name:?}; bind one with MockDriver::global({name:?}, bytes) \
             before the build, or MockWorld::bind_global before the module is loaded"
        );
        (CUresult::CUDA_ERROR_NOT_FOUND, why)
    }));
    g.ok_or(CUresult::CUDA_ERROR_NOT_FOUND)
}

/// Unloads every module of a context being destroyed; true if one was not a library's
/// (the program should have unloaded it first).
pub(super) fn drop_context_modules(s: &mut State, ctx: usize, call: &'static str) -> bool {
    let mine: Vec<(usize, Option<usize>)> = s
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(h, m)| (*h, m.library))
        .collect();
    let mut leaked = false;
    for (h, library) in mine {
        match library.and_then(|l| s.libraries.get_mut(&l)) {
            Some(lib) => {
                lib.modules.remove(&ctx);
            }
            None => leaked = true,
        }
        unload(s, h, call);
    }
    leaked
}

/// A C string argument, or `CUDA_ERROR_INVALID_VALUE` for null.
///
/// # Safety
/// `name` is null or NUL-terminated.
pub(super) unsafe fn name_arg<'a>(
    name: *const c_char,
) -> Result<std::borrow::Cow<'a, str>, CUresult> {
    if name.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy())
}

/// `cuModuleLoadData(Ex)`: a module of `image` in the current context.
///
/// # Safety
/// `out` is null or writable; `image` is null or a valid image (see [`image::read`]).
unsafe fn load_data(
    w: &World,
    s: &mut State,
    out: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    let ctx = match current(w, s) {
        Ok(c) => c,
        Err(e) => return e,
    };
    if out.is_null() || image.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null; a valid image by the caller's contract.
    let parsed = match unsafe { image::read(image) } {
        Ok(i) => i,
        Err(e) => return e,
    };
    match load(w, s, ctx, parsed, None) {
        Ok(h) => {
            // SAFETY: checked non-null out-pointer.
            unsafe { *out = h2p(h) };
            CUresult::CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// Writes a global's address and size through the optional out-pointers.
pub(super) fn write_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    (addr, size): (usize, usize),
) {
    if !dptr.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *dptr = addr as CUdeviceptr };
    }
    if !bytes.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *bytes = size };
    }
}

mock_fns! {
    fn cuModuleLoadData = cu_module_load_data(w, s, out: *mut CUmodule, image: *const c_void) [init] {
        // SAFETY: the caller passes a writable out-pointer and a valid image.
        unsafe { load_data(w, &mut s, out, image) }
    }
    fn cuModuleLoadDataEx = cu_module_load_data_ex(w, s, out: *mut CUmodule, image: *const c_void, n: c_uint, options: *mut CUjit_option, values: *mut *mut c_void) [init] {
        // JIT options change nothing here; they are accepted when well formed.
        if n > 0 && (options.is_null() || values.is_null()) {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: as for cuModuleLoadData.
        unsafe { load_data(w, &mut s, out, image) }
    }
    fn cuModuleUnload = cu_module_unload(w, s, module: CUmodule) [init] {
        let _ = w;
        let h = p2h(module);
        match s.modules.get(&h).map(|m| m.library) {
            None => CUresult::CUDA_ERROR_INVALID_HANDLE,
            // A library's module goes with its library.
            Some(Some(_)) => CUresult::CUDA_ERROR_NOT_PERMITTED,
            Some(None) => {
                unload(&mut s, h, "cuModuleUnload");
                CUresult::CUDA_SUCCESS
            }
        }
    }
    fn cuModuleGetFunction = cu_module_get_function(w, s, out: *mut CUfunction, module: CUmodule, name: *const c_char) [init] {
        if out.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a NUL-terminated name (null is refused).
        let name = match unsafe { name_arg(name) } {
            Ok(n) => n,
            Err(e) => return e,
        };
        match function(w, &mut s, p2h(module), &name) {
            Ok(f) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *out = h2p(f) };
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuModuleGetGlobal = cu_module_get_global(w, s, dptr: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: *const c_char) [init] {
        let _ = w;
        // SAFETY: the caller passes a NUL-terminated name (null is refused).
        let name = match unsafe { name_arg(name) } {
            Ok(n) => n,
            Err(e) => return e,
        };
        match global(&s, p2h(module), &name) {
            Ok(g) => {
                write_global(dptr, bytes, g);
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
}
