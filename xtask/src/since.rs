//! The version history: which release first declares each NCCL function and
//! `ncclConfig_t` field (`nccl-sys/src/since.rs`) and each CUDA driver function newer
//! than 12.0 (`cuda-sys/src/since.rs`), read off the header of every release pinned in
//! `scripts/wheels.lock`. Only the header is taken out of each wheel (`scripts/wheel NAME
//! VERSION PATH`), once; bindgen then reads it as it reads the newest one.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use crate::{CUDA_WHEEL, NCCL_WHEEL, base, root, wheel_file};

/// The wheels whose `nccl.h` make the NCCL history.
const NCCL_NAMES: [&str; 2] = ["nvidia-nccl-cu11", "nvidia-nccl-cu12"];
pub(crate) const NCCL_H: &str = "nvidia/nccl/include/nccl.h";
/// The wheels whose `cuda.h` make the driver history.
const CUDA_NAMES: [&str; 1] = ["nvidia-cuda-runtime-cu12"];
pub(crate) const CUDA_H: &str = "nvidia/cuda_runtime/include/cuda.h";

/// A release as a sortable triple (NCCL: major, minor, patch; CUDA: major, minor, 0).
type Release = (i64, i64, i64);

/// What one release's header declares.
struct Declared {
    /// The wheel it came from (`nvidia-nccl-cu12 2.19.3`).
    wheel: String,
    /// The release, as the header's own version macros give it.
    release: Release,
    functions: BTreeSet<String>,
    /// Functions in header order (for the newest header, which lists the output).
    ordered: Vec<String>,
    /// `ncclConfig_t`'s fields in layout order and its size, if the header has it.
    config: Option<(Vec<String>, usize)>,
}

/// `(name, version)` of every wheel of `names` pinned in `scripts/wheels.lock`.
fn pins(names: &[&str]) -> Result<Vec<(String, String)>, String> {
    let path = root().join("scripts/wheels.lock");
    let lock =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for line in lock.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut w = line.split_whitespace();
        if let (Some(n), Some(v)) = (w.next(), w.next())
            && names.contains(&n)
        {
            out.push((n.to_string(), v.to_string()));
        }
    }
    Ok(out)
}

/// Runs bindgen over one header (`builder` set up for it) and collects what it declares.
fn declared(builder: bindgen::Builder, wheel: String, nccl: bool) -> Result<Declared, String> {
    let code = builder
        .generate()
        .map_err(|e| format!("bindgen failed on {wheel}: {e}"))?
        .to_string();
    let file: syn::File = syn::parse_str(&code).map_err(|e| format!("parse ({wheel}): {e}"))?;
    let mut consts = std::collections::BTreeMap::new();
    let mut ordered = Vec::new();
    let mut config_alias = None;
    let mut structs = std::collections::BTreeMap::new();
    for item in &file.items {
        match item {
            syn::Item::ForeignMod(m) => {
                for fi in &m.items {
                    if let syn::ForeignItem::Fn(f) = fi {
                        ordered.push(f.sig.ident.to_string());
                    }
                }
            }
            syn::Item::Const(c) => {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(v),
                    ..
                }) = &*c.expr
                    && let Ok(v) = v.base10_parse::<i64>()
                {
                    consts.insert(c.ident.to_string(), v);
                }
            }
            syn::Item::Type(t) if t.ident == "ncclConfig_t" => {
                if let syn::Type::Path(p) = &*t.ty {
                    config_alias = p.path.get_ident().map(ToString::to_string);
                }
            }
            syn::Item::Struct(s) => {
                let fields: Vec<String> = s
                    .fields
                    .iter()
                    .filter_map(|f| f.ident.as_ref().map(ToString::to_string))
                    .collect();
                structs.insert(s.ident.to_string(), fields);
            }
            _ => {}
        }
    }
    let get = |name: &str| {
        consts
            .get(name)
            .copied()
            .ok_or_else(|| format!("{wheel}: the header defines no {name}"))
    };
    let release = if nccl {
        (get("NCCL_MAJOR")?, get("NCCL_MINOR")?, get("NCCL_PATCH")?)
    } else {
        let v = get("CUDA_VERSION")?;
        (v / 1000, v % 1000 / 10, 0)
    };
    let config = match config_alias.or_else(|| {
        structs
            .contains_key("ncclConfig_t")
            .then(|| "ncclConfig_t".into())
    }) {
        Some(name) if nccl => {
            let fields = structs
                .get(&name)
                .cloned()
                .ok_or_else(|| format!("{wheel}: ncclConfig_t is {name}, which is not a struct"))?;
            Some((fields, size_of_struct(&code, &name, &wheel)?))
        }
        _ => None,
    };
    Ok(Declared {
        wheel,
        release,
        functions: ordered.iter().cloned().collect(),
        ordered,
        config,
    })
}

