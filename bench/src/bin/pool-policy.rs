//! `pool-policy`: the table nccl-channel's pool follows ([`PoolPolicy`]), written from
//! the benchmark's own output, so what the pool registers is what was measured.
//!
//! ```text
//! bench -c all -b 8 -e 4G -f 4 -n 50 -w 5 -R 0,nccl,1,sym --check 0 > sweep.txt
//! pool-policy sweep.txt [more runs ...] > policy.tsv
//! NCCL_CHANNEL_POOL_POLICY=policy.tsv my-training   # or Communicator::set_pool_policy
//! ```
//!
//! It reads every row of every table that has both registered memory (`-R 1`) and a base
//! to compare it with: unregistered NCCL memory (`-R nccl`), else plain memory (`-R 0`),
//! from runs of two or more ranks with NCCL's default CTA config (the pool cannot change
//! a communicator's config). Per collective and size it averages, over the runs, the
//! ratio of registered busbw to base busbw, out of place and in place, and registers
//! where the smaller of the two is at least [`GAIN`] and the base took at least
//! [`MIN_US`]; rules start at the first size whose choice changes. Rows of symmetric
//! memory (`-R sym`, `Communicator::symmetric`), which the pool cannot allocate (every
//! rank must allocate it at once), make no rule: a comment names, per collective, the
//! sizes where it gains as much over the base, for programs to allocate it there.
//!
//! [`PoolPolicy`]: nccl_channel::PoolPolicy

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Parser;
use nccl_channel::Collective;

/// The smallest gain of registered over base busbw that registers: the run-to-run noise
/// of one size at large sizes is ±1 % (BENCHMARKS.md, runs A and B), and registering a
/// buffer for less than that is not worth its pinned memory.
const GAIN: f64 = 1.03;

/// The least time (µs) of a base measurement that counts: below, launch latency and its
/// noise swamp a gain (runs A and B of BENCHMARKS.md, the same sizes on two machines:
/// 40 % apart at 7 µs, 5 % at 11 µs, under 1 % from 50 µs).
const MIN_US: f64 = 30.0;

/// Writes nccl-channel's pool table from the benchmark's output.
#[derive(Parser, Debug)]
#[command(name = "pool-policy")]
struct Opts {
    /// Outputs of `bench ... -R nccl,1` (or `-R 0,1`), as it printed them; `-` for standard
    /// input.
    #[arg(required = true)]
    files: Vec<String>,
}

/// One measurement of one mode: time (µs) and busbw, out of place and in place (`None`:
/// the collective has no in-place form).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Measured {
    us: [Option<f64>; 2],
    busbw: [Option<f64>; 2],
}

/// The ratios gathered for one collective and size.
#[derive(Default, Debug)]
struct Samples {
    /// registered busbw / base busbw, out of place and in place.
    ratios: [Vec<f64>; 2],
    /// symmetric memory's (`-R sym`) busbw / base busbw, out of place and in place.
    symmetric: [Vec<f64>; 2],
    /// The base's time out of place (µs).
    base_us: Vec<f64>,
}

/// What one pass over the outputs found: samples per (collective, bytes), and what was
/// left out and why (printed as comments).
#[derive(Default, Debug)]
struct Gathered {
    samples: BTreeMap<(Collective, usize), Samples>,
    skipped: Vec<String>,
}

/// Where the reader is in one output.
#[derive(Default)]
struct Section {
    coll: Option<Collective>,
    ranks: usize,
    default_config: bool,
    /// The rows of the current size: mode name -> measurement.
    size: Option<usize>,
    modes: Vec<(String, Measured)>,
}

