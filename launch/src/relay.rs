//! The ranks' output, copied to the launcher's.

use std::io::{BufRead, BufReader, Read};

/// How [`processes`](fn@crate::processes) shows its ranks' output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Every line prefixed with `[rank R] `.
    Prefixed,
    /// Rank 0's lines as they are (a benchmark's table); the other ranks' standard output
    /// is dropped, their standard error shown prefixed with `[rank R] `.
    Rank0,
}

impl Output {
    /// Whether rank `rank`'s standard output is shown.
    pub(crate) fn shows_stdout(self, rank: usize) -> bool {
        self == Output::Prefixed || rank == 0
    }
}

/// Who a relayed line is from: a rank of the launch, or a process started later (a
/// replacement, `[name] `).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Who {
    Rank(usize),
    Named(&'static str),
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Rank(r) => write!(f, "rank {r}"),
            Who::Named(name) => f.write_str(name),
        }
    }
}

/// Copies a process's output to ours, line by line until it closes it: prefixed with who
/// it is, or (rank 0 only) as it is; `show` false drops it (standard output only).
pub(crate) fn relay(who: Who, stream: impl Read, err: bool, show: bool, output: Output) {
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        let line = match (output, who) {
            (Output::Rank0, Who::Rank(0)) => line,
            _ => format!("[{who}] {line}"),
        };
        match (err, show) {
            (true, _) => eprintln!("{line}"),
            (false, true) => println!("{line}"),
            (false, false) => {}
        }
    }
}
