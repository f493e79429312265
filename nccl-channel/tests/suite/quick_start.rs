//! The Quick start, and every other Rust example of nccl-channel's README and crate docs,
//! compiles in a crate whose only dependency is nccl-channel: the CUDA layer and NCCL's
//! table are reached as `nccl_channel::cuda_hal` and `nccl_channel::nccl_sys`, so a
//! `use cuda_hal::…` or `use nccl_sys::…` there fails this test. The same for cuda-hal's
//! README and crate docs, in a crate whose only dependency is cuda-hal (`cuda_sys` is
//! `cuda_hal::cuda_sys`).
//!
//! The scratch crates also depend on the simulators, `cuda-mock` (both) and `nccl-mock`
//! (nccl-channel's): the examples' hidden lines build a simulated machine with them, as a
//! user's tests would with the same dev-dependencies. They are not a way to the CUDA
//! layer or NCCL's table: an example's own crates are only the ones it depends on, and
//! `cuda_hal`/`nccl_sys` are not among them.
//!
//! The crates are built by a nested `cargo build --offline`, with a target dir of its own
//! under this test's scratch folder (no lock shared with the cargo running the tests),
//! and the repository's `Cargo.lock` (the same versions, nothing fetched).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// One Rust code block of a document: the heading it sits under and its code, hidden
/// lines (`# …`) included as rustdoc compiles them.
#[derive(Debug)]
struct Example {
    heading: String,
    code: String,
}

/// The Rust code blocks of markdown `text` (a README, or crate docs without their `//!`):
/// fences whose info string is empty or only `rust`, `no_run`, `should_panic`; `ignore`,
/// `text`, `sh` and the like are left out, as rustdoc leaves them.
fn rust_blocks(text: &str) -> Vec<Example> {
    enum State {
        Text,
        Rust(Vec<String>),
        Other,
    }
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut state = State::Text;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let fence = trimmed.strip_prefix("```");
        state = match (state, fence) {
            (State::Text, Some(info)) => {
                let rust = info
                    .split(',')
                    .all(|t| matches!(t.trim(), "" | "rust" | "no_run" | "should_panic"));
                if rust {
                    State::Rust(Vec::new())
                } else {
                    State::Other
                }
            }
            (State::Rust(lines), Some(_)) => {
                let code = lines.join("\n");
                let heading = heading.clone();
                out.push(Example { heading, code });
                State::Text
            }
            (State::Other, Some(_)) => State::Text,
            (State::Rust(mut lines), None) => {
                lines.push(unhide(line));
                State::Rust(lines)
            }
            (State::Other, None) => State::Other,
            (State::Text, None) => {
                if trimmed.starts_with('#') {
                    heading = trimmed.trim_start_matches('#').trim().to_string();
                }
                State::Text
            }
        };
    }
    out
}

/// A code line as rustdoc compiles it: `# x` and `#` are hidden lines, `##` an escaped `#`.
fn unhide(line: &str) -> String {
    let t = line.trim_start();
    if t == "#" {
        String::new()
    } else if let Some(rest) = t.strip_prefix("# ") {
        rest.to_string()
    } else if t.starts_with("##") {
        line.replacen("##", "#", 1)
    } else {
        line.to_string()
    }
}

/// The crate docs of `lib.rs`: its `//!` lines, without the marker.
fn crate_docs(lib_rs: &str) -> String {
    lib_rs
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A program of `code`, as rustdoc makes one: as it is when it has a `main`; else in a
/// `main`, through a closure that returns the block's `Ok::<(), E>(())` when it ends so.
fn program(code: &str) -> String {
    if code.contains("fn main(") {
        return format!("#![allow(unused)]\n{code}\n");
    }
    let last = code
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if last.trim_start().starts_with("Ok::<") {
        format!(
            "#![allow(unused)]\nfn main() {{\n    let example = || {{\n{code}\n    }};\n    example().unwrap();\n}}\n"
        )
    } else {
        format!("#![allow(unused)]\nfn main() {{\n{code}\n}}\n")
    }
}

/// The examples of `crate_dir`'s README and crate docs, each checked to have a Quick
/// start; returns (bin name, program) pairs, the names starting with `prefix`.
fn examples_of(crate_dir: &Path, prefix: &str) -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).unwrap();
    let lib_rs = std::fs::read_to_string(crate_dir.join("src/lib.rs")).unwrap();
    let mut bins = Vec::new();
    for (doc, blocks) in [
        ("readme", rust_blocks(&readme)),
        ("lib_rs", rust_blocks(&crate_docs(&lib_rs))),
    ] {
        let quick = blocks.iter().filter(|e| e.heading == "Quick start").count();
        assert!(
            quick >= 1,
            "{} {doc}: no Rust block under a Quick start heading: {blocks:#?}",
            crate_dir.display()
        );
        for (i, e) in blocks.iter().enumerate() {
            bins.push((format!("{prefix}_{doc}_{i}"), program(&e.code)));
        }
    }
    bins
}

