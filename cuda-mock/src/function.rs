//! Function queries and settings: attributes, the parameter layout and the name.
//!
//! Every simulated function reports 1024 threads per block, 32 registers per thread, no
//! static shared, constant or local memory, and PTX and binary versions equal to its
//! device's compute capability (90 for 9.0). Its dynamic shared memory allowance is 48 KiB
//! until raised with `cuFuncSetAttribute`, up to the device's opt-in limit (227 KiB).

use std::ffi::{CString, c_char, c_int};

use crate::handle::p2h;
use crate::limits;
use crate::macros::mock_fns;
use crate::state::{FuncInfo, State};
use crate::world::World;
use cuda_sys::*;

/// Parameter offsets in the kernel's parameter buffer, for parameters of `sizes` bytes:
/// each is aligned to the largest power of two that divides its size, at most 8 (the
/// natural alignment of scalars and pointers; structs are assumed aligned like their
/// size allows).
pub(super) fn param_offsets(sizes: &[usize]) -> Vec<usize> {
    let mut end = 0usize;
    sizes
        .iter()
        .map(|size| {
            let align = match size {
                0 => 1,
                s => 1usize << s.trailing_zeros().min(3),
            };
            let offset = end.next_multiple_of(align);
            end = offset + size;
            offset
        })
        .collect()
}

/// The function `f`, or `CUDA_ERROR_INVALID_HANDLE`.
pub(super) fn func(s: &State, f: CUfunction) -> Result<&FuncInfo, CUresult> {
    s.functions
        .get(&p2h(f))
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// The compute capability of a context's device as the driver encodes versions (`90`).
fn version_of(w: &World, s: &State, ctx: usize) -> c_int {
    let (major, minor) = s
        .contexts
        .get(&ctx)
        .and_then(|c| w.devices.get(c.device as usize))
        .map(|d| d.compute_capability)
        .unwrap_or((0, 0));
    major.saturating_mul(10).saturating_add(minor)
}

mock_fns! {
    fn cuFuncGetAttribute = cu_func_get_attribute(w, s, pi: *mut c_int, attrib: CUfunction_attribute, f: CUfunction) [init] {
        let (ctx, max_dynamic) = match func(&s, f) {
            Ok(x) => (x.ctx, x.max_dynamic_shared),
            Err(e) => return e,
        };
        if pi.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        type A = CUfunction_attribute;
        let v = match attrib {
            A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => limits::MAX_THREADS_PER_BLOCK as c_int,
            A::CU_FUNC_ATTRIBUTE_NUM_REGS => limits::REGISTERS_PER_THREAD,
            A::CU_FUNC_ATTRIBUTE_PTX_VERSION | A::CU_FUNC_ATTRIBUTE_BINARY_VERSION => version_of(w, &s, ctx),
            A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => max_dynamic as c_int,
            A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
            a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => 0,
            _ => return CUresult::CUDA_ERROR_INVALID_VALUE,
        };
        // SAFETY: checked non-null out-pointer.
        unsafe { *pi = v };
        CUresult::CUDA_SUCCESS
    }
    fn cuFuncSetAttribute = cu_func_set_attribute(w, s, f: CUfunction, attrib: CUfunction_attribute, value: c_int) [init] {
        let _ = w;
        let Some(info) = s.functions.get_mut(&p2h(f)) else {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        };
        type A = CUfunction_attribute;
        match attrib {
            A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => match u32::try_from(value) {
                Ok(v) if v <= limits::MAX_SHARED_PER_BLOCK_OPTIN => {
                    info.max_dynamic_shared = v;
                    CUresult::CUDA_SUCCESS
                }
                _ => CUresult::CUDA_ERROR_INVALID_VALUE,
            },
            // A hint only: accepted in range, changes nothing.
            A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT if (-1..=100).contains(&value) => {
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn cuFuncGetParamInfo = cu_func_get_param_info(w, s, f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) [init] {
        let _ = w;
        let name = match func(&s, f) {
            Ok(x) => x.name.clone(),
            Err(e) => return e,
        };
        let sizes = s.kernels.get(&name).map(|b| b.params.clone()).unwrap_or_default();
        let offsets = param_offsets(&sizes);
        match (offsets.get(index), sizes.get(index)) {
            (Some(o), Some(n)) if !offset.is_null() => {
                // SAFETY: checked non-null out-pointer; `size` is optional.
                unsafe {
                    *offset = *o;
                    if !size.is_null() {
                        *size = *n;
                    }
                }
                CUresult::CUDA_SUCCESS
            }
            _ => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }
    fn cuFuncGetName = cu_func_get_name(w, s, out: *mut *const c_char, f: CUfunction) [init] {
        let _ = w;
        let name = match func(&s, f) {
            Ok(x) => x.name.clone(),
            Err(e) => return e,
        };
        if out.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // Kept for the world's life: the pointer outlives the function, as callers of
        // the real driver may (wrongly) assume.
        let text = s
            .names
            .entry(name.clone())
            .or_insert_with(|| CString::new(name).unwrap_or_default());
        // SAFETY: checked non-null out-pointer; the string lives as long as the world.
        unsafe { *out = text.as_ptr() };
        CUresult::CUDA_SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::param_offsets;

    #[test]
    fn offsets_align_each_parameter_naturally() {
        // u8, f64, u16, a 12-byte struct (aligned 4), u64, u32
        assert_eq!(param_offsets(&[1, 8, 2, 12, 8, 4]), [0, 8, 16, 20, 32, 40]);
        assert_eq!(param_offsets(&[]), Vec::<usize>::new());
        assert_eq!(param_offsets(&[4, 16]), [0, 8], "at most 8-byte alignment");
    }
}