/// `sizeof(name)` as the header lays it out: bindgen's layout check
/// `["Size of name"][size_of::<name>() - 120usize]`.
fn size_of_struct(code: &str, name: &str, wheel: &str) -> Result<usize, String> {
    let missing = || format!("{wheel}: no layout check for the size of {name}");
    let at = code
        .find(&format!("\"Size of {name}\""))
        .ok_or_else(missing)?;
    let rest = &code[at..];
    let end = rest.find("usize").ok_or_else(missing)?;
    let digits: String = rest[..end]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().map_err(|_| missing())
}

/// Every pinned release's header, oldest first; the newest must be `newest`.
fn history(
    names: &[&str],
    member: &str,
    newest: (&str, &str),
    nccl: bool,
) -> Result<Vec<Declared>, String> {
    let shim = root().join("xtask/shim");
    let mut all = Vec::new();
    for (name, version) in pins(names)? {
        let header = wheel_file(&name, &version, member)?;
        let dir = header.parent().unwrap_or(Path::new("."));
        let b = if nccl {
            base()
                .clang_arg("-DNCCL_SYS")
                .clang_arg(format!("-I{}", shim.display()))
                .clang_arg(format!("-I{}", dir.display()))
                .allowlist_file(".*/nccl\\.h")
        } else {
            base()
                .clang_arg("-DCUDA_SYS")
                .clang_arg(format!("-I{}", dir.display()))
                .allowlist_file(".*/cuda\\.h")
        };
        let d = declared(b, format!("{name} {version}"), nccl)?;
        if nccl && version != format!("{}.{}.{}", d.release.0, d.release.1, d.release.2) {
            return Err(format!("{}: its nccl.h says {:?}", d.wheel, d.release));
        }
        all.push(d);
    }
    all.sort_by_key(|d| d.release);
    for w in all.windows(2) {
        if w[0].release == w[1].release {
            return Err(format!(
                "{} and {} are the same release: pin one",
                w[0].wheel, w[1].wheel
            ));
        }
    }
    match all.last() {
        Some(d) if d.wheel == format!("{} {}", newest.0, newest.1) => Ok(all),
        Some(d) => Err(format!(
            "the newest pinned header is {}'s, not {} {}'s (the bindings')",
            d.wheel, newest.0, newest.1
        )),
        None => Err(format!("no {} wheel is pinned", names.join(" or "))),
    }
}

/// The index of the oldest release from which on every header in `has` says yes: the
/// start of the last unbroken run (`None` if the newest lacks it).
fn first_of_last_run(all: &[Declared], has: impl Fn(&Declared) -> bool) -> Option<usize> {
    let mut i = all.len();
    while i > 0 && has(&all[i - 1]) {
        i -= 1;
    }
    (i < all.len()).then_some(i)
}

fn nccl_v(r: Release) -> String {
    format!("{}.{}.{}", r.0, r.1, r.2)
}

