//! The header's initializer macros, which bindgen cannot translate, as constants.

use crate::{NCCL_API_MAGIC, NCCL_VERSION_CODE, ncclCollConfig_t, ncclConfig_t, ncclSimInfo_t};
use core::ffi::c_int;

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): "not set, let NCCL choose".
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `NCCL_CONFIG_INITIALIZER`: every field unset, sized and versioned for the 2.32 layout.
///
/// NCCL copies `min(size, its own sizeof)` bytes and ignores fields newer than `version`,
/// so this value is valid for every supported library.
pub const NCCL_CONFIG_INITIALIZER: ncclConfig_t = ncclConfig_t {
    size: core::mem::size_of::<ncclConfig_t>(),
    magic: NCCL_API_MAGIC,
    version: NCCL_VERSION_CODE,
    blocking: NCCL_CONFIG_UNDEF_INT,
    cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
    minCTAs: NCCL_CONFIG_UNDEF_INT,
    maxCTAs: NCCL_CONFIG_UNDEF_INT,
    netName: core::ptr::null(),
    splitShare: NCCL_CONFIG_UNDEF_INT,
    trafficClass: NCCL_CONFIG_UNDEF_INT,
    commName: core::ptr::null(),
    collnetEnable: NCCL_CONFIG_UNDEF_INT,
    CTAPolicy: NCCL_CONFIG_UNDEF_INT,
    shrinkShare: NCCL_CONFIG_UNDEF_INT,
    nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
    nChannelsPerNetPeer: NCCL_CONFIG_UNDEF_INT,
    nvlinkCentricSched: NCCL_CONFIG_UNDEF_INT,
    graphUsageMode: NCCL_CONFIG_UNDEF_INT,
    numRmaCtx: NCCL_CONFIG_UNDEF_INT,
    maxP2pPeers: NCCL_CONFIG_UNDEF_INT,
    graphStreamOrdering: NCCL_CONFIG_UNDEF_INT,
    launchOrderImplicit: NCCL_CONFIG_UNDEF_INT,
    numRmaSig: NCCL_CONFIG_UNDEF_INT,
    rmaEagerInit: NCCL_CONFIG_UNDEF_INT,
    hostCftMode: NCCL_CONFIG_UNDEF_INT,
    nvlsHostMode: NCCL_CONFIG_UNDEF_INT,
};

/// `NCCL_COLLCONFIG_INITIALIZER` (NCCL 2.31+ per-collective configuration).
pub const NCCL_COLLCONFIG_INITIALIZER: ncclCollConfig_t = ncclCollConfig_t {
    size: core::mem::size_of::<ncclCollConfig_t>(),
    magic: NCCL_API_MAGIC,
    version: NCCL_VERSION_CODE,
    ext: core::ptr::null_mut(),
    minCTAs: NCCL_CONFIG_UNDEF_INT,
    maxCTAs: NCCL_CONFIG_UNDEF_INT,
    nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
    cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
    algSelection: core::ptr::null(),
    forceAlgSelection: 1,
    CTAPolicy: NCCL_CONFIG_UNDEF_INT,
    userProfilerTag: 0,
    launchCompletionEvent: core::ptr::null_mut(),
};

/// `NCCL_SIM_INFO_INITIALIZER` (for `ncclGroupSimulateEnd`).
pub const NCCL_SIM_INFO_INITIALIZER: ncclSimInfo_t = ncclSimInfo_t {
    size: core::mem::size_of::<ncclSimInfo_t>(),
    magic: 0x7468_5283,
    version: NCCL_VERSION_CODE,
    estimatedTime: -1.0,
};
