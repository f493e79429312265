//! The driver loader against small C stub drivers compiled at test time: a driver without
//! `cuGetProcAddress_v2`, one that is too old, one missing a required function, and
//! optional functions gated on the reported version.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use test_support::stubcc;

use cuda_sys::dylib::Reason;
use cuda_sys::{Driver, DriverFns, LoadError};

/// Opens a library this test chose (stub drivers compiled by this test, or paths that do not exist).
fn load_trusted(path: impl AsRef<std::path::Path>) -> Result<Driver, cuda_sys::LoadError> {
    // SAFETY: stub drivers compiled by this test, or paths that do not exist; a library that is not the real thing is what the test checks is refused.
    unsafe { Driver::load_from(path) }
}

/// C source of a stub driver reporting `version`, exporting every table entry except
/// `omit`, with `cuGetProcAddress_v2` unless `no_gpa`. `cuGetProcAddress_v2` records
/// the version each symbol was asked at, readable through `stub_requested_version`.
pub(crate) fn stub_source(version: i32, omit: &[&str], no_gpa: bool) -> String {
    let mut names: Vec<&str> = DriverFns::REQUIRED.to_vec();
    names.extend(DriverFns::OPTIONAL.iter().map(|(n, _)| *n));
    names.retain(|n| !omit.contains(n) && *n != "cuDriverGetVersion");
    let mut c = String::from("#include <string.h>\n");
    c += &format!("int stub_cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}\n");
    for n in &names {
        c += &format!("int stub_{n}(void) {{ return 999; }}\n");
    }
    c += "struct entry { const char *name; void *fn; int asked; };\n";
    c += "static struct entry table[] = {\n";
    if !omit.contains(&"cuDriverGetVersion") {
        c += "  {\"cuDriverGetVersion\", (void*)stub_cuDriverGetVersion, 0},\n";
    }
    for n in &names {
        c += &format!("  {{\"{n}\", (void*)stub_{n}, 0}},\n");
    }
    c += "  {0, 0, 0}\n};\n";
    c += "int stub_requested_version(const char *s) {\n\
           for (struct entry *e = table; e->name; e++) if (!strcmp(e->name, s)) return e->asked;\n\
           return -1; }\n";
    if !no_gpa {
        c += "int cuGetProcAddress_v2(const char *s, void **pfn, int ver, unsigned long long flags, int *status) {\n\
              for (struct entry *e = table; e->name; e++) if (!strcmp(e->name, s)) {\n\
                (void)flags; e->asked = ver; *pfn = e->fn; if (status) *status = 0; return 0; }\n\
              (void)flags; *pfn = 0; if (status) *status = 1; return 500; }\n";
    }
    c
}

fn stub(name: &str, version: i32, omit: &[&str], no_gpa: bool) -> std::path::PathBuf {
    stubcc::shared_library(
        env!("CARGO_TARGET_TMPDIR"),
        name,
        &stub_source(version, omit, no_gpa),
    )
}

fn reason(e: LoadError) -> Reason {
    e.reason()
        .cloned()
        .unwrap_or_else(|| panic!("expected Unusable, got {e}"))
}

#[test]
fn a_complete_new_driver_resolves_everything() {
    let lib = stub("cuda_full", 13000, &[], false);
    let d = load_trusted(&lib).unwrap();
    assert_eq!(d.version().to_string(), "13.0");
    assert!(d.fns().optional_present().iter().all(|(_, p)| *p));
    assert!(d.origin().contains("explicit path"), "{}", d.origin());
    // A call through the table reaches the stub.
    // SAFETY: the stub's cuInit ignores its argument and returns 999.
    let rc = unsafe { (d.fns().cuInit)(0) };
    assert_eq!(rc.0, 999);
}

#[test]
fn required_entries_are_asked_for_at_the_pinned_version() {
    let lib = stub("cuda_pin", 12090, &[], false);
    let d = load_trusted(&lib).unwrap();
    let open = d.library().unwrap();
    let asked = open.symbol(c"stub_requested_version");
    assert!(!asked.is_null());
    // SAFETY: the stub defines `int stub_requested_version(const char*)`.
    let asked: extern "C" fn(*const core::ffi::c_char) -> i32 =
        unsafe { std::mem::transmute(asked) };
    assert_eq!(asked(c"cuMemAlloc".as_ptr()), cuda_sys::PINNED_API_VERSION);
    assert_eq!(
        asked(c"cuLaunchKernel".as_ptr()),
        cuda_sys::PINNED_API_VERSION
    );
    assert_eq!(
        asked(c"cuLibraryLoadData".as_ptr()),
        cuda_sys::PINNED_API_VERSION
    );
    assert_eq!(asked(c"cuFuncGetName".as_ptr()), 12030);
    assert_eq!(asked(c"cuFuncGetParamInfo".as_ptr()), 12040);
    assert_eq!(asked(c"cuCtxRecordEvent".as_ptr()), 12050);
    assert_eq!(asked(c"cuStreamGetDevice".as_ptr()), 12080);
}

