//! Inputs once taken silently, and checks the rest of the suite did not pin: each test
//! names what it kills (a sign before a number or hex digit, an unbracketed IPv6 host, a
//! stream of another device or context, a length check loosened to "at least", a guard
//! whose drop no longer ends what it opened, a deadline ignored, a bound moved by one).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::common::{OneRank, Rig, on_one_rank};
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{CommConfig, Communicator, Error, Group, ReduceOp, UniqueId, World};
#[cfg(feature = "rendezvous")]
use nccl_channel::{PORT_BASE, Rendezvous};

#[cfg(feature = "rendezvous")]
use crate::common::lookup::derive;
use crate::common::lookup::{env, lookup};

fn env_error(variable: &str, value: &str, problem: &str) -> Error {
    Error::Env {
        variable: variable.into(),
        value: value.into(),
        problem: problem.into(),
    }
}

// ---- 1. unique ids: hex digits only ----

#[test]
fn a_unique_id_takes_hex_digits_only_not_a_sign() {
    let good = "ab".repeat(128);
    assert_eq!(UniqueId::from_str(&good).unwrap(), UniqueId([0xab; 128]));
    assert_eq!(
        UniqueId::from_str(&"AB".repeat(128)).unwrap(),
        UniqueId([0xab; 128])
    );
    for (bad, at) in [("+f", 10), ("-0", 0), ("+0", 254), (" f", 20)] {
        let mut text = good.clone();
        text.replace_range(at..at + 2, bad);
        assert_eq!(text.len(), 256);
        assert_eq!(
            UniqueId::from_str(&text).unwrap_err(),
            Error::UniqueId(format!(
                "{bad:?} at offset {at} is not two hex digits (0-9, a-f, A-F)"
            )),
            "{bad:?}"
        );
    }
}

// ---- 2. host:port ----

#[cfg(feature = "rendezvous")]
#[test]
fn an_unbracketed_ipv6_host_or_a_signed_port_is_refused_with_its_reason() {
    let cases = [
        (
            "a:b:c:8000",
            "the host \"a:b:c\" has colons: NCCL reads up to the first colon as the host, so \
             an IPv6 address must be in brackets ([addr]:port)",
        ),
        (
            "::1:8000",
            "the host \"::1\" has colons: NCCL reads up to the first colon as the host, so an \
             IPv6 address must be in brackets ([addr]:port)",
        ),
        (
            "1.2.3.4:+80",
            "the port \"+80\" is not a number from 1 to 65535 in decimal digits",
        ),
        (
            "1.2.3.4:0",
            "the port \"0\" is not a number from 1 to 65535 in decimal digits",
        ),
        (
            "1.2.3.4:65536",
            "the port \"65536\" is not a number from 1 to 65535 in decimal digits",
        ),
        (
            "1.2.3.4: 80",
            "the port \" 80\" is not a number from 1 to 65535 in decimal digits",
        ),
        ("[::1x]:80", "\"[::1x]\" is not an IPv6 address in brackets"),
        (":80", "the host is empty"),
    ];
    for (address, detail) in cases {
        assert_eq!(
            Rendezvous::tcp(address).unwrap_err(),
            Error::InvalidArgument {
                what: "Rendezvous address",
                problem: format!(
                    "{address:?} is not host:port with a port from 1 to 65535 (IPv6 addresses \
                     in brackets: [::1]:29500): {detail}"
                ),
            },
            "{address}"
        );
        // The launcher's variable says the same, as an environment error.
        let vars = [
            ("NCCL_CHANNEL_NPROCS", "2"),
            ("NCCL_CHANNEL_PROCID", "0"),
            ("NCCL_CHANNEL_RENDEZVOUS", address),
        ];
        assert_eq!(
            derive(&vars).unwrap_err(),
            env_error(
                "NCCL_CHANNEL_RENDEZVOUS",
                address,
                &format!(
                    "expected host:port with a port from 1 to 65535 (IPv6 in brackets: \
                     [::1]:29500): {detail}"
                )
            ),
            "{address}"
        );
    }
    // The ports at the bounds, and a bracketed IPv6 address, are taken.
    for (address, host, port) in [
        ("h:1", "h", 1),
        ("h:65535", "h", 65535),
        ("[::1]:8000", "::1", 8000),
        ("10.0.0.1:29500", "10.0.0.1", 29500),
    ] {
        let r = Rendezvous::tcp(address).unwrap();
        assert_eq!((r.host(), r.port()), (host, port), "{address}");
    }
}

