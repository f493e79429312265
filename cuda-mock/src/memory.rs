//! Device and pinned host memory: allocation, frees into the sanitizer's quarantine (both
//! done in [`crate::alloc`]), copies, memsets and pointer attributes.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::MutexGuard;

use crate::alloc::{alloc_device, free_device};
use crate::current::current;
use crate::handle::{check_ptr, h2p, ok, p2h};
use crate::macros::mock_fns;
use crate::op::{Op, OpKind};
use crate::queue::{capturing, enqueue, stream_ctx, stream_key, sync_run};
use crate::sanitizer::Side;
use crate::state::State;
use crate::world::World;
use cuda_sys::*;

/// Where (dst, src) of each kind of copy must lie, and whether it may cross devices.
type Placement = ((Side, Side), bool);
const UNIFIED: Placement = ((Side::Unified, Side::Unified), false);
const HTOD: Placement = ((Side::Device, Side::Host), false);
const DTOH: Placement = ((Side::Host, Side::Device), false);
const DTOD: Placement = ((Side::Device, Side::Device), false);
const PEER: Placement = ((Side::Device, Side::Device), true);

/// Pinned host memory: plain, zeroed, page-aligned host memory.
fn alloc_host(s: &mut State, pp: *mut *mut c_void, bytes: usize) -> Result<(), CUresult> {
    check_ptr(pp)?;
    // CUDA promises a page and no more: the memory handed out is 4096-aligned but never
    // 8192-aligned, so that code relying on more alignment fails here every time.
    const PAGE: usize = 4096;
    let size = bytes
        .max(1)
        .checked_add(PAGE)
        .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    let layout = std::alloc::Layout::from_size_align(size, 2 * PAGE)
        .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: non-zero size.
    let base = unsafe { std::alloc::alloc_zeroed(layout) };
    if base.is_null() {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: `PAGE < size`: within the allocation.
    let p = unsafe { base.add(PAGE) };
    s.host
        .insert(p.expose_provenance(), (base.expose_provenance(), layout));
    // SAFETY: checked non-null out-pointer.
    unsafe { *pp = p.cast() };
    Ok(())
}

/// A copy of `(dst, src, len)` placed as `placement` says, on `stream` or synchronous.
fn directed_copy(
    w: &World,
    s: MutexGuard<'_, State>,
    call: &'static str,
    (dst, src, len): (usize, usize, usize),
    (sides, peer): Placement,
    stream: Option<CUstream>,
) -> CUresult {
    let op = Op::new(
        call,
        OpKind::Copy {
            dst,
            src,
            len,
            sides,
            peer,
        },
    );
    match stream {
        Some(st) => enqueue(w, s, st, op),
        None => sync_run(w, s, op),
    }
}

/// A memset of `n` elements of `size` bytes, on `stream` or synchronous.
#[allow(clippy::too_many_arguments)]
fn memset(
    w: &World,
    s: MutexGuard<'_, State>,
    call: &'static str,
    dst: usize,
    value: u32,
    size: usize,
    n: usize,
    stream: Option<CUstream>,
) -> CUresult {
    let op = Op::new(
        call,
        OpKind::Memset {
            dst,
            value,
            size,
            n,
        },
    );
    match stream {
        Some(st) => enqueue(w, s, st, op),
        None => sync_run(w, s, op),
    }
}

mock_fns! {
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
        // Synchronous: the host waits for all work first, so no order check is needed.
        s.host_sync_all();
        free_device(&mut s, "cuMemFree", dptr as usize)
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
        let (key, ctx) = match stream_key(w, &s, stream) {
            Ok(k) => k,
            Err(e) => return e,
        };
        let p = dptr as usize;
        // Captured: a free node of the graph, freeing at each replay.
        if capturing(&s, key) {
            return enqueue(w, s, stream, Op::new("cuMemFreeAsync", OpKind::Free { ptr: p }));
        }
        // The free is stamped as an op of `stream`; every earlier use of the memory on
        // another stream must be ordered before it.
        if s.allocs.contains_key(&p) {
            s.stamp(key, ctx);
            s.check_free_order("cuMemFreeAsync", key, p);
        }
        free_device(&mut s, "cuMemFreeAsync", p)
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
        directed_copy(w, s, "cuMemcpy", (dst as usize, src as usize, n), UNIFIED, None)
    }
    fn cuMemcpyAsync = cu_memcpy_async(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, "cuMemcpyAsync", (dst as usize, src as usize, n), UNIFIED, Some(stream))
    }
    fn cuMemcpyHtoD = cu_memcpy_htod(w, s, dst: CUdeviceptr, src: *const c_void, n: usize) [init] {
        directed_copy(w, s, "cuMemcpyHtoD", (dst as usize, src.addr(), n), HTOD, None)
    }
    fn cuMemcpyDtoH = cu_memcpy_dtoh(w, s, dst: *mut c_void, src: CUdeviceptr, n: usize) [init] {
        directed_copy(w, s, "cuMemcpyDtoH", (dst.addr(), src as usize, n), DTOH, None)
    }
    fn cuMemcpyDtoD = cu_memcpy_dtod(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize) [init] {
        directed_copy(w, s, "cuMemcpyDtoD", (dst as usize, src as usize, n), DTOD, None)
    }
    fn cuMemcpyHtoDAsync = cu_memcpy_htod_async(w, s, dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, "cuMemcpyHtoDAsync", (dst as usize, src.addr(), n), HTOD, Some(stream))
    }
    fn cuMemcpyDtoHAsync = cu_memcpy_dtoh_async(w, s, dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, "cuMemcpyDtoHAsync", (dst.addr(), src as usize, n), DTOH, Some(stream))
    }
    fn cuMemcpyDtoDAsync = cu_memcpy_dtod_async(w, s, dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) [init] {
        directed_copy(w, s, "cuMemcpyDtoDAsync", (dst as usize, src as usize, n), DTOD, Some(stream))
    }
    fn cuMemcpyPeer = cu_memcpy_peer(w, s, dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) [init] {
        if !s.contexts.contains_key(&p2h(dctx)) || !s.contexts.contains_key(&p2h(sctx)) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        directed_copy(w, s, "cuMemcpyPeer", (dst as usize, src as usize, n), PEER, None)
    }
    fn cuMemcpyPeerAsync = cu_memcpy_peer_async(w, s, dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, stream: CUstream) [init] {
        if !s.contexts.contains_key(&p2h(dctx)) || !s.contexts.contains_key(&p2h(sctx)) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        directed_copy(w, s, "cuMemcpyPeerAsync", (dst as usize, src as usize, n), PEER, Some(stream))
    }
    fn cuMemsetD8 = cu_memset_d8(w, s, dst: CUdeviceptr, v: u8, n: usize) [init] {
        memset(w, s, "cuMemsetD8", dst as usize, u32::from(v), 1, n, None)
    }
    fn cuMemsetD16 = cu_memset_d16(w, s, dst: CUdeviceptr, v: u16, n: usize) [init] {
        memset(w, s, "cuMemsetD16", dst as usize, u32::from(v), 2, n, None)
    }
    fn cuMemsetD32 = cu_memset_d32(w, s, dst: CUdeviceptr, v: c_uint, n: usize) [init] {
        memset(w, s, "cuMemsetD32", dst as usize, v, 4, n, None)
    }
    fn cuMemsetD8Async = cu_memset_d8_async(w, s, dst: CUdeviceptr, v: u8, n: usize, stream: CUstream) [init] {
        memset(w, s, "cuMemsetD8Async", dst as usize, u32::from(v), 1, n, Some(stream))
    }
    fn cuMemsetD16Async = cu_memset_d16_async(w, s, dst: CUdeviceptr, v: u16, n: usize, stream: CUstream) [init] {
        memset(w, s, "cuMemsetD16Async", dst as usize, u32::from(v), 2, n, Some(stream))
    }
    fn cuMemsetD32Async = cu_memset_d32_async(w, s, dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream) [init] {
        memset(w, s, "cuMemsetD32Async", dst as usize, v, 4, n, Some(stream))
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
}
