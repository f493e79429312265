//! [`RendezvousSecret`]: the shared secret that authenticates a rendezvous and encrypts
//! the unique id on its way, and the keys derived from it (HKDF-SHA256).

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::{Error, Result};

/// The variable naming the file that holds the secret ([`Rendezvous::from_env`](crate::Rendezvous::from_env)).
pub const SECRET_FILE_ENV: &str = "NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE";

/// A secret shared by every rank of a job, which makes its rendezvous authenticated and
/// confidential ([`Rendezvous::secret`](crate::Rendezvous::secret)): before rank 0 hands
/// the unique id to a rank, each proves to the other that it knows the secret (a
/// challenge and response on fresh random numbers of both, so a recorded exchange cannot be
/// replayed), and the id travels encrypted and authenticated (ChaCha20-Poly1305 under a
/// key of that exchange alone). A peer without the secret learns nothing of the id and
/// gets a typed refusal ([`Error::RendezvousRefused`]).
///
/// At least [`RendezvousSecret::MIN_LEN`] bytes, from code, from a file only its owner can
/// read, or fresh from the operating system's random source; random, not a passphrase (see
/// [`MIN_LEN`](RendezvousSecret::MIN_LEN)). Never printed (its `Debug`
/// says `RendezvousSecret(..)`), compared in constant time, wiped from memory when the last
/// clone is dropped.
///
/// ```
/// use nccl_rendezvous::{Error, RendezvousSecret};
/// let secret = RendezvousSecret::new(*b"a secret of at least sixteen bytes")?;
/// assert_eq!(format!("{secret:?}"), "RendezvousSecret(..)");
/// assert!(matches!(RendezvousSecret::new(*b"short"), Err(Error::InvalidArgument { .. })));
/// assert_ne!(RendezvousSecret::generate()?, RendezvousSecret::generate()?);
/// # Ok::<(), nccl_rendezvous::Error>(())
/// ```
#[derive(Clone)]
pub struct RendezvousSecret {
    bytes: Arc<Zeroizing<Vec<u8>>>,
}

static_assertions::assert_impl_all!(RendezvousSecret: Send, Sync);

impl RendezvousSecret {
    /// The fewest bytes a secret may have. Length is not strength: whoever sees one
    /// exchange (or greets rank 0 once) can test guesses of the secret offline, so make it
    /// random — [`RendezvousSecret::generate`], or `openssl rand -hex 32` for a file (64 hex
    /// digits, 256 bits) — never a passphrase.
    pub const MIN_LEN: usize = 16;

    /// The most bytes a secret may have (a file of more is not a secret file).
    pub const MAX_LEN: usize = 4096;

