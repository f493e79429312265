//! Which collectives and sizes the pool registers its buffers for: a table the benchmark
//! writes from measurements (`pool-policy`, a binary of the bench package, reads the
//! benchmark's output), never a guess typed in here. The default is `policy.tsv` beside
//! this file, written from the run committed under `bench/results/`; a table measured on
//! another machine is set per communicator or for the whole process through
//! `NCCL_CHANNEL_POOL_POLICY`.
//!
//! The format, one rule per line (`#` starts a comment):
//!
//! ```text
//! # collective  from_bytes  memory
//! all_gather    2097152     registered
//! all_gather    1073741824  plain
//! ```
//!
//! Sizes are the benchmark's (and nccl-tests'): the bytes of the whole buffer of an
//! all-reduce, broadcast, reduce, all-to-all or send/receive, the gathered buffer of an
//! all-gather (its send buffer is a rank's share of it), the scattered buffer of a
//! reduce-scatter. A buffer a collective of `b` such bytes uses takes the memory of that
//! collective's rule with the largest `from_bytes` ≤ `b`; with no such rule, `plain`
//! (NCCL memory, not registered). The collectives are [`Collective`]'s names; the
//! variable-size all-to-all (`all_to_all_v`) follows the `all_to_all` rules, with its
//! whole buffers' bytes.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::{Collective, Error, Result};

/// The variable that names a table file to use instead of the measured default.
pub const POOL_POLICY_ENV: &str = "NCCL_CHANNEL_POOL_POLICY";

/// The largest table file [`PoolPolicy::from_file`] reads (1 MiB).
const MAX_FILE: u64 = 1 << 20;

/// The measured default, as the benchmark wrote it.
const MEASURED: &str = include_str!("policy.tsv");

/// What the pool makes of a buffer a collective uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolMemory {
    /// NCCL memory left unregistered: as fast as plain memory where registration gains
    /// nothing or costs (broadcast).
    Plain,
    /// Registered with the communicator (`ncclCommRegister`) at its first such use, and
    /// kept registered while the pool keeps the buffer.
    Registered,
}

impl PoolMemory {
    fn name(self) -> &'static str {
        match self {
            PoolMemory::Plain => "plain",
            PoolMemory::Registered => "registered",
        }
    }
}

/// The pool's table: for each collective, from which sizes its buffers are registered.
/// Set on a communicator with
/// [`Communicator::set_pool_policy`](crate::Communicator::set_pool_policy).
///
/// ```
/// use nccl_channel::{PoolMemory, PoolPolicy};
///
/// use nccl_channel::Collective::{AllGather, Broadcast};
///
/// let p = PoolPolicy::parse("all_gather 1M registered\nall_gather 1G plain  # measured")?;
/// assert_eq!(p.memory(AllGather, 4 << 20), PoolMemory::Registered);
/// assert_eq!(p.memory(AllGather, 2 << 30), PoolMemory::Plain);
/// assert_eq!(p.memory(AllGather, 4096), PoolMemory::Plain);
/// assert_eq!(p.memory(Broadcast, 4 << 20), PoolMemory::Plain); // no rule
/// // It prints as the table it reads.
/// assert_eq!(PoolPolicy::parse(&p.to_string())?, p);
/// # Ok::<(), nccl_channel::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolPolicy {
    /// Per collective, at its place in [`Collective::ALL`], its rules sorted by
    /// `from_bytes` (none for `all_to_all_v`, which follows `all_to_all`'s).
    rules: [Vec<(usize, PoolMemory)>; Collective::ALL.len()],
}

static_assertions::assert_impl_all!(PoolPolicy: Send, Sync);

