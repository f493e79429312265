//! The header's initializer macros, which bindgen cannot translate, as constants.

use crate::{
    NCCL_API_MAGIC, NCCL_VERSION_CODE, NcclVersion, ncclCollConfig_t, ncclConfig_t, ncclSimInfo_t,
};
use core::ffi::c_int;

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): "not set, let NCCL choose".
///
/// ```
/// use nccl_sys::{NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT};
/// assert_eq!(NCCL_CONFIG_UNDEF_INT, i32::MIN);
/// assert_eq!(NCCL_CONFIG_INITIALIZER.minCTAs, NCCL_CONFIG_UNDEF_INT);
/// ```
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `NCCL_CONFIG_INITIALIZER`: every field unset, sized and versioned for the 2.32 layout.
///
/// NCCL copies `min(size, its own sizeof)` bytes and ignores fields newer than `version`,
/// so this value is valid for every supported library.
///
/// Start from it and set what matters, as C code does with the macro:
///
/// ```
/// use nccl_sys::{NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT, ncclConfig_t};
/// let config = ncclConfig_t { blocking: 0, minCTAs: 4, ..NCCL_CONFIG_INITIALIZER };
/// assert_eq!(config.size, size_of::<ncclConfig_t>());
/// assert_eq!(config.maxCTAs, NCCL_CONFIG_UNDEF_INT);
/// assert!(config.netName.is_null());
/// ```
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
///
/// ```
/// use nccl_sys::{NCCL_COLLCONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT, ncclCollConfig_t};
/// let c = ncclCollConfig_t { maxCTAs: 8, ..NCCL_COLLCONFIG_INITIALIZER };
/// assert_eq!((c.minCTAs, c.forceAlgSelection), (NCCL_CONFIG_UNDEF_INT, 1));
/// ```
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
///
/// ```
/// let info = nccl_sys::NCCL_SIM_INFO_INITIALIZER;
/// assert_eq!(info.estimatedTime, -1.0, "not simulated yet");
/// ```
pub const NCCL_SIM_INFO_INITIALIZER: ncclSimInfo_t = ncclSimInfo_t {
    size: core::mem::size_of::<ncclSimInfo_t>(),
    magic: 0x7468_5283,
    version: NCCL_VERSION_CODE,
    estimatedTime: -1.0,
};

/// One field of `ncclConfig_t` (after the `size`, `magic`, `version` header): its C name,
/// the first NCCL release whose `nccl.h` declares it ([`since::config`](crate::since::config)),
/// and its offset in the 2.32 layout.
///
/// NCCL appends fields and never reorders them, so the fields a release knows are a
/// prefix of [`CONFIG_FIELDS`], and a library ignores the fields newer than itself (or
/// than the config's `version`).
///
/// What a config must hold for a library of a given release:
///
/// ```
/// use nccl_sys::{CONFIG_FIELDS, ConfigField, NcclVersion};
/// let comm_name = ConfigField::named("commName").expect("nccl.h has it");
/// assert_eq!(comm_name.since, NcclVersion::new(2, 27, 3));
/// assert_eq!(comm_name.size, size_of::<*const std::ffi::c_char>());
/// // sizeof(ncclConfig_t) in the headers of 2.18 and 2.27.
/// assert_eq!(ConfigField::layout_size(NcclVersion::new(2, 18, 3)), 48);
/// assert_eq!(ConfigField::layout_size(NcclVersion::new(2, 27, 3)), 72);
/// // The fields a release knows are a prefix of the table.
/// let known = CONFIG_FIELDS.iter().take_while(|f| f.since <= NcclVersion::new(2, 18, 3));
/// assert_eq!(known.map(|f| f.name).collect::<Vec<_>>(), ["blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "netName", "splitShare"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigField {
    /// The C field name (`"minCTAs"`).
    pub name: &'static str,
    /// The first NCCL release that has it.
    pub since: NcclVersion,
    /// Its byte offset in [`ncclConfig_t`].
    pub offset: usize,
    /// Its size in bytes (an `int` or a `const char*`).
    pub size: usize,
}