impl Gathered {
    /// Reads one output (`name` for the comments).
    fn read(&mut self, name: &str, text: &str) {
        let mut s = Section {
            default_config: true,
            ..Section::default()
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# config: ") {
                self.finish_size(&mut s);
                // `cta_policy -, min_ctas -, max_ctas -, nvls_ctas - (-: NCCL's default)`
                let values = rest.split(" (").next().unwrap_or(rest);
                s.default_config = values.split(',').all(|kv| kv.trim().ends_with(" -"));
                if !s.default_config {
                    self.skipped
                        .push(format!("{name}: a run with config {rest:?}"));
                }
            } else if let Some(h) = line.strip_prefix("# ").and_then(collective_header) {
                self.finish_size(&mut s);
                (s.coll, s.ranks) = (Some(h.0), h.1);
                if h.1 < 2 {
                    self.skipped
                        .push(format!("{name}: {} on {} rank", h.0, h.1));
                }
            } else if line.starts_with('$') || line.starts_with("# nccl-channel bench") {
                self.finish_size(&mut s);
                s = Section {
                    default_config: true,
                    ..Section::default()
                };
            } else if let Some((bytes, mode, m)) = row(line) {
                if s.size != Some(bytes) {
                    self.finish_size(&mut s);
                    s.size = Some(bytes);
                }
                s.modes.push((mode, m));
            }
        }
        self.finish_size(&mut s);
    }

    /// Takes the rows of one size: a sample if they hold registered and a base.
    fn finish_size(&mut self, s: &mut Section) {
        let modes = std::mem::take(&mut s.modes);
        let (Some(coll), Some(bytes)) = (s.coll, s.size.take()) else {
            return;
        };
        if s.ranks < 2 || !s.default_config {
            return;
        }
        let find = |n: &str| modes.iter().find(|(m, _)| m == n).map(|(_, m)| *m);
        let Some(base) = find("nccl").or_else(|| find("0")) else {
            return;
        };
        let e = self.samples.entry((coll, bytes)).or_default();
        let mut compared = false;
        for (mode, ratios) in [("1", &mut e.ratios), ("sym", &mut e.symmetric)] {
            let Some(m) = find(mode) else { continue };
            compared = true;
            for (k, ratio) in ratios.iter_mut().enumerate() {
                if let (Some(r), Some(b)) = (m.busbw[k], base.busbw[k])
                    && b > 0.0
                {
                    ratio.push(r / b);
                }
            }
        }
        if compared && let Some(us) = base.us[0] {
            e.base_us.push(us);
        }
    }

    /// The table: per collective, a rule where the choice changes.
    fn table(&self, sources: &[String]) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# nccl-channel's pool table, written by pool-policy from: {}\n\
             # registered where ncclCommRegister'd buffers (-R 1) had at least {GAIN}x the \
             busbw of unregistered NCCL memory (-R nccl; else plain memory, -R 0), out of \
             place and in place (mean over the runs), at sizes whose base took at least \
             {MIN_US} us; 2+ ranks, NCCL's default CTA config\n\
             # collective  from_bytes  memory  # registered/base busbw out, in; samples",
            sources.join(" ")
        );
        for why in &self.skipped {
            let _ = writeln!(out, "# left out: {why}");
        }
        for c in Collective::ALL {
            let name = c.name();
            if let Some(line) = self.symmetric_wins(c) {
                let _ = writeln!(out, "{line}");
            }
            let mut registered = false;
            for ((_, bytes), s) in self.samples.range((c, 0)..=(c, usize::MAX)) {
                let (out_r, in_r) = (mean(&s.ratios[0]), mean(&s.ratios[1]));
                let gain = match (out_r, in_r) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => continue,
                };
                let slow = mean(&s.base_us).is_none_or(|us| us < MIN_US);
                let wins = gain >= GAIN && !slow;
                let show = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.3}"));
                let _ = writeln!(
                    out,
                    "#   {name} {bytes}: {}, {}; base {:.1} us; {} run(s)",
                    show(out_r),
                    show(in_r),
                    mean(&s.base_us).unwrap_or(f64::NAN),
                    s.ratios[0].len()
                );
                if wins != registered {
                    registered = wins;
                    let _ = writeln!(
                        out,
                        "{name:<14} {bytes:>12}  {:<10}  # {}, {}; {}",
                        if wins { "registered" } else { "plain" },
                        show(out_r),
                        show(in_r),
                        s.ratios[0].len()
                    );
                }
            }
        }
        out
    }
}

