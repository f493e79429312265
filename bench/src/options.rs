//! The command line: nccl-tests' short options, and this crate's own (`--threads`,
//! `--nprocs`, `-R`, the communicator's CTA config, `--sim-nccl`).

use std::time::Duration;

use clap::Parser;
use nccl_sys::NcclVersion;

use crate::collective::{Colls, colls_arg};
use crate::mode::{Mem, mem_arg};
use crate::sizes::size_arg;

/// An nccl-tests-style benchmark of every collective through nccl-channel.
#[derive(Parser, Clone, Debug)]
#[command(name = "bench")]
pub(crate) struct Opts {
    /// Collectives: a comma list of nccl-channel's `Collective` names (all_reduce,
    /// all_gather, reduce_scatter, broadcast, reduce, all_to_all, all_to_all_v, gather,
    /// scatter, sendrecv), or `all`.
    #[arg(short = 'c', long = "collective", default_value = "all_reduce", value_parser = colls_arg)]
    pub(crate) colls: Colls,
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', default_value = "8", value_parser = size_arg)]
    pub(crate) min: usize,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', default_value = "64M", value_parser = size_arg)]
    pub(crate) max: usize,
    /// Factor between sizes.
    #[arg(short = 'f', default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    pub(crate) factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iters: u64,
    /// Warm-up iterations per size.
    #[arg(short = 'w', default_value_t = 5)]
    pub(crate) warmup: usize,
    /// Element type.
    #[arg(short = 'd', default_value = "float",
          value_parser = ["float", "half", "bfloat16", "double", "int32", "int8", "uint8"])]
    pub(crate) dtype: String,
    /// Reduction.
    #[arg(short = 'o', default_value = "sum", value_parser = ["sum", "prod", "max", "min", "avg"])]
    pub(crate) op: String,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', default_value_t = 0)]
    pub(crate) root: usize,
    /// Capture the `-n` iterations of each size into a CUDA graph and time its replay.
    #[arg(short = 'G', long = "graph")]
    pub(crate) graph: bool,
    /// Check each result (1) or not (0).
    #[arg(long, default_value = "1", value_name = "0|1", action = clap::ArgAction::Set, value_parser = check_arg)]
    pub(crate) check: bool,
    /// One process, one thread per GPU (default: every local GPU; 2 simulated devices).
    #[arg(long, conflicts_with = "nprocs")]
    pub(crate) threads: Option<usize>,
    /// One process per GPU (or simulated device), started by this program; each is
    /// configured as under torchrun, rank 0 prints the table.
    #[arg(long, value_parser = nccl_launch::positive)]
    pub(crate) nprocs: Option<usize>,
    /// With --nprocs: seconds the ranks may take before they are stopped. A rank waits for
    /// the others (the unique id, and without a driver the simulated NCCL) this long, at
    /// most 300 s.
    #[arg(long, value_name = "SECONDS", default_value = "3600", value_parser = nccl_launch::seconds)]
    pub(crate) timeout: Duration,
    /// Memory modes, a comma list or repeated: sym (the default) the collective allocation
    /// Communicator::symmetric (NCCL >= 2.27; plain memory where NCCL has no windows), 0
    /// plain cuMemAlloc buffers, nccl ncclMemAlloc unregistered, 1 ncclMemAlloc registered
    /// with the communicator (ncclCommRegister), 2 ncclMemAlloc registered as a symmetric
    /// window by hand, pool the communicator's pool of registered memory. Each size runs
    /// once per mode.
    #[arg(short = 'R', default_value = "sym", value_delimiter = ',', value_parser = mem_arg)]
    pub(crate) mems: Vec<Mem>,
    /// CTA policy of the communicator's config.
    #[arg(long, value_parser = ["default", "efficiency", "zero"])]
    pub(crate) cta_policy: Option<String>,
    /// Fewest CTAs per collective (config minCTAs).
    #[arg(long)]
    pub(crate) min_ctas: Option<u32>,
    /// Most CTAs per collective (config maxCTAs).
    #[arg(long)]
    pub(crate) max_ctas: Option<u32>,
    /// CTAs of NVLink-SHARP collectives (config nvlsCTAs).
    #[arg(long)]
    pub(crate) nvls_ctas: Option<u32>,
    /// The version the simulated NCCL reports (X.Y.Z; only without a CUDA driver), to see
    /// how the modes an older NCCL lacks are skipped.
    #[arg(long, value_name = "X.Y.Z", value_parser = version_arg)]
    pub(crate) sim_nccl: Option<NcclVersion>,
}

/// The command line, with what clap cannot say: a memory mode given twice runs once, and
/// the sweep must not be empty (`-b <= -e`).
pub(crate) fn parse() -> Result<Opts, clap::Error> {
    let mut o = Opts::try_parse()?;
    let mut seen = Vec::new();
    o.mems.retain(|m| {
        let new = !seen.contains(m);
        seen.push(*m);
        new
    });
    if o.min > o.max {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            "need -b <= -e\n",
        ));
    }
    Ok(o)
}

/// `--check`: 0 or 1, as nccl-tests spells it.
fn check_arg(s: &str) -> Result<bool, String> {
    match s {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("0 or 1".into()),
    }
}

/// `--sim-nccl 2.Y.Z`: NCCL's major version 2, minor and patch below 100 (what its version
/// code holds).
fn version_arg(s: &str) -> Result<NcclVersion, String> {
    let bad = || format!("bad version {s:?} (2.MINOR.PATCH, each below 100)");
    let p: Vec<u8> = s
        .split('.')
        .map(|x| nccl_launch::parse_decimal(x).ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    match p[..] {
        [2, b, c] if b < 100 && c < 100 => Ok(NcclVersion::new(2, b.into(), c.into())),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_version_is_2_minor_patch_below_100() {
        assert_eq!(version_arg("2.28.3"), Ok(NcclVersion::new(2, 28, 3)));
        assert_eq!(version_arg("2.99.99"), Ok(NcclVersion::new(2, 99, 99)));
        for bad in [
            "2.300.0",
            "2.28.100",
            "999999.0.0",
            "3.0.0",
            "2.28",
            "+2.28.3",
            "",
        ] {
            assert_eq!(
                version_arg(bad),
                Err(format!(
                    "bad version {bad:?} (2.MINOR.PATCH, each below 100)"
                ))
            );
        }
    }
}
