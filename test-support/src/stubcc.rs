//! Compiles a C source into a shared library with the `cc` crate, at test time, so the
//! loaders can be tested against libraries that misbehave on purpose.

use std::path::PathBuf;
use std::process::Command;

/// Compiles `source` into `lib<name>.so` in a fresh folder under `tmp` (a test's
/// `env!("CARGO_TARGET_TMPDIR")`) and returns its path. Panics (failing the test) if the
/// compiler fails.
pub fn shared_library(tmp: &str, name: &str, source: &str) -> PathBuf {
    shared_library_with(tmp, name, source, &[])
}

/// [`shared_library`] with extra arguments to the compiler driver, e.g.
/// `-Wl,-soname,libnccl.so.2` for a library the dynamic loader knows by that soname.
pub fn shared_library_with(tmp: &str, name: &str, source: &str, args: &[&str]) -> PathBuf {
    let dir = PathBuf::from(tmp).join(format!(
        "stub-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let compiler = cc::Build::new()
        .target(&target)
        .host(&target)
        .opt_level(0)
        .cargo_metadata(false)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args(["-shared", "-fPIC"]).args(args);
    cmd.arg("-o").arg(&out).arg(&src);
    let status = cmd.status().expect("C compiler runs");
    assert!(status.success(), "compiling {} failed", src.display());
    out
}
