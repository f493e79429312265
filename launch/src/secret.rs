//! The rendezvous secret of one launch: a file of fresh random bytes that only the user
//! who launched can read, named to every rank it starts.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The variable naming the rendezvous's secret file (nccl-channel's `SECRET_FILE_ENV`).
pub(crate) const SECRET_FILE_ENV: &str = "NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE";

/// Random bytes in a secret (64 hex digits in its file).
const SECRET_BYTES: usize = 32;

/// How many random directory names are tried before giving up (one is taken only if
/// something made it first).
const ATTEMPTS: usize = 8;

/// A secret file made for one launch, in a directory of its own (mode 0700, the file
/// 0600): only this launch's ranks, run as the same user, can read it, so a peer on the
/// machine that finds the rendezvous port cannot take the unique id. Dropped when the
/// launch returns (success, a failed rank, the timeout), it removes the file and its
/// directory; a launcher killed by a signal leaves them.
#[derive(Debug)]
pub(crate) struct LaunchSecret {
    dir: PathBuf,
    file: PathBuf,
}

impl LaunchSecret {
    /// The secret file a launch hands its ranks: the caller's own (`None`: their
    /// `NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE` passes through), else one made now.
    pub(crate) fn for_launch() -> Result<Option<LaunchSecret>, String> {
        let given = std::env::var_os(SECRET_FILE_ENV)
            .is_some_and(|v| !v.to_string_lossy().trim().is_empty());
        if given {
            return Ok(None);
        }
        let parent = std::env::temp_dir();
        LaunchSecret::create_in(&parent).map(Some).map_err(|e| {
            format!(
                "making the rendezvous's secret file in {}: {e}",
                parent.display()
            )
        })
    }

    /// A fresh private directory under `parent` holding 32 random bytes, hex-encoded.
    pub(crate) fn create_in(parent: &Path) -> std::io::Result<LaunchSecret> {
        let dir = private_dir(parent)?;
        // From here on, dropping `secret` removes whatever was made.
        let secret = LaunchSecret {
            file: dir.join("secret"),
            dir,
        };
        let mut hex = hex(SECRET_BYTES)?;
        hex.push('\n');
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&secret.file)?;
        // Exactly 0600, whatever the umask took away.
        f.set_permissions(Permissions::from_mode(0o600))?;
        f.write_all(hex.as_bytes())?;
        Ok(secret)
    }

    /// The file, as the ranks get it in `NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE`.
    pub(crate) fn path(&self) -> &Path {
        &self.file
    }
}

impl Drop for LaunchSecret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A directory of a new random name under `parent`, mode 0700 (made by this call, never
/// one that was there).
fn private_dir(parent: &Path) -> std::io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let tag = hex(8)?;
        let dir = parent.join(format!("nccl-launch-{}-{tag}", std::process::id()));
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                // Exactly 0700, whatever the umask took away.
                if let Err(e) = std::fs::set_permissions(&dir, Permissions::from_mode(0o700)) {
                    let _ = std::fs::remove_dir(&dir);
                    return Err(e);
                }
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no directory name was free")))
}

/// `n` random bytes from the operating system, in hex.
fn hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A directory of this test alone, removed at the end.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir()
                .join(format!("launch-secret-test-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            Scratch(dir)
        }

        fn entries(&self) -> Vec<PathBuf> {
            std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_secret_file_is_0600_in_a_0700_directory_of_its_own_while_it_exists() {
        let scratch = Scratch::new("modes");
        let secret = LaunchSecret::create_in(&scratch.0).unwrap();
        let file = secret.path().to_path_buf();
        let dir = file.parent().unwrap().to_path_buf();
        assert_eq!(scratch.entries(), std::slice::from_ref(&dir));
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn the_secret_is_64_hex_digits_that_the_ranks_read_and_differs_per_launch() {
        let scratch = Scratch::new("hex");
        let a = LaunchSecret::create_in(&scratch.0).unwrap();
        let b = LaunchSecret::create_in(&scratch.0).unwrap();
        let text = std::fs::read_to_string(a.path()).unwrap();
        let digits = text.strip_suffix('\n').unwrap();
        assert_eq!(digits.len(), 64);
        assert!(digits.bytes().all(|c| c.is_ascii_hexdigit()), "{text:?}");
        let read = nccl_channel::RendezvousSecret::from_file(a.path()).unwrap();
        assert_eq!(
            read,
            nccl_channel::RendezvousSecret::new(digits.as_bytes()).unwrap()
        );
        assert_ne!(
            read,
            nccl_channel::RendezvousSecret::from_file(b.path()).unwrap()
        );
        assert_ne!(a.path().parent(), b.path().parent());
    }

    #[test]
    fn dropping_the_secret_removes_its_file_and_directory() {
        let scratch = Scratch::new("drop");
        let secret = LaunchSecret::create_in(&scratch.0).unwrap();
        let file = secret.path().to_path_buf();
        assert!(file.exists());
        drop(secret);
        assert!(!file.exists());
        assert_eq!(scratch.entries(), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_secret_that_cannot_be_made_is_an_error_naming_why() {
        let missing = std::env::temp_dir().join(format!(
            "launch-secret-test-{}-missing/below",
            std::process::id()
        ));
        let e = LaunchSecret::create_in(&missing).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }
}
