//! A case: a generated program and the steps of it that are kept (shrinking deletes
//! steps), run in a child process of its own: a program may leak by design (a
//! simulated machine whose failure path keeps memory), abort, or hang, and none of that
//! may reach the next program.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::program::Program;
use super::run::Failure;

/// The environment variable that carries a case to the child.
pub const VAR: &str = "MODEL_CASE";

/// Generated program `seed` of `len` steps, with only the steps `kept` (all when `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    pub seed: u64,
    pub len: usize,
    pub kept: Option<Vec<usize>>,
}

impl Case {
    pub fn program(&self) -> Program {
        let mut p = super::generate::program(self.seed, self.len);
        if let Some(kept) = &self.kept {
            p.ops = kept.iter().filter_map(|&i| p.ops.get(i).cloned()).collect();
        }
        p
    }

    /// The indices of the steps it keeps.
    pub fn steps(&self) -> Vec<usize> {
        self.kept.clone().unwrap_or_else(|| (0..self.len).collect())
    }

    pub fn encode(&self) -> String {
        let kept = match &self.kept {
            None => "all".to_string(),
            Some(k) => k.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
        };
        format!("{}:{}:{kept}", self.seed, self.len)
    }

    pub fn decode(s: &str) -> Option<Case> {
        let mut parts = s.splitn(3, ':');
        let seed = parts.next()?.parse().ok()?;
        let len = parts.next()?.parse().ok()?;
        let kept = match parts.next()? {
            "all" => None,
            "" => Some(Vec::new()),
            k => Some(
                k.split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?,
            ),
        };
        Some(Case { seed, len, kept })
    }
}

/// Runs `case` in a child process (this test binary, its `model_child` test) within
/// `deadline`.
pub fn run(case: &Case, deadline: Duration) -> Result<(), Failure> {
    let exe = std::env::current_exe().expect("the test binary");
    // A scrubbed environment: a launcher's variables (NCCL_COMM_ID) change what the
    // simulated NCCL hands out, and a program must not depend on its caller's.
    let mut child = test_support::env::scrubbed(exe)
        .args([
            "--exact",
            "model_check::model_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(VAR, case.encode())
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("a child process");
    let mut out = child.stdout.take().expect("its stdout");
    let mut err = child.stderr.take().expect("its stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let out = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(Failure::Hang);
    };
    for line in out.lines() {
        if let Some(at) = line.find("MODEL-RESULT ") {
            let r = &line[at + "MODEL-RESULT ".len()..];
            return if r == "ok" {
                Ok(())
            } else {
                Err(Failure::decode(r))
            };
        }
    }
    let tail: String = err
        .chars()
        .rev()
        .take(2000)
        .collect::<String>()
        .chars()
        .rev()
        .collect();
    Err(Failure::Crash(format!("{status}: {tail}")))
}
