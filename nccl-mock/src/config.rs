//! `ncclConfig_t` as the simulated NCCL reads it: checked, trimmed to the fields this
//! library and the config's `version` know, and kept per communicator for tests
//! ([`MockNcclWorld::config_of`](crate::MockNcclWorld::config_of)).

use std::ffi::{CStr, c_char};

use nccl_sys::{
    ConfigField, NCCL_API_MAGIC, NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT, NCCL_VERSION_CODE,
    NcclVersion, ncclConfig_t,
};

/// The configuration a simulated communicator was created with, as NCCL sees it: the
/// caller's `ncclConfig_t` with every field the library or the config's `version` does
/// not know reset to unset (`NCCL_CONFIG_UNDEF_INT`, NULL), and the two strings copied
/// out (`raw.netName` and `raw.commName` are always NULL here).
///
/// ```
/// use cuda_mock::MockDriver;
/// use nccl_mock::MockNccl;
/// use nccl_sys::{NCCL_CONFIG_INITIALIZER, ncclConfig_t, ncclResult_t, ncclUniqueId};
///
/// let (driver, gpus) = MockDriver::with_devices(1).build()?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let (cu, f) = (driver.fns(), nccl.fns());
/// let mut config = ncclConfig_t { blocking: 1, commName: c"trainer".as_ptr(), ..NCCL_CONFIG_INITIALIZER };
/// let (mut id, mut comm, mut ctx) = (ncclUniqueId::default(), std::ptr::null_mut(), std::ptr::null_mut());
/// // SAFETY: valid out-pointers, device 0's context current, and a config whose name
/// // outlives the call; the communicator is destroyed once.
/// let seen = unsafe {
///     (cu.cuInit)(0);
///     (cu.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
///     (cu.cuCtxSetCurrent)(ctx);
///     assert_eq!((f.ncclGetUniqueId)(&mut id), ncclResult_t::ncclSuccess);
///     let rc = (f.ncclCommInitRankConfig)(&mut comm, 1, id, 0, &mut config);
///     assert_eq!(rc, ncclResult_t::ncclSuccess);
///     let seen = world.config_of(comm).expect("made with a config");
///     (f.ncclCommDestroy)(comm);
///     seen
/// };
/// assert_eq!(seen.blocking(), Some(true));
/// assert_eq!(seen.comm_name.as_deref(), Some("trainer"));
/// assert_eq!(seen.raw.minCTAs, nccl_sys::NCCL_CONFIG_UNDEF_INT);
/// # Ok::<(), nccl_sys::LoadError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockConfig {
    /// The fields; `size`, `magic` and `version` as the caller passed them.
    pub raw: ncclConfig_t,
    /// `netName`, if set and known.
    pub net_name: Option<String>,
    /// `commName`, if set and known.
    pub comm_name: Option<String>,
}

// SAFETY: the only pointers are `raw.netName` and `raw.commName`, which this type never
// dereferences (the mock stores them NULL); moving or sharing their values between
// threads is no data race.
unsafe impl Send for MockConfig {}
// SAFETY: as above: nothing behind a pointer is ever read through a `MockConfig`.
unsafe impl Sync for MockConfig {}

impl MockConfig {
    /// The explicit blocking mode: `None` when `blocking` is unset.
    pub fn blocking(&self) -> Option<bool> {
        (self.raw.blocking != NCCL_CONFIG_UNDEF_INT).then_some(self.raw.blocking != 0)
    }
}

/// The oldest config NCCL defines (2.14.3: the header words and `blocking`).
const FIRST: NcclVersion = nccl_sys::since::config::blocking;

