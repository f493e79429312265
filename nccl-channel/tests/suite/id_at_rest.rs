//! The id where it rests or where its protection is set: the id file rank 0 writes is its
//! owner's alone and written through no link planted for it; a secret file set beside
//! `NCCL_COMM_ID` (which protects nothing) is refused rather than ignored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use nccl_channel::{Error, IdSource, UniqueId, World};

use crate::common::Rig;

/// Rank 0 writes the id file: the file has mode 0600 whatever the umask, a link planted
/// at the name an earlier release used for its temporary file (`<path>.tmp.<pid>`) is
/// not written through, and no temporary file is left.
#[cfg(unix)]
#[test]
fn the_id_file_is_its_owners_alone_and_written_through_no_link() {
    use std::os::unix::fs::PermissionsExt;
    Rig::new(1).check(|rig| {
        let dir = std::env::temp_dir().join(format!("nccl-channel-id-rest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let victim = dir.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let planted = path.with_extension(format!("tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let id = UniqueId::exchange_via_file(&rig.nccl, &path, 0, Duration::from_secs(5)).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:03o}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", id.to_hex())
        );
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let link = planted.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(names, ["id".to_string(), link, "victim".to_string()]);
        let read = UniqueId::exchange_via_file(&rig.nccl, &path, 1, Duration::from_secs(5));
        assert_eq!(read, Ok(id));
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

/// `NCCL_COMM_ID` gives every rank the id with no exchange: a secret file set beside it
/// would protect nothing, so the channel refuses to start rather than ignore it.
#[test]
fn a_secret_file_set_beside_nccl_comm_id_is_refused() {
    let env = [
        ("NCCL_COMM_ID", std::ffi::OsStr::new("127.0.0.1:8125")),
        (
            "NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE",
            std::ffi::OsStr::new("/run/secret"),
        ),
    ];
    if !test_support::this_test_in_scrubbed_child!(&env) {
        return;
    }
    for source in [IdSource::Auto, IdSource::CommIdEnv] {
        let rig = Rig::new(2);
        let world = World::new(2, 0).unwrap();
        let e = rig.channel(world).unique_id(source).build().unwrap_err();
        let Error::Env {
            variable,
            value,
            problem,
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!(variable, "NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE");
        assert_eq!(value, "/run/secret");
        assert!(problem.contains("NCCL_COMM_ID=127.0.0.1:8125"), "{problem}");
        rig.assert_clean();
    }
}