    /// The bytes as the secret; fewer than [`MIN_LEN`](Self::MIN_LEN) or more than
    /// [`MAX_LEN`](Self::MAX_LEN) are [`Error::InvalidArgument`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<RendezvousSecret> {
        let bytes = Zeroizing::new(bytes.into());
        if !(Self::MIN_LEN..=Self::MAX_LEN).contains(&bytes.len()) {
            return Err(Error::InvalidArgument {
                what: "RendezvousSecret",
                problem: format!(
                    "a secret holds {} to {} bytes, not {}",
                    Self::MIN_LEN,
                    Self::MAX_LEN,
                    bytes.len()
                ),
            });
        }
        Ok(RendezvousSecret {
            bytes: Arc::new(bytes),
        })
    }

    /// 32 bytes from the operating system's random source: a launcher makes one per
    /// launch and hands it to its ranks (in a file only they can read).
    pub fn generate() -> Result<RendezvousSecret> {
        let mut bytes = Zeroizing::new(vec![0u8; 32]);
        fill_random(&mut bytes)?;
        Self::new(bytes.to_vec())
    }

    /// The secret in the file at `path`: its bytes, less one trailing line end (`\n` or
    /// `\r\n`, as `openssl rand -hex 32 > file` leaves). On Unix the file must not be
    /// readable, writable or executable by its group or others (`chmod 600`), as ssh asks
    /// of a private key: a file others can read is [`Error::InvalidArgument`] naming its
    /// mode, before anything of it is read.
    ///
    /// ```
    /// # use std::io::Write;
    /// # #[cfg(unix)] {
    /// use std::os::unix::fs::OpenOptionsExt;
    /// use nccl_rendezvous::RendezvousSecret;
    /// let path = std::env::temp_dir().join(format!("doc-secret-{}", std::process::id()));
    /// let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true)
    ///     .mode(0o600).open(&path)?;
    /// writeln!(f, "0123456789abcdef0123456789abcdef")?;
    /// let from_file = RendezvousSecret::from_file(&path)?;
    /// assert_eq!(from_file, RendezvousSecret::new(*b"0123456789abcdef0123456789abcdef")?);
    /// # std::fs::remove_file(&path)?;
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<RendezvousSecret> {
        let path = path.as_ref();
        let io = |what: &'static str, e: std::io::Error| Error::Io {
            what,
            path: path.display().to_string(),
            source: e.into(),
        };
        let file = std::fs::File::open(path).map_err(|e| io("opening the secret file", e))?;
        let meta = file
            .metadata()
            .map_err(|e| io("reading the secret file's mode", e))?;
        check_private(path, &meta)?;
        // A line end may follow the longest secret.
        if meta.len() > (Self::MAX_LEN + 2) as u64 {
            return Err(Error::InvalidArgument {
                what: "RendezvousSecret",
                problem: format!(
                    "{} holds {} bytes; a secret holds at most {}",
                    path.display(),
                    meta.len(),
                    Self::MAX_LEN
                ),
            });
        }
        let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
        // At most one byte past the limit, should the file grow after its length was read.
        std::io::Read::take(&file, (Self::MAX_LEN + 3) as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| io("reading the secret file", e))?;
        let n = bytes.len();
        if bytes.ends_with(b"\r\n") {
            bytes.truncate(n - 2);
        } else if bytes.ends_with(b"\n") {
            bytes.truncate(n - 1);
        }
        Self::new(bytes.to_vec()).map_err(|e| match e {
            Error::InvalidArgument { what, problem } => Error::InvalidArgument {
                what,
                problem: format!("{}: {problem}", path.display()),
            },
            other => other,
        })
    }

    /// A pre-shared key for NCCL's own encryption of its sockets (64 hex digits, 32
    /// bytes), derived from this secret: every rank holding the secret derives the same
    /// key, and the key reveals nothing of the secret. nccl-channel hands it to
    /// `ncclSetEncryption` ([`Rendezvous::encrypt_nccl`](crate::Rendezvous::encrypt_nccl)).
    ///
    /// ```
    /// use nccl_rendezvous::RendezvousSecret;
    /// let s = RendezvousSecret::new(*b"0123456789abcdef")?;
    /// let psk = s.nccl_psk();
    /// assert_eq!(psk.len(), 64);
    /// assert_eq!(psk, s.clone().nccl_psk());
    /// # Ok::<(), nccl_rendezvous::Error>(())
    /// ```
    #[must_use]
    pub fn nccl_psk(&self) -> Zeroizing<String> {
        let key = self.derive(b"nccl-channel nccl encryption key", b"");
        Zeroizing::new(crate::decimal::hex(key.as_ref()))
    }

    /// 32 bytes derived from the secret for `purpose` (HKDF-SHA256, the salt naming this
    /// crate's use, `context` binding the key to one exchange).
    pub(crate) fn derive(&self, purpose: &[u8], context: &[u8]) -> Zeroizing<[u8; 32]> {
        let hk = Hkdf::<Sha256>::new(Some(b"nccl-channel rendezvous secret"), &self.bytes);
        let mut info = Zeroizing::new(Vec::with_capacity(purpose.len() + 1 + context.len()));
        info.extend_from_slice(purpose);
        info.push(0);
        info.extend_from_slice(context);
        let mut out = Zeroizing::new([0u8; 32]);
        // HKDF-SHA256 gives up to 255 × 32 bytes: 32 always fit, so this cannot fail.
        let fitted = hk.expand(&info, out.as_mut());
        debug_assert!(fitted.is_ok());
        out
    }
}

impl PartialEq for RendezvousSecret {
    /// In constant time (over the bytes of the shorter length).
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq;
        self.bytes.len() == other.bytes.len() && bool::from(self.bytes.ct_eq(&other.bytes))
    }
}

impl Eq for RendezvousSecret {}

impl fmt::Debug for RendezvousSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RendezvousSecret(..)")
    }
}

