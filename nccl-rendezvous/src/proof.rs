//! The cryptography of one authenticated exchange, on keys derived from the
//! [`RendezvousSecret`]: proofs of knowing the secret (HMAC-SHA256 over everything both
//! sides said, so neither can be replayed into another exchange) and the id sealed for one
//! exchange alone (ChaCha20-Poly1305).

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::secret::RendezvousSecret;
use crate::{Id, Result};

/// The bytes of a nonce, a proof's tag and a sealed id's tag.
pub(crate) const NONCE_LEN: usize = 32;
pub(crate) const TAG_LEN: usize = 32;
pub(crate) const SEALED_LEN: usize = 128 + 16;

/// Who proves: each side's proof carries its role, so one side's proof never passes for
/// the other's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Role {
    /// Rank 0 (or the one who stored the id), answering a greeting.
    Server,
    /// A rank proving it before it gets the id.
    Client,
    /// A rank confirming it got the id.
    Ack,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Server => b"server",
            Role::Client => b"client",
            Role::Ack => b"ack",
        }
    }
}

/// The keys of one rendezvous's secret, derived once per exchange.
pub(crate) struct Keys {
    secret: RendezvousSecret,
    mac: Zeroizing<[u8; 32]>,
}

impl Keys {
    pub(crate) fn new(secret: &RendezvousSecret) -> Keys {
        Keys {
            secret: secret.clone(),
            mac: secret.derive(b"rendezvous proof", b""),
        }
    }

    /// The tag proving, as `role`, knowledge of the secret over `transcript`.
    pub(crate) fn prove(&self, role: Role, transcript: &[u8]) -> [u8; TAG_LEN] {
        self.mac_of(role, transcript).finalize().into_bytes().into()
    }

    /// Whether `tag` proves `role`'s knowledge over `transcript` (in constant time).
    pub(crate) fn verify(&self, role: Role, transcript: &[u8], tag: &[u8]) -> bool {
        self.mac_of(role, transcript).verify_slice(tag).is_ok()
    }

    fn mac_of(&self, role: Role, transcript: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(self.mac.as_ref())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(role.label());
        m.update(&[0]);
        m.update(transcript);
        m
    }

    /// `id` sealed under a key of `transcript` alone (each exchange has fresh nonces,
    /// hence its own key, so a fixed AEAD nonce is never reused under one key).
    pub(crate) fn seal(&self, transcript: &[u8], id: &Id) -> [u8; SEALED_LEN] {
        let sealed = self
            .cipher(transcript)
            .encrypt(
                &[0u8; 12].into(),
                Payload {
                    msg: id.as_slice(),
                    aad: transcript,
                },
            )
            .unwrap_or_default();
        let mut out = [0u8; SEALED_LEN];
        if sealed.len() == SEALED_LEN {
            out.copy_from_slice(&sealed);
        }
        out
    }

    /// The id sealed by [`Keys::seal`] over the same transcript, `None` when the bytes
    /// were not (another key, a changed byte).
    pub(crate) fn open(&self, transcript: &[u8], sealed: &[u8]) -> Option<Id> {
        let plain = Zeroizing::new(
            self.cipher(transcript)
                .decrypt(
                    &[0u8; 12].into(),
                    Payload {
                        msg: sealed,
                        aad: transcript,
                    },
                )
                .ok()?,
        );
        <[u8; 128]>::try_from(plain.as_slice()).ok()
    }

    fn cipher(&self, transcript: &[u8]) -> ChaCha20Poly1305 {
        let key = self.secret.derive(b"rendezvous id", transcript);
        ChaCha20Poly1305::new(&(*key).into())
    }
}

/// A fresh random nonce.
pub(crate) fn nonce() -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    crate::secret::fill_random(&mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> Keys {
        Keys::new(&RendezvousSecret::new([b; 16]).unwrap())
    }

    #[test]
    fn a_proof_passes_only_for_its_role_transcript_and_secret() {
        let k = keys(1);
        let tag = k.prove(Role::Server, b"t");
        assert!(k.verify(Role::Server, b"t", &tag));
        assert!(!k.verify(Role::Client, b"t", &tag));
        assert!(!k.verify(Role::Ack, b"t", &tag));
        assert!(!k.verify(Role::Server, b"u", &tag));
        assert!(!keys(2).verify(Role::Server, b"t", &tag));
        assert!(!k.verify(Role::Server, b"t", &tag[..31]));
    }

    #[test]
    fn a_sealed_id_opens_only_with_its_transcript_and_secret() {
        let k = keys(1);
        let id = [9; 128];
        let sealed = k.seal(b"t", &id);
        assert_ne!(&sealed[..128], id.as_slice());
        assert_eq!(k.open(b"t", &sealed), Some(id));
        assert_eq!(k.open(b"u", &sealed), None);
        assert_eq!(keys(2).open(b"t", &sealed), None);
        for i in [0, 127, 128, SEALED_LEN - 1] {
            let mut bad = sealed;
            bad[i] ^= 1;
            assert_eq!(k.open(b"t", &bad), None, "byte {i}");
        }
        assert_eq!(k.open(b"t", &sealed[..SEALED_LEN - 1]), None);
        // Another transcript seals the same id to other bytes.
        assert_ne!(k.seal(b"u", &id), sealed);
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
