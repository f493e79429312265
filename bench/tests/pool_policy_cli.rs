//! `pool-policy` as a program: files and standard input, the table on standard output,
//! and a refusal (exit status 1, the reason on standard error) when nothing compares.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::process::{Command, Stdio};

const RUN: &str = "\
$ bench -c all_gather -R nccl,1
# config: cta_policy -, min_ctas -, max_ctas -, nvls_ctas - (-: NCCL's default)
# all_gather: 2 ranks, type float, op -, graphs no
    134217728     16777216     float    none    -1      500.00  268.44  134.22      0      500.00  268.44  134.22      0    nccl     1.000   1.000     1.000   1.000
    134217728     16777216     float    none    -1      400.00  335.54  167.77      0      400.00  335.54  167.77      0       1     1.250   0.800     1.250   0.800
";

fn pool_policy(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pool-policy"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// The rules of a table, comments dropped.
fn rules(table: &str) -> Vec<String> {
    table
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            l.split('#')
                .next()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn a_file_and_standard_input_give_the_same_table() {
    let dir = std::env::temp_dir().join(format!("pool-policy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("run.txt");
    std::fs::write(&file, RUN).unwrap();
    let (ok, from_file, err) = pool_policy(&[file.to_str().unwrap()], "");
    assert!(ok, "{err}");
    assert_eq!(rules(&from_file), ["all_gather 134217728 registered"]);
    let (ok, from_stdin, err) = pool_policy(&["-"], RUN);
    assert!(ok, "{err}");
    assert_eq!(rules(&from_stdin), rules(&from_file));
    assert!(
        from_stdin.contains("written by pool-policy from: -"),
        "{from_stdin}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nothing_to_compare_is_refused_with_the_reason() {
    let one_rank = RUN.replace("2 ranks", "1 ranks");
    let (ok, out, err) = pool_policy(&["-"], &one_rank);
    assert!(!ok);
    assert_eq!(out, "");
    assert_eq!(
        err,
        "pool-policy: no row compares -R 1 with -R nccl or -R 0 on 2 or more ranks with \
         NCCL's default config\n  left out: -: all_gather on 1 rank\n"
    );
    let (ok, _, err) = pool_policy(&["/nonexistent/run.txt"], "");
    assert!(!ok);
    assert!(
        err.starts_with("pool-policy: /nonexistent/run.txt: "),
        "{err}"
    );
}
