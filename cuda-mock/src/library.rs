//! Libraries: context-independent code (`cuLibraryLoadData`). A library loads a module
//! into a context the first time a kernel's function or a global is asked for there
//! (what the driver's lazy loading does), and unloads them all with itself.

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void};

use crate::current::current;
use crate::handle::{h2p, p2h};
use crate::image;
use crate::macros::mock_fns;
use crate::module::{self, name_arg, write_global};
use crate::state::{KernelInfo, LibraryInfo, State};
use crate::world::World;
use cuda_sys::*;

/// The library's module in the current context, loaded now if it is not yet.
fn module_here(w: &World, s: &mut State, lib: usize) -> Result<usize, CUresult> {
    let ctx = current(w, s)?;
    let l = s
        .libraries
        .get(&lib)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(m) = l.modules.get(&ctx) {
        return Ok(*m);
    }
    let image = l.image.clone();
    let m = module::load(w, s, ctx, image, Some(lib))?;
    if let Some(l) = s.libraries.get_mut(&lib) {
        l.modules.insert(ctx, m);
    }
    Ok(m)
}

mock_fns! {
    fn cuLibraryLoadData = cu_library_load_data(w, s, out: *mut CUlibrary, code: *const c_void, jit: *mut CUjit_option, jit_values: *mut *mut c_void, n_jit: c_uint, opts: *mut CUlibraryOption, opt_values: *mut *mut c_void, n_opts: c_uint) [init] {
        // Options change nothing here; they are accepted when well formed.
        if out.is_null()
            || code.is_null()
            || (n_jit > 0 && (jit.is_null() || jit_values.is_null()))
            || (n_opts > 0 && (opts.is_null() || opt_values.is_null()))
        {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null; the caller passes a valid image.
        let image = match unsafe { image::read(code) } {
            Ok(i) => i,
            Err(e) => return e,
        };
        let h = s.handle(w.id);
        s.libraries.insert(h, LibraryInfo { image, modules: HashMap::new(), kernels: HashMap::new() });
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(h) };
        CUresult::CUDA_SUCCESS
    }
    fn cuLibraryUnload = cu_library_unload(w, s, library: CUlibrary) [init] {
        let _ = w;
        let Some(l) = s.libraries.remove(&p2h(library)) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        for m in l.modules.into_values() {
            module::unload(&mut s, m, "cuLibraryUnload");
        }
        for k in l.kernels.into_values() {
            s.library_kernels.remove(&k);
        }
        CUresult::CUDA_SUCCESS
    }
    fn cuLibraryGetKernel = cu_library_get_kernel(w, s, out: *mut CUkernel, library: CUlibrary, name: *const c_char) [init] {
        if out.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller passes a NUL-terminated name (null is refused).
        let name = match unsafe { name_arg(name) } {
            Ok(n) => n,
            Err(e) => return e,
        };
        let lib = p2h(library);
        let Some(l) = s.libraries.get(&lib) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        let k = match l.kernels.get(name.as_ref()) {
            Some(k) => *k,
            None if l.image.declares(&name) && s.kernels.contains_key(name.as_ref()) => {
                let k = s.handle(w.id);
                s.library_kernels.insert(k, KernelInfo { library: lib, name: name.to_string() });
                if let Some(l) = s.libraries.get_mut(&lib) {
                    l.kernels.insert(name.to_string(), k);
                }
                k
            }
            None => {
                let bound = s.kernels.contains_key(name.as_ref());
                let why = crate::image::missing_kernel(&l.image, bound, &name);
                crate::init::note_lookup(Some((CUresult::CUDA_ERROR_NOT_FOUND, why)));
                return CUresult::CUDA_ERROR_NOT_FOUND;
            }
        };
        // SAFETY: checked non-null out-pointer.
        unsafe { *out = h2p(k) };
        CUresult::CUDA_SUCCESS
    }
    fn cuKernelGetFunction = cu_kernel_get_function(w, s, out: *mut CUfunction, kernel: CUkernel) [init] {
        if out.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let Some((lib, name)) = s.library_kernels.get(&p2h(kernel)).map(|k| (k.library, k.name.clone())) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        let f = module_here(w, &mut s, lib).and_then(|m| module::function(w, &mut s, m, &name));
        match f {
            Ok(f) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *out = h2p(f) };
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
    fn cuLibraryGetGlobal = cu_library_get_global(w, s, dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) [init] {
        // SAFETY: the caller passes a NUL-terminated name (null is refused).
        let name = match unsafe { name_arg(name) } {
            Ok(n) => n,
            Err(e) => return e,
        };
        match module_here(w, &mut s, p2h(library)).and_then(|m| module::global(&s, m, &name)) {
            Ok(g) => {
                write_global(dptr, bytes, g);
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        }
    }
}
