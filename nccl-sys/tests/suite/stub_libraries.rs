//! The NCCL loader against small C stub libraries compiled at test time: one missing a
//! required symbol, one reporting a too-old version, one without the newest optional
//! functions, and version gating of the optional ones.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use test_support::stubcc;

use cuda_sys::dylib::Reason;
use nccl_sys::{LoadError, Nccl, NcclFns, NcclVersion};

/// Opens a library this test chose (stub libraries compiled by this test).
fn load_trusted(path: impl AsRef<std::path::Path>) -> Result<Nccl, nccl_sys::LoadError> {
    // SAFETY: stub libraries compiled by this test; a library that is not the real thing is what the test checks is refused.
    unsafe { Nccl::load_from(path) }
}

/// C source of a stub NCCL whose `ncclGetVersion` reports `version`, exporting every table
/// entry except those in `omit`; other functions return ncclInternalError (3).
fn stub_source(version: i32, omit: &[&str]) -> String {
    let mut c = String::new();
    if !omit.contains(&"ncclGetVersion") {
        c += &format!("int ncclGetVersion(int *v) {{ *v = {version}; return 0; }}\n");
    }
    let optional = NcclFns::OPTIONAL.iter().map(|(n, _)| *n);
    for n in NcclFns::REQUIRED.iter().copied().chain(optional) {
        if n != "ncclGetVersion" && !omit.contains(&n) {
            c += &format!("int {n}(void) {{ return 3; }}\n");
        }
    }
    c
}

fn stub(name: &str, version: NcclVersion, omit: &[&str]) -> std::path::PathBuf {
    stubcc::shared_library(
        env!("CARGO_TARGET_TMPDIR"),
        name,
        &stub_source(version.0, omit),
    )
}

fn reason(e: LoadError) -> Reason {
    e.reason()
        .cloned()
        .unwrap_or_else(|| panic!("expected Unusable, got {e}"))
}

#[test]
fn the_newest_library_has_every_optional_function() {
    let lib = stub("nccl_2323", NcclVersion::new(2, 32, 3), &[]);
    let n = load_trusted(&lib).unwrap();
    assert_eq!(n.version().to_string(), "2.32.3");
    let missing: Vec<_> = n
        .fns()
        .optional_present()
        .into_iter()
        .filter(|(_, p)| !p)
        .collect();
    assert!(missing.is_empty(), "{missing:?}");
}

#[test]
fn the_minimum_library_has_only_required_functions() {
    // The stub exports every optional symbol, but 2.18.0 predates them all: gated off.
    let lib = stub("nccl_2180", NcclVersion::MINIMUM, &[]);
    let n = load_trusted(&lib).unwrap();
    assert!(n.fns().optional_present().iter().all(|(_, p)| !p));
    // A call through the table reaches the stub.
    // SAFETY: the stub's ncclGroupStart takes no argument and returns 3.
    let rc = unsafe { (n.fns().ncclGroupStart)() };
    assert_eq!(rc, nccl_sys::ncclResult_t::ncclInternalError);
}

#[test]
fn gating_follows_each_functions_release() {
    let lib = stub("nccl_2283", NcclVersion::new(2, 28, 3), &[]);
    let n = load_trusted(&lib).unwrap();
    let f = n.fns();
    assert!(f.ncclAlltoAll.is_some() && f.ncclGather.is_some() && f.ncclScatter.is_some());
    assert!(f.ncclCommShrink.is_some());
    assert!(f.ncclCommRevoke.is_none(), "2.28.7 function on 2.28.3");
    assert!(f.ncclAllReduceConfig.is_none());
}

#[test]
fn a_library_without_the_newest_functions_gives_none() {
    let newest = ["ncclSetEncryption", "ncclAllReduceConfig", "ncclAlltoAll"];
    let lib = stub("nccl_lacking", NcclVersion::new(2, 32, 3), &newest);
    let n = load_trusted(&lib).unwrap();
    assert!(n.fns().ncclSetEncryption.is_none());
    assert!(n.fns().ncclAllReduceConfig.is_none());
    assert!(n.fns().ncclAlltoAll.is_none());
    assert!(n.fns().ncclGather.is_some());
}

#[test]
fn a_missing_required_symbol_is_named_with_the_library() {
    let lib = stub(
        "nccl_noallreduce",
        NcclVersion::new(2, 28, 3),
        &["ncclAllReduce"],
    );
    let e = load_trusted(&lib).unwrap_err();
    assert_eq!(
        reason(e.clone()),
        Reason::MissingSymbol("ncclAllReduce".into())
    );
    let msg = e.to_string();
    assert!(
        msg.contains("ncclAllReduce") && msg.contains(lib.to_str().unwrap()),
        "{msg}"
    );
}

#[test]
fn a_library_that_is_not_nccl_is_rejected() {
    let lib = stubcc::shared_library(
        env!("CARGO_TARGET_TMPDIR"),
        "not_nccl",
        "int something_else(void) { return 0; }\n",
    );
    let e = load_trusted(&lib).unwrap_err();
    assert_eq!(reason(e), Reason::MissingSymbol("ncclGetVersion".into()));
}

#[test]
fn a_too_old_library_gives_both_versions() {
    let lib = stub("nccl_2155", NcclVersion::new(2, 15, 5), &[]);
    let e = load_trusted(&lib).unwrap_err();
    assert_eq!(
        reason(e.clone()),
        Reason::TooOld {
            found: "2.15.5".into(),
            minimum: "2.18.0".into()
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("2.15.5") && msg.contains("2.18.0"), "{msg}");
}

#[test]
fn a_failing_version_query_is_reported() {
    let src = "int ncclGetVersion(int *v) { (void)v; return 4; }\n";
    let lib = stubcc::shared_library(env!("CARGO_TARGET_TMPDIR"), "nccl_badversion", src);
    match reason(load_trusted(&lib).unwrap_err()) {
        Reason::Version(msg) => assert!(msg.contains("ncclInvalidArgument"), "{msg}"),
        other => panic!("expected a version error, got {other}"),
    }
}

#[test]
fn the_search_list_keeps_the_documented_order() {
    use cuda_sys::dylib::Step;
    let list = Nccl::search_list();
    assert_eq!(list[0].path.to_str(), Some("libnccl.so.2"));
    assert_eq!(list[0].step, Step::AlreadyLoaded);
    let rank = |s: &Step| match s {
        Step::Explicit | Step::EnvOverride(_) => 0,
        Step::AlreadyLoaded => 1,
        Step::DynamicLoader => 2,
        Step::PythonPackage => 3,
        _ => 4,
    };
    let ranks: Vec<_> = list.iter().map(|c| rank(&c.step)).collect();
    let mut sorted = ranks.clone();
    sorted.sort_unstable();
    assert_eq!(ranks, sorted, "{list:?}");
    assert!(list.iter().any(|c| c.step == Step::SystemDir));
}
