//! The NCCL function table: every public `nccl*` function of `nccl.h` 2.32.
//!
//! Required entries exist in every NCCL from [`NcclVersion::MINIMUM`] on; each optional
//! entry names the release that introduced it (NCCL's own header history) and is resolved
//! only when `ncclGetVersion` reports at least that release. The `pnccl*` profiling twins
//! are the same entry points and are not in the table (their types are generated).

use std::ffi::CStr;

use crate::NcclVersion;
use crate::*;

const fn v(major: i32, minor: i32, patch: i32) -> i32 {
    NcclVersion::new(major, minor, patch).0
}

const MIN: i32 = NcclVersion::MINIMUM.0;

cuda_sys::fn_table! {
    /// The NCCL functions, resolved at run time with `dlsym`.
    ///
    /// Entries newer than [`NcclVersion::MINIMUM`] are `Option`s, present only when the
    /// library reports the release that introduced them:
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use nccl_mock::MockNccl;
    /// use nccl_sys::{NcclFns, NcclVersion};
    ///
    /// let (_driver, gpus) = MockDriver::with_devices(1).build()?;
    /// let (nccl, _world) = MockNccl::new(&gpus).version(NcclVersion::new(2, 21, 5)).build()?;
    /// let fns: &NcclFns = nccl.fns();
    /// assert!(fns.ncclMemAlloc.is_some(), "since 2.19");
    /// assert!(fns.ncclCommShrink.is_none(), "since 2.27");
    /// assert!(NcclFns::OPTIONAL.contains(&("ncclCommShrink", NcclVersion::new(2, 27, 0).0)));
    /// assert!(NcclFns::REQUIRED.contains(&"ncclAllReduce"));
    /// # Ok::<(), nccl_sys::LoadError>(())
    /// ```
    pub struct NcclFns;
    min = MIN;
    required {
        ncclGetVersion: PFN_ncclGetVersion,
        ncclGetUniqueId: PFN_ncclGetUniqueId,
        ncclCommInitRankConfig: PFN_ncclCommInitRankConfig,
        ncclCommInitRank: PFN_ncclCommInitRank,
        ncclCommInitAll: PFN_ncclCommInitAll,
        ncclCommFinalize: PFN_ncclCommFinalize,
        ncclCommDestroy: PFN_ncclCommDestroy,
        ncclCommAbort: PFN_ncclCommAbort,
        ncclCommSplit: PFN_ncclCommSplit,
        ncclGetErrorString: PFN_ncclGetErrorString,
        ncclGetLastError: PFN_ncclGetLastError,
        ncclCommGetAsyncError: PFN_ncclCommGetAsyncError,
        ncclCommCount: PFN_ncclCommCount,
        ncclCommCuDevice: PFN_ncclCommCuDevice,
        ncclCommUserRank: PFN_ncclCommUserRank,
        ncclRedOpCreatePreMulSum: PFN_ncclRedOpCreatePreMulSum,
        ncclRedOpDestroy: PFN_ncclRedOpDestroy,
        ncclReduce: PFN_ncclReduce,
        ncclBcast: PFN_ncclBcast,
        ncclBroadcast: PFN_ncclBroadcast,
        ncclAllReduce: PFN_ncclAllReduce,
        ncclReduceScatter: PFN_ncclReduceScatter,
        ncclAllGather: PFN_ncclAllGather,
        ncclSend: PFN_ncclSend,
        ncclRecv: PFN_ncclRecv,
        ncclGroupStart: PFN_ncclGroupStart,
        ncclGroupEnd: PFN_ncclGroupEnd,
    }
    optional {
        ncclMemAlloc: PFN_ncclMemAlloc = v(2, 19, 0),
        ncclMemFree: PFN_ncclMemFree = v(2, 19, 0),
        ncclCommRegister: PFN_ncclCommRegister = v(2, 19, 0),
        ncclCommDeregister: PFN_ncclCommDeregister = v(2, 19, 0),
        ncclGroupSimulateEnd: PFN_ncclGroupSimulateEnd = v(2, 22, 0),
        ncclCommInitRankScalable: PFN_ncclCommInitRankScalable = v(2, 23, 0),
        ncclCommShrink: PFN_ncclCommShrink = v(2, 27, 0),
        ncclCommWindowRegister: PFN_ncclCommWindowRegister = v(2, 27, 0),
        ncclCommWindowDeregister: PFN_ncclCommWindowDeregister = v(2, 27, 0),
        ncclAlltoAll: PFN_ncclAlltoAll = v(2, 28, 3),
        ncclGather: PFN_ncclGather = v(2, 28, 3),
        ncclScatter: PFN_ncclScatter = v(2, 28, 3),
        ncclCommRevoke: PFN_ncclCommRevoke = v(2, 28, 7),
        ncclCommGetUniqueId: PFN_ncclCommGetUniqueId = v(2, 29, 2),
        ncclCommGrow: PFN_ncclCommGrow = v(2, 29, 2),
        ncclPutSignal: PFN_ncclPutSignal = v(2, 29, 2),
        ncclSignal: PFN_ncclSignal = v(2, 29, 2),
        ncclWaitSignal: PFN_ncclWaitSignal = v(2, 29, 2),
        ncclWinGetUserPtr: PFN_ncclWinGetUserPtr = v(2, 29, 2),
        ncclCommSuspend: PFN_ncclCommSuspend = v(2, 29, 7),
        ncclCommResume: PFN_ncclCommResume = v(2, 29, 7),
        ncclCommMemStats: PFN_ncclCommMemStats = v(2, 29, 7),
        ncclParamBind: PFN_ncclParamBind = v(2, 30, 4),
        ncclParamGetStr: PFN_ncclParamGetStr = v(2, 30, 4),
        ncclParamGet: PFN_ncclParamGet = v(2, 30, 4),
        ncclParamGetI8: PFN_ncclParamGetI8 = v(2, 30, 4),
        ncclParamGetI16: PFN_ncclParamGetI16 = v(2, 30, 4),
        ncclParamGetI32: PFN_ncclParamGetI32 = v(2, 30, 4),
        ncclParamGetI64: PFN_ncclParamGetI64 = v(2, 30, 4),
        ncclParamGetU8: PFN_ncclParamGetU8 = v(2, 30, 4),
        ncclParamGetU16: PFN_ncclParamGetU16 = v(2, 30, 4),
        ncclParamGetU32: PFN_ncclParamGetU32 = v(2, 30, 4),
        ncclParamGetU64: PFN_ncclParamGetU64 = v(2, 30, 4),
        ncclParamGetParameter: PFN_ncclParamGetParameter = v(2, 30, 4),
        ncclParamGetAllParameterKeys: PFN_ncclParamGetAllParameterKeys = v(2, 30, 4),
        ncclParamDumpAll: PFN_ncclParamDumpAll = v(2, 30, 4),
        ncclAllReduceConfig: PFN_ncclAllReduceConfig = v(2, 31, 0),
        ncclBroadcastConfig: PFN_ncclBroadcastConfig = v(2, 31, 0),
        ncclReduceConfig: PFN_ncclReduceConfig = v(2, 31, 0),
        ncclAllGatherConfig: PFN_ncclAllGatherConfig = v(2, 31, 0),
        ncclReduceScatterConfig: PFN_ncclReduceScatterConfig = v(2, 31, 0),
        ncclAlltoAllConfig: PFN_ncclAlltoAllConfig = v(2, 31, 0),
        ncclGatherConfig: PFN_ncclGatherConfig = v(2, 31, 0),
        ncclScatterConfig: PFN_ncclScatterConfig = v(2, 31, 0),
        ncclSetEncryption: PFN_ncclSetEncryption = v(2, 32, 0),
    }
}