/// Writes package `name` with `deps` (`name = { path = … }` lines) and one bin per example.
fn write_package(root: &Path, name: &str, deps: &[(&str, &Path)], bins: &[(String, String)]) {
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(dir.join("src"));
    std::fs::create_dir_all(dir.join("src/bin")).unwrap();
    let mut toml = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n[dependencies]\n"
    );
    for (dep, path) in deps {
        toml += &format!("{dep} = {{ path = {:?} }}\n", path.display().to_string());
    }
    std::fs::write(dir.join("Cargo.toml"), toml).unwrap();
    for (bin, code) in bins {
        std::fs::write(dir.join(format!("src/bin/{bin}.rs")), code).unwrap();
    }
}

#[test]
fn the_parser_finds_quick_start_blocks_and_unhides_lines() {
    let doc = "# Crate\n\ntext\n\n```sh\ncargo run\n# not a heading\n```\n\n## Quick start\n\n\
               ```rust\nuse a::b;\n#   let x = 1;\n#\n## attr\n```\n\n```text\nout\n```\n\n\
               # More\n\n```no_run\nlet y = 2;\n```\n\n```rust,ignore\nno\n```\n";
    let blocks = rust_blocks(doc);
    let got: Vec<(&str, &str)> = blocks
        .iter()
        .map(|e| (e.heading.as_str(), e.code.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("Quick start", "use a::b;\n  let x = 1;\n\n# attr"),
            ("More", "let y = 2;"),
        ]
    );
    assert_eq!(
        program("let a = f()?;\nOk::<(), E>(())"),
        "#![allow(unused)]\nfn main() {\n    let example = || {\nlet a = f()?;\nOk::<(), E>(())\n    };\n    example().unwrap();\n}\n"
    );
}

#[test]
fn the_quick_starts_build_with_the_crate_as_their_only_dependency() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quick-start-deps");
    std::fs::create_dir_all(&root).unwrap();
    let channel = examples_of(&repo.join("nccl-channel"), "nccl_channel");
    let hal = examples_of(&repo.join("cuda-hal"), "cuda_hal");
    // Only the crate, and the simulators of the hidden lines.
    let (mock, nccl_mock) = (repo.join("cuda-mock"), repo.join("nccl-mock"));
    write_package(
        &root,
        "uses-nccl-channel",
        &[
            ("nccl-channel", &repo.join("nccl-channel")),
            ("cuda-mock", &mock),
            ("nccl-mock", &nccl_mock),
        ],
        &channel,
    );
    write_package(
        &root,
        "uses-cuda-hal",
        &[("cuda-hal", &repo.join("cuda-hal")), ("cuda-mock", &mock)],
        &hal,
    );
    std::fs::write(
        root.join("Cargo.toml"),
        "[workspace]\nresolver = \"3\"\nmembers = [\"uses-nccl-channel\", \"uses-cuda-hal\"]\n",
    )
    .unwrap();
    // The repository's versions of every dependency, so nothing is fetched.
    std::fs::copy(repo.join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["build", "--offline", "--workspace", "--bins", "--quiet"])
        .arg("--target-dir")
        .arg(root.join("target"))
        .env_remove("CARGO_TARGET_DIR")
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "an example does not build with only its crate as a dependency:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every example became a binary: none was left out of the build.
    for (package, bins) in [("uses-nccl-channel", &channel), ("uses-cuda-hal", &hal)] {
        for (bin, _) in bins {
            let exe = root.join("target/debug").join(bin);
            assert!(exe.exists(), "{package}: {} was not built", exe.display());
        }
    }
}
