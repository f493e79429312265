//! The NCCL function table: every public `nccl*` function of `nccl.h` 2.32.
//!
//! Required entries exist in every NCCL from [`NcclVersion::MINIMUM`] on; each optional
//! entry is resolved only when `ncclGetVersion` reports at least the release that
//! introduced it, which [`since`](crate::since) gives (generated from the pinned headers). The `pnccl*` profiling twins
//! are the same entry points and are not in the table (their types are generated).

use std::ffi::CStr;

use crate::NcclVersion;
use crate::*;

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
    /// assert!(NcclFns::OPTIONAL.contains(&("ncclCommShrink", NcclVersion::new(2, 27, 3).0)));
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
        ncclMemAlloc: PFN_ncclMemAlloc = since::ncclMemAlloc.0,
        ncclMemFree: PFN_ncclMemFree = since::ncclMemFree.0,
        ncclCommRegister: PFN_ncclCommRegister = since::ncclCommRegister.0,
        ncclCommDeregister: PFN_ncclCommDeregister = since::ncclCommDeregister.0,
        ncclGroupSimulateEnd: PFN_ncclGroupSimulateEnd = since::ncclGroupSimulateEnd.0,
        ncclCommInitRankScalable: PFN_ncclCommInitRankScalable = since::ncclCommInitRankScalable.0,
        ncclCommShrink: PFN_ncclCommShrink = since::ncclCommShrink.0,
        ncclCommWindowRegister: PFN_ncclCommWindowRegister = since::ncclCommWindowRegister.0,
        ncclCommWindowDeregister: PFN_ncclCommWindowDeregister = since::ncclCommWindowDeregister.0,
        ncclAlltoAll: PFN_ncclAlltoAll = since::ncclAlltoAll.0,
        ncclGather: PFN_ncclGather = since::ncclGather.0,
        ncclScatter: PFN_ncclScatter = since::ncclScatter.0,
        ncclCommRevoke: PFN_ncclCommRevoke = since::ncclCommRevoke.0,
        ncclCommGetUniqueId: PFN_ncclCommGetUniqueId = since::ncclCommGetUniqueId.0,
        ncclCommGrow: PFN_ncclCommGrow = since::ncclCommGrow.0,
        ncclPutSignal: PFN_ncclPutSignal = since::ncclPutSignal.0,
        ncclSignal: PFN_ncclSignal = since::ncclSignal.0,
        ncclWaitSignal: PFN_ncclWaitSignal = since::ncclWaitSignal.0,
        ncclWinGetUserPtr: PFN_ncclWinGetUserPtr = since::ncclWinGetUserPtr.0,
        ncclCommSuspend: PFN_ncclCommSuspend = since::ncclCommSuspend.0,
        ncclCommResume: PFN_ncclCommResume = since::ncclCommResume.0,
        ncclCommMemStats: PFN_ncclCommMemStats = since::ncclCommMemStats.0,
        ncclParamBind: PFN_ncclParamBind = since::ncclParamBind.0,
        ncclParamGetStr: PFN_ncclParamGetStr = since::ncclParamGetStr.0,
        ncclParamGet: PFN_ncclParamGet = since::ncclParamGet.0,
        ncclParamGetI8: PFN_ncclParamGetI8 = since::ncclParamGetI8.0,
        ncclParamGetI16: PFN_ncclParamGetI16 = since::ncclParamGetI16.0,
        ncclParamGetI32: PFN_ncclParamGetI32 = since::ncclParamGetI32.0,
        ncclParamGetI64: PFN_ncclParamGetI64 = since::ncclParamGetI64.0,
        ncclParamGetU8: PFN_ncclParamGetU8 = since::ncclParamGetU8.0,
        ncclParamGetU16: PFN_ncclParamGetU16 = since::ncclParamGetU16.0,
        ncclParamGetU32: PFN_ncclParamGetU32 = since::ncclParamGetU32.0,
        ncclParamGetU64: PFN_ncclParamGetU64 = since::ncclParamGetU64.0,
        ncclParamGetParameter: PFN_ncclParamGetParameter = since::ncclParamGetParameter.0,
        ncclParamGetAllParameterKeys: PFN_ncclParamGetAllParameterKeys = since::ncclParamGetAllParameterKeys.0,
        ncclParamDumpAll: PFN_ncclParamDumpAll = since::ncclParamDumpAll.0,
        ncclAllReduceConfig: PFN_ncclAllReduceConfig = since::ncclAllReduceConfig.0,
        ncclBroadcastConfig: PFN_ncclBroadcastConfig = since::ncclBroadcastConfig.0,
        ncclReduceConfig: PFN_ncclReduceConfig = since::ncclReduceConfig.0,
        ncclAllGatherConfig: PFN_ncclAllGatherConfig = since::ncclAllGatherConfig.0,
        ncclReduceScatterConfig: PFN_ncclReduceScatterConfig = since::ncclReduceScatterConfig.0,
        ncclAlltoAllConfig: PFN_ncclAlltoAllConfig = since::ncclAlltoAllConfig.0,
        ncclGatherConfig: PFN_ncclGatherConfig = since::ncclGatherConfig.0,
        ncclScatterConfig: PFN_ncclScatterConfig = since::ncclScatterConfig.0,
        ncclSetEncryption: PFN_ncclSetEncryption = since::ncclSetEncryption.0,
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

    /// The first release of the minimum's series that the headers were read for (2.18.1:
    /// there is no 2.18.0).
    fn oldest_supported() -> NcclVersion {
        let first = crate::since::RELEASES.iter().find(|r| r.0 >= MIN);
        *first.expect("a pinned release from the minimum on")
    }

    fn since(name: &str) -> NcclVersion {
        let entry = crate::since::FUNCTIONS.iter().find(|(n, _)| *n == name);
        entry.unwrap_or_else(|| panic!("{name} has no since")).1
    }

    #[test]
    fn required_entries_are_in_every_supported_release() {
        let oldest = oldest_supported();
        for name in NcclFns::REQUIRED {
            assert!(
                since(name) <= oldest,
                "{name} is required, but the {oldest} header lacks it (since {})",
                since(name)
            );
        }
    }

    #[test]
    fn optional_entries_are_gated_at_their_own_release() {
        let oldest = oldest_supported();
        for (name, v) in NcclFns::OPTIONAL {
            // Each entry names its version twice (field and constant): the same name.
            assert_eq!(*v, since(name).0, "{name} is gated at another's release");
            assert!(
                since(name) > oldest,
                "{name} is in every supported release ({oldest} has it): make it required"
            );
        }
    }
}
