//! The simulated NCCL reads `ncclConfig_t` as NCCL does: a bad header is refused with
//! `ncclInvalidArgument` and a last-error message, and each communicator keeps the
//! configuration NCCL saw (fields newer than the library or the config's `version`
//! unset; a split with a NULL config inherits its parent's). Raw table calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::CStr;

use cuda_mock::{MockDriver, MockWorld};
use cuda_sys::{CUresult, Driver};
use nccl_mock::{MockConfig, MockNccl, MockNcclWorld};
use nccl_sys::{
    NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_UNDEF_INT, Nccl, NcclVersion, ncclComm_t, ncclConfig_t,
    ncclResult_t, ncclUniqueId,
};

struct Rig {
    _driver: Driver,
    _gpus: MockWorld,
    nccl: Nccl,
    world: MockNcclWorld,
}

impl Rig {
    /// One device, its context current on this thread, and an NCCL reporting `version`.
    fn new(version: NcclVersion) -> Rig {
        let (driver, gpus) = MockDriver::with_devices(1).build().unwrap();
        let (nccl, world) = MockNccl::new(&gpus).version(version).build().unwrap();
        let f = driver.fns();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: mock driver calls with valid out-pointers and an existing device.
        unsafe {
            assert_eq!((f.cuInit)(0), CUresult::CUDA_SUCCESS);
            assert_eq!(
                (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!((f.cuCtxSetCurrent)(ctx), CUresult::CUDA_SUCCESS);
        }
        Rig {
            _driver: driver,
            _gpus: gpus,
            nccl,
            world,
        }
    }

    /// A one-rank communicator made with `config` (NULL for `None`).
    fn init(&self, config: Option<&mut ncclConfig_t>) -> (ncclResult_t, ncclComm_t) {
        let f = self.nccl.fns();
        let mut id = ncclUniqueId::default();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (f.ncclGetUniqueId)(&mut id) };
        assert_eq!(rc, ncclResult_t::ncclSuccess);
        let mut comm = std::ptr::null_mut();
        let p = config.map_or(std::ptr::null_mut(), |c| c as *mut ncclConfig_t);
        // SAFETY: valid out-pointer; `p` is NULL or a whole config.
        let rc = unsafe { (f.ncclCommInitRankConfig)(&mut comm, 1, id, 0, p) };
        (rc, comm)
    }

    fn last_error(&self) -> String {
        // SAFETY: returns a string owned by the library, valid until its next call.
        let p = unsafe { (self.nccl.fns().ncclGetLastError)(std::ptr::null_mut()) };
        // SAFETY: non-NULL and NUL-terminated (the mock always returns a string).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn split(&self, comm: ncclComm_t, config: Option<&mut ncclConfig_t>) -> ncclComm_t {
        let mut child = std::ptr::null_mut();
        let p = config.map_or(std::ptr::null_mut(), |c| c as *mut ncclConfig_t);
        // SAFETY: a live blocking parent (the split completes in the call), valid
        // out-pointer, NULL or a whole config.
        let rc = unsafe { (self.nccl.fns().ncclCommSplit)(comm, 0, 0, &mut child, p) };
        assert_eq!(rc, ncclResult_t::ncclSuccess, "{}", self.last_error());
        child
    }

    fn destroy(&self, comm: ncclComm_t) {
        // SAFETY: a live communicator, destroyed once.
        let rc = unsafe { (self.nccl.fns().ncclCommDestroy)(comm) };
        assert_eq!(rc, ncclResult_t::ncclSuccess);
    }
}

fn seen(world: &MockNcclWorld, comm: ncclComm_t) -> MockConfig {
    world
        .config_of(comm)
        .expect("the communicator keeps its config")
}

#[test]
fn a_config_with_a_bad_header_is_refused_and_creates_nothing() {
    let rig = Rig::new(NcclVersion::new(2, 32, 3));
    type Spoil = fn(&mut ncclConfig_t);
    let cases: [(Spoil, &str); 4] = [
        (
            |c| c.magic = 0,
            "ncclCommInitRankConfig: ncclConfig_t argument not initialized via \
             NCCL_CONFIG_INITIALIZER (magic 0x0)",
        ),
        (
            |c| c.version = 21300,
            "ncclCommInitRankConfig: ncclConfig_t version 21300 is older than NCCL 2.14.3, the \
             first with a config",
        ),
        (
            |c| c.size = 8,
            "ncclCommInitRankConfig: ncclConfig_t size 8 is smaller than the oldest layout (24 \
             bytes, NCCL 2.14.3); initialise it with NCCL_CONFIG_INITIALIZER",
        ),
        (
            |c| c.size = 96,
            "ncclCommInitRankConfig: ncclConfig_t size 96 does not hold the 120 bytes of the \
             NCCL 2.32.3 layout its version (23203) claims",
        ),
    ];
    for (spoil, message) in cases {
        let mut c = NCCL_CONFIG_INITIALIZER;
        spoil(&mut c);
        let (rc, _) = rig.init(Some(&mut c));
        assert_eq!(rc, ncclResult_t::ncclInvalidArgument);
        assert_eq!(rig.last_error(), message);
        assert_eq!(rig.world.live().comms, 0);
    }
}

#[test]
fn the_recorded_config_is_what_the_library_and_the_version_know() {
    // A 2.27.3 library: fields of 2.28 and later are not in its struct.
    let rig = Rig::new(NcclVersion::new(2, 27, 3));
    let mut c = NCCL_CONFIG_INITIALIZER;
    c.blocking = 1;
    c.minCTAs = 3;
    c.maxCTAs = 3; // NCCL refuses a minimum without a maximum
    c.trafficClass = 6; // 2.26
    c.nvlsCTAs = 9; // 2.27
    c.nChannelsPerNetPeer = 4; // 2.28
    c.nvlsHostMode = 1; // 2.32.3
    c.netName = c"IB".as_ptr();
    c.commName = c"dp".as_ptr();
    let (rc, comm) = rig.init(Some(&mut c));
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let m = seen(&rig.world, comm);
    assert_eq!(
        (
            m.raw.blocking,
            m.raw.minCTAs,
            m.raw.trafficClass,
            m.raw.nvlsCTAs
        ),
        (1, 3, 6, 9)
    );
    assert_eq!(m.raw.nChannelsPerNetPeer, NCCL_CONFIG_UNDEF_INT);
    assert_eq!(m.raw.nvlsHostMode, NCCL_CONFIG_UNDEF_INT);
    assert_eq!(m.raw.cgaClusterSize, NCCL_CONFIG_UNDEF_INT);
    assert_eq!(
        (m.net_name.as_deref(), m.comm_name.as_deref()),
        (Some("IB"), Some("dp"))
    );
    assert_eq!((m.raw.size, m.raw.version), (120, 23203));
    rig.destroy(comm);

    // The config's own version limits it too: a 2.26 layout's caller has no commName.
    let rig = Rig::new(NcclVersion::new(2, 32, 3));
    let mut c = NCCL_CONFIG_INITIALIZER;
    c.version = NcclVersion::new(2, 26, 2).0 as u32;
    c.trafficClass = 2;
    c.commName = c"ignored".as_ptr();
    c.nvlsCTAs = 5;
    let (rc, comm) = rig.init(Some(&mut c));
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let m = seen(&rig.world, comm);
    assert_eq!(
        (m.raw.trafficClass, m.raw.nvlsCTAs),
        (2, NCCL_CONFIG_UNDEF_INT)
    );
    assert_eq!((m.comm_name, m.raw.version), (None, 22602));
    rig.destroy(comm);
}

#[test]
fn no_config_records_none_and_splits_inherit_or_take_their_own() {
    let rig = Rig::new(NcclVersion::new(2, 32, 3));
    let (rc, plain) = rig.init(None);
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    assert_eq!(rig.world.config_of(plain), None);

    let mut c = NCCL_CONFIG_INITIALIZER;
    c.maxCTAs = 12;
    c.commName = c"parent".as_ptr();
    let (rc, parent) = rig.init(Some(&mut c));
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let inherited = rig.split(parent, None);
    let m = seen(&rig.world, inherited);
    assert_eq!(
        (m.raw.maxCTAs, m.comm_name.as_deref()),
        (12, Some("parent"))
    );

    let mut own = NCCL_CONFIG_INITIALIZER;
    own.minCTAs = 2;
    own.maxCTAs = 4; // not the parent's 12: a config of its own
    own.commName = c"child".as_ptr();
    let child = rig.split(parent, Some(&mut own));
    let m = seen(&rig.world, child);
    assert_eq!(
        (m.raw.minCTAs, m.raw.maxCTAs, m.comm_name.as_deref()),
        (2, 4, Some("child"))
    );

    for comm in [child, inherited, parent, plain] {
        rig.destroy(comm);
    }
    assert_eq!(rig.world.config_of(parent), None, "a freed handle has none");
    assert!(rig.world.live().is_empty());
}

#[test]
fn a_field_of_exactly_the_librarys_release_is_kept() {
    // 2.27.3 introduced nvlsCTAs and commName; 2.28.3 nChannelsPerNetPeer.
    let rig = Rig::new(NcclVersion::new(2, 27, 3));
    let mut c = NCCL_CONFIG_INITIALIZER;
    c.nvlsCTAs = 9;
    c.commName = c"exact".as_ptr();
    c.nChannelsPerNetPeer = 4;
    let (rc, comm) = rig.init(Some(&mut c));
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    let m = seen(&rig.world, comm);
    assert_eq!((m.raw.nvlsCTAs, m.comm_name.as_deref()), (9, Some("exact")));
    assert_eq!(m.raw.nChannelsPerNetPeer, NCCL_CONFIG_UNDEF_INT);
    rig.destroy(comm);
}
