//! Every collective × data type × op on the simulated NCCL, for world sizes 1 to 4 and 8,
//! against host-computed results; then leak checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Rig, matrix};

fn world_of(n: usize) {
    let rig = Rig::new(n);
    let results = rig.run(n, |comm, s| matrix::check_every_type(comm, s).unwrap());
    let bad: Vec<String> = results.into_iter().flatten().collect();
    assert!(
        bad.is_empty(),
        "{} wrong results, e.g.:\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
    rig.assert_clean();
}

#[test]
fn world_size_1() {
    world_of(1);
}

#[test]
fn world_size_2() {
    world_of(2);
}

#[test]
fn world_size_3() {
    world_of(3);
}

#[test]
fn world_size_4() {
    world_of(4);
}

#[test]
fn world_size_8() {
    world_of(8);
}
