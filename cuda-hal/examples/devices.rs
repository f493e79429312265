//! Lists the CUDA devices as `nvidia-smi -L` does, with memory and compute capability.
//!
//! ```text
//! cargo run -p cuda-hal --example devices
//! ```
//! Without a driver it prints one line saying what was looked for and where, and exits 1.

use std::process::ExitCode;

use cuda_hal::Cuda;

fn main() -> ExitCode {
    let cuda = match Cuda::load() {
        Ok(c) => c,
        Err(e) => {
            // One line: the loader's list of attempts, joined.
            let text = e.to_string().replace("\n  ", "; ").replace(":;", ":");
            eprintln!("no CUDA driver: {text}");
            return ExitCode::FAILURE;
        }
    };
    let devices = match cuda.devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot list devices: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "CUDA driver {} ({})",
        cuda.version(),
        cuda.driver().origin()
    );
    for d in devices {
        let line = (|| -> cuda_hal::Result<String> {
            let (major, minor) = d.compute_capability()?;
            Ok(format!(
                "{}  memory {:.1} GiB, compute capability {major}.{minor}, PCI {}",
                d.describe()?,
                d.total_memory()? as f64 / (1u64 << 30) as f64,
                d.pci_bus_id()?
            ))
        })();
        match line {
            Ok(l) => println!("{l}"),
            Err(e) => println!("GPU {}: {e}", d.ordinal()),
        }
    }
    ExitCode::SUCCESS
}