#[cfg(feature = "rendezvous")]
#[test]
fn master_port_takes_decimal_digits_only() {
    // (Surrounding spaces are trimmed from every launcher variable before it is read.)
    for port in ["+80", "-80", "0", "65536", "8 0", "0x50"] {
        let vars = [
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", port),
        ];
        assert_eq!(
            derive(&vars).unwrap_err(),
            env_error("MASTER_PORT", port, "expected a port from 1 to 65535"),
            "{port:?}"
        );
    }
    for port in [1u16, 65535] {
        let text = port.to_string();
        let vars = [
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", text.as_str()),
        ];
        assert_eq!(derive(&vars).unwrap().unwrap().port(), port);
    }
}

// ---- 3. counts ----

#[test]
fn counts_with_a_sign_are_refused() {
    for (size_var, rank_var) in [
        ("NCCL_CHANNEL_NPROCS", "NCCL_CHANNEL_PROCID"),
        ("IREE_CUDA_NCCL_NPROCS", "IREE_CUDA_NCCL_PROCID"),
        ("WORLD_SIZE", "RANK"),
    ] {
        let e = env(&[(size_var, "+2"), (rank_var, "0")]);
        assert_eq!(
            World::from_lookup(lookup(&e)).unwrap_err(),
            env_error(size_var, "+2", "expected a non-negative integer"),
        );
        let e = env(&[(size_var, "2"), (rank_var, "+1")]);
        assert_eq!(
            World::from_lookup(lookup(&e)).unwrap_err(),
            env_error(rank_var, "+1", "expected a non-negative integer"),
        );
    }
}

#[cfg(feature = "rendezvous")]
#[test]
fn the_rendezvous_timeout_is_plain_decimal_seconds() {
    let base = [("NCCL_CHANNEL_NPROCS", "2"), ("NCCL_CHANNEL_PROCID", "0")];
    for text in ["+1", "1e2", "+0.5", "1 s", "-0.5"] {
        let mut vars = base.to_vec();
        vars.extend([
            ("NCCL_CHANNEL_RENDEZVOUS", "h:1"),
            ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", text),
        ]);
        assert_eq!(
            derive(&vars).unwrap_err(),
            env_error(
                "NCCL_CHANNEL_RENDEZVOUS_TIMEOUT",
                text,
                "expected a positive number of seconds"
            ),
            "{text:?}"
        );
    }
    let mut vars = base.to_vec();
    vars.extend([
        ("NCCL_CHANNEL_RENDEZVOUS", "h:1"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "0.5"),
    ]);
    assert_eq!(
        derive(&vars).unwrap().unwrap().get_timeout(),
        Duration::from_millis(500)
    );
}

