//! The driver function table: what `cuda-hal` needs, resolved through `cuGetProcAddress`.

use crate::*;

/// The CUDA version whose ABI every required entry is resolved at (12.0).
///
/// `cuGetProcAddress(name, PINNED_API_VERSION, ...)` returns the variant of `name` that a
/// program compiled against CUDA 12.0 would call, e.g. `cuMemAlloc_v2`, never the 3.x-era
/// `cuMemAlloc` that a plain `dlsym("cuMemAlloc")` returns. The signatures come from the
/// CUDA 12.9 header, whose default names keep the 12.0 ABI for every function 12.0 had.
///
/// ```
/// use cuda_sys::{DriverFns, DriverVersion, PINNED_API_VERSION};
/// assert_eq!(DriverVersion(PINNED_API_VERSION).to_string(), "12.0");
/// // `cuMemAlloc` is the `_v2` ABI variant (64-bit sizes) at that version.
/// let sig = DriverFns::SIGNATURES.iter().find(|(name, _)| *name == "cuMemAlloc");
/// assert_eq!(sig, Some(&("cuMemAlloc", "PFN_cuMemAlloc_v2")));
/// ```
pub const PINNED_API_VERSION: i32 = 12000;

/// The oldest driver API version this crate loads (CUDA 12.0, driver 525); an older one
/// is refused with [`LoadError::Unusable`](crate::LoadError::Unusable) and
/// [`Reason::TooOld`](crate::dylib::Reason::TooOld).
pub const MINIMUM_DRIVER_VERSION: i32 = 12000;

