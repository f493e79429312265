//! Writes `exports.rs`: one `#[no_mangle]` forwarder per entry of the driver and NCCL
//! tables, named as the C library names it (the ABI variant: `cuMemAlloc_v2`), with the
//! signature bindgen generated from the pinned header, calling the simulated machine's
//! table. Generated, not typed: a table entry added later is exported without a word.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::path::Path;

/// `(symbol, arguments as declared, return type)` of `PFN_<symbol>` in a generated file.
fn signature(generated: &str, symbol: &str) -> (String, String) {
    let head = format!("pub type PFN_{symbol} = unsafe extern \"C\" fn(");
    let at = generated
        .find(&head)
        .unwrap_or_else(|| panic!("PFN_{symbol} is not in the generated bindings"));
    let rest = &generated[at + head.len()..];
    let end = rest.find(';').expect("a type alias ends with ';'");
    let decl = &rest[..end];
    let close = decl.rfind(')').expect("an argument list");
    let args = decl[..close].trim().trim_end_matches(',').to_string();
    let ret = decl[close + 1..]
        .trim()
        .strip_prefix("->")
        .map_or("()", str::trim)
        .to_string();
    (args, ret)
}

/// The argument names of a declared list (`a: T, b: U` -> `a, b`).
fn names(args: &str) -> String {
    args.split(',')
        .filter_map(|a| a.split(':').next())
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an absent optional entry returns: the library's "not supported", or null.
fn absent(ret: &str) -> &'static str {
    match ret {
        "CUresult" => "CUresult::CUDA_ERROR_NOT_SUPPORTED",
        "ncclResult_t" => "ncclResult_t::ncclInvalidUsage",
        r if r.starts_with('*') => "::core::ptr::null()",
        "()" => "()",
        r => panic!("no absent value for return type {r}"),
    }
}

/// What every entry returns when the environment describes no machine (said on stderr):
/// an error, and for the two string functions a message (NCCL's never return NULL).
fn broken(ret: &str) -> &'static str {
    match ret {
        "CUresult" => "CUresult::CUDA_ERROR_NOT_INITIALIZED",
        "ncclResult_t" => "ncclResult_t::ncclSystemError",
        "*const ::core::ffi::c_char" => "super::NO_MACHINE.as_ptr()",
        r if r.starts_with('*') => "::core::ptr::null()",
        "()" => "()",
        r => panic!("no error value for return type {r}"),
    }
}

fn emit(
    out: &mut String,
    generated: &str,
    table: &str,
    signatures: &[(&str, &str)],
    optional: &[&str],
    skip: &[&str],
) {
    for (field, pfn) in signatures {
        let symbol = pfn.strip_prefix("PFN_").expect("PFN_ names");
        if skip.contains(&symbol) {
            continue;
        }
        let (args, ret) = signature(generated, symbol);
        let call = names(&args);
        let call = if optional.contains(field) {
            format!(
                "match t.{field} {{ Some(f) => unsafe {{ f({call}) }}, None => {} }}",
                absent(&ret)
            )
        } else {
            format!("unsafe {{ (t.{field})({call}) }}")
        };
        let body = format!(
            "match {table}() {{ Some(t) => {call}, None => {} }}",
            broken(&ret)
        );
        writeln!(
            out,
            "/// `{symbol}`: the simulated machine's `{field}`.\n\
             ///\n/// # Safety\n/// As the C function's.\n\
             #[unsafe(no_mangle)]\n\
             pub unsafe extern \"C\" fn {symbol}({args}) -> {ret} {{\n\
             \x20   // SAFETY: the caller keeps the C function's contract, which is the table\n\
             \x20   // entry's: same signature (both from the pinned header), same arguments.\n\
             \x20   {body}\n}}\n"
        )
        .unwrap();
    }
}

fn main() {
    // Never unloaded (as libcuda and libnccl are not): a dlclose would run the exit check
    // in mid-process and unmap code the simulated NCCL's threads still run.
    println!("cargo::rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // The declarations come from the build-dependencies themselves (their generated
    // bindings' text): a change of theirs rebuilds this script.
    println!("cargo::rerun-if-changed=build.rs");
    let cuda = cuda_sys::GENERATED_SOURCE;
    let nccl = nccl_sys::GENERATED_SOURCE;

    let mut out = String::new();
    let optional: Vec<&str> = cuda_sys::DriverFns::OPTIONAL.iter().map(|o| o.0).collect();
    // The loader's own entry points are written by hand (lib.rs).
    let skip = ["cuGetProcAddress", "cuGetProcAddress_v2"];
    emit(
        &mut out,
        cuda,
        "driver",
        cuda_sys::DriverFns::SIGNATURES,
        &optional,
        &skip,
    );
    let optional: Vec<&str> = nccl_sys::NcclFns::OPTIONAL.iter().map(|o| o.0).collect();
    emit(
        &mut out,
        nccl,
        "nccl",
        nccl_sys::NcclFns::SIGNATURES,
        &optional,
        &[],
    );

    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("exports.rs");
    std::fs::write(dest, out).unwrap();
}
