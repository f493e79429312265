//! The real driver (GPU machine only; `#[ignore]`d in CI, run with `--include-ignored`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_sys::{CUresult, Driver, DriverFns};

#[test]
#[ignore = "needs a CUDA driver and a GPU"]
fn every_entry_is_the_abi_variant_its_signature_names() {
    let d = Driver::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let lib = d.library().expect("loaded from a library");
    println!("driver {} from {}", d.version(), d.origin());
    for (name, pfn) in DriverFns::SIGNATURES {
        let header_name = pfn.strip_prefix("PFN_").unwrap();
        let Some(resolved) = d.fns().address_of(name) else {
            println!("  {name}: absent (optional)");
            continue;
        };
        let cname = std::ffi::CString::new(header_name).unwrap();
        let exported = lib.symbol(&cname);
        assert!(!exported.is_null(), "libcuda does not export {header_name}");
        assert_eq!(
            resolved, exported,
            "cuGetProcAddress({name}) is not {header_name}: the table's signature would be wrong"
        );
    }
}

#[test]
#[ignore = "needs a CUDA driver and a GPU"]
fn init_and_count_devices() {
    let d = Driver::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        assert_eq!((d.fns().cuInit)(0), CUresult::CUDA_SUCCESS);
        let mut n = 0;
        assert_eq!((d.fns().cuDeviceGetCount)(&mut n), CUresult::CUDA_SUCCESS);
        assert!(n >= 1);
        println!("{n} device(s)");
    }
}
