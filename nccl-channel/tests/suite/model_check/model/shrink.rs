//! Shrinking by deletion: chunks, then single steps, while the case fails the same way
//! (the same kind of failure).

use super::DEADLINE;
use super::case::{self, Case};
use super::run::Failure;

/// The smallest case found that still fails like `f` (at most 400 runs, or
/// `MODEL_SHRINK_RUNS`).
pub fn shrink(case: Case, mut f: Failure) -> (Case, Failure) {
    let mut steps = case.steps();
    let mut budget: u32 = std::env::var("MODEL_SHRINK_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut chunk = steps.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        let mut removed = false;
        while i < steps.len() && budget > 0 {
            let mut fewer = steps.clone();
            fewer.drain(i..(i + chunk).min(steps.len()));
            let q = Case {
                kept: Some(fewer.clone()),
                ..case.clone()
            };
            budget -= 1;
            match case::run(&q, DEADLINE) {
                Err(g) if g.kind() == f.kind() => {
                    steps = fewer;
                    f = g;
                    removed = true;
                }
                _ => i += chunk,
            }
        }
        if budget == 0 || (chunk == 1 && !removed) {
            break;
        }
        if !removed {
            chunk = (chunk / 2).max(1);
        }
    }
    (
        Case {
            kept: Some(steps),
            ..case
        },
        f,
    )
}
