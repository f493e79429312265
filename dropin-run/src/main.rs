//! `mock-dropin-run`: runs an unchanged program on simulated GPUs. It builds the
//! [`mock-dropin`](https://docs.rs/mock-dropin) library once (with the same version as
//! itself, from the registry, through cargo), lays it out as `libcuda.so.1`,
//! `libcuda.so`, `libnccl.so.2` and `libnccl.so` in a folder of its own, and runs the
//! program with that folder first on `LD_LIBRARY_PATH`.
//!
//! ```text
//! mock-dropin-run [--gpus N] [--] PROGRAM [ARGS...]   run PROGRAM on the simulated GPUs
//! mock-dropin-run --lib-dir                           print the folder (building it first)
//! ```
//!
//! The folder is `$MOCK_DROPIN_HOME/<version>/lib`, by default under
//! `$XDG_CACHE_HOME/mock-dropin` or `~/.cache/mock-dropin`. The build runs `cargo` (or
//! `$CARGO`) in `$MOCK_DROPIN_HOME/<version>/build`, so cargo's configuration there and in
//! the folders above it applies (an offline build, a mirror of the registry).

mod library;

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode};

use clap::Parser;

/// Runs an unchanged CUDA/NCCL program on simulated GPUs (mock-dropin).
#[derive(Parser, Debug)]
#[command(name = "mock-dropin-run", version)]
struct Opts {
    /// Print the folder that holds the drop-in libcuda.so.1 and libnccl.so.2 (building it
    /// first if needed), for LD_LIBRARY_PATH, and run nothing.
    #[arg(long, conflicts_with_all = ["gpus", "program"])]
    lib_dir: bool,
    /// How many simulated GPUs the program sees, 1 to 64 (CUDA_MOCK_DEVICES; default 8).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus: Option<u32>,
    /// The program and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "lib_dir"
    )]
    program: Vec<OsString>,
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    let dir = match library::ensure(&library::home()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("mock-dropin-run: {e}");
            return ExitCode::FAILURE;
        }
    };
    if opts.lib_dir {
        println!("{}", dir.display());
        return ExitCode::SUCCESS;
    }
    let Some((program, args)) = opts.program.split_first() else {
        return ExitCode::from(2);
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", library::search_path(&dir));
    if let Some(n) = opts.gpus {
        cmd.env("CUDA_MOCK_DEVICES", n.to_string());
    }
    // The program takes this process's place (its PID, its signals, its exit status);
    // exec returns only when it could not start.
    let e = cmd.exec();
    eprintln!(
        "mock-dropin-run: cannot run {}: {e}",
        program.to_string_lossy()
    );
    ExitCode::from(127)
}
