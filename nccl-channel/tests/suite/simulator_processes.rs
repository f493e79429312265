//! The multi-process simulator never fails a correct program: short programs of 2 to 8
//! ranks, each rank an OS process of its own (this test binary again) with its own
//! simulated driver and NCCL, meeting at rank 0's hub through `NCCL_COMM_ID`; blocking and
//! non-blocking communicators; ranks ending in every order (closing, dropping, leaving the
//! communicator to the process's end), early or late.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use cuda_hal::{Cuda, DeviceBuffer, Stream};
use cuda_mock::MockDriver;
use nccl_channel::{CommConfig, Communicator, ReduceOp, UniqueId};
use nccl_mock::MockNccl;

/// Set in a child: what its rank does (see [`Rank::from_env`]).
const CHILD: &str = "NCCL_CHANNEL_TEST_SIMULATED_RANK";

/// How a rank's program ends once its result is checked.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ending {
    /// `close()`, then the process ends.
    Close,
    /// The communicator is dropped (destroyed), then the process ends.
    Drop,
    /// The process ends with the communicator alive (`std::process::exit`).
    Exit,
}

/// One rank's program.
#[derive(Clone, Copy, Debug)]
struct Rank {
    rank: usize,
    nranks: usize,
    non_blocking: bool,
    /// Microseconds the rank waits after its collectives (the order in which ranks end).
    pause_us: u64,
    ending: Ending,
    /// Elements each rank gives to the all-gather.
    elems: usize,
}

impl Rank {
    fn to_env(self) -> String {
        let ending = match self.ending {
            Ending::Close => "close",
            Ending::Drop => "drop",
            Ending::Exit => "exit",
        };
        format!(
            "{} {} {} {} {ending} {}",
            self.rank, self.nranks, self.non_blocking, self.pause_us, self.elems
        )
    }

    fn from_env(s: &str) -> Rank {
        let v: Vec<&str> = s.split(' ').collect();
        Rank {
            rank: v[0].parse().unwrap(),
            nranks: v[1].parse().unwrap(),
            non_blocking: v[2].parse().unwrap(),
            pause_us: v[3].parse().unwrap(),
            ending: match v[4] {
                "close" => Ending::Close,
                "drop" => Ending::Drop,
                _ => Ending::Exit,
            },
            elems: v[5].parse().unwrap(),
        }
    }
}

/// Runs a rank when started as a child by [`rounds`]: an all-reduce and an all-gather,
/// each checked, then the program ends as its [`Ending`] says. Prints `rank R: ok` or
/// what failed. Does nothing in a normal test run.
#[test]
fn simulated_rank() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let me = Rank::from_env(&spec);
    match run_rank(me) {
        Ok(comm) => {
            println!("rank {}: ok", me.rank);
            std::thread::sleep(Duration::from_micros(me.pause_us));
            let ended = match me.ending {
                // Idle, its work done: no peer's ending is an error here.
                Ending::Close => comm
                    .async_error()
                    .and_then(|()| comm.close())
                    .map_err(|e| e.to_string()),
                Ending::Drop => {
                    drop(comm);
                    Ok(())
                }
                Ending::Exit => std::process::exit(0),
            };
            match ended {
                Ok(()) => println!("rank {}: ended", me.rank),
                Err(e) => println!("rank {}: close failed: {e}", me.rank),
            }
        }
        Err(e) => println!("rank {}: failed: {e}", me.rank),
    }
    std::process::exit(0);
}

fn run_rank(me: Rank) -> Result<Communicator, String> {
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let (cuda, _gpus) = MockDriver::with_devices(1)
        .build_with(Cuda::from_driver)
        .map_err(|e| s(&e))?;
    let (nccl, _world) = MockNccl::new(&_gpus)
        .multi_process(true)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| s(&e))?;
    let nccl = Arc::new(nccl);
    let ctx = cuda
        .device(0)
        .and_then(|d| d.primary_context())
        .map_err(|e| s(&e))?;
    let id = UniqueId::generate(&nccl).map_err(|e| s(&e))?;
    let config = if me.non_blocking {
        CommConfig::non_blocking(Duration::from_secs(30))
    } else {
        CommConfig::new()
    };
    let comm = Communicator::init_rank_with(&nccl, &ctx, &id, me.nranks, me.rank, &config)
        .map_err(|e| s(&e))?;
    let stream = Stream::non_blocking(&ctx).map_err(|e| s(&e))?;
    let mut sum = DeviceBuffer::from_slice(&ctx, &[me.rank as i32 + 1]).map_err(|e| s(&e))?;
    comm.all_reduce_in_place(&mut sum, ReduceOp::Sum, &stream)
        .map_err(|e| s(&e))?;
    let mine =
        DeviceBuffer::from_slice(&ctx, &vec![me.rank as i32; me.elems]).map_err(|e| s(&e))?;
    let mut all = DeviceBuffer::<i32>::zeroed(&ctx, me.nranks * me.elems).map_err(|e| s(&e))?;
    comm.all_gather(&mine, &mut all, &stream)
        .map_err(|e| s(&e))?;
    stream.synchronize().map_err(|e| s(&e))?;
    let n = me.nranks as i32;
    let got = (
        sum.to_vec().map_err(|e| s(&e))?,
        all.to_vec().map_err(|e| s(&e))?,
    );
    let gathered = (0..n)
        .flat_map(|r| std::iter::repeat_n(r, me.elems))
        .collect();
    let want = (vec![n * (n + 1) / 2], gathered);
    if got != want {
        return Err("wrong results".into());
    }
    Ok(comm)
}

