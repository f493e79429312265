//! Encrypting NCCL's TCP sockets from code (`ncclSetEncryption`, NCCL ≥ 2.32.3).

use std::ffi::CString;

use nccl_sys::{Nccl, ncclEncryptionConfig_t};

use crate::{Error, Result};

/// The shortest pre-shared key NCCL accepts, in bytes.
pub const PSK_MIN_LEN: usize = 32;

/// How NCCL's TCP sockets are protected ([`set_encryption`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encryption {
    /// Plaintext (`NCCL_ENCRYPTION_MODE_NONE`).
    None,
    /// TLS with a pre-shared key of at least [`PSK_MIN_LEN`] bytes, the same on every
    /// rank (`NCCL_ENCRYPTION_MODE_PSK`).
    Psk(String),
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Encryption::None => f.write_str("None"),
            // Never printed: a key.
            Encryption::Psk(_) => f.write_str("Psk(..)"),
        }
    }
}

impl Encryption {
    /// A pre-shared key derived from the rendezvous's secret
    /// ([`RendezvousSecret::nccl_psk`](nccl_rendezvous::RendezvousSecret::nccl_psk)): every rank
    /// holding the secret derives the same key, which reveals nothing of the secret
    /// ([`Rendezvous::encrypt_nccl`](crate::Rendezvous::encrypt_nccl) hands it to NCCL).
    ///
    /// ```
    /// use nccl_channel::{Encryption, RendezvousSecret};
    /// let s = RendezvousSecret::new(*b"0123456789abcdef")?;
    /// let Encryption::Psk(psk) = Encryption::derived_from(&s) else { unreachable!() };
    /// assert_eq!(psk.len(), 64);
    /// assert_eq!(Encryption::derived_from(&s), Encryption::derived_from(&s.clone()));
    /// # Ok::<(), nccl_channel::Error>(())
    /// ```
    #[cfg(feature = "rendezvous")]
    #[must_use]
    pub fn derived_from(secret: &nccl_rendezvous::RendezvousSecret) -> Encryption {
        Encryption::Psk(secret.nccl_psk().as_str().to_owned())
    }
}

/// Asks NCCL to encrypt its TCP sockets (`ncclSetEncryption`, NCCL ≥ 2.32.3); call it
/// before the communicators are made. A key shorter than [`PSK_MIN_LEN`] bytes, or with a
/// NUL byte, is refused with [`Error::InvalidArgument`] before NCCL sees it.
///
/// ```
/// use nccl_channel::{Encryption, Error, set_encryption};
/// # let (_cuda, gpus) = cuda_mock::MockDriver::with_devices(1).build()?;
/// # let (nccl, _sim) = nccl_mock::MockNccl::new(&gpus).build()?;
/// set_encryption(&nccl, &Encryption::Psk("k".repeat(32)))?;
/// let e = set_encryption(&nccl, &Encryption::Psk("short".into())).unwrap_err();
/// assert!(matches!(e, Error::InvalidArgument { what: "set_encryption", .. }));
/// set_encryption(&nccl, &Encryption::None)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(alias = "ncclSetEncryption")]
pub fn set_encryption(nccl: &Nccl, mode: &Encryption) -> Result<()> {
    const WHAT: &str = "set_encryption";
    let (f, call) = optional!(nccl, ncclSetEncryption)?;
    // NCCL_ENCRYPTION_CONFIG_INITIALIZER.
    let mut config = ncclEncryptionConfig_t {
        size: size_of::<ncclEncryptionConfig_t>(),
        magic: nccl_sys::NCCL_API_MAGIC,
        version: nccl_sys::NCCL_VERSION_CODE,
        mode: nccl_sys::ncclEncryptionMode_t::NCCL_ENCRYPTION_MODE_NONE.0 as i32,
        psk: std::ptr::null(),
    };
    let psk: &'static std::ffi::CStr;
    match mode {
        Encryption::None => {}
        Encryption::Psk(key) => {
            if key.len() < PSK_MIN_LEN {
                return Err(Error::InvalidArgument {
                    what: WHAT,
                    problem: format!(
                        "the pre-shared key holds {} bytes; NCCL needs at least {PSK_MIN_LEN}",
                        key.len()
                    ),
                });
            }
            let key = CString::new(key.as_str()).map_err(|_| Error::InvalidArgument {
                what: WHAT,
                problem: "the pre-shared key holds a NUL byte".into(),
            })?;
            // Kept for the life of the process: NCCL's header does not say whether it
            // copies the key or keeps the pointer, so it must never dangle (one key per
            // call, a few bytes).
            psk = Box::leak(key.into_boxed_c_str());
            config.mode = nccl_sys::ncclEncryptionMode_t::NCCL_ENCRYPTION_MODE_PSK.0 as i32;
            config.psk = psk.as_ptr();
        }
    }
    // SAFETY: a config laid out as NCCL_ENCRYPTION_CONFIG_INITIALIZER makes it, whose key (if any)
    // lives as long as the process, whether NCCL copies it or keeps the pointer.
    let rc = unsafe { f(&config) };
    crate::check(nccl, rc, call, None)
}
