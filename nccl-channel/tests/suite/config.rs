//! `CommConfig` on the simulated NCCL: every setter reaches its own `ncclConfig_t` field
//! (read back from what the mock recorded), unset fields stay unset, fields newer than the
//! loaded NCCL and bad values are refused before anything is created, the struct's
//! `version` is lowered to the library's, and splits inherit or take a config.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common::Rig;
use nccl_channel::{
    CommConfig, Communicator, CtaPolicy, Error, HostCftMode, NvlsHostMode, UniqueId,
};
use nccl_mock::MockConfig;
use nccl_sys::{NCCL_CONFIG_UNDEF_INT, NcclVersion, ncclConfig_t};

const UNDEF: i32 = NCCL_CONFIG_UNDEF_INT;

/// Every `int` field of the config by C name, spelled out here (not from the crate's
/// table), so that a setter writing the wrong field is seen.
fn ints(c: &ncclConfig_t) -> Vec<(&'static str, i32)> {
    vec![
        ("blocking", c.blocking),
        ("cgaClusterSize", c.cgaClusterSize),
        ("minCTAs", c.minCTAs),
        ("maxCTAs", c.maxCTAs),
        ("splitShare", c.splitShare),
        ("trafficClass", c.trafficClass),
        ("collnetEnable", c.collnetEnable),
        ("CTAPolicy", c.CTAPolicy),
        ("shrinkShare", c.shrinkShare),
        ("nvlsCTAs", c.nvlsCTAs),
        ("nChannelsPerNetPeer", c.nChannelsPerNetPeer),
        ("nvlinkCentricSched", c.nvlinkCentricSched),
        ("graphUsageMode", c.graphUsageMode),
        ("numRmaCtx", c.numRmaCtx),
        ("maxP2pPeers", c.maxP2pPeers),
        ("graphStreamOrdering", c.graphStreamOrdering),
        ("launchOrderImplicit", c.launchOrderImplicit),
        ("numRmaSig", c.numRmaSig),
        ("rmaEagerInit", c.rmaEagerInit),
        ("hostCftMode", c.hostCftMode),
        ("nvlsHostMode", c.nvlsHostMode),
    ]
}

type Set = fn(CommConfig) -> CommConfig;
type Get = fn(&CommConfig) -> Option<i32>;

/// (C field, setter, what NCCL must see, the getter as an int).
fn int_setters() -> Vec<(&'static str, Set, i32, Get)> {
    vec![
        (
            "cgaClusterSize",
            |c| c.cga_cluster_size(3),
            3,
            |c| c.get_cga_cluster_size().map(|v| v as i32),
        ),
        (
            "minCTAs",
            // NCCL wants a maximum with a minimum.
            |c| c.min_ctas(5).max_ctas(64),
            5,
            |c| c.get_min_ctas().map(|v| v as i32),
        ),
        (
            "maxCTAs",
            |c| c.max_ctas(7),
            7,
            |c| c.get_max_ctas().map(|v| v as i32),
        ),
        (
            "splitShare",
            |c| c.split_share(true),
            1,
            |c| c.get_split_share().map(i32::from),
        ),
        (
            "trafficClass",
            |c| c.traffic_class(11),
            11,
            |c| c.get_traffic_class().map(|v| v as i32),
        ),
        (
            "collnetEnable",
            |c| c.collnet(true),
            1,
            |c| c.get_collnet().map(i32::from),
        ),
        (
            "CTAPolicy",
            |c| c.cta_policy(CtaPolicy::EFFICIENCY | CtaPolicy::ZERO),
            3,
            |c| c.get_cta_policy().map(|p| p.0),
        ),
        (
            "shrinkShare",
            |c| c.shrink_share(false),
            0,
            |c| c.get_shrink_share().map(i32::from),
        ),
        (
            "nvlsCTAs",
            |c| c.nvls_ctas(13),
            13,
            |c| c.get_nvls_ctas().map(|v| v as i32),
        ),
        (
            "nChannelsPerNetPeer",
            |c| c.channels_per_net_peer(4),
            4,
            |c| c.get_channels_per_net_peer().map(|v| v as i32),
        ),
        (
            "nvlinkCentricSched",
            |c| c.nvlink_centric_sched(false),
            0,
            |c| c.get_nvlink_centric_sched().map(i32::from),
        ),
        (
            "graphUsageMode",
            |c| c.graph_usage_mode(1),
            1,
            |c| c.get_graph_usage_mode().map(|v| v as i32),
        ),
        (
            "numRmaCtx",
            |c| c.rma_contexts(17),
            17,
            |c| c.get_rma_contexts().map(|v| v as i32),
        ),
        (
            "maxP2pPeers",
            |c| c.max_p2p_peers(19),
            19,
            |c| c.get_max_p2p_peers().map(|v| v as i32),
        ),
        (
            "graphStreamOrdering",
            |c| c.graph_stream_ordering(true),
            1,
            |c| c.get_graph_stream_ordering().map(i32::from),
        ),
        (
            "launchOrderImplicit",
            |c| c.launch_order_implicit(false),
            0,
            |c| c.get_launch_order_implicit().map(i32::from),
        ),
        (
            "numRmaSig",
            |c| c.rma_signals(23),
            23,
            |c| c.get_rma_signals().map(|v| v as i32),
        ),
        (
            "rmaEagerInit",
            |c| c.rma_eager_init(true),
            1,
            |c| c.get_rma_eager_init().map(i32::from),
        ),
        (
            "hostCftMode",
            |c| c.host_cft_mode(HostCftMode::FALLBACK),
            3,
            |c| c.get_host_cft_mode().map(|m| m.0),
        ),
        (
            "nvlsHostMode",
            |c| c.nvls_host_mode(NvlsHostMode::DISABLE_TRANSPORT),
            1,
            |c| c.get_nvls_host_mode().map(|m| m.0),
        ),
    ]
}