#[test]
fn optional_entries_newer_than_the_driver_are_none() {
    // 12.3 has cuFuncGetName, not cuFuncGetParamInfo (12.4).
    let lib = stub("cuda_123", 12030, &[], false);
    let d = load_trusted(&lib).unwrap();
    assert!(d.fns().cuFuncGetName.is_some());
    assert!(d.fns().cuFuncGetParamInfo.is_none());
    // 12.4 exports them (the stub does) but is older than 12.5 / 12.8: gated off.
    let lib = stub("cuda_124", 12040, &[], false);
    let d = load_trusted(&lib).unwrap();
    assert!(d.fns().cuFuncGetParamInfo.is_some());
    assert!(d.fns().cuCtxRecordEvent.is_none());
    assert!(d.fns().cuStreamGetDevice.is_none());
    // 12.5: the 12.5 ones only.
    let lib = stub("cuda_125", 12050, &[], false);
    let d = load_trusted(&lib).unwrap();
    assert!(d.fns().cuCtxRecordEvent.is_some());
    assert!(d.fns().cuStreamGetDevice.is_none());
}

#[test]
fn an_optional_entry_the_driver_lacks_is_none() {
    let lib = stub("cuda_noopt", 12090, &["cuStreamGetDevice"], false);
    let d = load_trusted(&lib).unwrap();
    assert!(d.fns().cuStreamGetDevice.is_none());
    assert!(d.fns().cuCtxRecordEvent.is_some());
}

#[test]
fn a_missing_required_function_is_named() {
    let lib = stub("cuda_nomalloc", 12090, &["cuMemAlloc"], false);
    let e = load_trusted(&lib).unwrap_err();
    assert_eq!(
        reason(e.clone()),
        Reason::MissingSymbol("cuMemAlloc".into())
    );
    let msg = e.to_string();
    assert!(
        msg.contains("cuMemAlloc") && msg.contains(lib.to_str().unwrap()),
        "{msg}"
    );
}

#[test]
fn a_driver_without_cu_get_proc_address_v2_is_rejected() {
    let lib = stub("cuda_nogpa", 12090, &[], true);
    let e = load_trusted(&lib).unwrap_err();
    assert_eq!(
        reason(e),
        Reason::MissingSymbol("cuGetProcAddress_v2".into())
    );
}

#[test]
fn a_driver_older_than_12_0_gives_both_versions() {
    let lib = stub("cuda_118", 11080, &[], false);
    let e = load_trusted(&lib).unwrap_err();
    assert_eq!(
        reason(e.clone()),
        Reason::TooOld {
            found: "11.8".into(),
            minimum: "12.0".into()
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("11.8") && msg.contains("12.0"), "{msg}");
}

#[test]
fn a_missing_file_and_a_non_library_say_why() {
    let e = load_trusted("/nonexistent/libcuda.so.1").unwrap_err();
    assert_eq!(reason(e), Reason::NoSuchFile);
    let junk = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("not-a-library.so");
    std::fs::write(&junk, b"hello").unwrap();
    match reason(load_trusted(&junk).unwrap_err()) {
        // The dynamic loader's own words: the file, and why it is no library.
        Reason::Open(msg) => assert!(
            msg.contains(junk.to_str().unwrap())
                && (msg.contains("file too short") || msg.contains("invalid ELF header")),
            "{msg}"
        ),
        other => panic!("expected an open error, got {other}"),
    }
}

#[test]
fn a_search_lists_every_candidate_with_its_reason() {
    use cuda_sys::dylib::{Candidate, Step, first_usable};
    let good = stub("cuda_search", 12000, &[], false);
    let old = stub("cuda_search_old", 11000, &[], false);
    let list = vec![
        Candidate::new("/nonexistent/a/libcuda.so.1", Step::SystemDir),
        Candidate::new(&old, Step::PythonPackage),
        Candidate::new("libcuda-does-not-exist.so.7", Step::DynamicLoader),
    ];
    let attempts =
        first_usable(list.clone(), |c| load_trusted(&c.path).map_err(reason)).unwrap_err();
    assert_eq!(attempts.0.len(), 3);
    let text = attempts.to_string();
    for c in &list {
        assert!(text.contains(c.path.to_str().unwrap()), "{text}");
    }
    assert!(
        text.contains("no such file") && text.contains("older than") && text.contains("dlopen: "),
        "{text}"
    );
    let mut with_good = list;
    with_good.push(Candidate::new(&good, Step::Explicit));
    let d = first_usable(with_good, |c| load_trusted(&c.path).map_err(reason)).unwrap();
    assert_eq!(d.version().to_string(), "12.0");
}

#[test]
fn a_resolver_that_finds_nothing_is_a_typed_error() {
    // SAFETY: the resolver returns null for every name, which is always allowed.
    let e =
        unsafe { Driver::from_resolver("empty resolver", |_, _| std::ptr::null()) }.unwrap_err();
    assert_eq!(
        reason(e.clone()),
        Reason::MissingSymbol("cuDriverGetVersion".into())
    );
    assert!(e.to_string().contains("empty resolver"));
}