/// A job id is a number only when it is digits: `+5` is hashed, not read as job 5.
#[cfg(feature = "rendezvous")]
#[test]
fn a_signed_slurm_job_id_is_not_read_as_a_number() {
    let port = |job: &str| {
        derive(&[
            ("SLURM_NTASKS", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_NODELIST", "node1"),
            ("SLURM_JOB_ID", job),
            ("SLURM_STEP_ID", "0"),
        ])
        .unwrap()
        .unwrap()
        .port()
    };
    assert_eq!(port("5"), PORT_BASE + 80);
    assert_ne!(port("+5"), PORT_BASE + 80);
}

// ---- 11. bounds of ranks ----

#[test]
fn a_rank_equal_to_the_size_is_refused_and_size_minus_one_taken() {
    let e = env(&[("NCCL_CHANNEL_NPROCS", "3"), ("NCCL_CHANNEL_PROCID", "3")]);
    assert_eq!(
        World::from_lookup(lookup(&e)).unwrap_err(),
        env_error(
            "NCCL_CHANNEL_PROCID",
            "3",
            "the rank must be below NCCL_CHANNEL_NPROCS=3"
        ),
    );
    let e = env(&[("NCCL_CHANNEL_NPROCS", "3"), ("NCCL_CHANNEL_PROCID", "2")]);
    let w = World::from_lookup(lookup(&e)).unwrap().unwrap();
    assert_eq!((w.rank, w.size), (2, 3));

    // A root or peer equal to the size is refused; size - 1 is taken.
    let rig = Rig::new(1);
    let (ctx, comm) = rig.one_rank(0);
    let s = Stream::new(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[1i32, 2]).unwrap();
    assert_eq!(
        comm.broadcast_in_place(&mut buf, 1, &s).unwrap_err(),
        Error::InvalidRank {
            what: "broadcast_in_place",
            rank: 1,
            size: 1
        }
    );
    assert_eq!(
        comm.reduce_in_place(&mut buf, ReduceOp::Sum, 1, &s)
            .unwrap_err(),
        Error::InvalidRank {
            what: "reduce_in_place",
            rank: 1,
            size: 1
        }
    );
    comm.broadcast_in_place(&mut buf, 0, &s).unwrap();
    comm.reduce_in_place(&mut buf, ReduceOp::Sum, 0, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(buf.to_vec().unwrap(), [1, 2]);
    drop((buf, s, comm, ctx));
    rig.assert_clean();
}

// ---- 4 and 5. streams and buffers of another device or context ----

#[test]
fn wait_refuses_a_stream_of_another_device() {
    Rig::new(2).check(|rig| {
        let (ctx0, comm) = rig.one_rank(0);
        let ctx1 = rig.context(1);
        let other = Stream::new(&ctx1).unwrap();
        let e = comm.wait(&other).unwrap_err();
        assert_eq!(
            e,
            Error::WrongDevice {
                what: "Communicator::wait",
                object: "stream",
                expected: 0,
                found: 1
            }
        );
        assert_eq!(
            e.to_string(),
            "Communicator::wait: the stream is on device 1, the communicator on device 0"
        );
        assert!(!comm.is_aborted(), "a refused wait aborts nothing");
        let own = Stream::new(&ctx0).unwrap();
        comm.wait(&own).unwrap();
    });
}

#[test]
fn a_stream_or_buffer_of_another_cuda_instance_names_the_context() {
    Rig::new(1).check(|rig| {
        let other = Rig::new(1);
        let (ctx, comm) = rig.one_rank(0);
        let foreign_ctx = other.cuda.device(0).unwrap().primary_context().unwrap();
        let foreign = Stream::new(&foreign_ctx).unwrap();
        let s = Stream::new(&ctx).unwrap();
        let a = DeviceBuffer::from_slice(&ctx, &[1.0f32; 4]).unwrap();
        let mut b = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
        let foreign_buf = DeviceBuffer::from_slice(&foreign_ctx, &[1.0f32; 4]).unwrap();

        let e = comm
            .all_reduce(&a, &mut b, ReduceOp::Sum, &foreign)
            .unwrap_err();
        assert_eq!(
            e,
            Error::WrongContext {
                what: "all_reduce",
                object: "stream",
                device: 0
            }
        );
        assert_eq!(
            e.to_string(),
            "all_reduce: the stream belongs to another CUDA context than the communicator's (both \
             are on device 0; another cuda_hal::Cuda instance?): use the communicator's context"
        );
        assert_eq!(
            comm.wait(&foreign).unwrap_err(),
            Error::WrongContext {
                what: "Communicator::wait",
                object: "stream",
                device: 0
            }
        );
        assert_eq!(
            comm.all_reduce(&foreign_buf, &mut b, ReduceOp::Sum, &s)
                .unwrap_err(),
            Error::WrongContext {
                what: "all_reduce",
                object: "send buffer",
                device: 0
            }
        );
        assert_eq!(
            comm.register(&foreign_buf).unwrap_err(),
            Error::WrongContext {
                what: "Communicator::register",
                object: "memory",
                device: 0
            }
        );
        drop((foreign_buf, a, b, s, foreign, foreign_ctx, comm, ctx));
        other.assert_clean();
    });
}

// ---- 6. the message of an in-place operation's buffer ----

#[test]
fn an_all_to_all_send_buffer_that_does_not_split_is_named_before_the_receive_buffer() {
    // 5 elements over 2 ranks, and a receive buffer sized from the bad split (2 * 2): the
    // send buffer's split is the error, not the receive buffer's length.
    Rig::new(2).check(|rig| {
        let errs = rig.run(2, |comm, s| {
            let ctx = s.context();
            let send = DeviceBuffer::<i32>::zeroed(ctx, 5).unwrap();
            let mut recv = DeviceBuffer::<i32>::zeroed(ctx, 4).unwrap();
            comm.all_to_all(&send, &mut recv, s)
                .unwrap_err()
                .to_string()
        });
        for e in errs {
            assert_eq!(
                e,
                "all_to_all: the send buffer holds 5 elements, not a multiple of the 2 ranks"
            );
        }
    });
}

#[test]
fn an_in_place_buffer_is_named_once() {
    Rig::new(2).check(|rig| {
        let errs = rig.run(2, |comm, s| {
            let ctx = s.context();
            let mut buf = DeviceBuffer::<i32>::zeroed(ctx, 5).unwrap();
            (
                comm.all_gather_in_place(&mut buf, s).unwrap_err(),
                comm.reduce_scatter_in_place(&mut buf, ReduceOp::Sum, s)
                    .unwrap_err(),
            )
        });
        for (gather, scatter) in errs {
            for (e, what) in [
                (gather, "all_gather_in_place"),
                (scatter, "reduce_scatter_in_place"),
            ] {
                assert_eq!(
                    e,
                    Error::InvalidArgument {
                        what,
                        problem: "the buffer holds 5 elements, not a multiple of the 2 ranks"
                            .into()
                    }
                );
                assert_eq!(
                    e.to_string(),
                    format!("{what}: the buffer holds 5 elements, not a multiple of the 2 ranks")
                );
            }
        }
        // The length message names an in-place buffer once too, and the others with their role.
        let e = Error::LengthMismatch {
            what: "op",
            buffer: "buffer",
            expected: 4,
            got: 5,
        };
        assert_eq!(
            e.to_string(),
            "op: the buffer must hold 4 elements, it holds 5"
        );
        let e = Error::LengthMismatch {
            what: "op",
            buffer: "recv",
            expected: 4,
            got: 5,
        };
        assert_eq!(
            e.to_string(),
            "op: the recv buffer must hold 4 elements, it holds 5"
        );
    });
}

// ---- 7. exact lengths, both sides of the boundary ----

fn mismatch(what: &'static str, buffer: &'static str, expected: usize, got: usize) -> Error {
    Error::LengthMismatch {
        what,
        buffer,
        expected,
        got,
    }
}

/// Every collective's contract is an exact length: one element short and one too many
/// are both refused, the exact length runs. Two ranks, so the multiples count.
#[test]
fn collective_lengths_are_exact_on_both_sides() {
    const N: usize = 2;
    const M: usize = 3;
    let rig = Rig::new(N);
    rig.run(N, |comm, s| {
        let ctx = s.context();
        let buf = |len: usize| DeviceBuffer::<i32>::zeroed(ctx, len).unwrap();
        let root = comm.rank() == 0;
        for delta in [-1isize, 1] {
            let off = |n: usize| n.checked_add_signed(delta).unwrap();
            // all_reduce: recv == send.
            assert_eq!(
                comm.all_reduce(&buf(M), &mut buf(off(M)), ReduceOp::Sum, s)
                    .unwrap_err(),
                mismatch("all_reduce", "recv", M, off(M))
            );
            // all_gather: recv == n * send.
            assert_eq!(
                comm.all_gather(&buf(M), &mut buf(off(N * M)), s)
                    .unwrap_err(),
                mismatch("all_gather", "recv", N * M, off(N * M))
            );
            // reduce_scatter: send == n * recv.
            assert_eq!(
                comm.reduce_scatter(&buf(off(N * M)), &mut buf(M), ReduceOp::Sum, s)
                    .unwrap_err(),
                mismatch("reduce_scatter", "send", N * M, off(N * M))
            );
            // all_to_all: recv == send.
            assert_eq!(
                comm.all_to_all(&buf(N * M), &mut buf(off(N * M)), s)
                    .unwrap_err(),
                mismatch("all_to_all", "recv", N * M, off(N * M))
            );
            if root {
                // broadcast: the root's send == recv.
                let send = buf(off(M));
                assert_eq!(
                    comm.broadcast(Some(send.as_view()), &mut buf(M), 0, s)
                        .unwrap_err(),
                    mismatch("broadcast", "send", M, off(M))
                );
                // reduce: the root's recv == send.
                let mut recv = buf(off(M));
                assert_eq!(
                    comm.reduce(&buf(M), Some(recv.as_view_mut()), ReduceOp::Sum, 0, s)
                        .unwrap_err(),
                    mismatch("reduce", "recv", M, off(M))
                );
                // gather: the root's recv == n * send.
                let mut recv = buf(off(N * M));
                assert_eq!(
                    comm.gather(&buf(M), Some(recv.as_view_mut()), 0, s)
                        .unwrap_err(),
                    mismatch("gather", "recv", N * M, off(N * M))
                );
                // scatter: the root's send == n * recv.
                let send = buf(off(N * M));
                assert_eq!(
                    comm.scatter(Some(send.as_view()), &mut buf(M), 0, s)
                        .unwrap_err(),
                    mismatch("scatter", "send", N * M, off(N * M))
                );
            }
        }
        // The exact lengths run (every rank calls every collective, in the same order).
        comm.all_reduce(&buf(M), &mut buf(M), ReduceOp::Sum, s)
            .unwrap();
        comm.all_gather(&buf(M), &mut buf(N * M), s).unwrap();
        comm.reduce_scatter(&buf(N * M), &mut buf(M), ReduceOp::Sum, s)
            .unwrap();
        comm.all_to_all(&buf(N * M), &mut buf(N * M), s).unwrap();
        let send = buf(M);
        comm.broadcast(root.then(|| send.as_view()), &mut buf(M), 0, s)
            .unwrap();
        let mut recv = buf(M);
        comm.reduce(
            &buf(M),
            root.then(|| recv.as_view_mut()),
            ReduceOp::Sum,
            0,
            s,
        )
        .unwrap();
        let mut recv = buf(N * M);
        comm.gather(&buf(M), root.then(|| recv.as_view_mut()), 0, s)
            .unwrap();
        let send = buf(N * M);
        comm.scatter(root.then(|| send.as_view()), &mut buf(M), 0, s)
            .unwrap();
        s.synchronize().unwrap();
    });
    rig.assert_clean();
}

// ---- 8. a group ends when its guard drops ----

fn grouped_then_fails(rig: &Rig, comm: &Communicator, s: &Stream) -> Result<(), Error> {
    let _g = Group::start(&rig.nccl)?;
    let ctx = s.context();
    let a = DeviceBuffer::from_slice(ctx, &[3i32]).unwrap();
    let mut b = DeviceBuffer::<i32>::zeroed(ctx, 2).unwrap();
    // Fails: the guard's drop must end the group on this early return.
    comm.all_reduce(&a, &mut b, ReduceOp::Sum, s)?;
    unreachable!("the lengths differ")
}

#[test]
fn dropping_a_group_ends_it_also_on_an_early_return() {
    on_one_rank(1, |rig, OneRank { ctx, comm, s }| {
        let ends = rig.world.calls("ncclGroupEnd");
        {
            let _g = Group::start(&rig.nccl).unwrap();
        }
        assert_eq!(rig.world.calls("ncclGroupEnd"), ends + 1, "dropped: ended");
        assert_eq!(
            grouped_then_fails(rig, &comm, &s).unwrap_err(),
            mismatch("all_reduce", "recv", 1, 2)
        );
        assert_eq!(
            rig.world.calls("ncclGroupEnd"),
            ends + 2,
            "early return: ended"
        );
        // No group is left open: an all-reduce now runs at once, not at some later end.
        let a = DeviceBuffer::from_slice(&ctx, &[7i32]).unwrap();
        let mut b = DeviceBuffer::<i32>::zeroed(&ctx, 1).unwrap();
        comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [7]);
        // NCCL has no group open to end any more: one more end is an error.
        // SAFETY: ncclGroupEnd has no preconditions; with no group open it returns an error.
        let rc = unsafe { (rig.nccl.fns().ncclGroupEnd)() };
        assert_ne!(rc, nccl_sys::ncclResult_t::ncclSuccess);
    });
}

// ---- 10. deadlines ----

/// A non-blocking collective whose peer never joins (alive, not failed) ends at the
/// communicator's deadline with a timeout, not at the simulated NCCL's own (20 s).
/// (`Communicator::wait`'s own deadline cannot be reached on the simulation: its streams
/// run work at enqueue, and a non-blocking call waits for its work itself.)
#[test]
fn a_collective_whose_peer_never_joins_ends_at_the_deadline() {
    const DEADLINE: Duration = Duration::from_millis(500);
    let rig = Rig::new(2);
    let id = UniqueId::generate(&rig.nccl).unwrap();
    let config = CommConfig::non_blocking(DEADLINE);
    let (release, parked) = std::sync::mpsc::channel::<()>();
    let (e, took, aborted) = std::thread::scope(|sc| {
        let (rig, id, config) = (&rig, &id, &config);
        let peer = sc.spawn(move || {
            let ctx = rig.context(1);
            let comm = Communicator::init_rank_with(&rig.nccl, &ctx, id, 2, 1, config).unwrap();
            // Alive, but never joins the all-reduce, until rank 0's call is over (also
            // released when rank 0 fails: the sender is dropped). Leaves after 10 s in any
            // case, so that a deadline ignored fails the test (NCCL's error, not a
            // timeout) instead of hanging it.
            let _ = parked.recv_timeout(Duration::from_secs(10));
            comm.abort().unwrap();
        });
        let release = release;
        let ctx = rig.context(0);
        let comm = Communicator::init_rank_with(&rig.nccl, &ctx, id, 2, 0, config).unwrap();
        let s = Stream::new(&ctx).unwrap();
        let a = DeviceBuffer::from_slice(&ctx, &[1.0f32; 4]).unwrap();
        let mut b = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
        let t = Instant::now();
        let e = comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s).unwrap_err();
        let took = t.elapsed();
        let aborted = comm.is_aborted();
        release.send(()).unwrap();
        peer.join().unwrap();
        (e, took, aborted)
    });
    assert_eq!(
        e,
        Error::Timeout {
            what: "ncclAllReduce".into(),
            after: DEADLINE
        }
    );
    assert!(aborted, "a call past its deadline aborts the communicator");
    assert!(
        took < Duration::from_secs(15),
        "did not wait for NCCL's own: {took:?}"
    );
    rig.assert_clean();
}