/// One rank (blocking unless `config` says otherwise) made with `config`: what NCCL saw
/// and the configuration the communicator reports, then it is closed.
fn seen_by_nccl(rig: &Rig, config: &CommConfig) -> (Option<MockConfig>, CommConfig) {
    let ctx = rig.context(0);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let comm = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, config).unwrap();
    let seen = rig.world.config_of(comm.as_raw());
    let kept = comm.config().clone();
    comm.close().unwrap();
    (seen, kept)
}

/// The init's error, after checking that nothing was created or even attempted.
fn refused(rig: &Rig, config: &CommConfig) -> Error {
    let ctx = rig.context(0);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let before = rig.world.calls("ncclCommInitRankConfig");
    let e = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, config).unwrap_err();
    assert_eq!(rig.world.live().comms, 0, "{e}");
    assert_eq!(rig.world.calls("ncclCommInitRankConfig"), before, "{e}");
    e
}

#[test]
fn each_setter_reaches_its_own_field_and_no_other() {
    Rig::new(1).check(|rig| {
        for (field, set, want, get) in int_setters() {
            let config = set(CommConfig::new());
            assert_eq!(get(&config), Some(want), "getter of {field}");
            let (seen, kept) = seen_by_nccl(rig, &config);
            let seen =
                seen.unwrap_or_else(|| panic!("{field}: made without ncclCommInitRankConfig"));
            for (name, value) in ints(&seen.raw) {
                let expected = match name {
                    _ if name == field => want,
                    "maxCTAs" if field == "minCTAs" => 64,
                    "blocking" => 1, // always explicit on this path
                    _ => UNDEF,
                };
                assert_eq!(value, expected, "setting {field} left {name} = {value}");
            }
            assert_eq!((seen.net_name, seen.comm_name), (None, None), "{field}");
            assert_eq!(
                kept, config,
                "{field}: the communicator keeps its configuration"
            );
        }
        for (field, config) in [
            ("netName", CommConfig::new().net_name("Socket")),
            ("commName", CommConfig::new().comm_name("tp-0")),
        ] {
            let (seen, _) = seen_by_nccl(rig, &config);
            let seen = seen.unwrap();
            let names = (seen.net_name.as_deref(), seen.comm_name.as_deref());
            let expected = if field == "netName" {
                (Some("Socket"), None)
            } else {
                (None, Some("tp-0"))
            };
            assert_eq!(names, expected, "{field}");
            let set: Vec<_> = ints(&seen.raw)
                .into_iter()
                .filter(|&(n, v)| n != "blocking" && v != UNDEF)
                .collect();
            assert!(set.is_empty(), "setting {field} also set {set:?}");
        }
        assert_eq!(CommConfig::new().net_name("IB").get_net_name(), Some("IB"));
        assert_eq!(CommConfig::new().comm_name("x").get_comm_name(), Some("x"));
    });
}

