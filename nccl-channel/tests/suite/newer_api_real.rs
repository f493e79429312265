//! The newer API's entry points that need no live communicator (`join_grown`,
//! `init_rank_scalable`, `Param`, `set_encryption`, `Group::simulate_end`) with the real
//! libnccl of the pinned wheels and no GPU: a context of the simulated driver, the real
//! library. NCCL 2.18.3 has none of them: each is exactly `Error::Unsupported` naming its
//! release, decided before any call that would need a GPU (the simulated driver sees no
//! context made current). NCCL 2.32.3 has them all: the same calls get past the version
//! gate to the crate's own checks, and to NCCL itself, which without a GPU fails the init
//! with its own status.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use cuda_hal::{Context, Cuda};
use cuda_mock::MockWorld;
use nccl_channel::{
    CommConfig, Communicator, Encryption, Error, Group, Param, UniqueId, set_encryption,
};
use nccl_sys::Nccl;
use test_support::this_test;

use crate::common::wheel::{self, load_trusted};

const LIBNCCL: &str = "NCCL_SYS_TEST_LIBNCCL";

/// In a child running test `name` (its full name: `this_test!()`) with the real library of
/// `version`: that library, a context of the simulated driver (device 0) and the driver's world;
/// `None` in the parent.
fn in_child(name: &str, version: &str) -> Option<(Arc<Nccl>, Cuda, Context, MockWorld)> {
    let lib = wheel::libnccl(version, LIBNCCL);
    if !test_support::env::in_scrubbed_child(name, &[(LIBNCCL, lib.as_os_str())]) {
        return None;
    }
    let (cuda, gpus) = cuda_mock::MockDriver::with_devices(1)
        .build_with(Cuda::from_driver)
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    Some((Arc::new(load_trusted(lib).unwrap()), cuda, ctx, gpus))
}

/// The calls: joins of a grow, scalable inits, parameters, encryption, a simulated end.
fn calls(nccl: &Arc<Nccl>, ctx: &Context, id: &UniqueId) -> Vec<(&'static str, String)> {
    let nb = CommConfig::non_blocking(Duration::from_secs(2));
    let two = [*id, *id];
    vec![
        (
            "join_grown",
            format!(
                "{:?}",
                Communicator::join_grown(nccl, ctx, id, 2, 1).map(|c| c.rank())
            ),
        ),
        (
            "join_grown, rank out of range",
            format!(
                "{:?}",
                Communicator::join_grown(nccl, ctx, id, 2, 2).map(|c| c.rank())
            ),
        ),
        (
            "join_grown_with",
            format!(
                "{:?}",
                Communicator::join_grown_with(nccl, ctx, id, 2, 1, &nb).map(|c| c.rank())
            ),
        ),
        (
            "init_rank_scalable, two ids for one rank",
            format!(
                "{:?}",
                Communicator::init_rank_scalable(nccl, ctx, &two, 1, 0, &CommConfig::new())
                    .map(|c| c.rank())
            ),
        ),
        (
            "init_rank_scalable",
            format!(
                "{:?}",
                Communicator::init_rank_scalable(nccl, ctx, &two[..1], 1, 0, &CommConfig::new())
                    .map(|c| c.rank())
            ),
        ),
        (
            "Param::<u64>::bind",
            format!(
                "{:?}",
                Param::<u64>::bind(nccl, "NCCL_DEBUG_SUBSYS").map(|p| p.key().to_owned())
            ),
        ),
        (
            "Param::value_string",
            format!("{:?}", Param::value_string(nccl, "NCCL_NO_SUCH_PARAMETER")),
        ),
        ("Param::dump_all", format!("{:?}", Param::dump_all(nccl))),
        (
            "set_encryption",
            format!(
                "{:?}",
                set_encryption(nccl, &Encryption::Psk("short".into()))
            ),
        ),
        (
            "Group::simulate_end",
            format!("{:?}", Group::start(nccl).unwrap().simulate_end()),
        ),
    ]
}

/// Whether this machine has a usable GPU, asked of the real driver if there is one (then
/// NCCL's inits would proceed, and a join would wait for its coordinator).
fn gpu_present() -> bool {
    let Ok(d) = cuda_sys::Driver::load() else {
        return false;
    };
    let mut n = 0;
    // SAFETY: plain driver calls with a valid out-pointer.
    unsafe {
        (d.fns().cuInit)(0) == cuda_sys::CUresult::CUDA_SUCCESS
            && (d.fns().cuDeviceGetCount)(&mut n) == cuda_sys::CUresult::CUDA_SUCCESS
            && n > 0
    }
}

