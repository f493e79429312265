//! `ncclSetEncryption` (2.32.3): TLS for NCCL's TCP sockets, requested from code; checked
//! as NCCL 2.32.3 checks it (its answers and messages, tested against the library in
//! nccl-channel's `params_real` tests), and remembered ([`crate::MockNcclWorld`] does not
//! expose it: the simulated sockets are loopback ones and stay plaintext).

use std::ffi::CStr;

use crate::macros::mock_fns;
use crate::state::fail;
use nccl_sys::{NCCL_API_MAGIC, ncclEncryptionConfig_t, ncclResult_t};

/// The shortest pre-shared key NCCL accepts, in bytes.
const PSK_MIN: usize = 32;

mock_fns! {
    fn ncclSetEncryption = set_encryption(w, s, config: *const ncclEncryptionConfig_t) {
        let _ = w;
        if config.is_null() {
            // NCCL 2.32.3 answers success and does nothing.
            return ncclResult_t::ncclSuccess;
        }
        // SAFETY: non-NULL; the caller's struct.
        let c = unsafe { config.read_unaligned() };
        if c.magic != NCCL_API_MAGIC {
            return fail(&mut s, ncclResult_t::ncclInvalidArgument,
                "ncclSetEncryption: config not initialized via NCCL_ENCRYPTION_CONFIG_INITIALIZER".into());
        }
        match c.mode {
            0 => ncclResult_t::ncclSuccess,
            1 if c.psk.is_null() => fail(&mut s, ncclResult_t::ncclInvalidArgument,
                "ncclSetEncryption: NCCL_ENCRYPTION_MODE_PSK requires config->psk".into()),
            1 => {
                // SAFETY: non-NULL, NUL-terminated by the API's contract.
                let psk = unsafe { CStr::from_ptr(c.psk) };
                if psk.to_bytes().len() < PSK_MIN {
                    return fail(&mut s, ncclResult_t::ncclInvalidArgument,
                        "ncclSetEncryption: config->psk must be at least 32 bytes".into());
                }
                ncclResult_t::ncclSuccess
            }
            m => fail(&mut s, ncclResult_t::ncclInvalidArgument,
                format!("ncclSetEncryption: config->mode={m} is not a supported encryption mode")),
        }
    }
}