#[test]
fn every_field_at_once_non_blocking() {
    Rig::new(1).check(|rig| {
        let mut config = CommConfig::non_blocking(Duration::from_secs(10))
            .net_name("IB")
            .comm_name("all");
        for (_, set, _, _) in int_setters() {
            config = set(config);
        }
        let (seen, kept) = seen_by_nccl(rig, &config);
        let seen = seen.unwrap();
        let mut expected: Vec<(&str, i32)> = vec![("blocking", 0)];
        expected.extend(int_setters().into_iter().map(|(f, _, v, _)| (f, v)));
        let mut got = ints(&seen.raw);
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected);
        assert_eq!(
            (seen.net_name.as_deref(), seen.comm_name.as_deref()),
            (Some("IB"), Some("all"))
        );
        assert_eq!((seen.raw.size, seen.raw.version), (120, 23203));
        assert!(!kept.is_blocking());
        assert_eq!(kept.get_timeout(), Duration::from_secs(10));
    });
}

#[test]
fn unset_fields_stay_unset() {
    Rig::new(1).check(|rig| {
        // Blocking with no NCCL field: plain ncclCommInitRank, no config at all.
        let (seen, kept) = seen_by_nccl(rig, &CommConfig::new());
        assert_eq!(seen, None);
        assert_eq!(rig.world.calls("ncclCommInitRankConfig"), 0);
        assert_eq!(kept, CommConfig::default());
        // Non-blocking alone: only `blocking` is set; both names NULL.
        let (seen, _) = seen_by_nccl(rig, &CommConfig::non_blocking(Duration::from_secs(5)));
        let seen = seen.unwrap();
        for (name, value) in ints(&seen.raw) {
            assert_eq!(value, if name == "blocking" { 0 } else { UNDEF }, "{name}");
        }
        assert_eq!((seen.net_name, seen.comm_name), (None, None));
        assert_eq!(rig.world.calls("ncclCommInitRankConfig"), 1);
    });
}

#[test]
fn a_field_newer_than_the_library_is_unsupported_and_nothing_is_created() {
    // (field, a setter of it): every field newer than the oldest supported NCCL. The
    // releases come from the pinned headers (nccl_sys::since): refused by the last
    // release read that lacks the field, passed to NCCL from the first that has it.
    let cases: [(&str, Set); 17] = [
        ("trafficClass", |c| c.traffic_class(1)),
        ("commName", |c| c.comm_name("n")),
        ("collnetEnable", |c| c.collnet(true)),
        ("CTAPolicy", |c| c.cta_policy(CtaPolicy::ZERO)),
        ("shrinkShare", |c| c.shrink_share(true)),
        ("nvlsCTAs", |c| c.nvls_ctas(2)),
        ("nChannelsPerNetPeer", |c| c.channels_per_net_peer(2)),
        ("nvlinkCentricSched", |c| c.nvlink_centric_sched(true)),
        ("graphUsageMode", |c| c.graph_usage_mode(2)),
        ("numRmaCtx", |c| c.rma_contexts(2)),
        ("maxP2pPeers", |c| c.max_p2p_peers(2)),
        ("graphStreamOrdering", |c| c.graph_stream_ordering(false)),
        ("launchOrderImplicit", |c| c.launch_order_implicit(true)),
        ("numRmaSig", |c| c.rma_signals(2)),
        ("rmaEagerInit", |c| c.rma_eager_init(true)),
        ("hostCftMode", |c| c.host_cft_mode(HostCftMode::ENABLE)),
        ("nvlsHostMode", |c| c.nvls_host_mode(NvlsHostMode::DISABLE)),
    ];
    let oldest = nccl_sys::since::RELEASES
        .iter()
        .find(|r| **r >= NcclVersion::MINIMUM)
        .unwrap();
    let newer: Vec<&str> = nccl_sys::CONFIG_FIELDS
        .iter()
        .filter(|f| f.since > *oldest)
        .map(|f| f.name)
        .collect();
    assert_eq!(cases.map(|(f, _)| f).to_vec(), newer);
    for (field, set) in cases {
        let since = nccl_sys::ConfigField::named(field).unwrap().since;
        let releases = nccl_sys::since::RELEASES;
        let before = releases[releases.iter().position(|r| *r == since).unwrap() - 1];
        let needed = since.to_string();
        let needed = needed.as_str();
        let rig = Rig::with_version(1, before);
        let e = refused(&rig, &set(CommConfig::new()));
        let Error::Unsupported {
            feature,
            needed: n,
            found,
        } = &e
        else {
            panic!("{field}: {e}")
        };
        assert_eq!(*feature, format!("ncclConfig_t.{field}"));
        assert_eq!(
            (n.as_str(), found.as_str()),
            (needed, before.to_string().as_str())
        );
        assert_eq!(
            e.to_string(),
            format!(
                "ncclConfig_t.{field} needs NCCL {needed} or newer; the loaded NCCL is {before}"
            )
        );
        rig.assert_clean();

        // At the release that introduced it, it reaches NCCL.
        let rig = Rig::with_version(1, since);
        let (seen, _) = seen_by_nccl(&rig, &set(CommConfig::new()));
        let seen = seen.unwrap();
        let is_set = ints(&seen.raw)
            .iter()
            .any(|&(n, v)| n == field && v != UNDEF)
            || (field == "commName" && seen.comm_name.is_some());
        assert!(is_set, "{field} did not reach NCCL {needed}");
        rig.assert_clean();
    }
}

