//! The rendezvous secret file of a launch, as its ranks see it and as the launch leaves
//! it. The launcher starts the running executable, so this test binary is its own rank
//! program: each rank runs [`a_launched_rank_reports_the_secret_file_it_was_given`], which
//! writes what it got to a folder of the launching test, then succeeds, fails, hangs or
//! dies as the launch's arguments ask of it. Each launch runs in a child with a scrubbed
//! environment (a caller's `NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE` would pass through).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nccl_channel::{RendezvousSecret, SECRET_FILE_ENV};
use nccl_launch::{Output, Replacement, processes, processes_replacing};
use test_support::this_test_in_scrubbed_child;

/// The rank program (its full name in this binary).
const RANK: &str = "secret_file::a_launched_rank_reports_the_secret_file_it_was_given";

/// Long enough for any rank here, which only reports and ends.
const PLENTY: Duration = Duration::from_secs(120);

/// Only a rank of a launch below does anything: its arguments name the folder for its
/// report (`reports=DIR`), and may ask rank `R` to fail, hang or die (`fail=R`, `hang=R`,
/// `die=R`); a replacement is `who=replacement`.
#[test]
fn a_launched_rank_reports_the_secret_file_it_was_given() {
    let Some(reports) = arg("reports=") else {
        return;
    };
    let who = arg("who=").unwrap_or_else(|| std::env::var("NCCL_CHANNEL_PROCID").unwrap());
    let path = PathBuf::from(std::env::var_os(SECRET_FILE_ENV).expect("no secret file"));
    let report = format!(
        "{}\n{:o}\n{:o}\n{}\n",
        path.display(),
        mode(&path),
        mode(path.parent().unwrap()),
        RendezvousSecret::from_file(&path).is_ok()
    );
    std::fs::write(Path::new(&reports).join(&who), report).unwrap();
    let asked = |what: &str| arg(what).as_deref() == Some(who.as_str());
    if asked("fail=") {
        panic!("rank {who} fails, as asked");
    }
    if asked("hang=") {
        std::thread::sleep(PLENTY);
    }
    if asked("die=") {
        // SAFETY: raising a signal in this process; SIGKILL ends it here.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}

/// The value of this process's argument `key=value`.
fn arg(key: &str) -> Option<String> {
    std::env::args().find_map(|a| a.strip_prefix(key).map(str::to_string))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// What a rank got, as it reported it.
#[derive(Debug, PartialEq)]
struct Report {
    path: PathBuf,
    file_mode: u32,
    dir_mode: u32,
    /// `RendezvousSecret::from_file` took it.
    accepted: bool,
}

/// A folder for the ranks' reports, removed at the end.
struct Reports(PathBuf);

impl Reports {
    fn new() -> Reports {
        let dir = std::env::temp_dir().join(format!("launch-suite-{}-reports", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Reports(dir)
    }

    /// The arguments of a rank of this launch (`more`: what it is asked to do).
    fn args(&self, more: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [RANK, "--exact", "--nocapture", "--test-threads=1"]
            .map(String::from)
            .into();
        args.push(format!("reports={}", self.0.display()));
        args.extend(more.iter().map(|m| m.to_string()));
        args
    }

    /// The report of `who`.
    fn of(&self, who: &str) -> Report {
        let text = std::fs::read_to_string(self.0.join(who))
            .unwrap_or_else(|e| panic!("no report from {who}: {e}"));
        let lines: Vec<&str> = text.lines().collect();
        Report {
            path: PathBuf::from(lines[0]),
            file_mode: u32::from_str_radix(lines[1], 8).unwrap(),
            dir_mode: u32::from_str_radix(lines[2], 8).unwrap(),
            accepted: lines[3] == "true",
        }
    }
}

impl Drop for Reports {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks that `report` is of a secret file the launch made: 0600, in a 0700 folder of its
/// own under the temporary folder, accepted as a secret.
fn made_by_the_launch(report: &Report) {
    assert_eq!(report.file_mode, 0o600, "{report:?}");
    assert_eq!(report.dir_mode, 0o700, "{report:?}");
    assert!(report.accepted, "{report:?}");
    let dir = report.path.parent().unwrap();
    assert_eq!(dir.parent().unwrap(), std::env::temp_dir(), "{report:?}");
    let name = dir.file_name().unwrap().to_string_lossy();
    assert!(name.starts_with(&prefix()), "{report:?}");
}

/// What the launcher of this process names its secret folders with.
fn prefix() -> String {
    format!("nccl-launch-{}-", std::process::id())
}

/// Checks that the launch left nothing of the secret it made: not the file, not its
/// folder, and no folder of this process's launches in the temporary folder.
fn nothing_left(report: &Report) {
    assert!(!report.path.exists(), "{report:?}");
    assert!(!report.path.parent().unwrap().exists(), "{report:?}");
    no_launch_folder_left();
}

/// Checks that no folder of this process's launches is in the temporary folder.
fn no_launch_folder_left() {
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn every_rank_gets_the_same_0600_secret_file_in_a_0700_folder_gone_after_the_launch() {
    if !this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let reports = Reports::new();
    processes(2, &reports.args(&[]), PLENTY, Output::Prefixed).unwrap();
    let (r0, r1) = (reports.of("0"), reports.of("1"));
    made_by_the_launch(&r0);
    assert_eq!(r0, r1);
    nothing_left(&r0);
}

#[test]
fn a_launch_whose_rank_fails_removes_its_secret_file() {
    if !this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let reports = Reports::new();
    let e = processes(2, &reports.args(&["fail=1"]), PLENTY, Output::Prefixed).unwrap_err();
    assert!(e.contains("rank 1 exited with exit status: 101"), "{e}");
    let r1 = reports.of("1");
    made_by_the_launch(&r1);
    nothing_left(&r1);
}

#[test]
fn a_launch_that_times_out_removes_its_secret_file() {
    if !this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let reports = Reports::new();
    let timeout = Duration::from_secs(5);
    let e = processes(2, &reports.args(&["hang=1"]), timeout, Output::Prefixed).unwrap_err();
    assert_eq!(e, "rank 1 was stopped: still running after 5s");
    let r1 = reports.of("1");
    made_by_the_launch(&r1);
    nothing_left(&r1);
}

#[test]
fn a_replacement_rank_gets_the_launch_s_secret_file_which_is_gone_afterwards() {
    if !this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let reports = Reports::new();
    let replacement = Replacement {
        rank: 1,
        as_rank: 1,
        args: reports.args(&["who=replacement"]),
    };
    let args = reports.args(&["die=1"]);
    processes_replacing(2, &args, PLENTY, Output::Prefixed, &replacement).unwrap();
    let (r0, r1, again) = (reports.of("0"), reports.of("1"), reports.of("replacement"));
    made_by_the_launch(&r0);
    assert_eq!(r0, r1);
    assert_eq!(r0, again);
    nothing_left(&r0);
}

#[test]
fn a_secret_file_the_caller_names_is_passed_to_the_ranks_and_left_in_place() {
    let given = std::env::temp_dir().join(format!("launch-suite-{}-given", std::process::id()));
    if !this_test_in_scrubbed_child!(&[(SECRET_FILE_ENV, given.as_os_str())]) {
        return;
    }
    // The caller's file, made here: this process is the caller whose environment names it.
    let given = PathBuf::from(std::env::var_os(SECRET_FILE_ENV).unwrap());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&given)
        .unwrap();
    std::io::Write::write_all(&mut f, b"a secret of the caller's own choosing\n").unwrap();
    let reports = Reports::new();
    let launched = processes(2, &reports.args(&[]), PLENTY, Output::Prefixed);
    let still_there = given.exists();
    let _ = std::fs::remove_file(&given);
    launched.unwrap();
    for r in ["0", "1"] {
        let report = reports.of(r);
        assert_eq!(report.path, given, "{report:?}");
        assert!(report.accepted, "{report:?}");
    }
    assert!(still_there, "the launch removed the caller's secret file");
    no_launch_folder_left();
}