crate::fn_table! {
    /// The CUDA driver functions, resolved at run time.
    ///
    /// Field names are the API names; each field's type is the signature of the ABI
    /// variant that `cuGetProcAddress` returns for it at [`PINNED_API_VERSION`]
    /// (optional entries: at the version that introduced them).
    ///
    /// Optional entries are `Option`s: `None` on a driver older than the version that
    /// introduced them, as on this simulated 12.4 driver:
    ///
    /// ```
    /// use cuda_sys::DriverFns;
    /// use cuda_mock::MockDriver;
    ///
    /// let (driver, _world) = MockDriver::with_devices(1).version(12040).build()?;
    /// let fns: &DriverFns = driver.fns();
    /// assert!(fns.cuFuncGetParamInfo.is_some(), "new in 12.4");
    /// assert!(fns.cuStreamGetDevice.is_none(), "new in 12.8");
    /// assert!(DriverFns::OPTIONAL.contains(&("cuStreamGetDevice", 12080)));
    /// assert!(fns.optional_present().contains(&("cuStreamGetDevice", false)));
    /// assert!(DriverFns::REQUIRED.contains(&"cuMemAlloc"));
    /// assert!(fns.address_of("cuMemAlloc").is_some());
    /// assert_eq!(fns.address_of("cuNoSuchFunction"), None);
    /// # Ok::<(), cuda_sys::LoadError>(())
    /// ```
    pub struct DriverFns;
    min = PINNED_API_VERSION;
    required {
        cuInit: PFN_cuInit,
        cuDriverGetVersion: PFN_cuDriverGetVersion,
        cuGetErrorName: PFN_cuGetErrorName,
        cuGetErrorString: PFN_cuGetErrorString,
        cuDeviceGetCount: PFN_cuDeviceGetCount,
        cuDeviceGet: PFN_cuDeviceGet,
        cuDeviceGetName: PFN_cuDeviceGetName,
        cuDeviceGetUuid: PFN_cuDeviceGetUuid_v2,
        cuDeviceGetPCIBusId: PFN_cuDeviceGetPCIBusId,
        cuDeviceGetByPCIBusId: PFN_cuDeviceGetByPCIBusId,
        cuDeviceGetAttribute: PFN_cuDeviceGetAttribute,
        cuDeviceTotalMem: PFN_cuDeviceTotalMem_v2,
        cuDeviceCanAccessPeer: PFN_cuDeviceCanAccessPeer,
        cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease: PFN_cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxGetState: PFN_cuDevicePrimaryCtxGetState,
        cuCtxSetCurrent: PFN_cuCtxSetCurrent,
        cuCtxGetCurrent: PFN_cuCtxGetCurrent,
        cuCtxPushCurrent: PFN_cuCtxPushCurrent_v2,
        cuCtxPopCurrent: PFN_cuCtxPopCurrent_v2,
        cuCtxGetDevice: PFN_cuCtxGetDevice,
        cuCtxSynchronize: PFN_cuCtxSynchronize,
        cuCtxEnablePeerAccess: PFN_cuCtxEnablePeerAccess,
        cuStreamCreate: PFN_cuStreamCreate,
        cuStreamCreateWithPriority: PFN_cuStreamCreateWithPriority,
        cuStreamDestroy: PFN_cuStreamDestroy_v2,
        cuStreamSynchronize: PFN_cuStreamSynchronize,
        cuStreamQuery: PFN_cuStreamQuery,
        cuStreamWaitEvent: PFN_cuStreamWaitEvent,
        cuStreamGetCtx: PFN_cuStreamGetCtx,
        cuStreamBeginCapture: PFN_cuStreamBeginCapture_v2,
        cuStreamEndCapture: PFN_cuStreamEndCapture,
        cuStreamIsCapturing: PFN_cuStreamIsCapturing,
        cuLaunchHostFunc: PFN_cuLaunchHostFunc,
        cuEventCreate: PFN_cuEventCreate,
        cuEventDestroy: PFN_cuEventDestroy_v2,
        cuEventRecord: PFN_cuEventRecord,
        cuEventSynchronize: PFN_cuEventSynchronize,
        cuEventQuery: PFN_cuEventQuery,
        cuEventElapsedTime: PFN_cuEventElapsedTime,
        cuMemGetInfo: PFN_cuMemGetInfo_v2,
        cuMemAlloc: PFN_cuMemAlloc_v2,
        cuMemFree: PFN_cuMemFree_v2,
        cuMemAllocAsync: PFN_cuMemAllocAsync,
        cuMemFreeAsync: PFN_cuMemFreeAsync,
        cuMemAllocHost: PFN_cuMemAllocHost_v2,
        cuMemHostAlloc: PFN_cuMemHostAlloc,
        cuMemFreeHost: PFN_cuMemFreeHost,
        cuMemcpy: PFN_cuMemcpy,
        cuMemcpyAsync: PFN_cuMemcpyAsync,
        cuMemcpyHtoD: PFN_cuMemcpyHtoD_v2,
        cuMemcpyDtoH: PFN_cuMemcpyDtoH_v2,
        cuMemcpyDtoD: PFN_cuMemcpyDtoD_v2,
        cuMemcpyHtoDAsync: PFN_cuMemcpyHtoDAsync_v2,
        cuMemcpyDtoHAsync: PFN_cuMemcpyDtoHAsync_v2,
        cuMemcpyDtoDAsync: PFN_cuMemcpyDtoDAsync_v2,
        cuMemcpyPeer: PFN_cuMemcpyPeer,
        cuMemcpyPeerAsync: PFN_cuMemcpyPeerAsync,
        cuMemsetD8: PFN_cuMemsetD8_v2,
        cuMemsetD16: PFN_cuMemsetD16_v2,
        cuMemsetD32: PFN_cuMemsetD32_v2,
        cuMemsetD8Async: PFN_cuMemsetD8Async,
        cuMemsetD16Async: PFN_cuMemsetD16Async,
        cuMemsetD32Async: PFN_cuMemsetD32Async,
        cuPointerGetAttribute: PFN_cuPointerGetAttribute,
        cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags,
        cuGraphLaunch: PFN_cuGraphLaunch,
        cuGraphExecDestroy: PFN_cuGraphExecDestroy,
        cuGraphDestroy: PFN_cuGraphDestroy,
        cuStreamGetCaptureInfo: PFN_cuStreamGetCaptureInfo_v2,
        cuUserObjectCreate: PFN_cuUserObjectCreate,
        cuUserObjectRelease: PFN_cuUserObjectRelease,
        cuGraphRetainUserObject: PFN_cuGraphRetainUserObject,
        cuModuleLoadData: PFN_cuModuleLoadData,
        cuModuleLoadDataEx: PFN_cuModuleLoadDataEx,
        cuModuleUnload: PFN_cuModuleUnload,
        cuModuleGetFunction: PFN_cuModuleGetFunction,
        cuModuleGetGlobal: PFN_cuModuleGetGlobal_v2,
        cuLibraryLoadData: PFN_cuLibraryLoadData,
        cuLibraryUnload: PFN_cuLibraryUnload,
        cuLibraryGetKernel: PFN_cuLibraryGetKernel,
        cuLibraryGetGlobal: PFN_cuLibraryGetGlobal,
        cuKernelGetFunction: PFN_cuKernelGetFunction,
        cuLaunchKernel: PFN_cuLaunchKernel,
        cuFuncGetAttribute: PFN_cuFuncGetAttribute,
        cuFuncSetAttribute: PFN_cuFuncSetAttribute,
        cuOccupancyMaxActiveBlocksPerMultiprocessor: PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor,
        cuOccupancyMaxPotentialBlockSize: PFN_cuOccupancyMaxPotentialBlockSize,
    }
    optional {
        cuCtxRecordEvent: PFN_cuCtxRecordEvent = since::cuCtxRecordEvent,
        cuCtxWaitEvent: PFN_cuCtxWaitEvent = since::cuCtxWaitEvent,
        cuStreamGetDevice: PFN_cuStreamGetDevice = since::cuStreamGetDevice,
        cuFuncGetName: PFN_cuFuncGetName = since::cuFuncGetName,
        cuFuncGetParamInfo: PFN_cuFuncGetParamInfo = since::cuFuncGetParamInfo,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CUDA version whose header first declares the symbol of a signature type
    /// (`PFN_cuMemAlloc_v2`: `cuMemAlloc_v2`); `None`: every header read (12.0 on) has it.
    fn since(signature: &str) -> Option<i32> {
        let symbol = signature.strip_prefix("PFN_").expect("a PFN_ type");
        let entry = crate::since::FUNCTIONS.iter().find(|(n, _)| *n == symbol);
        entry.map(|(_, v)| *v)
    }

    #[test]
    fn required_entries_are_in_the_oldest_header() {
        for (name, signature) in &DriverFns::SIGNATURES[..DriverFns::REQUIRED.len()] {
            assert_eq!(
                since(signature),
                None,
                "{name} ({signature}) is newer than 12.0"
            );
        }
    }

    #[test]
    fn optional_entries_are_gated_at_their_own_release() {
        let optional = &DriverFns::SIGNATURES[DriverFns::REQUIRED.len()..];
        for ((name, v), (same, signature)) in DriverFns::OPTIONAL.iter().zip(optional) {
            assert_eq!(name, same);
            // Each entry names its version twice (field and constant): the same name.
            assert_eq!(since(signature), Some(*v), "{name} ({signature})");
            assert!(*v > MINIMUM_DRIVER_VERSION, "{name}");
        }
    }
}
