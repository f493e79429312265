//! Initialisation, versions, error names and device queries: what needs no context.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint};
use std::sync::{Mutex, OnceLock};

use crate::handle::{check_ptr, ok};
use crate::limits;
use crate::macros::mock_fns;
use crate::world::World;
use cuda_sys::*;

/// A device ordinal as an index into the world's devices.
pub(super) fn device_of(w: &World, dev: CUdevice) -> Result<usize, CUresult> {
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < w.devices.len())
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// Writes `text` NUL-terminated into a caller buffer of `len` bytes, truncated to fit.
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

/// Notes the outcome of a name lookup on this thread: `Some((status, why))` for a failure,
/// whose `cuGetErrorString` then reads `simulated driver: <status words>: <why>`; `None`
/// for a success (so that no earlier detail is given for a later failure).
pub(crate) fn note_lookup(failure: Option<(CUresult, String)>) {
    let detail = failure.and_then(|(code, why)| {
        let (_, plain) = error_text(code)?;
        Some((
            code.0,
            intern(format!("{}: {why}", plain.to_string_lossy()))?,
        ))
    });
    crate::detail::set(detail);
}

/// A message that lives as long as the process: a pointer `cuGetErrorString` hands out
/// must stay valid, so each distinct message is kept once (their number is that of the
/// distinct names looked up and not found).
fn intern(msg: String) -> Option<&'static CStr> {
    static KEPT: OnceLock<Mutex<HashMap<String, &'static CStr>>> = OnceLock::new();
    let mut kept = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(c) = kept.get(&msg) {
        return Some(c);
    }
    let c: &'static CStr = Box::leak(CString::new(msg.clone()).ok()?.into_boxed_c_str());
    kept.insert(msg, c);
    Some(c)
}

/// This thread's noted detail for `code`, taken.
fn take_detail(code: CUresult) -> Option<&'static CStr> {
    crate::detail::take(code.0)
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
                let msg = take_detail(code).unwrap_or(msg);
                // SAFETY: checked non-null out-pointer; the string is static (or kept for
                // the rest of the process).
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
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE => limits::WARP as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => limits::MAX_THREADS_PER_BLOCK as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X => limits::MAX_BLOCK_DIM[0] as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => limits::MAX_BLOCK_DIM[1] as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => limits::MAX_BLOCK_DIM[2] as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => limits::MAX_GRID_DIM[0] as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y => limits::MAX_GRID_DIM[1] as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => limits::MAX_GRID_DIM[2] as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => limits::DEFAULT_DYNAMIC_SHARED as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => limits::MAX_SHARED_PER_BLOCK_OPTIN as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => limits::SHARED_PER_MULTIPROCESSOR as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => limits::MAX_THREADS_PER_MULTIPROCESSOR as c_int,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => limits::MAX_BLOCKS_PER_MULTIPROCESSOR as c_int,
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
}
