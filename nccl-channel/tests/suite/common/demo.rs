//! Finds the programs the tests start: the examples (`$NCCL_CHANNEL_DEMO` for allgather,
//! `$NCCL_CHANNEL_DATA_PARALLEL`) and the benchmark (`$NCCL_CHANNEL_BENCH`, the `bench`
//! binary of nccl-bench), else beside this test binary (the GPU machine's staged layout),
//! else in cargo's `examples/` or profile folder (built on demand).

use std::path::{Path, PathBuf};

pub fn demo_exe() -> PathBuf {
    example_exe("allgather", "NCCL_CHANNEL_DEMO")
}

/// The example `name` of nccl-channel: `$var`, beside this test binary, or in cargo's
/// `examples/`.
pub fn example_exe(name: &str, var: &str) -> PathBuf {
    program(name, var, Program::Example)
}

/// The benchmark, a binary crate of its own (`bench/`): `$NCCL_CHANNEL_BENCH`, beside this
/// test binary, or in cargo's profile folder.
pub fn bench_exe() -> PathBuf {
    program("bench", "NCCL_CHANNEL_BENCH", Program::Bin("nccl-bench"))
}

/// What a program the tests start is to cargo.
#[derive(Clone, Copy)]
enum Program {
    /// An example of nccl-channel.
    Example,
    /// A binary of the workspace's package.
    Bin(&'static str),
}

impl Program {
    /// Where cargo puts it, under the profile's folder.
    fn folder(self, profile_dir: &Path) -> PathBuf {
        match self {
            Program::Example => profile_dir.join("examples"),
            Program::Bin(_) => profile_dir.to_path_buf(),
        }
    }

    /// The arguments of `cargo build` that build it.
    fn build_args(self, name: &str) -> Vec<&str> {
        match self {
            // As the tests are built (all features: tensor_parallel needs `cudarc`).
            Program::Example => vec!["-p", "nccl-channel", "--all-features", "--example", name],
            Program::Bin(package) => vec!["-p", package, "--bin", name],
        }
    }
}

/// `name`: `$var`, beside this test binary, or where cargo builds it (built now if
/// missing: under `cargo test` with a target filter it may not be built yet).
fn program(name: &str, var: &str, kind: Program) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let me = std::env::current_exe().unwrap();
    let dir = me.parent().unwrap();
    // The test binary lives in the profile's `deps/`.
    let profile_dir = dir.parent();
    let mut candidates = vec![dir.join(name)];
    if let Some(p) = profile_dir {
        candidates.push(kind.folder(p).join(name));
    }
    if let Some(found) = candidates.into_iter().find(|c| c.exists()) {
        return found;
    }
    if let (Some(cargo), Some(profile_dir)) = (std::env::var_os("CARGO"), profile_dir) {
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-q"]).args(kind.build_args(name));
        if release {
            cmd.arg("--release");
        }
        if cmd.status().is_ok_and(|s| s.success()) {
            let built = kind.folder(profile_dir).join(name);
            if built.exists() {
                return built;
            }
        }
    }
    panic!(
        "{name} was not found beside {} or where cargo builds it; build it (cargo build \
         {}) or set {var}",
        me.display(),
        kind.build_args(name).join(" ")
    );
}

/// Runs the demo with `args` and `env`; returns (success, stdout, stderr).
pub fn run_demo(args: &[&str], env: &[(&str, String)]) -> (bool, String, String) {
    run_example(demo_exe(), args, env)
}

/// As [`run_demo`] for a GPU test: `NCCL_SYS_LIBRARY` and `CUDA_SYS_LIBRARY` pass through.
pub fn run_demo_on_gpus(args: &[&str], env: &[(&str, String)]) -> (bool, String, String) {
    run(super::env::scrubbed_for_gpu(demo_exe()), args, env)
}

/// Runs `exe` with `args` and `env` (on top of a scrubbed environment, see
/// [`super::env`]); returns (success, stdout, stderr).
pub fn run_example(exe: PathBuf, args: &[&str], env: &[(&str, String)]) -> (bool, String, String) {
    run(super::env::scrubbed(exe), args, env)
}

fn run(
    mut cmd: std::process::Command,
    args: &[&str],
    env: &[(&str, String)],
) -> (bool, String, String) {
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A port free now, below Linux's ephemeral range (32768 and up): a port `bind(":0")` gave
/// and released can be handed to another socket before the test's process binds it again,
/// one chosen here cannot (nothing picks it at random). Each test process starts at a
/// random place and walks up.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    const LOW: u16 = 20000;
    const SPAN: u16 = 12000;
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut p = next.unwrap_or_else(|| {
        let random = RandomState::new().hash_one(std::process::id());
        LOW + (random % u64::from(SPAN)) as u16
    });
    loop {
        let port = p;
        p = LOW + (p - LOW + 1) % SPAN;
        let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        if free {
            *next = Some(p);
            return port;
        }
    }
}
