//! The all-gather demo on a machine without a CUDA driver: the launcher runs its ranks on
//! simulated devices and says so on its first line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::demo::{demo_exe, run_demo};

/// Hides any real driver, so the demo takes the simulated path on every machine.
fn no_driver() -> Vec<(&'static str, String)> {
    vec![("CUDA_SYS_LIBRARY", "/nonexistent/libcuda.so.1".into())]
}

#[test]
fn the_seed_scenario_on_simulated_devices() {
    let (ok, out, err) = run_demo(&["--nprocs", "2"], &no_driver());
    assert!(ok, "{out}\n{err}");
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("no CUDA driver") && first.contains("simulated devices"),
        "{first}"
    );
    for r in 0..2 {
        assert!(
            out.contains(&format!("[rank {r}] 2x2xi32=[101 102][101 102]")),
            "{out}"
        );
    }
    // The launcher gives its ranks a key of this launch (NCCL_CHANNEL_RENDEZVOUS_KEY), the
    // same for both, so that another launch on the same port is told apart.
    let keys: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split(", key ").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .collect();
    assert_eq!(keys.len(), 2, "{out}");
    assert!(keys[0].starts_with("launch-"), "{out}");
    assert_eq!(keys[0], keys[1], "{out}");
}

#[test]
fn other_collectives_counts_and_dtypes() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &[
                "--nprocs",
                "3",
                "--collective",
                "all_reduce",
                "--dtype",
                "f32",
                "--count",
                "3",
            ],
            &["3xf32=[303 306 309]"],
        ),
        (
            &[
                "--nprocs",
                "2",
                "--collective",
                "all_to_all",
                "--count",
                "4",
            ],
            &[
                "[rank 0] 2x2xi32=[101 102][101 102]",
                "[rank 1] 2x2xi32=[103 104][103 104]",
            ],
        ),
        (
            &[
                "--nprocs",
                "2",
                "--collective",
                "reduce_scatter",
                "--dtype",
                "i64",
                "--count",
                "2",
            ],
            &["[rank 0] 1xi64=[202]", "[rank 1] 1xi64=[204]"],
        ),
        (
            &[
                "--nprocs",
                "4",
                "--collective",
                "broadcast",
                "--dtype",
                "ui8",
            ],
            &["[rank 3] 2xui8=[101 102]"],
        ),
    ];
    for (args, wants) in cases {
        let (ok, out, err) = run_demo(args, &no_driver());
        assert!(ok, "{args:?}: {out}\n{err}");
        for w in *wants {
            assert!(out.contains(w), "{args:?}: want {w:?} in\n{out}");
        }
    }
}

