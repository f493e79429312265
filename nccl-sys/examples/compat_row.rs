//! One row of the compatibility table: loads the NCCL at the given path through nccl-sys
//! and reports what works. Used by `scripts/compat.py`.
//!
//! ```text
//! compat_row /path/to/libnccl.so.2            # load, optional functions, ids, init error
//! NCCL_COMM_ID=127.0.0.1:29999 compat_row --comm-id /path/to/libnccl.so.2
//! ```
//! Prints `key=value` lines.

use std::process::ExitCode;

use nccl_sys::{Nccl, ncclResult_t, ncclUniqueId};

fn id(n: &Nccl) -> Result<[u8; 128], String> {
    let mut u = ncclUniqueId::default();
    // SAFETY: valid out-pointer.
    let rc = unsafe { (n.fns().ncclGetUniqueId)(&mut u) };
    if rc != ncclResult_t::ncclSuccess {
        return Err(format!(
            "{} ({})",
            rc.name().unwrap_or("?"),
            n.error_string(rc)
        ));
    }
    Ok(u.internal.map(|c| c as u8))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let comm_id = args.iter().any(|a| a == "--comm-id");
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: compat_row [--comm-id] LIBNCCL");
        return ExitCode::from(2);
    };
    // SAFETY: the user names the NCCL library to probe; running its code is the point.
    let n = match unsafe { Nccl::load_from(path) } {
        Ok(n) => n,
        Err(e) => {
            println!("loaded=no: {}", e.to_string().replace('\n', " "));
            return ExitCode::SUCCESS;
        }
    };
    println!("loaded=yes");
    println!("version={}", n.version());
    if comm_id {
        match (id(&n), id(&n)) {
            (Ok(a), Ok(b)) => println!("comm_id_identical={}", if a == b { "yes" } else { "no" }),
            (Err(e), _) | (_, Err(e)) => println!("comm_id_identical=error: {e}"),
        }
        return ExitCode::SUCCESS;
    }
    let present: Vec<&str> = n
        .fns()
        .optional_present()
        .into_iter()
        .filter(|(_, p)| *p)
        .map(|(f, _)| f)
        .collect();
    println!("optional_present={}", present.len());
    println!("optional_total={}", nccl_sys::NcclFns::OPTIONAL.len());
    println!("optional_list={}", present.join(","));
    match (id(&n), id(&n)) {
        (Ok(a), Ok(b)) => println!(
            "unique_id={}",
            if a != b && a.iter().any(|&x| x != 0) {
                "ok (128 bytes, fresh each call)"
            } else {
                "SUSPICIOUS"
            }
        ),
        (Err(e), _) | (_, Err(e)) => println!("unique_id=error: {e}"),
    }
    if let Ok(raw) = id(&n) {
        let u = ncclUniqueId {
            internal: raw.map(|b| b as core::ffi::c_char),
        };
        let mut comm: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a one-rank world with a fresh id and a valid out-pointer.
        let rc = unsafe { (n.fns().ncclCommInitRank)(&mut comm, 1, u, 0) };
        if rc == ncclResult_t::ncclSuccess {
            println!("init_without_gpu=succeeded (a GPU is present)");
            // SAFETY: just created, destroyed once.
            unsafe { (n.fns().ncclCommDestroy)(comm) };
        } else {
            println!(
                "init_without_gpu={}: {}",
                rc.name().unwrap_or("?"),
                n.error_string(rc)
            );
        }
    }
    ExitCode::SUCCESS
}