impl PoolPolicy {
    /// The default: the table the benchmark wrote from the measurements committed with
    /// this crate (2 × H200 over NVLink; BENCHMARKS.md, "The pool's table").
    ///
    /// ```
    /// use nccl_channel::{Collective, PoolMemory, PoolPolicy};
    /// let table = PoolPolicy::measured();
    /// // Measured: registration made all-gathers faster and broadcasts slower.
    /// assert_eq!(table.memory(Collective::AllGather, 128 << 20), PoolMemory::Registered);
    /// assert_eq!(table.memory(Collective::Broadcast, 128 << 20), PoolMemory::Plain);
    /// ```
    #[must_use]
    pub fn measured() -> &'static PoolPolicy {
        static TABLE: OnceLock<PoolPolicy> = OnceLock::new();
        // A test parses the committed table, so the fallback is never taken.
        TABLE.get_or_init(|| PoolPolicy::parse(MEASURED).unwrap_or_default())
    }

    /// A table that never registers (what the pool does where NCCL cannot register).
    #[must_use]
    pub fn plain() -> PoolPolicy {
        PoolPolicy::default()
    }

    /// Reads a table (the format is in the module's docs: `collective from_bytes memory`
    /// per line, sizes in bytes or with a `K`, `M` or `G` suffix). A line that names an
    /// unknown collective (or `all_to_all_v`, which follows `all_to_all`) or memory, a
    /// malformed size, or a size twice for one collective is an
    /// [`Error::InvalidArgument`] naming the line.
    pub fn parse(text: &str) -> Result<PoolPolicy> {
        let mut p = PoolPolicy::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("");
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.is_empty() {
                continue;
            }
            let bad = |problem: String| Error::InvalidArgument {
                what: "PoolPolicy::parse",
                problem: format!("line {}: {problem}: {:?}", i + 1, raw.trim()),
            };
            let [coll, from, memory] = fields[..] else {
                return Err(bad("want `collective from_bytes memory`".into()));
            };
            let c = coll.parse::<Collective>().map_err(|e| bad(e.to_string()))?;
            if row(c) != c as usize {
                return Err(bad(format!(
                    "{c} follows the rules of {}",
                    Collective::ALL[row(c)]
                )));
            }
            let from = size(from).ok_or_else(|| bad(format!("bad size {from:?}")))?;
            let memory = match memory {
                "plain" => PoolMemory::Plain,
                "registered" => PoolMemory::Registered,
                _ => {
                    return Err(bad(format!(
                        "unknown memory {memory:?} (plain or registered)"
                    )));
                }
            };
            let rules = &mut p.rules[row(c)];
            match rules.binary_search_by_key(&from, |r| r.0) {
                Ok(_) => return Err(bad(format!("a second rule for {coll} from {from} bytes"))),
                Err(at) => rules.insert(at, (from, memory)),
            }
        }
        Ok(p)
    }

    /// The table in the file `path` names, read and parsed: a regular file of at most
    /// 1 MiB (a table is a few KiB; this refuses devices and pipes, which could block or
    /// never end).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<PoolPolicy> {
        use std::io::Read as _;
        let path = path.as_ref();
        let io = |e: std::io::Error| Error::Io {
            what: "reading the pool policy",
            path: path.display().to_string(),
            source: e.into(),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() || meta.len() > MAX_FILE {
            return Err(Error::InvalidArgument {
                what: "PoolPolicy::from_file",
                problem: format!(
                    "{} is not a regular file of at most {MAX_FILE} bytes",
                    path.display()
                ),
            });
        }
        let mut text = String::new();
        file.take(MAX_FILE).read_to_string(&mut text).map_err(io)?;
        PoolPolicy::parse(&text)
    }

    /// The memory for a buffer that a call of `collective` of `bytes` bytes uses, in the
    /// benchmark's sizes (the module docs say which).
    #[must_use]
    pub fn memory(&self, collective: Collective, bytes: usize) -> PoolMemory {
        let rules = &self.rules[row(collective)];
        match rules.partition_point(|r| r.0 <= bytes) {
            0 => PoolMemory::Plain,
            k => rules[k - 1].1,
        }
    }

    /// The process's default for new communicators: the table in the file
    /// [`POOL_POLICY_ENV`] names, else [`measured`](Self::measured). A variable that
    /// names no readable table is an error of the first [`buffer`] call.
    ///
    /// [`buffer`]: crate::Communicator::buffer
    pub(crate) fn from_env() -> Result<Arc<PoolPolicy>> {
        static DEFAULT: OnceLock<Arc<PoolPolicy>> = OnceLock::new();
        // Empty is unset, as the workspace's other path variables.
        match std::env::var_os(POOL_POLICY_ENV).filter(|v| !v.is_empty()) {
            None => Ok(DEFAULT
                .get_or_init(|| Arc::new(PoolPolicy::measured().clone()))
                .clone()),
            Some(v) => PoolPolicy::from_file(&v)
                .map(Arc::new)
                .map_err(|e| Error::Env {
                    variable: POOL_POLICY_ENV.into(),
                    value: v.to_string_lossy().into_owned(),
                    problem: match &e {
                        Error::Io { source, .. } => format!("{e}: {}", source.get()),
                        other => other.to_string(),
                    },
                }),
        }
    }
}

/// The place of the rules `c` follows: its own, but `all_to_all`'s for `all_to_all_v`.
fn row(c: Collective) -> usize {
    match c {
        Collective::AllToAllV => Collective::AllToAll as usize,
        c => c as usize,
    }
}

/// The size the table knows a use by (see the module docs): `bytes` of the buffer called
/// `buffer` (collective.rs's names) of a call of `c` on `ranks` ranks. An all-gather's
/// send buffer is a rank's share of the gathered buffer, a reduce-scatter's receive buffer
/// a rank's share of the scattered one (gather and scatter alike); in place, the buffer is
/// the whole.
pub(crate) fn collective_bytes(c: Collective, buffer: &str, bytes: usize, ranks: usize) -> usize {
    use Collective::{AllGather, Gather, ReduceScatter, Scatter};
    match (c, buffer) {
        (AllGather | Gather, "send") | (ReduceScatter | Scatter, "recv") => {
            bytes.saturating_mul(ranks)
        }
        _ => bytes,
    }
}

/// A size in bytes: decimal, with an optional `K`, `M` or `G` (powers of 1024).
fn size(s: &str) -> Option<usize> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