#[test]
fn the_struct_version_is_lowered_to_the_library() {
    for ((a, b, c), code) in [
        ((2, 27, 3), 22703),
        ((2, 30, 7), 23007),
        ((2, 32, 3), 23203),
    ] {
        let rig = Rig::with_version(1, NcclVersion::new(a, b, c));
        let (seen, _) = seen_by_nccl(&rig, &CommConfig::new().nvls_ctas(6));
        let seen = seen.unwrap();
        assert_eq!(seen.raw.version, code);
        assert_eq!(seen.raw.nvlsCTAs, 6);
        rig.assert_clean();
    }
}

#[test]
fn names_with_a_nul_byte_and_values_beyond_int_are_invalid_arguments() {
    Rig::new(1).check(|rig| {
        let e = refused(rig, &CommConfig::new().net_name("IB\0x"));
        assert_eq!(
            e,
            Error::InvalidArgument {
                what: "ncclConfig_t.netName",
                problem: "\"IB\\0x\" has a NUL byte at 2".into()
            }
        );
        let e = refused(rig, &CommConfig::new().comm_name("\0"));
        assert_eq!(
            e,
            Error::InvalidArgument {
                what: "ncclConfig_t.commName",
                problem: "\"\\0\" has a NUL byte at 0".into()
            }
        );
        let e = refused(rig, &CommConfig::new().max_ctas(u32::MAX));
        assert_eq!(
            e,
            Error::InvalidArgument {
                what: "ncclConfig_t.maxCTAs",
                problem: "4294967295 does not fit NCCL's int".into()
            }
        );
        let e = refused(rig, &CommConfig::new().host_cft_mode(HostCftMode(UNDEF)));
        assert!(
            matches!(&e, Error::InvalidArgument { what: "ncclConfig_t.hostCftMode", problem } if problem.contains("NCCL_CONFIG_UNDEF_INT")),
            "{e}"
        );
    });
}