impl ConfigField {
    /// The field named `name` (its C name), if the header has it.
    pub fn named(name: &str) -> Option<&'static ConfigField> {
        CONFIG_FIELDS.iter().find(|f| f.name == name)
    }

    /// The byte count of the layout `version` knows: up to its newest field, padded to
    /// the struct's alignment (what `sizeof(ncclConfig_t)` was in that release's header).
    pub fn layout_size(version: NcclVersion) -> usize {
        let end = CONFIG_FIELDS
            .iter()
            .filter(|f| f.since <= version)
            .map(|f| f.offset + f.size)
            .max()
            .unwrap_or(core::mem::offset_of!(ncclConfig_t, blocking));
        let align = core::mem::align_of::<ncclConfig_t>();
        end.div_ceil(align) * align
    }
}

macro_rules! config_fields {
    ($($field:ident,)*) => {
        /// Every field of `ncclConfig_t` in layout order, with the NCCL release that
        /// introduced it: [`since::config`](crate::since::config), generated from the
        /// `nccl.h` of every pinned release (its documentation has the table).
        pub const CONFIG_FIELDS: [ConfigField; [$(stringify!($field)),*].len()] = [$(
            ConfigField {
                name: stringify!($field),
                since: crate::since::config::$field,
                offset: core::mem::offset_of!(ncclConfig_t, $field),
                size: size_of_field(|c: &ncclConfig_t| &c.$field),
            },
        )*];
    };
}

/// The size of a field, from a projection (`offset_of!` has no `size_of` twin).
const fn size_of_field<T, F: Fn(&ncclConfig_t) -> &T>(field: F) -> usize {
    core::mem::forget(field);
    core::mem::size_of::<T>()
}

config_fields! {
    blocking,
    cgaClusterSize,
    minCTAs,
    maxCTAs,
    netName,
    splitShare,
    trafficClass,
    commName,
    collnetEnable,
    CTAPolicy,
    shrinkShare,
    nvlsCTAs,
    nChannelsPerNetPeer,
    nvlinkCentricSched,
    graphUsageMode,
    numRmaCtx,
    maxP2pPeers,
    graphStreamOrdering,
    launchOrderImplicit,
    numRmaSig,
    rmaEagerInit,
    hostCftMode,
    nvlsHostMode,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sim_info_initializer_is_nccl_h_s() {
        // nccl.h: { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }
        // with NCCL_UNDEF_FLOAT -1.0f.
        let i = NCCL_SIM_INFO_INITIALIZER;
        assert_eq!(
            (i.size, i.magic, i.version),
            (
                core::mem::size_of::<ncclSimInfo_t>(),
                0x7468_5283,
                NCCL_VERSION_CODE
            )
        );
        assert_eq!(i.estimatedTime.to_bits(), (-1.0f32).to_bits());
    }

    #[test]
    fn the_table_covers_every_field_in_layout_order() {
        let mut end = core::mem::offset_of!(ncclConfig_t, blocking);
        for f in &CONFIG_FIELDS {
            // Pointers are 8-aligned: an int before one leaves a 4-byte hole.
            let start = end.div_ceil(f.size) * f.size;
            assert_eq!(
                f.offset, start,
                "{} is not the field after the previous one",
                f.name
            );
            end = f.offset + f.size;
        }
        assert_eq!(end.div_ceil(8) * 8, core::mem::size_of::<ncclConfig_t>());
        assert_eq!(CONFIG_FIELDS.len(), 23);
    }

    #[test]
    fn versions_only_grow_along_the_layout() {
        for w in CONFIG_FIELDS.windows(2) {
            assert!(
                w[0].since <= w[1].since,
                "{} ({}) comes before {} ({})",
                w[0].name,
                w[0].since,
                w[1].name,
                w[1].since
            );
        }
        let last = CONFIG_FIELDS.last().map(|f| f.since);
        assert_eq!(last, Some(NcclVersion(NCCL_VERSION_CODE as i32)));
    }

    #[test]
    fn layout_sizes_match_the_headers_of_each_release() {
        // sizeof(ncclConfig_t) in each pinned release's nccl.h, as bindgen laid it out.
        for &(v, size) in crate::since::CONFIG_SIZES {
            assert_eq!(ConfigField::layout_size(v), size, "{v}");
        }
        assert_eq!(ConfigField::named("numRmaSig").map(|f| f.offset), Some(100));
        assert_eq!(ConfigField::named("nope"), None);
    }
}