impl fmt::Display for PoolPolicy {
    /// The table, in the format [`parse`](Self::parse) reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# collective  from_bytes  memory")?;
        for (name, rules) in Collective::ALL.iter().zip(&self.rules) {
            for (from, memory) in rules {
                writeln!(f, "{:<14} {from:>12}  {}", name.name(), memory.name())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_table_parses_and_is_not_empty() {
        let p = PoolPolicy::parse(MEASURED).unwrap();
        assert_eq!(&p, PoolPolicy::measured());
        assert!(p.rules.iter().any(|r| !r.is_empty()));
    }

    #[test]
    fn a_size_takes_the_rule_with_the_largest_start_at_or_below_it() {
        let p = PoolPolicy::parse("reduce 100 registered\nreduce 200 plain\nreduce 300 registered")
            .unwrap();
        let at = |b| p.memory(Collective::Reduce, b);
        assert_eq!(
            [
                at(0),
                at(99),
                at(100),
                at(199),
                at(200),
                at(299),
                at(300),
                at(usize::MAX)
            ],
            [
                PoolMemory::Plain,
                PoolMemory::Plain,
                PoolMemory::Registered,
                PoolMemory::Registered,
                PoolMemory::Plain,
                PoolMemory::Plain,
                PoolMemory::Registered,
                PoolMemory::Registered
            ]
        );
    }

    /// Each collective finds its own rules, and only those; the variable-size all-to-all
    /// finds the all-to-all's.
    #[test]
    fn every_collective_finds_its_rules() {
        for coll in Collective::ALL {
            if coll == Collective::AllToAllV {
                continue;
            }
            let p = PoolPolicy::parse(&format!("{coll} 0 registered")).unwrap();
            for other in Collective::ALL {
                let follows = other == coll
                    || (coll == Collective::AllToAll && other == Collective::AllToAllV);
                let want = if follows {
                    PoolMemory::Registered
                } else {
                    PoolMemory::Plain
                };
                assert_eq!(p.memory(other, 1), want, "{other} under a rule for {coll}");
            }
        }
    }

    #[test]
    fn shares_count_as_their_collectives_size() {
        use Collective::*;
        let at = |c, buffer| collective_bytes(c, buffer, 10, 4);
        assert_eq!(at(AllGather, "send"), 40);
        assert_eq!(at(Gather, "send"), 40);
        assert_eq!(at(ReduceScatter, "recv"), 40);
        assert_eq!(at(Scatter, "recv"), 40);
        for (c, buffer) in [
            (AllGather, "recv"),
            (AllGather, "buffer"),
            (Gather, "recv"),
            (ReduceScatter, "send"),
            (ReduceScatter, "buffer"),
            (Scatter, "send"),
            (AllReduce, "send"),
            (AllToAll, "recv"),
            (AllToAllV, "send"),
            (SendRecv, "send"),
            (SendRecv, "recv"),
        ] {
            assert_eq!(at(c, buffer), 10, "{c} {buffer}");
        }
        assert_eq!(
            collective_bytes(AllGather, "send", usize::MAX, 2),
            usize::MAX
        );
    }

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(size("0"), Some(0));
        assert_eq!(size("4096"), Some(4096));
        assert_eq!(size("3K"), Some(3 << 10));
        assert_eq!(size("2m"), Some(2 << 20));
        assert_eq!(size("1G"), Some(1 << 30));
        for bad in [
            "",
            "K",
            "-1",
            "+1",
            "1.5M",
            "1T",
            "0x10",
            "99999999999999999999",
        ] {
            assert_eq!(size(bad), None, "{bad}");
        }
        assert_eq!(size(&format!("{}G", usize::MAX >> 20)), None);
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number() {
        let cases = [
            (
                "all_gather 1M",
                "line 1: want `collective from_bytes memory`",
            ),
            (
                "\n# c\nallgather 1M plain",
                "line 3: unknown collective \"allgather\"",
            ),
            ("all_gather 1Q plain", "line 1: bad size \"1Q\""),
            ("all_gather 1M fast", "line 1: unknown memory \"fast\""),
            (
                "all_gather 1M plain\nall_gather 1048576 registered",
                "line 2: a second rule for all_gather from 1048576 bytes",
            ),
            (
                "all_to_all_v 0 registered",
                "line 1: all_to_all_v follows the rules of all_to_all",
            ),
            (
                "send 0 registered",
                "line 1: unknown collective \"send\" (one of all_reduce, ",
            ),
        ];
        for (text, want) in cases {
            let Err(Error::InvalidArgument { what, problem }) = PoolPolicy::parse(text) else {
                panic!("{text:?} parsed");
            };
            assert_eq!(what, "PoolPolicy::parse");
            assert!(problem.starts_with(want), "{problem:?} for {text:?}");
        }
    }

    #[test]
    fn it_prints_as_it_reads() {
        let text = "all_to_all 0 plain\nall_to_all 8M registered\nbroadcast 1K plain\n";
        let p = PoolPolicy::parse(text).unwrap();
        let printed = p.to_string();
        assert_eq!(
            printed,
            "# collective  from_bytes  memory\n\
             broadcast              1024  plain\n\
             all_to_all                0  plain\n\
             all_to_all          8388608  registered\n"
        );
        assert_eq!(PoolPolicy::parse(&printed).unwrap(), p);
    }
}