/// The sentence that says where a fact comes from: the first header that declares the
/// item and the one before it, which lacks it.
fn provenance(all: &[Declared], i: usize, what: &str, show: impl Fn(Release) -> String) -> String {
    if i == 0 {
        format!(
            "{what}: declared by every header read (the oldest is {}'s).",
            show(all[0].release)
        )
    } else {
        format!(
            "{what}: first declared by {} ({} lacks it).",
            show(all[i].release),
            show(all[i - 1].release)
        )
    }
}

const HEAD: &str = "// Regenerate with `cargo xtask bindgen`; CI fails when this file differs.\n\
//\n\
// Facts (names and versions) read off NVIDIA's headers; no declaration of theirs is copied.\n\n";

pub(crate) fn nccl() -> Result<(), String> {
    let all = history(&NCCL_NAMES, NCCL_H, NCCL_WHEEL, true)?;
    let newest = all.last().unwrap();
    let show = nccl_v;
    let rel = |r: Release| format!("NcclVersion::new({}, {}, {})", r.0, r.1, r.2);
    let mut s = format!(
        "// @generated by `cargo xtask bindgen` from the nccl.h of every NCCL release pinned in\n\
         // scripts/wheels.lock ({} releases: {} to {}). Do not edit.\n{HEAD}",
        all.len(),
        all[0].wheel,
        newest.wheel
    );
    s += "use crate::NcclVersion;\n\n";
    s += "/// Every NCCL release whose `nccl.h` was read, oldest first.\n";
    s += "pub const RELEASES: &[NcclVersion] = &[\n";
    for d in &all {
        writeln!(s, "    {},", rel(d.release)).unwrap();
    }
    s += "];\n\n";
    s += "/// `sizeof(ncclConfig_t)` in the header of each release that has the struct, oldest\n\
          /// first.\n";
    s += "pub const CONFIG_SIZES: &[(NcclVersion, usize)] = &[\n";
    for d in &all {
        if let Some((_, size)) = &d.config {
            writeln!(s, "    ({}, {size}),", rel(d.release)).unwrap();
        }
    }
    s += "];\n\n";

    let functions: Vec<&String> = newest
        .ordered
        .iter()
        .filter(|f| !f.starts_with("pnccl"))
        .collect();
    writeln!(
        s,
        "/// Every function of `nccl.h` {} but the `pnccl*` twins, in header order, with the\n\
         /// release from which on every header read declares it (the constant of its name).",
        show(newest.release)
    )
    .unwrap();
    s += "pub const FUNCTIONS: &[(&str, NcclVersion)] = &[\n";
    for f in &functions {
        writeln!(s, "    (\"{f}\", {f}),").unwrap();
    }
    s += "];\n";
    for f in &functions {
        let i = first_of_last_run(&all, |d| d.functions.contains(*f)).unwrap();
        let doc = provenance(&all, i, &format!("`{f}`"), show);
        writeln!(
            s,
            "\n/// {doc}\npub const {f}: NcclVersion = {};",
            rel(all[i].release)
        )
        .unwrap();
    }

    let (fields, _) = newest
        .config
        .as_ref()
        .ok_or_else(|| format!("{} has no ncclConfig_t", newest.wheel))?;
    let fields: Vec<&String> = fields
        .iter()
        .filter(|f| !matches!(f.as_str(), "size" | "magic" | "version"))
        .collect();
    let mut since = Vec::new();
    for f in &fields {
        let has = |d: &Declared| d.config.as_ref().is_some_and(|(fs, _)| fs.contains(*f));
        since.push(first_of_last_run(&all, has).unwrap());
    }
    s += "\n/// The release from which on every header read declares each field of `ncclConfig_t`\n\
          /// (after `size`, `magic` and `version`), in layout order:\n///\n\
          /// | field | since | the release before, which lacks it |\n/// | --- | --- | --- |\n";
    for (f, &i) in fields.iter().zip(&since) {
        let before = if i == 0 {
            "(none read)".to_string()
        } else {
            show(all[i - 1].release)
        };
        writeln!(s, "/// | `{f}` | {} | {before} |", show(all[i].release)).unwrap();
    }
    s += "pub mod config {\n    use crate::NcclVersion;\n";
    for (f, &i) in fields.iter().zip(&since) {
        let doc = provenance(&all, i, &format!("`ncclConfig_t.{f}`"), show);
        writeln!(
            s,
            "\n    /// {doc}\n    pub const {f}: NcclVersion = {};",
            rel(all[i].release)
        )
        .unwrap();
    }
    s += "}\n\n";
    s += "/// The release that introduced a field of `ncclConfig_t` (see [`since::config`]), as a\n\
          /// string literal, for documentation: `config_field_since!(\"blocking\")` is the\n\
          /// version of `since::config::blocking`.\n\
          ///\n\
          /// [`since::config`]: crate::since::config\n\
          #[macro_export]\nmacro_rules! config_field_since {\n";
    for (f, &i) in fields.iter().zip(&since) {
        writeln!(
            s,
            "    (\"{f}\") => {{\n        \"{}\"\n    }};",
            show(all[i].release)
        )
        .unwrap();
    }
    s += "}\n";
    write(&root().join("nccl-sys/src/since.rs"), &s)?;
    eprintln!(
        "wrote nccl-sys/src/since.rs ({} releases, {} functions, {} config fields)",
        all.len(),
        functions.len(),
        fields.len()
    );
    Ok(())
}

