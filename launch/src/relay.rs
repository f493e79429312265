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

/// Copies a rank's output to ours, line by line until the rank closes it: prefixed with
/// the rank, or (rank 0 only) as it is; `show` false drops it (standard output only).
pub(crate) fn relay(rank: usize, stream: impl Read, err: bool, show: bool, output: Output) {
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        let line = match output {
            Output::Prefixed => format!("[rank {rank}] {line}"),
            Output::Rank0 if rank == 0 => line,
            Output::Rank0 => format!("[rank {rank}] {line}"),
        };
        match (err, show) {
            (true, _) => eprintln!("{line}"),
            (false, true) => println!("{line}"),
            (false, false) => {}
        }
    }
}