#[test]
fn splits_inherit_the_parent_config_or_take_their_own() {
    Rig::new(1).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let parent_config = CommConfig::new().max_ctas(9).comm_name("parent");
        let parent = Communicator::init_rank_with(&rig.nccl, &ctx, &id, 1, 0, &parent_config).unwrap();

        let inherited = parent.split(Some(0), 0).unwrap().unwrap();
        assert_eq!(inherited.config(), &parent_config);
        let seen = rig.world.config_of(inherited.as_raw()).unwrap();
        assert_eq!(
            (seen.raw.maxCTAs, seen.comm_name.as_deref()),
            (9, Some("parent"))
        );

        let own = CommConfig::new().min_ctas(2).max_ctas(4).comm_name("child");
        let child = parent.split_with(Some(0), 0, &own).unwrap().unwrap();
        assert_eq!(child.config(), &own);
        let seen = rig.world.config_of(child.as_raw()).unwrap();
        assert_eq!(
            (
                seen.raw.minCTAs,
                seen.raw.maxCTAs,
                seen.comm_name.as_deref()
            ),
            (2, 4, Some("child"))
        );

        // A child in the other blocking mode is refused before NCCL is called.
        let splits = rig.world.calls("ncclCommSplit");
        let e = parent
            .split_with(
                Some(0),
                0,
                &CommConfig::non_blocking(Duration::from_secs(1)),
            )
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what: "Communicator::split_with", problem } if problem.contains("non-blocking")),
            "{e}"
        );
        // So is a field the library does not have, and NUL in a name.
        let e = parent
            .split_with(Some(0), 0, &CommConfig::new().comm_name("a\0b"))
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    what: "ncclConfig_t.commName",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(rig.world.calls("ncclCommSplit"), splits);
        assert!(!parent.is_aborted());
        assert_eq!(rig.world.live().comms, 6);
        for c in [child, inherited, parent] {
            c.close().unwrap();
        }
    });
}

#[test]
fn split_with_a_field_newer_than_the_library_is_unsupported() {
    Rig::with_version(1, NcclVersion::new(2, 28, 3)).check(|rig| {
        let ctx = rig.context(0);
        let id = UniqueId::generate(&rig.nccl).unwrap();
        let parent = Communicator::init_rank(&rig.nccl, &ctx, &id, 1, 0).unwrap();
        let e = parent
            .split_with(Some(0), 0, &CommConfig::new().max_p2p_peers(4))
            .unwrap_err();
        assert_eq!(
            e,
            Error::Unsupported {
                feature: "ncclConfig_t.maxP2pPeers",
                needed: "2.30.3".into(),
                found: "2.28.3".into()
            }
        );
        assert_eq!(rig.world.calls("ncclCommSplit"), 1);
        assert_eq!(rig.world.live().comms, 2);
        parent.close().unwrap();
    });
}

/// NCCL's rule for CTA counts is checked before NCCL: at least 1 each, a minimum only
/// with a maximum, and not above it (NCCL compares a minimum with an unset maximum as
/// INT_MIN and refuses the config; seen on NCCL 2.28.9).
#[test]
fn cta_counts_follow_nccls_rule_before_nccl_sees_them() {
    Rig::new(1).check(|rig| {
        for (config, want) in [
            (
                CommConfig::new().min_ctas(32),
                "min_ctas(32) needs max_ctas too",
            ),
            (
                CommConfig::new().min_ctas(8).max_ctas(4),
                "min_ctas(8) is above max_ctas(4)",
            ),
            (
                CommConfig::new().min_ctas(0).max_ctas(4),
                "min_ctas must be at least 1",
            ),
            (CommConfig::new().max_ctas(0), "max_ctas must be at least 1"),
        ] {
            match refused(rig, &config) {
                Error::InvalidArgument {
                    what: "CommConfig",
                    problem,
                } => {
                    assert!(problem.starts_with(want), "{problem}")
                }
                other => panic!("{want}: {other:?}"),
            }
        }
        assert_eq!(rig.world.calls("ncclCommInitRankConfig"), 0);
        for config in [
            CommConfig::new().max_ctas(4),
            CommConfig::new().min_ctas(4).max_ctas(4),
        ] {
            let (seen, _) = seen_by_nccl(rig, &config);
            let seen = seen.unwrap();
            assert_eq!(seen.raw.maxCTAs, 4);
        }
    });
}

#[test]
fn combining_a_flag_already_set_keeps_it_set() {
    // A union, not a toggle: a flag given twice stays set.
    let p = CtaPolicy::EFFICIENCY | CtaPolicy::ZERO;
    assert_eq!(p | CtaPolicy::ZERO, CtaPolicy(3));
    assert_eq!(CtaPolicy::EFFICIENCY | CtaPolicy::EFFICIENCY, CtaPolicy(1));
    let m = NvlsHostMode::DISABLE_TRANSPORT | NvlsHostMode::DISABLE_SYMMETRIC_MULTIMEM;
    assert_eq!(m | NvlsHostMode::DISABLE_TRANSPORT, NvlsHostMode(3));
    assert_eq!(
        NvlsHostMode::DISABLE | NvlsHostMode::DISABLE_TRANSPORT,
        NvlsHostMode::DISABLE
    );
}