/// The context binds the simulated driver saw (each begins with `cuCtxGetCurrent`).
fn binds(gpus: &MockWorld) -> u64 {
    gpus.calls("cuCtxGetCurrent")
}

#[test]
fn nccl_2_18_3_refuses_every_newer_entry_point_before_any_gpu_call() {
    let Some((nccl, _cuda, ctx, gpus)) = in_child(&this_test!(), "2.18.3") else {
        return;
    };
    let id = UniqueId::generate(&nccl).unwrap();
    let before = binds(&gpus);
    let un = |feature: &'static str, needed: &str| {
        let e = Error::Unsupported {
            feature,
            needed: needed.into(),
            found: "2.18.3".into(),
        };
        format!("{:?}", Err::<(), _>(e))
    };
    let got: Vec<(&str, String)> = calls(&nccl, &ctx, &id);
    let want = [
        ("join_grown", un("ncclCommGrow", "2.29.2")),
        (
            "join_grown, rank out of range",
            un("ncclCommGrow", "2.29.2"),
        ),
        ("join_grown_with", un("ncclCommGrow", "2.29.2")),
        (
            "init_rank_scalable, two ids for one rank",
            un("ncclCommInitRankScalable", "2.23.4"),
        ),
        (
            "init_rank_scalable",
            un("ncclCommInitRankScalable", "2.23.4"),
        ),
        ("Param::<u64>::bind", un("ncclParamBind", "2.30.4")),
        ("Param::value_string", un("ncclParamGetParameter", "2.30.4")),
        ("Param::dump_all", un("ncclParamDumpAll", "2.30.4")),
        ("set_encryption", un("ncclSetEncryption", "2.32.3")),
        ("Group::simulate_end", un("ncclGroupSimulateEnd", "2.22.3")),
    ];
    let want: Vec<(&str, String)> = want.iter().map(|(w, e)| (*w, e.clone())).collect();
    assert_eq!(got, want);
    // The gate comes first: not even the device's context was made current.
    assert_eq!(binds(&gpus), before, "a refused call touched the driver");
    assert_eq!(gpus.violations(), Vec::<String>::new());
}

#[test]
fn nccl_2_32_3_lets_every_newer_entry_point_past_the_version_gate() {
    let Some((nccl, _cuda, ctx, gpus)) = in_child(&this_test!(), "2.32.3") else {
        return;
    };
    if gpu_present() {
        // NCCL's inits would proceed on the real GPU (not this test's business).
        return;
    }
    let id = UniqueId::generate(&nccl).unwrap();
    let before = binds(&gpus);
    let got = calls(&nccl, &ctx, &id);
    // NCCL itself refuses an init without a GPU: its status, the call named.
    let no_gpu = |call: &str, r: &str| {
        assert!(
            r.starts_with(&format!(
                "Err(Nccl {{ call: \"{call}\", code: ncclResult_t(1), name: \"ncclUnhandledCudaError\""
            )),
            "{call}: {r}"
        );
    };
    let by = |what: &str| &got.iter().find(|g| g.0 == what).unwrap().1;
    no_gpu("ncclCommGrow", by("join_grown"));
    no_gpu("ncclCommGrow", by("join_grown_with"));
    no_gpu("ncclCommInitRankScalable", by("init_rank_scalable"));
    // The crate's own checks after the gate.
    assert_eq!(
        by("join_grown, rank out of range"),
        "Err(InvalidRank { what: \"Communicator::join_grown\", rank: 2, size: 2 })"
    );
    assert_eq!(
        by("init_rank_scalable, two ids for one rank"),
        &format!(
            "{:?}",
            Err::<(), _>(Error::InvalidArgument {
                what: "Communicator::init_rank_scalable",
                problem: "2 unique ids for 1 ranks: NCCL takes 1 to one per rank".into(),
            })
        )
    );
    // No GPU needed: NCCL answers.
    assert_eq!(by("Param::<u64>::bind"), "Ok(\"NCCL_DEBUG_SUBSYS\")");
    assert_eq!(
        by("Param::value_string"),
        "Err(UnknownParam { key: \"NCCL_NO_SUCH_PARAMETER\" })"
    );
    assert_eq!(by("Param::dump_all"), "Ok(())");
    assert!(
        by("set_encryption").starts_with("Err(InvalidArgument { what: \"set_encryption\""),
        "{}",
        by("set_encryption")
    );
    // An empty group simulated: nothing to launch, zero predicted.
    assert_eq!(by("Group::simulate_end"), "Ok(0ns)");
    // The three inits made the device's context current before calling NCCL.
    assert_eq!(binds(&gpus) - before, 3, "the inits' binds");
    assert_eq!(gpus.violations(), Vec::<String>::new());
}
