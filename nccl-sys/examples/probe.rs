//! Loads the CUDA driver and NCCL and prints what was found.
//!
//! ```text
//! cargo run -p nccl-sys --example probe                      # search for both
//! cargo run -p nccl-sys --example probe -- /path/libnccl.so.2 ...   # also these NCCLs
//! ```
//! Exits non-zero when the driver or any NCCL cannot be loaded, with the reason.

use std::process::ExitCode;
use std::time::Instant;

use cuda_sys::{CUresult, Driver};
use nccl_sys::{Nccl, ncclResult_t, ncclUniqueId};

fn main() -> ExitCode {
    let mut ok = true;
    let t = Instant::now();
    match Driver::load() {
        Ok(d) => {
            let loaded = t.elapsed();
            let mut count = 0;
            // SAFETY: plain driver calls with valid out-pointers.
            let rc = unsafe {
                let rc = (d.fns().cuInit)(0);
                if rc == CUresult::CUDA_SUCCESS {
                    (d.fns().cuDeviceGetCount)(&mut count)
                } else {
                    rc
                }
            };
            println!(
                "CUDA driver {} from {} (loaded and resolved in {:?})",
                d.version(),
                d.origin(),
                loaded
            );
            if rc == CUresult::CUDA_SUCCESS {
                println!("  devices: {count}");
            } else {
                println!("  cuInit/cuDeviceGetCount failed: CUresult {}", rc.0);
                ok = false;
            }
        }
        Err(e) => {
            println!("CUDA driver: {e}");
            ok = false;
        }
    }
    let paths: Vec<String> = std::env::args().skip(1).collect();
    let mut loads: Vec<(
        String,
        Result<Nccl, nccl_sys::LoadError>,
        std::time::Duration,
    )> = Vec::new();
    let t = Instant::now();
    loads.push(("search".into(), Nccl::load(), t.elapsed()));
    for p in paths {
        let t = Instant::now();
        // SAFETY: the user names the NCCL libraries to probe; running their code is the point.
        let r = unsafe { Nccl::load_from(&p) };
        loads.push((p, r, t.elapsed()));
    }
    for (what, r, took) in loads {
        match r {
            Ok(n) => {
                let present = n.fns().optional_present();
                let have = present.iter().filter(|(_, p)| *p).count();
                println!(
                    "NCCL {} [{what}] from {} (loaded and resolved in {took:?}); optional functions: {have}/{}",
                    n.version(),
                    n.origin(),
                    present.len()
                );
                let mut id = ncclUniqueId::default();
                // SAFETY: valid out-pointer.
                let rc = unsafe { (n.fns().ncclGetUniqueId)(&mut id) };
                if rc != ncclResult_t::ncclSuccess {
                    println!("  ncclGetUniqueId failed: {}", n.error_string(rc));
                    ok = false;
                }
            }
            Err(e) => {
                println!("NCCL [{what}]: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