/// Reads a caller's config as NCCL's `parseCommConfig` does: copies `min(size, sizeof)`
/// bytes, checks `magic`, and resets the fields newer than `config.version` or than the
/// library (`library`, the version the mock reports). Stricter than NCCL, which accepts
/// these silently: a `version` older than 2.14 (no config existed) and a `size` that does
/// not hold the layout its `version` claims are refused. `Ok(None)` for a NULL config.
///
/// # Safety
/// `config` is NULL or points to a config of at least `size` bytes (its first field)
/// whose non-NULL `netName` / `commName` are NUL-terminated strings: NCCL's contract.
pub(super) unsafe fn read(
    config: *const ncclConfig_t,
    library: i32,
) -> Result<Option<MockConfig>, String> {
    if config.is_null() {
        return Ok(None);
    }
    let base = config.cast::<u8>();
    // SAFETY: every config starts with its `size` (NCCL reads it the same way).
    let size = unsafe { base.cast::<usize>().read_unaligned() };
    let smallest = ConfigField::layout_size(FIRST);
    if size < smallest {
        return Err(format!(
            "ncclConfig_t size {size} is smaller than the oldest layout ({smallest} bytes, NCCL \
             {FIRST}); initialise it with NCCL_CONFIG_INITIALIZER"
        ));
    }
    let mut raw = NCCL_CONFIG_INITIALIZER;
    let n = size.min(std::mem::size_of::<ncclConfig_t>());
    // SAFETY: the caller's config holds `size` bytes, of which at most our own size is
    // copied into a local of that size; every field is an integer or a pointer, so any
    // bytes are a valid value.
    unsafe { std::ptr::copy_nonoverlapping(base, (&raw mut raw).cast::<u8>(), n) };
    if raw.magic != NCCL_API_MAGIC {
        return Err(format!(
            "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER (magic {:#x})",
            raw.magic
        ));
    }
    let claimed = NcclVersion(i32::try_from(raw.version).unwrap_or(i32::MAX));
    if claimed < FIRST {
        return Err(format!(
            "ncclConfig_t version {} is older than NCCL {FIRST}, the first with a config",
            raw.version
        ));
    }
    let layout = claimed.min(NcclVersion(NCCL_VERSION_CODE as i32));
    let needed = ConfigField::layout_size(layout);
    if size < needed {
        return Err(format!(
            "ncclConfig_t size {size} does not hold the {needed} bytes of the NCCL {layout} \
             layout its version ({}) claims",
            raw.version
        ));
    }
    // What this library sees: the fields it and the caller's version both know.
    let effective = claimed.min(NcclVersion(library));
    let mut seen = MockConfig {
        raw,
        net_name: None,
        comm_name: None,
    };
    reset_newer(&mut seen.raw, effective);
    if !matches!(seen.raw.blocking, NCCL_CONFIG_UNDEF_INT | 0 | 1) {
        return Err(format!(
            "Invalid config blocking attribute value {}",
            seen.raw.blocking
        ));
    }
    // NCCL's own rule (init.cc): positive when set, and min <= max compared as ints, so
    // a min with an unset max (INT_MIN) is refused too.
    let (min, max) = (seen.raw.minCTAs, seen.raw.maxCTAs);
    if (min != NCCL_CONFIG_UNDEF_INT && min <= 0)
        || (max != NCCL_CONFIG_UNDEF_INT && max <= 0)
        || min > max
    {
        return Err(format!(
            "Invalid config min/max channels attribute value {min}/{max}"
        ));
    }
    // SAFETY: NCCL's contract for non-NULL names (the caller's).
    seen.net_name = unsafe { copy_name(seen.raw.netName) };
    // SAFETY: as above.
    seen.comm_name = unsafe { copy_name(seen.raw.commName) };
    seen.raw.netName = std::ptr::null();
    seen.raw.commName = std::ptr::null();
    Ok(Some(seen))
}

/// Resets every field newer than `version` to unset, field by field from the table.
fn reset_newer(raw: &mut ncclConfig_t, version: NcclVersion) {
    let unset = NCCL_CONFIG_INITIALIZER;
    let base = (&raw mut *raw).cast::<u8>();
    let from = (&raw const unset).cast::<u8>();
    for f in nccl_sys::CONFIG_FIELDS.iter().filter(|f| f.since > version) {
        // SAFETY: `offset` and `size` describe one field of `ncclConfig_t` (checked by
        // the table's tests), in bounds of both structs, which do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(from.add(f.offset), base.add(f.offset), f.size) };
    }
}