/// A small deterministic generator for the rounds' shapes.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Runs one program, each rank a child process; every rank's output.
fn run(ranks: &[Rank]) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let name = test_support::test_name(module_path!(), "simulated_rank");
    let addr = format!("127.0.0.1:{}", crate::common::demo::free_port());
    let children: Vec<_> = ranks
        .iter()
        .map(|r| {
            test_support::env::scrubbed(&exe)
                .args(["--exact", &name, "--nocapture", "--test-threads=1"])
                .env(CHILD, r.to_env())
                .env("NCCL_COMM_ID", &addr)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            format!(
                "{}{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                if out.status.success() {
                    String::new()
                } else {
                    format!("[exit: {}]", out.status)
                }
            )
        })
        .collect()
}

/// `None` when every rank got its results and ended as its program says; else the
/// program with every rank's output.
fn failure(ranks: &[Rank], outputs: &[String]) -> Option<String> {
    let correct = ranks.iter().zip(outputs).all(|(r, out)| {
        let ok = out.contains(&format!("rank {}: ok", r.rank));
        let ended = r.ending == Ending::Exit || out.contains(&format!("rank {}: ended", r.rank));
        ok && ended && !out.contains("[exit")
    });
    if correct {
        return None;
    }
    let mut report = String::new();
    for (r, out) in ranks.iter().zip(outputs) {
        report += &format!("  {r:?}\n    {}\n", out.trim().replace('\n', "\n    "));
    }
    Some(report)
}

/// `count` programs from `seed`, each run to its end; the failures, each with the
/// program and every rank's output.
pub(crate) fn rounds(seed: u64, count: usize) -> Vec<String> {
    let mut x = seed.max(1);
    let mut failures = Vec::new();
    for round in 0..count {
        let nranks = 2 + (next(&mut x) % 7) as usize;
        let non_blocking = next(&mut x).is_multiple_of(2);
        let elems = 1 + (next(&mut x) % 4) as usize;
        let ranks: Vec<Rank> = (0..nranks)
            .map(|rank| Rank {
                rank,
                nranks,
                non_blocking,
                pause_us: [0, 0, 200, 2000, 20_000][(next(&mut x) % 5) as usize],
                ending: [Ending::Close, Ending::Close, Ending::Drop, Ending::Exit]
                    [(next(&mut x) % 4) as usize],
                elems,
            })
            .collect();
        if let Some(f) = failure(&ranks, &run(&ranks)) {
            failures.push(format!("round {round} of seed {seed}:\n{f}"));
        }
    }
    failures
}

/// Two non-blocking ranks of one element each: rank `exits` ends its process without
/// destroying its communicator, and the other, half a second later, closes its own.
fn one_exits_and_one_closes(exits: usize) -> Vec<Rank> {
    (0..2)
        .map(|rank| Rank {
            rank,
            nranks: 2,
            non_blocking: true,
            pause_us: if rank == exits { 0 } else { 500_000 },
            ending: if rank == exits {
                Ending::Exit
            } else {
                Ending::Close
            },
            elems: 1,
        })
        .collect()
}

/// Rank 0's process hosts the hub. Ending at once, without destroying its communicator,
/// it took the hub with it: its peer, still closing (or still waiting for its answer),
/// heard of a network error. Its process now stays until every peer has left.
#[test]
fn the_hub_process_ending_without_a_destroy_stays_for_its_peers() {
    let ranks = one_exits_and_one_closes(0);
    if let Some(f) = failure(&ranks, &run(&ranks)) {
        panic!("{f}");
    }
}

/// A peer that ends without destroying its communicator left it, as a destroy would: it
/// did not die, and rank 0's non-blocking communicator, idle since, closes cleanly
/// (before, the hub told rank 0 of a death, whose asynchronous error failed the close).
#[test]
fn a_peer_ending_without_a_destroy_is_no_death_for_the_others() {
    let ranks = one_exits_and_one_closes(1);
    if let Some(f) = failure(&ranks, &run(&ranks)) {
        panic!("{f}");
    }
}

/// `$name` as a number, when it is set to one.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Programs of 2 to 8 ranks, blocking and non-blocking, ending in every order: none fails.
#[test]
fn correct_programs_never_fail_on_the_multi_process_simulator() {
    let count = env_number("SIM_ROUNDS").unwrap_or(60);
    let failures = rounds(0x5eed, count);
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The long run (`SOAK=simulator scripts/soak MINUTES [SEED]`): programs from fresh seeds
/// until the time is up; the count run, and every failure.
#[test]
#[ignore = "a long run: scripts/soak"]
fn soak() {
    let minutes: u64 = env_number("SIM_MINUTES").unwrap_or(1);
    // Else from the clock: a fresh seed each run.
    let seed = env_number("SIM_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("simulator soak: seed {seed}, {minutes} min");
    let end = std::time::Instant::now() + Duration::from_secs(minutes * 60);
    let (mut programs, mut failures) = (0usize, Vec::new());
    let mut batch = seed;
    while std::time::Instant::now() < end {
        failures.extend(rounds(batch, 20));
        programs += 20;
        batch = batch.wrapping_add(1);
    }
    eprintln!(
        "simulator soak: {programs} programs, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