impl NcclFns {
    /// `ncclGetErrorString(result)` as a Rust string (`nccl.error_string(rc)` on a
    /// [`Nccl`](crate::Nccl), which derefs to its table).
    pub fn error_string(&self, result: ncclResult_t) -> String {
        // SAFETY: ncclGetErrorString accepts any value and returns a static string
        // (or null, checked below).
        let p = unsafe { (self.ncclGetErrorString)(result) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, static storage in the library.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_public_function_of_the_header() {
        let mut in_table: Vec<&str> = NcclFns::REQUIRED.to_vec();
        in_table.extend(NcclFns::OPTIONAL.iter().map(|(n, _)| *n));
        let mut in_header: Vec<&str> = crate::FUNCTIONS
            .iter()
            .copied()
            .filter(|f| !f.starts_with("pnccl"))
            .collect();
        in_table.sort_unstable();
        in_header.sort_unstable();
        assert_eq!(in_table, in_header);
    }

    #[test]
    fn every_pnccl_twin_has_an_nccl_original() {
        for f in crate::FUNCTIONS.iter().filter(|f| f.starts_with("pnccl")) {
            assert!(crate::FUNCTIONS.contains(&&f[1..]), "{f}");
        }
    }

    #[test]
    fn optional_versions_are_newer_than_the_minimum() {
        for (name, v) in NcclFns::OPTIONAL {
            assert!(
                *v > MIN,
                "{name} is gated at {v}, not above the minimum {MIN}"
            );
        }
    }
}
