//! Occupancy: deterministic figures from the device limits (see
//! [`limits::blocks_per_multiprocessor`]), so tests can assert exact values.

use std::ffi::c_int;

use crate::function::func;
use crate::limits;
use crate::macros::mock_fns;
use crate::world::World;
use cuda_sys::*;

/// The multiprocessor count of a context's device.
fn multiprocessors(w: &World, s: &crate::state::State, ctx: usize) -> u32 {
    s.contexts
        .get(&ctx)
        .and_then(|c| w.devices.get(c.device as usize))
        .map(|d| u32::try_from(d.multiprocessors).unwrap_or(0))
        .unwrap_or(0)
}

mock_fns! {
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor = cu_occupancy_max_active_blocks(w, s, n: *mut c_int, f: CUfunction, block: c_int, shared: usize) [init] {
        let _ = w;
        let max_shared = match func(&s, f) {
            Ok(x) => x.max_dynamic_shared,
            Err(e) => return e,
        };
        let Ok(threads) = u32::try_from(block) else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        if n.is_null() || threads == 0 {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let blocks = limits::blocks_per_multiprocessor(threads, shared, max_shared);
        // SAFETY: checked non-null out-pointer.
        unsafe { *n = blocks as c_int };
        CUresult::CUDA_SUCCESS
    }
    fn cuOccupancyMaxPotentialBlockSize = cu_occupancy_max_potential_block_size(w, s, min_grid: *mut c_int, block_size: *mut c_int, f: CUfunction, b2d: CUoccupancyB2DSize, shared: usize, limit: c_int) [init] {
        let (ctx, max_shared) = match func(&s, f) {
            Ok(x) => (x.ctx, x.max_dynamic_shared),
            Err(e) => return e,
        };
        if min_grid.is_null() || block_size.is_null() || limit < 0 {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let sms = multiprocessors(w, &s, ctx);
        // The callback is the caller's code, which may call the driver: unlock first.
        drop(s);
        let top = match u32::try_from(limit) {
            Ok(l) if l > 0 => l.min(limits::MAX_THREADS_PER_BLOCK),
            _ => limits::MAX_THREADS_PER_BLOCK,
        };
        // Candidates: the top size, then every smaller multiple of a warp. The first with
        // the most resident threads wins (so the largest block among equals).
        let candidates = std::iter::once(top)
            .chain((1..=top / limits::WARP).rev().map(|k| k * limits::WARP).filter(|b| *b < top));
        let mut best = (0u32, 0u32, 0u32); // (threads resident, block size, blocks per SM)
        for b in candidates {
            let smem = match b2d {
                // SAFETY: the caller's callback, given a block size as documented.
                Some(cb) => unsafe { cb(b as c_int) },
                None => shared,
            };
            let blocks = limits::blocks_per_multiprocessor(b, smem, max_shared);
            if blocks * b > best.0 {
                best = (blocks * b, b, blocks);
            }
        }
        // SAFETY: checked non-null out-pointers.
        unsafe {
            *block_size = best.1 as c_int;
            *min_grid = c_int::try_from(best.2.saturating_mul(sms)).unwrap_or(c_int::MAX);
        }
        CUresult::CUDA_SUCCESS
    }
}