#[test]
fn bad_options_and_no_world_fail_with_a_message() {
    for (args, needle) in [
        (
            &["--nprocs", "0"][..],
            "invalid value '0' for '--nprocs <N>': must be at least 1",
        ),
        (
            &["--nprocs=x"][..],
            "invalid value 'x' for '--nprocs <N>': expects a number",
        ),
        (&["--bogus"][..], "unexpected argument '--bogus'"),
        (
            &["--nprocs", "2", "--dtype", "c64"][..],
            "invalid value 'c64' for '--dtype <DTYPE>'",
        ),
        (
            &[
                "--nprocs",
                "2",
                "--collective",
                "all_to_all",
                "--count",
                "3",
            ][..],
            "multiple of the 2 ranks",
        ),
        (&[][..], "no world configured"),
    ] {
        let (ok, out, err) = run_demo(args, &no_driver());
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let (ok, _, err) = run_demo(
        &[],
        &[
            ("IREE_CUDA_NCCL_NPROCS", "2".into()),
            ("IREE_CUDA_NCCL_PROCID", "5".into()),
        ],
    );
    assert!(!ok && err.contains("IREE_CUDA_NCCL_PROCID"), "{err}");
}

/// A `--count` larger than the device's memory (it was an allocation failure and SIGABRT)
/// is refused by the launcher before any rank starts: one error naming the flag, the bytes
/// it needs and the device's, whichever rank would have failed first.
#[test]
fn a_count_beyond_the_device_memory_is_an_error_naming_the_limit() {
    for (dtype, count, need, recv) in [
        ("i32", "99999999999", "1199999999988", "199999999998"),
        ("f64", "1000000000", "24000000000", "2000000000"),
        // One element over the device: 1431655765 would need 17179869180 bytes, and fit.
        ("i32", "1431655766", "17179869192", "2863311532"),
    ] {
        let args = ["--count", count, "--dtype", dtype, "--nprocs", "2"];
        let (ok, out, err) = run_demo(&args, &no_driver());
        assert!(!ok, "{out}\n{err}");
        let want = format!(
            "allgather: --count: {count} elements of {dtype} per rank need {need} bytes of \
             device memory for the all_gather on 2 ranks ({count} elements to send, {recv} \
             to receive), more than the 17179869184 bytes of device 0"
        );
        assert_eq!(err.trim_end(), want);
        assert_eq!(out, "", "no rank may start");
    }
}

/// A rank started by another launcher checks `--count` against its own device before it
/// allocates anything.
#[test]
fn a_rank_refuses_a_count_beyond_its_device_memory() {
    let env = [
        ("NCCL_CHANNEL_NPROCS", "1".to_string()),
        ("NCCL_CHANNEL_PROCID", "0".to_string()),
        ("CUDA_SYS_LIBRARY", "/nonexistent/libcuda.so.1".to_string()),
    ];
    let (ok, out, err) = run_demo(&["--count", "99999999999"], &env);
    assert!(!ok, "{out}\n{err}");
    let want = "allgather: --count: 99999999999 elements of i32 per rank need 799999999992 \
                bytes of device memory for the all_gather on 1 rank (99999999999 elements to \
                send, 99999999999 to receive), more than the 17179869184 bytes of device 0";
    assert!(err.lines().any(|l| l == want), "want {want:?} in\n{err}");
    assert!(!err.contains("memory allocation of"), "{err}");
}

/// The command line behaves as users expect: `--help` and `--version` succeed (exit 0),
/// `--opt=value` is the same as `--opt value`, a bad option exits 2 with the usage.
#[test]
fn the_command_line_takes_both_option_forms_and_helps() {
    let (ok, out, _) = run_demo(&["--help"], &no_driver());
    assert!(ok, "--help must exit 0");
    assert!(out.contains("Usage: allgather [OPTIONS]"), "{out}");
    assert!(
        out.contains("--device <cuda://<index>|cuda://GPU-<uuid>>"),
        "{out}"
    );
    let (ok, out, _) = run_demo(&["--version"], &no_driver());
    assert!(ok);
    assert_eq!(
        out.trim(),
        format!("allgather {}", env!("CARGO_PKG_VERSION"))
    );
    let (ok, out, err) = run_demo(
        &[
            "--nprocs=2",
            "--count=3",
            "--dtype=f32",
            "--collective=all_reduce",
        ],
        &no_driver(),
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("[rank 1] 3xf32=[202 204 206]"), "{out}");
    // --device names one rank's GPU; the launcher gives each rank its own.
    let (ok, _, err) = run_demo(&["--nprocs=2", "--device=cuda://5"], &no_driver());
    assert!(!ok);
    assert!(
        err.contains("the argument '--nprocs <N>' cannot be used with '--device"),
        "{err}"
    );
    let out = test_support::env::scrubbed(demo_exe())
        .arg("--nprocs")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a value is required for '--nprocs <N>'") && err.contains("try '--help'"),
        "{err}"
    );
}

/// The launcher's ranks take the unique id from a rendezvous authenticated by a secret
/// file it made for the launch (each rank's line says so), and the file's folder, made in
/// the launcher's temporary folder, is gone when the launch ends.
#[test]
fn the_launchers_ranks_rendezvous_under_a_secret_of_the_launch_gone_after_it() {
    for n in [2, 4] {
        let tmp = std::env::temp_dir().join(format!("demo-secret-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).unwrap();
        let mut env = no_driver();
        env.push(("TMPDIR", tmp.display().to_string()));
        let (ok, out, err) = run_demo(&["--nprocs", &n.to_string()], &env);
        let left: Vec<String> = std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("nccl-launch-"))
            .collect();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert!(ok, "{out}\n{err}");
        let ranks: Vec<&str> = out.lines().filter(|l| l.contains("unique id: ")).collect();
        assert_eq!(ranks.len(), n, "{out}");
        for line in ranks {
            assert!(line.contains(", authenticated by a secret"), "{line}");
        }
        assert_eq!(left, Vec::<String>::new(), "left in the temporary folder");
    }
}
