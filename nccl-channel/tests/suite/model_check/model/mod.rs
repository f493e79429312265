//! A model checker over the public API of cuda-hal and nccl-channel, on the simulated
//! devices: seeded random programs of allocations, copies, every collective, groups
//! (the user's, nested, the crate's own fallbacks), captures and graph launches, pools,
//! registrations and windows, splits and shrinks, aborts, drops in any order (also on
//! other threads and in thread-locals), injected driver/NCCL failures and injected
//! panics, on the NCCL releases that switch code paths. The oracle: the sanitizer
//! reports nothing, no panic escapes but the injected ones, nothing leaks outside the
//! documented leak-on-failure paths, and no program hangs. A failing program is shrunk
//! to a minimal one, printed so that it can become a named regression test.
//!
//! A seeded generator of our own rather than proptest's state machines: every operand is
//! an index taken modulo what exists, so any subsequence of a program is a program and
//! shrinking is deletion; a program runs on a thread of its own with a deadline (a hang
//! is a finding, not a stuck test); and a seed reproduces a run on any machine.
#![allow(dead_code, unreachable_pub)]

pub mod case;
pub mod generate;
pub mod program;
pub mod run;
pub mod shrink;

pub use case::Case;
pub use program::{Coll, Fault, Op, Program, Sabotage, Setup};
pub use run::{Failure, run};

use std::time::{Duration, Instant};

/// The deadline of one program.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// What a search did.
#[derive(Debug, Default)]
pub struct Report {
    pub programs: u64,
    pub steps: u64,
}

/// Runs programs from `first_seed` on, each in a child process: at least `min`, then
/// until `budget` is spent or `max` ran; the first failure is shrunk and returned.
pub fn search(
    first_seed: u64,
    budget: Duration,
    min: u64,
    max: u64,
) -> Result<Report, (Case, Failure)> {
    let start = Instant::now();
    let mut report = Report::default();
    let mut seed = first_seed;
    while (report.programs < min || start.elapsed() < budget) && report.programs < max {
        let len = 8 + (generate::Rng::new(seed ^ 0x5EED).below(48) as usize);
        let case = Case {
            seed,
            len,
            kept: None,
        };
        report.programs += 1;
        report.steps += len as u64;
        if let Err(f) = case::run(&case, DEADLINE) {
            return Err(shrink::shrink(case, f));
        }
        seed = seed.wrapping_add(1);
    }
    Ok(report)
}

/// The child's side: runs the case in `MODEL_CASE` here and prints its result.
pub fn child() {
    let Some(case) = std::env::var(case::VAR).ok().and_then(|s| Case::decode(&s)) else {
        return;
    };
    // The injected panics are expected: only others are worth a backtrace.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&run::INJECTED) {
            hook(info);
        }
    }));
    if std::env::var_os("MODEL_SHOW").is_some() {
        println!("{:#?}", case.program());
    }
    let r = run::execute(&case.program());
    match r {
        Ok(()) => println!("MODEL-RESULT ok"),
        Err(f) => println!("MODEL-RESULT {}", f.encode()),
    }
}