/// A copy of a config string (`None` for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn copy_name(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated (the caller's contract).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    const LIB: i32 = NCCL_VERSION_CODE as i32;

    fn read_ok(c: &ncclConfig_t, library: i32) -> MockConfig {
        // SAFETY: a whole config, no strings.
        let r = unsafe { read(c, library) };
        match r {
            Ok(Some(m)) => m,
            other => panic!("expected a config, got {other:?}"),
        }
    }

    fn read_err(c: &ncclConfig_t) -> String {
        // SAFETY: a whole config, no strings.
        match unsafe { read(c, LIB) } {
            Err(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn null_is_no_config() {
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read(std::ptr::null(), LIB) }, Ok(None));
    }

    #[test]
    fn cta_counts_follow_nccls_rule() {
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.minCTAs = 32;
        assert_eq!(
            read_err(&c),
            "Invalid config min/max channels attribute value 32/-2147483648"
        );
        c.maxCTAs = 16;
        assert_eq!(
            read_err(&c),
            "Invalid config min/max channels attribute value 32/16"
        );
        c.maxCTAs = 32;
        assert_eq!(
            read_ok(&c, nccl_sys::NCCL_VERSION_CODE as i32).raw.minCTAs,
            32
        );
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.maxCTAs = 0;
        assert_eq!(
            read_err(&c),
            "Invalid config min/max channels attribute value -2147483648/0"
        );
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.magic = 0xdead;
        assert!(
            read_err(&c).contains("not initialized via NCCL_CONFIG_INITIALIZER (magic 0xdead)")
        );
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.version = 21300;
        assert_eq!(
            read_err(&c),
            "ncclConfig_t version 21300 is older than NCCL 2.14.3, the first with a config"
        );
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.size = 16;
        assert!(
            read_err(&c)
                .starts_with("ncclConfig_t size 16 is smaller than the oldest layout (24 bytes")
        );
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.size = 72; // the 2.27 layout, claiming 2.32.3
        assert_eq!(
            read_err(&c),
            "ncclConfig_t size 72 does not hold the 120 bytes of the NCCL 2.32.3 layout its \
             version (23203) claims"
        );
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.blocking = 2;
        assert_eq!(read_err(&c), "Invalid config blocking attribute value 2");
    }

    #[test]
    fn fields_newer_than_the_library_or_the_version_are_unset() {
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.blocking = 0;
        c.splitShare = 1; // 2.18
        c.trafficClass = 5; // 2.26
        c.nvlsCTAs = 7; // 2.27
        c.nvlsHostMode = 3; // 2.32.3
        let m = read_ok(&c, NcclVersion::new(2, 26, 5).0);
        assert_eq!(
            (m.raw.blocking, m.raw.splitShare, m.raw.trafficClass),
            (0, 1, 5)
        );
        assert_eq!(
            (m.raw.nvlsCTAs, m.raw.nvlsHostMode),
            (NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT)
        );
        assert_eq!(m.blocking(), Some(false));
        // The caller's version limits it the same way.
        c.version = NcclVersion::new(2, 18, 3).0 as u32;
        let m = read_ok(&c, LIB);
        assert_eq!(
            (m.raw.splitShare, m.raw.trafficClass),
            (1, NCCL_CONFIG_UNDEF_INT)
        );
        assert_eq!(m.raw.version, 21803);
    }

    #[test]
    fn a_smaller_older_layout_is_read_only_up_to_its_size() {
        // A 2.27-sized struct followed by other bytes, which are not the config's.
        #[repr(C)]
        struct Old {
            head: [u8; 72],
            poison: [u8; 48],
        }
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.size = 72;
        c.version = NcclVersion::new(2, 27, 3).0 as u32;
        c.nvlsCTAs = 4;
        let mut old = Old {
            head: [0; 72],
            poison: [0x5a; 48],
        };
        // SAFETY: copies the first 72 bytes of a 120-byte struct into a 72-byte array.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const c).cast::<u8>(), old.head.as_mut_ptr(), 72)
        };
        let p = (&raw const old).cast::<ncclConfig_t>();
        // SAFETY: `size` says 72 bytes; `Old` is 8-aligned enough for the header reads
        // (read_unaligned) and the copy is bytewise.
        let m = match unsafe { read(p, LIB) } {
            Ok(Some(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(m.raw.nvlsCTAs, 4);
        assert_eq!(m.raw.nChannelsPerNetPeer, NCCL_CONFIG_UNDEF_INT);
        assert_eq!(m.raw.nvlsHostMode, NCCL_CONFIG_UNDEF_INT);
        assert_eq!(m.raw.size, 72);
    }

    #[test]
    fn names_are_copied_and_their_pointers_dropped() {
        let mut c = NCCL_CONFIG_INITIALIZER;
        c.netName = c"Socket".as_ptr();
        c.commName = c"tp-group".as_ptr();
        let m = read_ok(&c, LIB);
        assert_eq!(m.net_name.as_deref(), Some("Socket"));
        assert_eq!(m.comm_name.as_deref(), Some("tp-group"));
        assert!(m.raw.netName.is_null() && m.raw.commName.is_null());
        // commName is 2.27: a 2.26 library does not see it.
        let m = read_ok(&c, NcclVersion::new(2, 26, 2).0);
        assert_eq!((m.net_name.as_deref(), m.comm_name), (Some("Socket"), None));
    }
}