pub(crate) fn cuda() -> Result<(), String> {
    let all = history(&CUDA_NAMES, CUDA_H, CUDA_WHEEL, false)?;
    let newest = all.last().unwrap();
    let code = |r: Release| r.0 * 1000 + r.1 * 10;
    let show = |r: Release| format!("CUDA {}.{}", r.0, r.1);
    let mut s = format!(
        "// @generated by `cargo xtask bindgen` from the cuda.h of every CUDA release pinned in\n\
         // scripts/wheels.lock ({} releases: {} to {}). Do not edit.\n{HEAD}",
        all.len(),
        all[0].wheel,
        CUDA_WHEEL.1
    );
    s += "/// The `CUDA_VERSION` of every `cuda.h` read, oldest first.\n";
    s += "pub const RELEASES: &[i32] = &[";
    let codes: Vec<String> = all.iter().map(|d| code(d.release).to_string()).collect();
    s += &codes.join(", ");
    s += "];\n\n";
    let newer: Vec<(&String, usize)> = newest
        .ordered
        .iter()
        .filter_map(|f| {
            let i = first_of_last_run(&all, |d| d.functions.contains(f)).unwrap();
            (i > 0).then_some((f, i))
        })
        .collect();
    writeln!(
        s,
        "/// Every function of `cuda.h` {}.{} that the {}.{} header lacks, in header order, with the\n\
         /// `CUDA_VERSION` of the first header from which on every one read declares it (the\n\
         /// constant of its name). A function not listed is in every header read.",
        newest.release.0, newest.release.1, all[0].release.0, all[0].release.1
    )
    .unwrap();
    s += "pub const FUNCTIONS: &[(&str, i32)] = &[\n";
    for (f, _) in &newer {
        writeln!(s, "    (\"{f}\", {f}),").unwrap();
    }
    s += "];\n";
    for (f, i) in &newer {
        let doc = provenance(&all, *i, &format!("`{f}`"), show);
        writeln!(
            s,
            "\n/// {doc}\npub const {f}: i32 = {};",
            code(all[*i].release)
        )
        .unwrap();
    }
    write(&root().join("cuda-sys/src/since.rs"), &s)?;
    eprintln!(
        "wrote cuda-sys/src/since.rs ({} releases, {} functions newer than the oldest)",
        all.len(),
        newer.len()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
}
