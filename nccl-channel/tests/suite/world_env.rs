//! World size and rank from every supported launcher's variables, precedence, and every
//! malformed or contradictory value.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::type_complexity
)]

use nccl_channel::{ENV_FAMILIES, Error, World};

fn world(vars: &[(&str, &str)]) -> Result<Option<World>, Error> {
    World::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    })
}

#[test]
fn every_launcher_is_read() {
    let cases: &[(&[(&str, &str)], (usize, usize, Option<usize>, &str))] = &[
        (
            &[
                ("NCCL_CHANNEL_NPROCS", "4"),
                ("NCCL_CHANNEL_PROCID", "3"),
                ("NCCL_CHANNEL_LOCAL_PROCID", "1"),
            ],
            (4, 3, Some(1), "nccl-channel"),
        ),
        (
            &[
                ("IREE_CUDA_NCCL_NPROCS", "2"),
                ("IREE_CUDA_NCCL_PROCID", "1"),
            ],
            (2, 1, None, "IREE"),
        ),
        (
            &[("WORLD_SIZE", "8"), ("RANK", "5"), ("LOCAL_RANK", "1")],
            (8, 5, Some(1), "torchrun"),
        ),
        (
            &[
                ("OMPI_COMM_WORLD_SIZE", "3"),
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ],
            (3, 2, Some(0), "Open MPI"),
        ),
        (&[("PMI_SIZE", "2"), ("PMI_RANK", "0")], (2, 0, None, "PMI")),
        (
            &[
                ("SLURM_NTASKS", "16"),
                ("SLURM_PROCID", "9"),
                ("SLURM_LOCALID", "1"),
            ],
            (16, 9, Some(1), "Slurm"),
        ),
    ];
    for (vars, (size, rank, local, source)) in cases {
        let w = world(vars).unwrap().unwrap();
        assert_eq!(
            (w.size, w.rank, w.local_rank, w.source),
            (*size, *rank, *local, *source),
            "{vars:?}"
        );
    }
    assert_eq!(ENV_FAMILIES.len(), cases.len());
}

#[test]
fn the_device_defaults_to_the_local_rank() {
    let w = world(&[("WORLD_SIZE", "8"), ("RANK", "5"), ("LOCAL_RANK", "1")])
        .unwrap()
        .unwrap();
    assert_eq!(w.default_device(), 1);
    let w = world(&[
        ("IREE_CUDA_NCCL_NPROCS", "2"),
        ("IREE_CUDA_NCCL_PROCID", "1"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(w.default_device(), 1);
}

#[test]
fn precedence_follows_the_documented_order() {
    // Ours over IREE over torchrun over Open MPI over PMI over Slurm; a lower family that
    // disagrees is not read (torchrun under Slurm legitimately disagrees with it).
    let all = [
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "1"),
        ("PMI_SIZE", "3"),
        ("PMI_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("WORLD_SIZE", "5"),
        ("RANK", "4"),
        ("IREE_CUDA_NCCL_NPROCS", "6"),
        ("IREE_CUDA_NCCL_PROCID", "5"),
        ("NCCL_CHANNEL_NPROCS", "7"),
        ("NCCL_CHANNEL_PROCID", "6"),
    ];
    for k in 0..6 {
        let vars = &all[..all.len() - 2 * k];
        let w = world(vars).unwrap().unwrap();
        assert_eq!(w.size, 7 - k, "{vars:?}");
    }
}

#[test]
fn no_world_means_no_channel() {
    assert_eq!(world(&[]).unwrap(), None);
    assert_eq!(world(&[("IREE_CUDA_NCCL_NPROCS", "0")]).unwrap(), None);
    assert_eq!(world(&[("NCCL_CHANNEL_NPROCS", " ")]).unwrap(), None);
    // RANK alone (set by many tools) does not make a world.
    assert_eq!(world(&[("RANK", "3")]).unwrap(), None);
}

#[test]
fn malformed_and_contradictory_values_name_the_variable_and_value() {
    let cases: &[(&[(&str, &str)], &str, &str, &str)] = &[
        (
            &[
                ("IREE_CUDA_NCCL_NPROCS", "two"),
                ("IREE_CUDA_NCCL_PROCID", "0"),
            ],
            "IREE_CUDA_NCCL_NPROCS",
            "two",
            "non-negative integer",
        ),
        (
            &[("IREE_CUDA_NCCL_NPROCS", "-1")],
            "IREE_CUDA_NCCL_NPROCS",
            "-1",
            "non-negative integer",
        ),
        (
            &[
                ("IREE_CUDA_NCCL_NPROCS", "2"),
                ("IREE_CUDA_NCCL_PROCID", "2"),
            ],
            "IREE_CUDA_NCCL_PROCID",
            "2",
            "below IREE_CUDA_NCCL_NPROCS=2",
        ),
        (
            &[("IREE_CUDA_NCCL_NPROCS", "2")],
            "IREE_CUDA_NCCL_NPROCS",
            "2",
            "IREE_CUDA_NCCL_PROCID is not",
        ),
        (
            &[("IREE_CUDA_NCCL_PROCID", "1")],
            "IREE_CUDA_NCCL_PROCID",
            "1",
            "IREE_CUDA_NCCL_NPROCS is not",
        ),
        (
            &[("NCCL_CHANNEL_PROCID", "0")],
            "NCCL_CHANNEL_PROCID",
            "0",
            "NCCL_CHANNEL_NPROCS is not",
        ),
        (
            &[("WORLD_SIZE", "2"), ("RANK", "x")],
            "RANK",
            "x",
            "non-negative integer",
        ),
        (
            &[("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1.5")],
            "LOCAL_RANK",
            "1.5",
            "non-negative integer",
        ),
        (
            &[
                ("SLURM_NTASKS", "99999999999999999999999"),
                ("SLURM_PROCID", "0"),
            ],
            "SLURM_NTASKS",
            "99999999999999999999999",
            "non-negative integer",
        ),
    ];
    for (vars, var, value, needle) in cases {
        let e = world(vars).unwrap_err();
        let Error::Env {
            variable,
            value: v,
            problem,
        } = &e
        else {
            panic!("{vars:?}: {e}")
        };
        assert_eq!((variable.as_str(), v.as_str()), (*var, *value), "{vars:?}");
        assert!(
            problem.contains(needle) || e.to_string().contains(needle),
            "{vars:?}: {e}"
        );
    }
}

#[test]
fn worlds_from_code_are_checked() {
    assert!(matches!(
        World::new(0, 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        World::new(2, 2),
        Err(Error::InvalidRank {
            rank: 2,
            size: 2,
            ..
        })
    ));
    let w = World::new(4, 1).unwrap().with_local_rank(0);
    assert_eq!(
        (w.size, w.rank, w.default_device(), w.source),
        (4, 1, 0, "code")
    );
}