/// Random bytes from the operating system.
pub(crate) fn fill_random(out: &mut [u8]) -> Result<()> {
    getrandom::fill(out).map_err(|e| Error::InvalidArgument {
        what: "RendezvousSecret",
        problem: format!("the operating system gave no random bytes: {e}"),
    })
}

#[cfg(unix)]
fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::InvalidArgument {
            what: "RendezvousSecret",
            problem: format!(
                "{} has mode {mode:03o}: its group or others may read or change it; a \
                 secret file must be its owner's alone (chmod 600 {})",
                path.display(),
                path.display()
            ),
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_path: &Path, _meta: &std::fs::Metadata) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_differ_by_purpose_context_and_secret() {
        let a = RendezvousSecret::new([1u8; 16]).unwrap();
        let b = RendezvousSecret::new([2u8; 16]).unwrap();
        let k = |s: &RendezvousSecret, p: &[u8], c: &[u8]| *s.derive(p, c);
        assert_eq!(k(&a, b"p", b"c"), k(&a.clone(), b"p", b"c"));
        assert_ne!(k(&a, b"p", b"c"), k(&b, b"p", b"c"));
        assert_ne!(k(&a, b"p", b"c"), k(&a, b"q", b"c"));
        assert_ne!(k(&a, b"p", b"c"), k(&a, b"p", b"d"));
        // The separator keeps purpose and context apart.
        assert_ne!(k(&a, b"pc", b""), k(&a, b"p", b"c"));
    }

    #[test]
    fn the_nccl_key_is_derived_long_enough_and_secret_free() {
        let s = RendezvousSecret::new(*b"0123456789abcdef").unwrap();
        let psk = s.nccl_psk();
        assert_eq!(psk.len(), 64);
        assert!(!psk.contains("0123456789abcdef"));
        assert_eq!(s.nccl_psk(), s.clone().nccl_psk());
        // The key of the release before this crate split off: NCCL's traffic of ranks of
        // both stays readable to each other.
        assert_eq!(
            psk.as_str(),
            crate::decimal::hex(s.derive(b"nccl-channel nccl encryption key", b"").as_ref())
        );
    }

    #[test]
    fn lengths_outside_the_bounds_are_refused() {
        assert!(RendezvousSecret::new(vec![0u8; RendezvousSecret::MIN_LEN - 1]).is_err());
        assert!(RendezvousSecret::new(vec![0u8; RendezvousSecret::MIN_LEN]).is_ok());
        assert!(RendezvousSecret::new(vec![0u8; RendezvousSecret::MAX_LEN]).is_ok());
        assert!(RendezvousSecret::new(vec![0u8; RendezvousSecret::MAX_LEN + 1]).is_err());
        // As documented: 16 to 4096 bytes.
        assert!(RendezvousSecret::new([0u8; 15]).is_err());
        assert!(RendezvousSecret::new([0u8; 16]).is_ok());
        assert!(RendezvousSecret::new(vec![0u8; 4096]).is_ok());
        assert!(RendezvousSecret::new(vec![0u8; 4097]).is_err());
        assert_ne!(
            RendezvousSecret::new([1u8; 16]).unwrap(),
            RendezvousSecret::new([1u8; 17]).unwrap()
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_read_is_refused_and_line_ends_are_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("secret-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        std::fs::write(&path, b"0123456789abcdef\r\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o601] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = RendezvousSecret::from_file(&path).unwrap_err();
            let Error::InvalidArgument { problem, .. } = &e else {
                panic!("{e:?}")
            };
            assert!(problem.contains(&format!("mode {mode:03o}")), "{problem}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            RendezvousSecret::from_file(&path).unwrap(),
            RendezvousSecret::new(*b"0123456789abcdef").unwrap()
        );
        std::fs::write(&path, b"0123456789abcdef\n").unwrap();
        assert_eq!(
            RendezvousSecret::from_file(&path).unwrap(),
            RendezvousSecret::new(*b"0123456789abcdef").unwrap()
        );
        std::fs::write(&path, vec![b'x'; RendezvousSecret::MAX_LEN + 10]).unwrap();
        assert!(matches!(
            RendezvousSecret::from_file(&path),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            RendezvousSecret::from_file(dir.join("missing")),
            Err(Error::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
