//! `cuLaunchKernel`: checks the launch as the driver does, copies the parameters, and
//! enqueues the kernel's host function in stream order (run now, or recorded by a capture
//! and run at each replay; see [`crate::kernel`]).

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use crate::handle::p2h;
use crate::kernel::Launch;
use crate::limits;
use crate::macros::mock_fns;
use crate::op::{Op, OpKind};
use crate::queue::{check_live, enqueue, stream_ctx};
use cuda_sys::*;

/// The most bytes of parameters a kernel may take (CUDA 12.1 and later).
const MAX_PARAM_BYTES: usize = 32764;

/// Copies the launch's parameters: `params[i]` points at parameter `i`, of the size the
/// binding declares. Bindings whose parameters exceed the driver's limit are refused.
///
/// # Safety
/// `params` is null or points at `sizes.len()` pointers, each null or pointing at as
/// many readable bytes as its size says.
unsafe fn copy_params(params: *mut *mut c_void, sizes: &[usize]) -> Result<Vec<Vec<u8>>, CUresult> {
    if sizes.is_empty() {
        return Ok(Vec::new());
    }
    let total = sizes.iter().try_fold(0usize, |t, s| t.checked_add(*s));
    if total.is_none_or(|t| t > MAX_PARAM_BYTES) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut out = Vec::with_capacity(sizes.len());
    for (i, size) in sizes.iter().enumerate() {
        // SAFETY: `params` holds `sizes.len()` pointers (the caller's contract).
        let p = unsafe { *params.add(i) };
        if p.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `p` points at `size` readable bytes (the caller's contract).
        out.push(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), *size) }.to_vec());
    }
    Ok(out)
}

mock_fns! {
    fn cuLaunchKernel = cu_launch_kernel(w, s, f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) [init] {
        // Parameters packed into one buffer (`extra`) are not simulated.
        if !extra.is_null() {
            return CUresult::CUDA_ERROR_NOT_SUPPORTED;
        }
        let h = p2h(f);
        if let Err(e) = check_live(&mut s, h, "") {
            return e;
        }
        let Some((module, fctx, name, max_shared)) = s
            .functions
            .get(&h)
            .map(|x| (x.module, x.ctx, x.name.clone(), x.max_dynamic_shared))
        else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        match stream_ctx(w, &s, stream) {
            Ok(c) if c == fctx => {}
            Ok(_) => return CUresult::CUDA_ERROR_INVALID_HANDLE,
            Err(e) => return e,
        }
        let (grid, block) = ([gx, gy, gz], [bx, by, bz]);
        if !limits::valid_shape(grid, block) || shared > max_shared {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let Some(binding) = s.kernels.get(&name).cloned() else {
            return CUresult::CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller passes one pointer per kernel parameter, each to a value of
        // the parameter's size (the binding declares the sizes, as the image would).
        let params = match unsafe { copy_params(params, &binding.params) } {
            Ok(p) => p,
            Err(e) => return e,
        };
        let launch = Launch { function: h, module, name, grid, block, shared, params, f: binding.f };
        enqueue(w, s, stream, Op::new("cuLaunchKernel", OpKind::Kernel(Arc::new(launch))))
    }
}