impl Gathered {
    /// A comment for collective `c`: the sizes at which symmetric memory (`-R sym`, the
    /// collective allocation, which the pool cannot make) had at least GAIN times the base's
    /// busbw out of place and in place: where a program should allocate it with
    /// `Communicator::symmetric` instead of taking the pool's.
    fn symmetric_wins(&self, c: Collective) -> Option<String> {
        let sizes: Vec<String> = self
            .samples
            .range((c, 0)..=(c, usize::MAX))
            .filter(|(_, s)| mean(&s.base_us).is_some_and(|us| us >= MIN_US))
            .filter_map(|((_, bytes), s)| {
                let gain = match (mean(&s.symmetric[0]), mean(&s.symmetric[1])) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => return None,
                };
                (gain >= GAIN).then(|| format!("{bytes} ({gain:.3})"))
            })
            .collect();
        (!sizes.is_empty()).then(|| {
            format!(
                "# {c}: symmetric memory (-R sym, Communicator::symmetric) had >= {GAIN}x the \
                 base's busbw at {}",
                sizes.join(", ")
            )
        })
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// `all_gather: 2 ranks, type float, ...` -> (collective, ranks).
fn collective_header(h: &str) -> Option<(Collective, usize)> {
    let (coll, rest) = h.split_once(": ")?;
    let c = Collective::from_name(coll)?;
    let ranks = rest.split_once(" rank")?.0.parse().ok()?;
    Some((c, ranks))
}

/// A table row of several modes: size, count, type, redop, root, then time, algbw, busbw
/// and #wrong out of place and in place (`N/A` without an in-place form), the mode, and
/// four ratios. -> (bytes, mode, measurement).
fn row(line: &str) -> Option<(usize, String, Measured)> {
    if !line.starts_with(' ') {
        return None;
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 18 {
        return None;
    }
    let bytes = f[0].parse().ok()?;
    let num = |s: &str| {
        if s == "N/A" {
            Some(None)
        } else {
            s.parse::<f64>().ok().map(Some)
        }
    };
    let m = Measured {
        us: [num(f[5])?, num(f[9])?],
        busbw: [num(f[7])?, num(f[11])?],
    };
    Some((bytes, f[13].to_string(), m))
}

fn main() -> ExitCode {
    let o = Opts::parse();
    let mut g = Gathered::default();
    for f in &o.files {
        let text = if f == "-" {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(f)
        };
        match text {
            Ok(t) => g.read(f, &t),
            Err(e) => {
                eprintln!("pool-policy: {f}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if g.samples.is_empty() {
        eprintln!(
            "pool-policy: no row compares -R 1 with -R nccl or -R 0 on 2 or more ranks with \
             NCCL's default config{}",
            g.skipped
                .iter()
                .map(|s| format!("\n  left out: {s}"))
                .collect::<String>()
        );
        return ExitCode::FAILURE;
    }
    print!("{}", g.table(&o.files));
    ExitCode::SUCCESS
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// One row as the benchmark prints it (several modes; ratios not read).
    fn line(bytes: usize, mode: &str, us: f64, bw: f64, in_us: f64, in_bw: f64) -> String {
        format!(
            " {bytes:>12} {:>12} {:>9} {:>7} {:>5}   {us:>9.2} {bw:>7.2} {bw:>7.2} {:>6}   \
             {in_us:>9.2} {in_bw:>7.2} {in_bw:>7.2} {:>6}   {mode:>5}     1.000   1.000     \
             1.000   1.000",
            bytes / 4,
            "float",
            "none",
            -1,
            0,
            0
        )
    }

    fn run(coll: &str, ranks: usize, config: &str, rows: &[String]) -> String {
        format!(
            "$ bench ...\n# nccl-channel bench: ...\n# config: {config}\n#\n# {coll}: {ranks} \
             ranks, type float, op -, graphs no\n#  size ...\n#  (B) ...\n{}\n# Avg bus \
             bandwidth    : 1.0 (out of place, {coll}, mem 0)\n",
            rows.join("\n")
        )
    }

    const DEFAULT: &str = "cta_policy -, min_ctas -, max_ctas -, nvls_ctas - (-: NCCL's default)";

    fn table(texts: &[String]) -> String {
        let mut g = Gathered::default();
        for t in texts {
            g.read("t", t);
        }
        g.table(&["t".into()])
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
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn registers_from_the_first_size_that_gains_out_of_place_and_in_place() {
        let rows = [
            line(1 << 20, "nccl", 60.0, 100.0, 60.0, 100.0),
            line(1 << 20, "1", 60.0, 102.0, 60.0, 110.0), // out of place gains too little
            line(4 << 20, "nccl", 60.0, 100.0, 60.0, 100.0),
            line(4 << 20, "1", 60.0, 104.0, 60.0, 110.0),
            line(16 << 20, "nccl", 60.0, 100.0, 60.0, 100.0),
            line(16 << 20, "1", 60.0, 120.0, 60.0, 99.0), // in place loses
        ];
        assert_eq!(
            table(&[run("all_gather", 2, DEFAULT, &rows)]),
            "all_gather 4194304 registered\nall_gather 16777216 plain"
        );
    }

    /// Rows of symmetric memory (`-R sym`) make no rule (the pool cannot allocate it) but a
    /// comment naming the sizes where it gains, out of place and in place, on bases slow
    /// enough to count.
    #[test]
    fn symmetric_memory_that_gains_is_named_in_a_comment() {
        let rows = [
            line(1 << 10, "0", 10.0, 1.0, 10.0, 1.0), // too fast a base to count
            line(1 << 10, "sym", 5.0, 2.0, 5.0, 2.0),
            line(1 << 20, "0", 60.0, 100.0, 60.0, 100.0),
            line(1 << 20, "sym", 50.0, 130.0, 50.0, 120.0),
            line(1 << 30, "0", 1000.0, 100.0, 1000.0, 100.0),
            line(1 << 30, "sym", 1000.0, 110.0, 1000.0, 102.0), // in place gains too little
        ];
        let mut g = Gathered::default();
        g.read("t", &run("all_reduce", 2, DEFAULT, &rows));
        let out = g.table(&["t".into()]);
        assert!(
            out.contains(
                "# all_reduce: symmetric memory (-R sym, Communicator::symmetric) had >= 1.03x \
                 the base's busbw at 1048576 (1.200)\n"
            ),
            "{out}"
        );
        assert_eq!(table(&[run("all_reduce", 2, DEFAULT, &rows)]), "");
    }

    #[test]
    fn the_gain_threshold_is_3_percent_of_the_smaller_ratio() {
        let at = |gain: f64| {
            let rows = [
                line(1 << 30, "nccl", 1000.0, 100.0, 1000.0, 100.0),
                line(1 << 30, "1", 1000.0, 100.0 * gain, 1000.0, 200.0),
            ];
            table(&[run("all_to_all", 2, DEFAULT, &rows)])
        };
        assert_eq!(at(1.029), "");
        assert_eq!(at(1.031), "all_to_all 1073741824 registered");
    }

    #[test]
    fn sizes_faster_than_30_us_never_register() {
        let at = |us: f64| {
            let rows = [
                line(4096, "nccl", us, 100.0, us, 100.0),
                line(4096, "1", us, 200.0, us, 200.0),
            ];
            table(&[run("sendrecv", 2, DEFAULT, &rows)])
        };
        assert_eq!(at(29.9), "");
        assert_eq!(at(30.0), "sendrecv 4096 registered");
    }

    #[test]
    fn ratios_are_averaged_over_runs_and_plain_memory_is_the_base_without_nccl_memory() {
        let run_with = |bw: f64| {
            let rows = [
                line(1 << 27, "0", 500.0, 100.0, 500.0, 100.0),
                line(1 << 27, "1", 500.0, bw, 500.0, bw),
            ];
            run("reduce", 2, DEFAULT, &rows)
        };
        // 1.00 and 1.05: 1.025 on average, below the threshold; 1.02 and 1.05 above.
        assert_eq!(table(&[run_with(100.0), run_with(105.0)]), "");
        assert_eq!(
            table(&[run_with(102.0), run_with(105.0)]),
            "reduce 134217728 registered"
        );
    }

    #[test]
    fn nccl_memory_is_the_base_where_both_ran() {
        let rows = [
            line(1 << 27, "0", 500.0, 90.0, 500.0, 90.0),
            line(1 << 27, "nccl", 500.0, 100.0, 500.0, 100.0),
            line(1 << 27, "1", 500.0, 101.0, 500.0, 101.0),
        ];
        assert_eq!(table(&[run("broadcast", 2, DEFAULT, &rows)]), "");
    }

    #[test]
    fn one_rank_other_configs_and_rows_without_both_modes_are_left_out() {
        let gains = [
            line(1 << 27, "nccl", 500.0, 100.0, 500.0, 100.0),
            line(1 << 27, "1", 500.0, 200.0, 500.0, 200.0),
        ];
        let cta = "cta_policy zero, min_ctas -, max_ctas -, nvls_ctas - (-: NCCL's default)";
        let mut g = Gathered::default();
        g.read("one", &run("all_gather", 1, DEFAULT, &gains));
        g.read("cta", &run("all_gather", 2, cta, &gains));
        g.read("no-base", &run("all_gather", 2, DEFAULT, &gains[1..]));
        assert!(g.samples.is_empty(), "{:?}", g.samples);
        assert_eq!(
            g.skipped,
            [
                "one: all_gather on 1 rank".to_string(),
                format!("cta: a run with config {cta:?}")
            ]
        );
        g.read("two", &run("all_gather", 2, DEFAULT, &gains));
        assert_eq!(g.samples.len(), 1);
    }

    /// A run's config ends with the run: the next `$ command` line, or the next
    /// benchmark header, starts from NCCL's default (an output without a config line is
    /// of the default config).
    #[test]
    fn a_config_holds_until_the_next_run() {
        let gains = [
            line(1 << 27, "nccl", 500.0, 100.0, 500.0, 100.0),
            line(1 << 27, "1", 500.0, 200.0, 500.0, 200.0),
        ];
        let cta = "cta_policy zero, min_ctas -, max_ctas -, nvls_ctas - (-: NCCL's default)";
        let plain_run = |first: &str| {
            format!(
                "{first}\n# all_gather: 2 ranks, type float, op -, graphs no\n{}\n",
                gains.join("\n")
            )
        };
        for next in [
            "$ bench -c all_gather",
            "# nccl-channel bench: CUDA driver 13.0",
        ] {
            let text = run("all_gather", 2, cta, &gains) + &plain_run(next);
            assert_eq!(table(&[text]), "all_gather 134217728 registered", "{next}");
        }
        // No config line at all: the default.
        assert_eq!(
            table(&[plain_run("# no config line")]),
            "all_gather 134217728 registered"
        );
    }

    /// A base without bandwidth (0.00, as printed for tiny sizes) is no evidence: no
    /// ratio, rather than an infinite one.
    #[test]
    fn a_base_of_zero_bandwidth_is_no_evidence() {
        let rows = [
            line(4096, "nccl", 100.0, 0.0, 100.0, 0.0),
            line(4096, "1", 100.0, 1.0, 100.0, 1.0),
        ];
        assert_eq!(table(&[run("all_gather", 2, DEFAULT, &rows)]), "");
    }

    #[test]
    fn a_collective_without_in_place_uses_out_of_place_alone() {
        let row = |mode: &str, bw: f64| {
            line(1 << 27, mode, 500.0, bw, 0.0, 0.0).replacen(
                "     0.00    0.00    0.00      0",
                "      N/A     N/A     N/A    N/A",
                1,
            )
        };
        let rows = [row("nccl", 100.0), row("1", 110.0)];
        assert!(rows[1].contains("N/A"), "{}", rows[1]);
        assert_eq!(
            table(&[run("sendrecv", 2, DEFAULT, &rows)]),
            "sendrecv 134217728 registered"
        );
    }

    #[test]
    fn what_it_writes_nccl_channel_reads_and_follows() {
        let rows = [
            line(4 << 20, "nccl", 60.0, 100.0, 60.0, 100.0),
            line(4 << 20, "1", 60.0, 110.0, 60.0, 110.0),
        ];
        let mut g = Gathered::default();
        g.read("t", &run("all_gather", 2, DEFAULT, &rows));
        let p = nccl_channel::PoolPolicy::parse(&g.table(&["t".into()])).unwrap();
        use nccl_channel::PoolMemory::{Plain, Registered};
        assert_eq!(p.memory(Collective::AllGather, 4 << 20), Registered);
        assert_eq!(p.memory(Collective::AllGather, (4 << 20) - 1), Plain);
    }
}
