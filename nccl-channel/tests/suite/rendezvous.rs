//! Rendezvous: three ranks (threads) agree on rank 0's id under torchrun (agent TCPStore
//! and not), Slurm, Open MPI and MPICH-style environments read through `from_lookup`, then
//! prove the id by an all-gather on the mock; every failure (rank 0 missing, a foreign
//! server, a size mismatch, garbage peers) is a typed error naming the address; the
//! derivation rule's table, precedence and port formula.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::type_complexity
)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::tcpstore::{Faults, TestStore};
use crate::common::{Rig, all_gather_and_close, on_threads, two_ranks_without_a_shared_id};
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, IdSource, Rendezvous, RendezvousKind, UniqueId, World};

use crate::common::lookup::{Env, derive, env, lookup};

/// A port free on 127.0.0.1 now, in the derived range (so Slurm ids can name it). Each
/// process starts at a place of its own (its pid and the time) and strides by 997, so
/// that copies of this test run at once rarely try the same ports.
fn free_port_in_range() -> u16 {
    static NEXT: Mutex<u16> = Mutex::new(0);
    let mut next = NEXT.lock().unwrap();
    if *next == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let seed = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9) ^ u64::from(nanos);
        *next = 20000 + (seed % 11990) as u16;
    }
    loop {
        let p = *next;
        *next = 20000 + (p - 20000 + 997) % 11990;
        if TcpListener::bind(("127.0.0.1", p)).is_ok() && TcpListener::bind(("0.0.0.0", p)).is_ok()
        {
            return p;
        }
    }
}

/// Slurm job and step ids whose derived port is `port`.
fn slurm_ids(port: u16) -> (String, String) {
    let n = u64::from(port - 20000);
    ((n / 16).to_string(), (n % 16).to_string())
}

/// Runs `n` ranks as threads: each reads its environment, derives its rendezvous (checked
/// by `check`), agrees on an id (rank 0's from the mock's ncclGetUniqueId), then inits a
/// communicator with it and all-gathers. Returns every rank's id and rank 0's generated one.
fn run_ranks(
    n: usize,
    env_of: impl Fn(usize) -> Env + Sync,
    check: impl Fn(&Rendezvous) + Sync,
) -> (Vec<UniqueId>, UniqueId) {
    let rig = Rig::new(n);
    let made: Mutex<Vec<UniqueId>> = Mutex::new(Vec::new());
    let ids: Vec<UniqueId> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (rig, made, env_of, check) = (&rig, &made, &env_of, &check);
                s.spawn(move || {
                    let e = env_of(rank);
                    let world = World::from_lookup(lookup(&e)).unwrap().unwrap();
                    assert_eq!((world.size, world.rank), (n, rank));
                    let rdv = Rendezvous::from_lookup(&world, lookup(&e))
                        .unwrap()
                        .unwrap();
                    check(&rdv);
                    let id = rdv
                        .exchange_with(rank, n, || {
                            let id = UniqueId::generate(&rig.nccl)?;
                            made.lock().unwrap().push(id);
                            Ok(id)
                        })
                        .unwrap();
                    let ctx = rig.context(rank);
                    let comm = Communicator::init_rank(&rig.nccl, &ctx, &id, n, rank).unwrap();
                    let stream = Stream::new(&ctx).unwrap();
                    let send = DeviceBuffer::from_slice(
                        &ctx,
                        &[rank as i32 * 10 + 1, rank as i32 * 10 + 2],
                    )
                    .unwrap();
                    let mut recv = DeviceBuffer::<i32>::alloc(&ctx, 2 * n).unwrap();
                    comm.all_gather(&send, &mut recv, &stream).unwrap();
                    stream.synchronize().unwrap();
                    let want: Vec<i32> = (0..n as i32)
                        .flat_map(|r| [r * 10 + 1, r * 10 + 2])
                        .collect();
                    assert_eq!(recv.to_vec().unwrap(), want, "rank {rank}");
                    drop((send, recv, stream));
                    comm.close().unwrap();
                    id
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made = made.into_inner().unwrap();
    assert_eq!(made.len(), 1, "rank 0 makes exactly one id");
    rig.assert_clean();
    (ids, made[0])
}

/// Every rank's exchange gave `id`.
fn assert_every_rank_took(ids: &[nccl_channel::Result<UniqueId>], id: UniqueId) {
    for (rank, got) in ids.iter().enumerate() {
        assert_eq!(got.as_ref().ok(), Some(&id), "rank {rank}: {got:?}");
    }
}

fn assert_all_equal(ids: &[UniqueId], made: UniqueId) {
    assert!(ids.iter().all(|id| *id == made), "{ids:?} vs {made:?}");
    assert_ne!(made, UniqueId([0; 128]));
}

/// A rank outside the world, or an empty world, is refused before anything connects or
/// listens (port 1: nothing is there, so an attempt would show as a rendezvous error).
#[test]
fn an_exchange_for_a_rank_outside_its_world_is_refused() {
    let short = Duration::from_millis(200);
    for kind in [
        Rendezvous::tcp("127.0.0.1:1").unwrap().timeout(short),
        Rendezvous::torch_store("127.0.0.1:1")
            .unwrap()
            .timeout(short),
    ] {
        for (rank, size) in [(2, 2), (5, 2), (1, 1), (0, 0)] {
            assert_eq!(
                kind.exchange_with(rank, size, || unreachable!()),
                Err(Error::InvalidRank {
                    what: "Rendezvous::exchange",
                    rank,
                    size
                }),
                "{:?}",
                kind.kind()
            );
        }
    }
}

#[test]
fn torchrun_with_the_agent_store_goes_through_its_tcpstore() {
    let store = TestStore::start();
    let port = store.port.to_string();
    let (ids, made) = run_ranks(
        3,
        |rank| {
            let r = rank.to_string();
            env(&[
                ("WORLD_SIZE", "3"),
                ("RANK", &r),
                ("LOCAL_RANK", &r),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", &port),
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                ("TORCHELASTIC_RUN_ID", "run42"),
                ("TORCHELASTIC_RESTART_COUNT", "1"),
                ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20"),
            ])
        },
        |rdv| {
            assert_eq!(rdv.kind(), RendezvousKind::TorchStore);
            assert_eq!(rdv.address(), format!("127.0.0.1:{port}"));
            assert_eq!(
                rdv.derived_from(),
                "MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE"
            );
            assert_eq!(rdv.get_key(), "torchrun-run42-attempt_1");
            assert_eq!(rdv.get_timeout(), Duration::from_secs(20));
        },
    );
    assert_all_equal(&ids, made);
    let key = "/nccl-channel/torchrun-run42-attempt_1#0";
    let log = store.log();
    // Every connection validates, then checks a key (no PING: torch <= 2.4 has none),
    // before anything else.
    assert_eq!(
        log.iter().filter(|q| *q == "VALIDATE").count(),
        3,
        "{log:?}"
    );
    assert_eq!(
        log.iter().filter(|q| *q == "CHECK /nccl-channel").count(),
        3,
        "{log:?}"
    );
    assert!(!log.iter().any(|q| q == "refused"), "{log:?}");
    assert!(log.iter().any(|q| q == &format!("SET {key}")), "{log:?}");
    assert_eq!(
        log.iter().filter(|q| *q == &format!("GET {key}")).count(),
        2
    );
    // Before storing the id, rank 0 removed what an earlier exchange under the key could
    // have left; once every rank took the id, it removed it and the acks.
    let deleted: Vec<&String> = log.iter().filter(|q| q.starts_with("DELETE ")).collect();
    let each = [
        format!("DELETE {key}"),
        format!("DELETE {key}/ack/1"),
        format!("DELETE {key}/ack/2"),
    ];
    assert_eq!(
        deleted,
        each.iter().chain(&each).collect::<Vec<_>>(),
        "{log:?}"
    );
    let set = log.iter().position(|q| q == &format!("SET {key}")).unwrap();
    assert!(
        log[..set]
            .iter()
            .filter(|q| q.starts_with("DELETE "))
            .count()
            == 3,
        "{log:?}"
    );
    // Rank 0 read both acks to compare their nonce with its own.
    for r in 1..3 {
        assert!(log.contains(&format!("GET {key}/ack/{r}")), "{log:?}");
    }
    assert_eq!(store.keys(), Vec::<String>::new());
    assert_eq!(store.keys(), Vec::<String>::new());
}

#[test]
fn torchrun_without_the_agent_store_has_rank_0_serve_at_master_addr() {
    let port = free_port_in_range().to_string();
    let (ids, made) = run_ranks(
        3,
        |rank| {
            let r = rank.to_string();
            env(&[
                ("WORLD_SIZE", "3"),
                ("RANK", &r),
                ("LOCAL_RANK", &r),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", &port),
                ("TORCHELASTIC_USE_AGENT_STORE", "False"),
                ("TORCHELASTIC_RUN_ID", "none"),
                ("TORCHELASTIC_RESTART_COUNT", "0"),
                ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20"),
            ])
        },
        |rdv| {
            assert_eq!(rdv.kind(), RendezvousKind::RankZero);
            assert_eq!(rdv.address(), format!("127.0.0.1:{port}"));
            assert_eq!(rdv.derived_from(), "MASTER_ADDR, MASTER_PORT");
            assert_eq!(rdv.get_key(), "torchrun-none-attempt_0");
        },
    );
    assert_all_equal(&ids, made);
}

#[test]
fn slurm_ranks_meet_on_the_first_node_at_the_job_port() {
    let port = free_port_in_range();
    let (job, step) = slurm_ids(port);
    let (ids, made) = run_ranks(
        3,
        |rank| {
            let r = rank.to_string();
            env(&[
                ("SLURM_NTASKS", "3"),
                ("SLURM_PROCID", &r),
                ("SLURM_LOCALID", &r),
                ("SLURM_JOB_NODELIST", "localhost"),
                ("SLURM_JOB_ID", &job),
                ("SLURM_STEP_ID", &step),
                ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20"),
            ])
        },
        |rdv| {
            assert_eq!(rdv.kind(), RendezvousKind::RankZero);
            assert_eq!(rdv.address(), format!("localhost:{port}"));
            assert_eq!(
                rdv.derived_from(),
                "SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID"
            );
            assert_eq!(rdv.get_key(), format!("slurm-{job}.{step}"));
        },
    );
    assert_all_equal(&ids, made);
}

#[test]
fn slurm_with_a_compressed_loopback_node_list() {
    let port = free_port_in_range();
    let (job, step) = slurm_ids(port);
    let (ids, made) = run_ranks(
        3,
        |rank| {
            let r = rank.to_string();
            env(&[
                ("SLURM_NTASKS", "3"),
                ("SLURM_PROCID", &r),
                ("SLURM_STEP_NODELIST", "127.0.0.[1-2]"),
                ("SLURM_JOB_NODELIST", "elsewhere[1-4]"),
                ("SLURM_JOB_ID", &job),
                ("SLURM_STEP_ID", &step),
                ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20"),
            ])
        },
        |rdv| {
            assert_eq!(rdv.address(), format!("127.0.0.1:{port}"));
            assert_eq!(
                rdv.derived_from(),
                "SLURM_STEP_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID"
            );
        },
    );
    assert_all_equal(&ids, made);
}

#[test]
fn open_mpi_on_one_node_meets_on_loopback_at_the_job_port() {
    let port = free_port_in_range();
    let jobid = (u64::from(port - 20000) + 12000 * 7).to_string();
    let (ids, made) = run_ranks(
        3,
        |rank| {
            let r = rank.to_string();
            env(&[
                ("OMPI_COMM_WORLD_SIZE", "3"),
                ("OMPI_COMM_WORLD_RANK", &r),
                ("OMPI_COMM_WORLD_LOCAL_RANK", &r),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
                ("OMPI_MCA_ess_base_jobid", &jobid),
                ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20"),
            ])
        },
        |rdv| {
            assert_eq!(rdv.address(), format!("127.0.0.1:{port}"));
            assert_eq!(
                rdv.derived_from(),
                "OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE, OMPI_MCA_ess_base_jobid"
            );
            assert_eq!(rdv.get_key(), format!("ompi-{jobid}"));
        },
    );
    assert_all_equal(&ids, made);
}

#[test]
fn pmi_on_one_node_meets_on_loopback_at_the_proxy_port() {
    let port = 20000 + (std::os::unix::process::parent_id() % 12000) as u16;
    let (ids, made) = run_ranks(
        3,
        |rank| {
            let r = rank.to_string();
            env(&[
                ("PMI_SIZE", "3"),
                ("PMI_RANK", &r),
                ("MPI_LOCALNRANKS", "3"),
                ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "20"),
            ])
        },
        |rdv| {
            assert_eq!(rdv.address(), format!("127.0.0.1:{port}"));
            assert_eq!(
                rdv.derived_from(),
                "MPI_LOCALNRANKS, PMI_SIZE, the parent process id"
            );
            assert_eq!(
                rdv.get_key(),
                format!("pmi-{}", std::os::unix::process::parent_id())
            );
        },
    );
    assert_all_equal(&ids, made);
}

#[test]
fn consecutive_exchanges_get_their_own_keys() {
    let port = free_port_in_range();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .key("twice")
        .timeout(Duration::from_secs(20));
    for round in 0u8..3 {
        let ids: Vec<UniqueId> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let rdv = &rdv;
                    s.spawn(move || rdv.exchange_with(rank, 3, || Ok(UniqueId([round + 1; 128]))))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        assert_eq!(ids, vec![UniqueId([round + 1; 128]); 3], "round {round}");
    }
}

#[test]
fn rank_0_never_coming_is_a_rendezvous_error_naming_the_address_and_derivation() {
    let port = free_port_in_range();
    let (job, step) = slurm_ids(port);
    let e = env(&[
        ("SLURM_NTASKS", "3"),
        ("SLURM_PROCID", "2"),
        ("SLURM_JOB_NODELIST", "127.0.0.1"),
        ("SLURM_JOB_ID", &job),
        ("SLURM_STEP_ID", &step),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "0.5"),
    ]);
    let world = World::from_lookup(lookup(&e)).unwrap().unwrap();
    let rdv = Rendezvous::from_lookup(&world, lookup(&e))
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let err = rdv
        .exchange_with(2, 3, || panic!("only rank 0 makes the id"))
        .unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let Error::Rendezvous {
        service,
        address,
        derived_from,
        problem,
        source,
    } = &err
    else {
        panic!("{err:?}")
    };
    // A deadline over several attempts: no one OS error is the cause.
    assert_eq!(*source, None);
    assert_eq!(*service, "rank 0's rendezvous");
    assert_eq!(*address, format!("127.0.0.1:{port}"));
    assert_eq!(
        derived_from,
        "SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID"
    );
    assert!(
        problem.starts_with("did not answer within 500ms (last attempt: "),
        "{problem}"
    );
    assert!(problem.contains("refused"), "{problem}");
    assert!(
        err.to_string().starts_with(&format!(
            "rank 0's rendezvous at 127.0.0.1:{port} (derived from SLURM_JOB_NODELIST, \
             SLURM_JOB_ID, SLURM_STEP_ID) did not answer within 500ms"
        )),
        "{err}"
    );
}

#[test]
fn rank_0_reports_the_ranks_that_never_came() {
    let port = free_port_in_range();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_millis(600));
    let (r0, r2) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 4, || Ok(UniqueId([3; 128]))));
        let r2 = s.spawn(|| rdv.exchange_with(2, 4, || unreachable!()));
        (r0.join().unwrap(), r2.join().unwrap())
    });
    assert_eq!(r2.unwrap(), UniqueId([3; 128]));
    let err = r0.unwrap_err();
    assert!(matches!(err, Error::Rendezvous { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "rank 0's rendezvous at 127.0.0.1:{port} (derived from code) did not hear from \
             ranks 1, 3 within 600ms"
        )
    );
}

#[test]
fn a_foreign_server_is_waited_out_then_named() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let theirs = Rendezvous::tcp(&addr)
        .unwrap()
        .key("other-job")
        .timeout(Duration::from_secs(3));
    let mine = Rendezvous::tcp(&addr)
        .unwrap()
        .key("my-job")
        .timeout(Duration::from_secs(1));
    let (their_result, my_result, took) = std::thread::scope(|s| {
        let server = s.spawn(|| theirs.exchange_with(0, 2, || Ok(UniqueId([9; 128]))));
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let mine = mine.exchange_with(1, 2, || unreachable!());
        let took = start.elapsed();
        (server.join().unwrap(), mine, took)
    });
    // The client kept trying until its deadline, then said what answered.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    let err = my_result.unwrap_err();
    assert!(matches!(err, Error::Rendezvous { .. }), "{err:?}");
    // Every attempt after the first met the foreign server: the last one is its answer.
    assert_eq!(
        err.to_string(),
        format!(
            "rank 0's rendezvous at {addr} (derived from code) did not answer within 1s (last \
             attempt: a rendezvous for key other-job#0 answered, not my-job#0 (another job, or \
             an earlier channel still serving))"
        )
    );
    // The foreign server never served its own rank 1, and saw who knocked.
    let err = their_result.unwrap_err().to_string();
    assert!(err.contains("did not hear from rank 1 within 3s"), "{err}");
    assert!(err.contains("asked for key my-job#0"), "{err}");
}

/// The rank with the other world size fails at once; rank 0 goes on serving (one line
/// from anyone must not stop it) and at its deadline names the sizes it saw.
#[test]
fn a_size_mismatch_fails_the_client_at_once_and_rank_0_names_it_at_its_deadline() {
    let port = free_port_in_range();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(2));
    let start = Instant::now();
    let (r0, r1, r1_took) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 3, || Ok(UniqueId([1; 128]))));
        let r1 = s.spawn(|| {
            let r = rdv.exchange_with(1, 4, || unreachable!());
            (r, start.elapsed())
        });
        let (r1, took) = r1.join().unwrap();
        (r0.join().unwrap(), r1, took)
    });
    assert!(r1_took < Duration::from_millis(1500), "{r1_took:?}");
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let e1 = r1.unwrap_err();
    assert!(matches!(e1, Error::Rendezvous { .. }), "{e1:?}");
    assert_eq!(
        e1.to_string(),
        format!(
            "rank 0's rendezvous at 127.0.0.1:{port} (derived from code) serves a world of 3 \
             ranks, but rank 1 has a world of 4; every rank must see the same world size"
        )
    );
    let e0 = r0.unwrap_err();
    assert_eq!(
        e0.to_string(),
        format!(
            "rank 0's rendezvous at 127.0.0.1:{port} (derived from code) did not hear from \
             ranks 1, 2 within 2s; 1 greeting with another world size than rank 0's 3 (rank 1 \
             of 4): every rank must see the same world size"
        )
    );
}

#[test]
fn garbage_peers_are_ignored_and_the_real_ranks_served() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .timeout(Duration::from_secs(20));
    let start = Instant::now();
    let ids = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 3, || Ok(UniqueId([5; 128]))));
        // Garbage first: an HTTP request, a megabyte without a newline, a TCPStore
        // handshake, a wrong-version greeting, a silent connection kept open.
        let connect = || loop {
            if let Ok(c) = TcpStream::connect(&addr) {
                return c;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut silent = connect();
        let _ = silent.write_all(b"");
        for junk in [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            vec![b'x'; 1 << 20],
            vec![0, 0xce, 0xf7, 0x85, 0x3c, 13, 1, 2, 3, 4],
            b"nccl-channel-rendezvous 2 hello k 1 3\n".to_vec(),
            b"nccl-channel-rendezvous 1 hello nccl-channel#0 0 3\n".to_vec(),
        ] {
            let mut c = connect();
            let _ = c.write_all(&junk);
        }
        let r1 = s.spawn(|| rdv.exchange_with(1, 3, || unreachable!()));
        let r2 = s.spawn(|| rdv.exchange_with(2, 3, || unreachable!()));
        let ids = [r0, r1, r2].map(|h| h.join().unwrap().unwrap());
        drop(silent);
        ids
    });
    assert_eq!(ids, [UniqueId([5; 128]); 3]);
    // Rank 0 did not wait for the silent peer.
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn rank_0_names_the_garbage_it_ignored_when_a_rank_is_missing() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .timeout(Duration::from_millis(700));
    let err = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([5; 128]))));
        loop {
            if let Ok(mut c) = TcpStream::connect(&addr) {
                c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        r0.join().unwrap().unwrap_err()
    });
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "rank 0's rendezvous at {addr} (derived from code) did not hear from rank 1 within \
             700ms (1 other connection ignored, the last: 127.0.0.1:"
        )),
        "{text}"
    );
    assert!(text.ends_with(" sent \"GET / HTTP/1.1\\r\")"), "{text}");
}

#[test]
fn torch_store_without_rank_0_times_out_naming_the_key() {
    let store = TestStore::start();
    let port = store.port.to_string();
    let e = env(&[
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", &port),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RUN_ID", "lonely"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "0.5"),
    ]);
    let world = World::from_lookup(lookup(&e)).unwrap().unwrap();
    let rdv = Rendezvous::from_lookup(&world, lookup(&e))
        .unwrap()
        .unwrap();
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert!(matches!(err, Error::Rendezvous { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "torchrun's TCPStore at 127.0.0.1:{port} (derived from MASTER_ADDR, MASTER_PORT, \
             TORCHELASTIC_USE_AGENT_STORE) did not get the id from rank 0 (key \
             /nccl-channel/torchrun-lonely-attempt_0#0) within 500ms"
        )
    );
    // The test store stops waiting for a client that has gone (its thread ends).
    let t = Instant::now();
    while !store.log().iter().any(|q| q.starts_with("WAIT abandoned")) {
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", store.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn torch_store_refuses_a_foreign_value_and_a_size_mismatch() {
    let store = TestStore::start();
    let addr = format!("127.0.0.1:{}", store.port);
    let rdv = Rendezvous::torch_store(&addr)
        .unwrap()
        .key("k")
        .timeout(Duration::from_secs(5));
    store.set("/nccl-channel/k#0", b"hello");
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert!(
        err.to_string().ends_with(
            "holds under key /nccl-channel/k#0 something that is not a rendezvous value: \"hello\""
        ),
        "{err}"
    );
    store.set(
        "/nccl-channel/k#1",
        format!(
            "nccl-channel-rendezvous 2 3 0123456789abcdef {}",
            UniqueId([1; 128]).to_hex()
        )
        .as_bytes(),
    );
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "torchrun's TCPStore at {addr} (derived from code) holds under key \
             /nccl-channel/k#1 an id for a world of 3 ranks, but this rank's world has 2; every \
             rank must see the same world size"
        )
    );
    // A value of the version before nonces (a rank 0 of an older nccl-channel).
    let old = format!(
        "nccl-channel-rendezvous 1 2 {}",
        UniqueId([1; 128]).to_hex()
    );
    store.set("/nccl-channel/k#2", old.as_bytes());
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "torchrun's TCPStore at {addr} (derived from code) holds under key \
             /nccl-channel/k#2 a value of another version of nccl-channel's rendezvous \
             (\"{}\"… (284 bytes)); every rank must run the same",
            &old[..64]
        )
    );
    // The largest value read is 4096 bytes (a rendezvous value is under 400): one of
    // exactly 4096 is read and refused as not ours, one byte more is not even read.
    store.set("/nccl-channel/k#3", &[b'x'; 4096]);
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "torchrun's TCPStore at {addr} (derived from code) holds under key \
             /nccl-channel/k#3 something that is not a rendezvous value: \"{}\"… (4096 bytes)",
            "x".repeat(64)
        )
    );
    store.set("/nccl-channel/k#4", &[b'x'; 4097]);
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    // The read failed: what failed is the error, why is its source.
    assert_eq!(
        err.to_string(),
        format!(
            "torchrun's TCPStore at {addr} (derived from code) failed reading key /nccl-channel/k#4"
        )
    );
    let why = std::error::Error::source(&err).map(ToString::to_string);
    assert_eq!(
        why.as_deref(),
        Some("a value of 4097 bytes, more than any rendezvous stores")
    );
    // No ack was written for a value refused.
    assert!(
        !store.keys().iter().any(|k| k.contains("/ack/")),
        "{:?}",
        store.keys()
    );
}

#[test]
fn something_that_is_not_a_tcpstore_is_named() {
    // A server that answers the validating check with the wrong bytes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { continue };
            let _ = c.write_all(b"HTTP/1.1 400 Bad\r\n");
        }
    });
    let rdv = Rendezvous::torch_store(&addr.to_string())
        .unwrap()
        .timeout(Duration::from_millis(300));
    let err = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "did not answer within 300ms (last attempt: something answered a TCPStore check \
             with \"H\" instead of 0 or 1: not a TCPStore)"
        ),
        "{text}"
    );
}

#[test]
fn the_channel_builder_takes_a_rendezvous() {
    Rig::new(2).check(|rig| {
        let port = free_port_in_range();
        let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
            .unwrap()
            .timeout(Duration::from_secs(20));
        let out = on_threads(2, |r| {
            let ch = rig
                .channel(World::new(2, r).unwrap())
                .unique_id(IdSource::Rendezvous(rdv.clone()))
                .build()
                .unwrap()
                .unwrap();
            assert_eq!(
                ch.id_origin(),
                format!(
                    "rank 0's rendezvous at 127.0.0.1:{port} (derived from code), \
                     key nccl-channel, timeout 20s"
                )
            );
            all_gather_and_close(ch, &[r as i32])
        });
        assert_eq!(out, vec![vec![0, 1]; 2]);
    });
}

#[test]
fn without_a_rendezvous_the_builder_error_names_the_ways() {
    // The builder reads NCCL_COMM_ID, NCCL_CHANNEL_RENDEZVOUS and the launchers'
    // variables: none may be set.
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let text = two_ranks_without_a_shared_id().to_string();
    for part in [
        "NCCL_COMM_ID=host:port",
        "NCCL_CHANNEL_RENDEZVOUS=host:port",
        "torchrun, srun, mpirun or mpiexec",
        "IdSource::Rendezvous",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
}

// ---- derivation -------------------------------------------------------------------------

const SLURM: &[(&str, &str)] = &[
    ("SLURM_NTASKS", "8"),
    ("SLURM_PROCID", "3"),
    ("SLURM_JOB_NODELIST", "gpu[01-04,07],login1"),
    ("SLURM_JOB_ID", "123456"),
    ("SLURM_STEP_ID", "0"),
];

fn with(
    base: &[(&'static str, &'static str)],
    extra: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    v.extend_from_slice(extra);
    v
}

fn addr_and_source(vars: &[(&str, &str)]) -> (String, String) {
    let r = derive(vars).unwrap().unwrap();
    (r.address(), r.derived_from().to_string())
}

#[test]
fn precedence_explicit_then_master_addr_then_slurm() {
    let all = with(
        SLURM,
        &[
            ("NCCL_CHANNEL_RENDEZVOUS", "head:1111"),
            ("MASTER_ADDR", "master"),
            ("MASTER_PORT", "2222"),
        ],
    );
    assert_eq!(
        addr_and_source(&all),
        ("head:1111".into(), "NCCL_CHANNEL_RENDEZVOUS".into())
    );
    let no_explicit: Vec<_> = all
        .iter()
        .filter(|(k, _)| *k != "NCCL_CHANNEL_RENDEZVOUS")
        .copied()
        .collect();
    assert_eq!(
        addr_and_source(&no_explicit),
        ("master:2222".into(), "MASTER_ADDR, MASTER_PORT".into())
    );
    assert_eq!(
        addr_and_source(SLURM),
        (
            "gpu01:27296".into(),
            "SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID".into()
        )
    );
    // MASTER_ADDR alone does not override Slurm (its port is not known).
    assert_eq!(
        addr_and_source(&with(SLURM, &[("MASTER_ADDR", "master")])).0,
        "gpu01:27296"
    );
}

#[test]
fn slurm_node_lists_most_specific_first() {
    let vars = with(
        SLURM,
        &[
            ("SLURM_STEP_NODELIST", "step[3-4]"),
            ("SLURM_NODELIST", "old[1-2]"),
        ],
    );
    assert_eq!(addr_and_source(&vars).0, "step3:27296");
    let vars: Vec<_> = with(SLURM, &[("SLURM_NODELIST", "old[1-2]")])
        .into_iter()
        .filter(|(k, _)| *k != "SLURM_JOB_NODELIST")
        .collect();
    assert_eq!(
        addr_and_source(&vars),
        (
            "old1:27296".into(),
            "SLURM_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID".into()
        )
    );
    let bad = with(SLURM, &[("SLURM_JOB_NODELIST", "gpu[01-04")]);
    let e = derive(&bad).unwrap_err();
    assert!(
        matches!(&e, Error::Env { variable, .. } if variable == "SLURM_JOB_NODELIST"),
        "{e:?}"
    );
}

#[test]
fn slurm_port_formula_fixed_values() {
    let cases: &[(&str, Option<&str>, u16)] = &[
        ("123456", Some("0"), 27296),
        ("123456", Some("1"), 27297),
        ("123456", Some("17"), 27297),
        ("123456", None, 27296),
        ("750", Some("0"), 20000),
        ("4294967294", Some("0"), 20704),
        ("123456", Some("batch"), 27307),
    ];
    for (job, step, port) in cases {
        let mut vars = vec![
            ("SLURM_NTASKS", "2"),
            ("SLURM_PROCID", "1"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", *job),
        ];
        if let Some(s) = step {
            vars.push(("SLURM_STEP_ID", s));
        }
        let r = derive(&vars).unwrap().unwrap();
        assert_eq!(r.port(), *port, "job {job} step {step:?}");
        assert!(
            (nccl_channel::PORT_BASE..nccl_channel::PORT_BASE + nccl_channel::PORT_SPAN)
                .contains(&r.port())
        );
    }
    let e = derive(&[
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "1"),
        ("SLURM_JOB_NODELIST", "n1"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("SLURM_JOB_ID is not set"), "{e}");
}

const OMPI_MULTI: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_SIZE", "8"),
    ("OMPI_COMM_WORLD_RANK", "5"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ("OMPI_MCA_ess_base_jobid", "2416508929"),
];

#[test]
fn open_mpi_on_several_nodes_needs_a_host() {
    let e = derive(OMPI_MULTI).unwrap_err();
    let Error::Env {
        variable, problem, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(variable, "OMPI_COMM_WORLD_LOCAL_SIZE");
    assert!(
        problem.contains("export MASTER_ADDR=<rank 0's host> to every rank (mpirun -x"),
        "{problem}"
    );
    assert!(
        problem.contains("NCCL_CHANNEL_RENDEZVOUS=host:port"),
        "{problem}"
    );
    // MASTER_ADDR alone is enough: the port comes from the job id.
    assert_eq!(
        addr_and_source(&with(OMPI_MULTI, &[("MASTER_ADDR", "node1")])),
        (
            "node1:28929".into(),
            "MASTER_ADDR, OMPI_MCA_ess_base_jobid".into()
        )
    );
    // mpirun inside Slurm: Slurm's first host.
    assert_eq!(
        addr_and_source(&with(
            OMPI_MULTI,
            &[("SLURM_JOB_NODELIST", "cn[0100-0103]")]
        )),
        (
            "cn0100:28929".into(),
            "SLURM_JOB_NODELIST, OMPI_MCA_ess_base_jobid".into()
        )
    );
    // Open MPI 5: the PMIx namespace's hash.
    let v5: Vec<_> = with(
        OMPI_MULTI,
        &[
            ("PMIX_NAMESPACE", "prterun-node1-4242@1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
        ],
    )
    .into_iter()
    .filter(|(k, _)| *k != "OMPI_MCA_ess_base_jobid")
    .collect();
    assert_eq!(
        addr_and_source(&v5),
        (
            "127.0.0.1:27189".into(),
            "OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE, PMIX_NAMESPACE".into()
        )
    );
}

/// MASTER_PORT alone moves a derived host's port (what the "port taken" error advises), and
/// the errors for a half-given address name what is missing.
#[test]
fn master_port_alone_moves_the_derived_port_and_half_addresses_are_named() {
    assert_eq!(
        addr_and_source(&with(SLURM, &[("MASTER_PORT", "29560")])),
        (
            "gpu01:29560".into(),
            "SLURM_JOB_NODELIST, MASTER_PORT".into()
        )
    );
    let ompi_one_node = [
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_MCA_ess_base_jobid", "77"),
        ("MASTER_PORT", "29600"),
    ];
    assert_eq!(
        addr_and_source(&ompi_one_node),
        (
            "127.0.0.1:29600".into(),
            "OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE, MASTER_PORT".into()
        )
    );
    let pmi_one_node = [
        ("PMI_SIZE", "2"),
        ("PMI_RANK", "0"),
        ("MPI_LOCALNRANKS", "2"),
        ("MASTER_PORT", "29601"),
    ];
    assert_eq!(
        addr_and_source(&pmi_one_node),
        (
            "127.0.0.1:29601".into(),
            "MPI_LOCALNRANKS, PMI_SIZE, MASTER_PORT".into()
        )
    );
    // PMI on several nodes inside Slurm: the first Slurm host, MASTER_PORT's port.
    let pmi_in_slurm = [
        ("PMI_SIZE", "4"),
        ("PMI_RANK", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ("SLURM_JOB_ID", "123456"),
        ("MASTER_PORT", "29602"),
    ];
    assert_eq!(
        addr_and_source(&pmi_in_slurm),
        (
            "gpu01:29602".into(),
            "SLURM_JOB_NODELIST, MASTER_PORT".into()
        )
    );
    let e = derive(&with(SLURM, &[("MASTER_PORT", "0")])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "environment variable MASTER_PORT=\"0\": expected a port from 1 to 65535"
    );
    // Open MPI without its local size: one node or several is unknown.
    let e = derive(&[
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_MCA_ess_base_jobid", "77"),
    ])
    .unwrap_err();
    assert!(
        e.to_string().starts_with(
            "environment variable OMPI_COMM_WORLD_LOCAL_SIZE=\"\": it is not set, so whether \
             the job runs on one node is unknown"
        ),
        "{e}"
    );
    // PMI on several nodes with a host but no port.
    let e = derive(&[
        ("PMI_SIZE", "4"),
        ("PMI_RANK", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("MASTER_ADDR", "node0"),
    ])
    .unwrap_err();
    assert!(
        matches!(&e, Error::Env { variable, value, problem }
            if variable == "MASTER_ADDR" && value == "node0"
                && problem.starts_with("it names rank 0's host, but no port is known")
                && problem.contains("set MASTER_PORT too")),
        "{e:?}"
    );
    // torchrun's variables with one of the two.
    for (set, missing) in [
        ("MASTER_ADDR", "MASTER_PORT"),
        ("MASTER_PORT", "MASTER_ADDR"),
    ] {
        let e = derive(&[("WORLD_SIZE", "2"), ("RANK", "1"), (set, "29500")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "environment variable {set}=\"29500\": it is set but {missing} is not: rank 0 \
                 serves the id at MASTER_ADDR:MASTER_PORT"
            )
        );
    }
}

#[test]
fn pmi_on_several_nodes_uses_slurm_or_asks() {
    let pmi = [
        ("PMI_SIZE", "4"),
        ("PMI_RANK", "1"),
        ("MPI_LOCALNRANKS", "2"),
    ];
    let e = derive(&pmi).unwrap_err();
    assert!(
        matches!(&e, Error::Env { variable, problem, .. }
            if variable == "PMI_SIZE" && problem.contains("MASTER_ADDR")),
        "{e:?}"
    );
    let in_slurm = with(
        &pmi,
        &[
            ("SLURM_JOB_NODELIST", "gpu[01-02]"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_STEP_ID", "1"),
        ],
    );
    assert_eq!(
        addr_and_source(&in_slurm),
        (
            "gpu01:27297".into(),
            "SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID".into()
        )
    );
}

#[test]
fn torchrun_rows() {
    let base = [
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
    ];
    let r = derive(&with(&base, &[("TORCHELASTIC_USE_AGENT_STORE", "True")]))
        .unwrap()
        .unwrap();
    assert_eq!(r.kind(), RendezvousKind::TorchStore);
    assert_eq!(r.address(), "node0:29500");
    // torch compares with the string "True" exactly.
    let r = derive(&with(&base, &[("TORCHELASTIC_USE_AGENT_STORE", "true")]))
        .unwrap()
        .unwrap();
    assert_eq!(r.kind(), RendezvousKind::RankZero);
    assert_eq!(r.derived_from(), "MASTER_ADDR, MASTER_PORT");
    // No MASTER_ADDR: nothing to derive, or an error when the agent store is promised.
    assert_eq!(derive(&[("WORLD_SIZE", "2"), ("RANK", "1")]).unwrap(), None);
    let e = derive(&[
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ])
    .unwrap_err();
    assert!(
        matches!(&e, Error::Env { variable, .. } if variable == "TORCHELASTIC_USE_AGENT_STORE"),
        "{e:?}"
    );
    let e = derive(&with(&base, &[("MASTER_PORT", "0")])).unwrap_err();
    assert!(
        matches!(&e, Error::Env { variable, .. } if variable == "MASTER_PORT"),
        "{e:?}"
    );
}

#[test]
fn our_own_and_irees_families_derive_nothing_but_the_explicit_variable() {
    let noise = [
        ("MASTER_ADDR", "m"),
        ("MASTER_PORT", "1234"),
        ("SLURM_JOB_NODELIST", "n1"),
        ("SLURM_JOB_ID", "5"),
    ];
    for fam in [
        [("NCCL_CHANNEL_NPROCS", "2"), ("NCCL_CHANNEL_PROCID", "1")],
        [
            ("IREE_CUDA_NCCL_NPROCS", "2"),
            ("IREE_CUDA_NCCL_PROCID", "1"),
        ],
    ] {
        assert_eq!(derive(&with(&fam, &noise)).unwrap(), None, "{fam:?}");
        let r = derive(&with(
            &with(&fam, &noise),
            &[("NCCL_CHANNEL_RENDEZVOUS", "[::1]:4000")],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.address(), r.host(), r.port()),
            ("[::1]:4000".into(), "::1", 4000)
        );
    }
    // A world given in code: the explicit variable only.
    let w = World::new(2, 1).unwrap();
    let e = env(&noise);
    assert_eq!(Rendezvous::from_lookup(&w, lookup(&e)).unwrap(), None);
}

#[test]
fn malformed_values_are_env_errors_and_the_timeout_is_read() {
    for (var, value) in [
        ("NCCL_CHANNEL_RENDEZVOUS", "nohost"),
        ("NCCL_CHANNEL_RENDEZVOUS", "h:0"),
        ("NCCL_CHANNEL_RENDEZVOUS", "::1:80"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "-1"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "0"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "1e9"),
        // Exactly 1e9 seconds in digits: the first value refused.
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "1000000000"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "inf"),
        ("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "soon"),
    ] {
        let vars = with(SLURM, &[(var, value)]);
        let e = derive(&vars).unwrap_err();
        assert!(
            matches!(&e, Error::Env { variable, .. } if variable == var),
            "{var}={value}: {e:?}"
        );
    }
    let r = derive(&with(SLURM, &[("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", "2.5")]))
        .unwrap()
        .unwrap();
    assert_eq!(r.get_timeout(), Duration::from_millis(2500));
    // The bounds: just above 0 and just below 1e9 seconds are taken.
    for (text, want) in [
        ("0.001", Duration::from_millis(1)),
        ("999999999", Duration::from_secs(999_999_999)),
    ] {
        let r = derive(&with(SLURM, &[("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT", text)]))
            .unwrap()
            .unwrap();
        assert_eq!(r.get_timeout(), want, "{text}");
    }
    assert_eq!(
        derive(SLURM).unwrap().unwrap().get_timeout(),
        nccl_channel::DEFAULT_TIMEOUT
    );
    assert_eq!(nccl_channel::DEFAULT_TIMEOUT, Duration::from_secs(300));
    assert!(matches!(
        Rendezvous::tcp("no-port"),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn display_says_what_and_where_from() {
    let r = derive(SLURM).unwrap().unwrap();
    assert_eq!(
        r.to_string(),
        "rank 0's rendezvous at gpu01:27296 (derived from SLURM_JOB_NODELIST, SLURM_JOB_ID, \
         SLURM_STEP_ID), key slurm-123456.0, timeout 300s"
    );
    let r = Rendezvous::torch_store("h:1").unwrap().key("a b/c");
    assert_eq!(
        r.to_string(),
        "torchrun's TCPStore at h:1 (derived from code), key a_b/c, timeout 300s"
    );
}

// ---- robustness: slow, stray and older peers ---------------------------------------------

/// Connects to `addr` and sends one byte (never a newline) every `every`, for `for_`.
fn trickle(addr: &str, every: Duration, for_: Duration) -> std::thread::JoinHandle<()> {
    let addr = addr.to_string();
    std::thread::spawn(move || {
        let Ok(mut s) = TcpStream::connect(&addr) else {
            return;
        };
        let end = Instant::now() + for_;
        while Instant::now() < end {
            if s.write_all(b"n").is_err() {
                return;
            }
            std::thread::sleep(every);
        }
    })
}

/// 64 connections that each dribble a byte per second (a slowloris) hold nothing rank 1
/// needs: rank 0 serves every connection from one poll, so rank 1 is served at once, not
/// when the slow ones are dropped (a greeting not complete within STEP, 5 s).
#[test]
fn slow_peers_cannot_hold_every_handler_of_rank_0() {
    let addr = format!("127.0.0.1:{}", free_port_in_range());
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .key("slowloris")
        .timeout(Duration::from_secs(15));
    let r0 = {
        let rdv = rdv.clone();
        std::thread::spawn(move || rdv.exchange_with(0, 2, || Ok(UniqueId([4; 128]))))
    };
    std::thread::sleep(Duration::from_millis(300));
    let slow: Vec<_> = (0..64)
        .map(|_| trickle(&addr, Duration::from_millis(1000), Duration::from_secs(25)))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let r1 = rdv.exchange_with(1, 2, || unreachable!());
    let took = start.elapsed();
    let r0 = r0.join().unwrap();
    assert!(took < Duration::from_millis(2500), "rank 1 waited {took:?}");
    assert_eq!(
        r1.as_ref().ok(),
        Some(&UniqueId([4; 128])),
        "rank 1: {r1:?}; rank 0: {r0:?}"
    );
    assert_eq!(
        r0.as_ref().ok(),
        Some(&UniqueId([4; 128])),
        "rank 0: {r0:?}"
    );
    drop(slow);
}

/// A server that accepts and dribbles a byte per second (no newline) must not keep a rank
/// past its deadline (each byte used to restart the read timeout, up to 512 bytes).
#[test]
fn a_slow_server_does_not_keep_a_rank_past_its_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                for _ in 0..25 {
                    if c.write_all(b"x").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
        }
    });
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .timeout(Duration::from_secs(2));
    let t = Instant::now();
    let r = rdv.exchange_with(1, 2, || unreachable!());
    let took = t.elapsed();
    assert!(
        matches!(&r, Err(Error::Rendezvous { service: "rank 0's rendezvous", address, derived_from, problem, source: None })
            if *address == addr && derived_from == "code"
                && problem == "did not answer within 2s (last attempt: something accepted the \
                               connection but sent no complete answer in time)"),
        "{r:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "gave up after {took:?} (timeout 2 s): {r:?}"
    );
}

/// A server that answers a line without its end and closes: the deadline error says that
/// something that is not a rendezvous answered, and what it sent.
#[test]
fn a_server_answering_an_unterminated_line_is_named() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { continue };
            // Takes the greeting (closing with unread bytes would reset the connection).
            let mut greeting = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut greeting);
            let _ = c.write_all(b"garbage");
        }
    });
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .timeout(Duration::from_secs(1));
    let r = rdv.exchange_with(1, 2, || unreachable!());
    assert!(
        matches!(&r, Err(Error::Rendezvous { problem, .. })
            if problem == "did not answer within 1s (last attempt: something answered that \
                           is not a rendezvous: an unterminated line: \"garbage\")"),
        "{r:?}"
    );
}

/// The same against the TCPStore client: a "store" that takes the validation and then
/// answers every query a byte per second must not keep a rank past its deadline.
#[test]
fn a_slow_tcpstore_does_not_keep_a_rank_past_its_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                // CHECK answers 1 (not ready), WAIT answers 0 (ready), GET's length
                // arrives a byte per second: 8 bytes of 0x01 announce a huge value, so
                // the length itself must be cut off by the deadline.
                let mut buf = [0u8; 4096];
                let _ = std::io::Read::read(&mut c, &mut buf);
                let _ = c.write_all(&[1]);
                std::thread::sleep(Duration::from_millis(50));
                let _ = std::io::Read::read(&mut c, &mut buf);
                let _ = c.write_all(&[0]);
                let _ = std::io::Read::read(&mut c, &mut buf);
                for _ in 0..25 {
                    if c.write_all(&[0]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
        }
    });
    let rdv = Rendezvous::torch_store(&addr)
        .unwrap()
        .timeout(Duration::from_secs(2));
    let t = Instant::now();
    let r = rdv.exchange_with(1, 2, || unreachable!());
    let took = t.elapsed();
    assert!(
        // The value's length is cut off by the deadline: the read fails with a timeout.
        matches!(&r, Err(Error::Rendezvous { service: "torchrun's TCPStore", address, derived_from, problem, .. })
            if *address == addr && derived_from == "code"
                && problem == "failed reading key /nccl-channel/nccl-channel#0"),
        "{r:?}"
    );
    // The failed read is the error's source, whole: the deadline's TimedOut.
    let e = r.as_ref().unwrap_err();
    let io = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<nccl_channel::IoError>())
        .unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(io.to_string(), "the peer did not answer in time");
    assert!(
        took < Duration::from_secs(4),
        "gave up after {took:?} (timeout 2 s): {r:?}"
    );
}

/// torch <= 2.4's TCPStore (libuv and legacy alike) has no PING (query 13) and closes the
/// connection on it; torchrun 2.4 sets TORCHELASTIC_USE_AGENT_STORE=True for its default
/// (static) rendezvous. The test store closes on unknown queries and knows no PING.
#[test]
fn the_torch_store_client_works_with_a_store_without_ping() {
    let store = TestStore::start();
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{}", store.port))
        .unwrap()
        .key("torch24")
        .timeout(Duration::from_secs(5));
    let ids: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let rdv = &rdv;
                s.spawn(move || rdv.exchange_with(r, 2, || Ok(UniqueId([2; 128]))))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_every_rank_took(&ids, UniqueId([2; 128]));
    let log = store.log();
    assert!(!log.iter().any(|q| q.starts_with("unknown")), "{log:?}");
}

/// torchrun's agent store outlives the worker processes of one attempt: two programs run
/// one after the other by the same workers (`torchrun --no-python sh -c './a; ./b'`) share
/// TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT, and both number their first
/// exchange #0. Rank 0 removes the id and the acks once every rank took the id, so the
/// second program's rank 1 waits for its own rank 0 rather than taking the first's id.
/// (The two "processes" are told apart by spelling the address differently, which
/// restarts the per-process exchange numbering.)
#[test]
fn a_later_program_under_the_same_torchrun_attempt_does_not_get_a_stale_id() {
    let store = TestStore::start();
    let key = "torchrun-none-attempt_0";
    let first = Rendezvous::torch_store(&format!("127.0.0.1:{}", store.port))
        .unwrap()
        .key(key)
        .timeout(Duration::from_secs(10));
    std::thread::scope(|s| {
        let a = s.spawn(|| first.exchange_with(0, 2, || Ok(UniqueId([0xa; 128]))));
        let b = s.spawn(|| first.exchange_with(1, 2, || unreachable!()));
        assert_eq!(a.join().unwrap().unwrap(), UniqueId([0xa; 128]));
        assert_eq!(b.join().unwrap().unwrap(), UniqueId([0xa; 128]));
    });
    // The second program: its rank 0 comes a little later than its rank 1.
    let second = Rendezvous::torch_store(&format!("localhost:{}", store.port))
        .unwrap()
        .key(key)
        .timeout(Duration::from_secs(10));
    let (r0, r1) = std::thread::scope(|s| {
        let r1 = s.spawn(|| second.exchange_with(1, 2, || unreachable!()));
        std::thread::sleep(Duration::from_millis(500));
        let r0 = s.spawn(|| second.exchange_with(0, 2, || Ok(UniqueId([0xb; 128]))));
        (r0.join().unwrap(), r1.join().unwrap())
    });
    assert_eq!(
        r1.unwrap(),
        UniqueId([0xb; 128]),
        "rank 1 took the first program's id"
    );
    assert_eq!(r0.unwrap(), UniqueId([0xb; 128]));
    assert_eq!(store.keys(), Vec::<String>::new());
}

/// Sends `line` to rank 0 at `addr` as a peer would (connecting again until it listens)
/// and returns its one-line answer.
fn greet(addr: &str, line: &str) -> String {
    loop {
        if let Ok(mut c) = TcpStream::connect(addr) {
            c.write_all(format!("{line}\n").as_bytes()).unwrap();
            let mut answer = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut answer).unwrap();
            return answer;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One line from anyone must not stop rank 0: a greeting with the right key but another
/// world size is answered `size 3` (that client fails at once), and rank 0 goes on
/// serving its real ranks.
#[test]
fn a_greeting_with_another_world_size_does_not_stop_rank_0() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .key("sizes")
        .timeout(Duration::from_secs(20));
    let ids = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 3, || Ok(UniqueId([6; 128]))));
        let stray = greet(&addr, "nccl-channel-rendezvous 1 hello sizes#0 1 4");
        assert_eq!(stray, "nccl-channel-rendezvous 1 size 3\n");
        let r1 = s.spawn(|| rdv.exchange_with(1, 3, || unreachable!()));
        let r2 = s.spawn(|| rdv.exchange_with(2, 3, || unreachable!()));
        [r0, r1, r2].map(|h| h.join().unwrap())
    });
    assert_every_rank_took(&ids, UniqueId([6; 128]));
}

/// A peer that takes the id but acknowledges it as another rank (or with anything else)
/// is not counted: rank 0 goes on waiting for its rank 1 and names what happened.
#[test]
fn a_wrong_acknowledgement_is_not_counted() {
    for ack in [
        "nccl-channel-rendezvous 1 ack 2",
        "nccl-channel-rendezvous 1 nonsense",
    ] {
        let port = free_port_in_range();
        let addr = format!("127.0.0.1:{port}");
        let rdv = Rendezvous::tcp(&addr)
            .unwrap()
            .key("acks")
            .timeout(Duration::from_secs(1));
        let (r0, peer) = std::thread::scope(|s| {
            let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([6; 128]))));
            let c = loop {
                match TcpStream::connect(&addr) {
                    Ok(c) => break c,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            };
            (&c).write_all(b"nccl-channel-rendezvous 1 hello acks#0 1 2\n")
                .unwrap();
            let mut answer = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut answer).unwrap();
            assert_eq!(
                answer,
                format!(
                    "nccl-channel-rendezvous 1 id {}\n",
                    UniqueId([6; 128]).to_hex()
                )
            );
            (&c).write_all(format!("{ack}\n").as_bytes()).unwrap();
            (r0.join().unwrap(), c.local_addr().unwrap())
        });
        assert_eq!(
            r0.unwrap_err().to_string(),
            format!(
                "rank 0's rendezvous at {addr} (derived from code) did not hear from rank 1 \
                 within 1s (1 other connection ignored, the last: {peer} (rank 1) did not \
                 confirm the id)"
            ),
            "{ack}"
        );
    }
}

/// An accept that fails (here for want of a file descriptor, EMFILE) is noted and rank 0
/// goes on serving; its deadline error names it. In a child whose descriptor limit is
/// lowered so that the one connection's accept has none left.
#[cfg(target_os = "linux")]
#[test]
fn a_failed_accept_is_noted_not_fatal() {
    if !test_support::this_test_in_scrubbed_child!(&[]) {
        return;
    }
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .key("fds")
        .timeout(Duration::from_millis(1500));
    let (r0, held) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([1; 128]))));
        // Rank 0 listens once its port cannot be bound here.
        while TcpListener::bind(("127.0.0.1", port)).is_ok() {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The lowest free descriptor (what the next open gets): the limit is set a few
        // above it, so that some are left to take. Descriptors open above a lowered limit
        // stay usable (rank 0's listener among them); only new ones must be below it. No
        // /proc needed.
        let lowest_free = {
            use std::os::fd::AsRawFd;
            std::fs::File::open("/dev/null").unwrap().as_raw_fd()
        };
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-pointer.
        let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        assert_eq!(got, 0);
        limit.rlim_cur = (lowest_free + 8) as libc::rlim_t;
        // SAFETY: a valid limit; it lowers only this child process's soft limit.
        let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
        assert_eq!(set, 0);
        // Every descriptor taken, then one given back for the connection.
        let mut held = Vec::new();
        let e = loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => held.push(f),
                Err(e) => break e,
            }
        };
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
        held.pop();
        let c = TcpStream::connect(&addr).unwrap();
        (r0.join().unwrap(), (held, c))
    });
    drop(held);
    let e = r0.unwrap_err().to_string();
    let start = format!(
        "rank 0's rendezvous at {addr} (derived from code) did not hear from rank 1 within \
         1.5s ("
    );
    assert!(e.starts_with(&start), "{e}");
    assert!(
        e.ends_with(
            " other connections ignored, the last: accept failed: Too many open files (os \
             error 24))"
        ),
        "{e}"
    );
}

/// Rank 0's deadline error names the first four greetings with another world size and
/// counts the rest.
#[test]
fn rank_0_names_four_wrong_sizes_and_counts_the_rest() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .key("five")
        .timeout(Duration::from_secs(2));
    let r0 = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 3, || Ok(UniqueId([6; 128]))));
        for (rank, size) in [(1, 4), (2, 5), (1, 6), (2, 7), (1, 8)] {
            let answer = greet(
                &addr,
                &format!("nccl-channel-rendezvous 1 hello five#0 {rank} {size}"),
            );
            assert_eq!(answer, "nccl-channel-rendezvous 1 size 3\n");
        }
        r0.join().unwrap()
    });
    assert_eq!(
        r0.unwrap_err().to_string(),
        format!(
            "rank 0's rendezvous at {addr} (derived from code) did not hear from ranks 1, 2 \
             within 2s; 5 greetings with another world size than rank 0's 3 (rank 1 of 4, \
             rank 2 of 5, rank 1 of 6, rank 2 of 7, …): every rank must see the same world size"
        )
    );
}

/// A rendezvous for another key answered, then went away: the deadline error still says a
/// foreign key answered (it used to say only what the last attempt met: refused).
#[test]
fn a_foreign_server_is_named_even_after_it_went_away() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let theirs = Rendezvous::tcp(&addr)
        .unwrap()
        .key("gone-job")
        .timeout(Duration::from_millis(400));
    let mine = Rendezvous::tcp(&addr)
        .unwrap()
        .key("my-job")
        .timeout(Duration::from_millis(1500));
    let (their_result, my_result) = std::thread::scope(|s| {
        let server = s.spawn(|| theirs.exchange_with(0, 2, || Ok(UniqueId([9; 128]))));
        std::thread::sleep(Duration::from_millis(100));
        let mine = mine.exchange_with(1, 2, || unreachable!());
        (server.join().unwrap(), mine)
    });
    // Their rank 0 waited for its rank 1, which never came (ours is of another key).
    let theirs = their_result.unwrap_err().to_string();
    assert!(
        theirs.starts_with(&format!(
            "rank 0's rendezvous at {addr} (derived from code) did not hear from rank 1 \
             within 400ms"
        )),
        "{theirs}"
    );
    let text = my_result.unwrap_err().to_string();
    assert!(
        text.starts_with(&format!(
            "rank 0's rendezvous at {addr} (derived from code) did not answer within 1.5s ("
        )),
        "{text}"
    );
    assert!(
        text.contains("a rendezvous for key gone-job#0 answered, not my-job#0"),
        "{text}"
    );
    assert!(text.contains("last attempt: "), "{text}");
    assert!(text.contains("refused"), "{text}");
}

#[test]
fn nccl_channel_rendezvous_key_names_the_job() {
    let base = [
        ("NCCL_CHANNEL_NPROCS", "2"),
        ("NCCL_CHANNEL_PROCID", "1"),
        ("NCCL_CHANNEL_RENDEZVOUS", "127.0.0.1:4000"),
    ];
    let r = derive(&base).unwrap().unwrap();
    assert_eq!(r.get_key(), "nccl-channel");
    let r = derive(&with(
        &base,
        &[("NCCL_CHANNEL_RENDEZVOUS_KEY", "launch-1234-5678")],
    ))
    .unwrap()
    .unwrap();
    assert_eq!(r.get_key(), "launch-1234-5678");
    assert_eq!(r.derived_from(), "NCCL_CHANNEL_RENDEZVOUS");
    // Under torchrun too, the explicit key wins over the job's.
    let r = derive(&[
        ("WORLD_SIZE", "2"),
        ("RANK", "0"),
        ("TORCHELASTIC_RUN_ID", "r"),
        ("NCCL_CHANNEL_RENDEZVOUS", "h:1"),
        ("NCCL_CHANNEL_RENDEZVOUS_KEY", "mine"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(r.get_key(), "mine");
    // Without NCCL_CHANNEL_RENDEZVOUS it is not read (the launcher's rows keep their key).
    let r = derive(&[
        ("WORLD_SIZE", "2"),
        ("RANK", "0"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
        ("TORCHELASTIC_RUN_ID", "r"),
        ("NCCL_CHANNEL_RENDEZVOUS_KEY", "mine"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(r.get_key(), "torchrun-r-attempt_0");
}

/// A first program under a torchrun attempt whose rank 2 never came leaves its id and
/// rank 1's acknowledgement in the agent store. A second program under the same attempt
/// (same key; simulated here with `localhost`, whose exchange counter starts at 0 again)
/// must not count the stale ack as rank 1's: rank 0 would delete the id and return as soon
/// as rank 2 acknowledged, and rank 1, which had not read it yet, would wait out its
/// deadline.
#[test]
fn a_stale_ack_from_an_earlier_exchange_does_not_count_for_rank_0() {
    let store = TestStore::start();
    let first = Rendezvous::torch_store(&format!("127.0.0.1:{}", store.port))
        .unwrap()
        .key("stale")
        .timeout(Duration::from_millis(1500));
    std::thread::scope(|s| {
        let r0 = s.spawn(|| first.exchange_with(0, 3, || Ok(UniqueId([1; 128]))));
        let r1 = s.spawn(|| first.exchange_with(1, 3, || unreachable!()));
        let e0 = r0.join().unwrap().unwrap_err();
        assert_eq!(
            e0.to_string(),
            format!(
                "torchrun's TCPStore at 127.0.0.1:{} (derived from code) did not see rank 2 \
                 take the id (key /nccl-channel/stale#0) within 1.5s",
                store.port
            ),
            "rank 2 never came"
        );
        assert_eq!(r1.join().unwrap().unwrap(), UniqueId([1; 128]));
    });
    eprintln!("left in the store: {:?}", store.keys());

    let second = Rendezvous::torch_store(&format!("localhost:{}", store.port))
        .unwrap()
        .key("stale")
        .timeout(Duration::from_secs(4));
    let ids: Vec<_> = std::thread::scope(|s| {
        let r0 = s.spawn(|| second.exchange_with(0, 3, || Ok(UniqueId([2; 128]))));
        std::thread::sleep(Duration::from_millis(300));
        let r2 = s.spawn(|| second.exchange_with(2, 3, || unreachable!()));
        std::thread::sleep(Duration::from_millis(700));
        let r1 = s.spawn(|| second.exchange_with(1, 3, || unreachable!()));
        [r0, r1, r2]
            .map(|h| h.join().unwrap())
            .into_iter()
            .collect()
    });
    assert_every_rank_took(&ids, UniqueId([2; 128]));
}

/// Once every rank acknowledged the id (and went on to init with it), a failed clean-up
/// DELETE_KEY must not make rank 0 alone fail the exchange: its peers would be left in
/// ncclCommInitRank waiting for a rank 0 that gave up. The test store's
/// deletion of a present key closes the connection: both ranks get the id, and the store still holds it (the clean-up failed).
#[test]
fn a_failed_deletion_after_every_ack_does_not_fail_rank_0() {
    let store = TestStore::start_with(Faults {
        refuse_deleting_present_keys: true,
        ..Faults::default()
    });
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{}", store.port))
        .unwrap()
        .key("nodelete")
        .timeout(Duration::from_secs(3));
    let ids: Vec<_> = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([5; 128]))));
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        [r0, r1].map(|h| h.join().unwrap()).into_iter().collect()
    });
    assert_every_rank_took(&ids, UniqueId([5; 128]));
    let log = store.log();
    assert!(
        log.iter()
            .any(|q| q == "DELETE refused /nccl-channel/nodelete#0"),
        "{log:?}"
    );
    assert!(
        store
            .keys()
            .contains(&"/nccl-channel/nodelete#0".to_string()),
        "{:?}",
        store.keys()
    );
}

/// The validation (VALIDATE + CHECK) must not take an echo server for a TCPStore, although
/// VALIDATE's own first byte, 0, is a valid CHECK answer.
#[test]
fn an_echo_server_is_not_a_tcpstore() {
    let addr = fake_server(|c| {
        let mut r = c.try_clone().unwrap();
        let mut w = c;
        let _ = std::io::copy(&mut r, &mut w);
    });
    let e = rank_1_error(&addr, Duration::from_millis(800));
    assert!(
        e.contains("with 0 (ready) instead of 1: not a TCPStore (an echo server?)"),
        "{e}"
    );
}

/// Nor a server that answers the validation with a 1 and then more (a banner that starts
/// with byte 1): a TCPStore answers the CHECK with one byte and nothing else.
#[test]
fn a_server_that_answers_more_than_one_byte_is_not_a_tcpstore() {
    let addr = fake_server(|mut c| {
        let _ = std::io::Read::read(&mut c, &mut [0u8; 4096]);
        let _ = c.write_all(b"\x01hello");
        std::thread::sleep(Duration::from_millis(100));
    });
    let e = rank_1_error(&addr, Duration::from_millis(500));
    assert!(
        e.contains(
            "something answered a TCPStore check with more than one byte (\"\\x01\" then \
             \"hello\"): not a TCPStore"
        ),
        "{e}"
    );
}

/// A server that takes the validation and closes the connection, and one that takes it and
/// never answers, are each named for what they did (each attempt met the same).
#[test]
fn a_server_that_closes_or_stays_silent_on_the_validation_is_named() {
    for (closes, met) in [
        (true, "closed it on a TCPStore check"),
        (
            false,
            "did not answer a TCPStore check in time (not a TCPStore?)",
        ),
    ] {
        let addr = fake_server(move |mut c| {
            let _ = std::io::Read::read(&mut c, &mut [0u8; 4096]);
            if closes {
                // A FIN, not a reset: the connection stays open on this side.
                let _ = c.shutdown(std::net::Shutdown::Write);
            }
            std::thread::sleep(Duration::from_secs(3));
        });
        assert_eq!(
            rank_1_error(&addr, Duration::from_millis(500)),
            format!(
                "torchrun's TCPStore at {addr} (derived from code) did not answer within 500ms \
                 (last attempt: something accepted the connection but {met})"
            )
        );
    }
}

/// A server on 127.0.0.1 that runs `serve` on each connection, in a thread of its own;
/// its address.
fn fake_server(serve: impl Fn(TcpStream) + Copy + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            std::thread::spawn(move || serve(c));
        }
    });
    addr
}

/// What rank 1 of 2 meets with a TCPStore rendezvous at `addr` (an error, as text).
fn rank_1_error(addr: &str, timeout: Duration) -> String {
    Rendezvous::torch_store(addr)
        .unwrap()
        .timeout(timeout)
        .exchange_with(1, 2, || unreachable!())
        .unwrap_err()
        .to_string()
}

/// A store that closes the connection on a WAIT fails the wait with the connection's
/// error; it is not taken for "the id is not there yet".
#[test]
fn a_wait_that_fails_is_an_error_not_an_absent_id() {
    let store = TestStore::start_with(Faults {
        waits_fail: true,
        ..Faults::default()
    });
    let addr = format!("127.0.0.1:{}", store.port);
    let rdv = Rendezvous::torch_store(&addr)
        .unwrap()
        .key("closing")
        .timeout(Duration::from_secs(5));
    let e = rdv.exchange_with(1, 2, || unreachable!()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "torchrun's TCPStore at {addr} (derived from code) failed waiting for key \
             /nccl-channel/closing#0"
        )
    );
    let Error::Rendezvous {
        source: Some(source),
        ..
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
}

/// A peer's greeting that claims rank 0, or a rank outside the world, is answered with
/// the world size and not served the id.
#[test]
fn a_greeting_as_rank_0_or_outside_the_world_is_not_served() {
    let port = free_port_in_range();
    let addr = format!("127.0.0.1:{port}");
    let rdv = Rendezvous::tcp(&addr)
        .unwrap()
        .key("claims")
        .timeout(Duration::from_secs(5));
    let ids = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([8; 128]))));
        for rank in [0, 2, 7] {
            let answer = greet(
                &addr,
                &format!("nccl-channel-rendezvous 1 hello claims#0 {rank} 2"),
            );
            assert_eq!(answer, "nccl-channel-rendezvous 1 rank 2\n", "rank {rank}");
        }
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        [r0, r1].map(|h| h.join().unwrap())
    });
    assert_every_rank_took(&ids, UniqueId([8; 128]));
}

/// A TCPStore that comes up after the ranks started (a launcher's agent may start its
/// store late): every rank tries again until its deadline, then takes the id.
#[test]
fn ranks_wait_for_a_torch_store_that_comes_up_late() {
    let port = free_port_in_range();
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{port}"))
        .unwrap()
        .key("late-store")
        .timeout(Duration::from_secs(5));
    let ids: Vec<_> = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([5; 128]))));
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        std::thread::sleep(Duration::from_millis(500));
        let _store = TestStore::start_on(port);
        [r0, r1].map(|h| h.join().unwrap()).into_iter().collect()
    });
    assert_every_rank_took(&ids, UniqueId([5; 128]));
}

/// A rank waits for rank 0's id past one socket step (5 s): a WAIT whose step runs out
/// before the deadline is waited again, not taken for the deadline.
#[test]
fn a_torch_store_rank_waits_for_the_id_longer_than_one_socket_step() {
    let store = TestStore::start();
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{}", store.port))
        .unwrap()
        .key("patient")
        .timeout(Duration::from_secs(30));
    let ids: Vec<_> = std::thread::scope(|s| {
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        std::thread::sleep(Duration::from_millis(5500));
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([7; 128]))));
        [r0, r1].map(|h| h.join().unwrap()).into_iter().collect()
    });
    assert_every_rank_took(&ids, UniqueId([7; 128]));
}

/// When the last acknowledgement lands between rank 0's WAIT running out and its fresh
/// look, rank 0 must not fail with "did not see ranks  take the id" (an empty list): every
/// rank took the id and went on. The test store's WAIT for
/// acknowledgements never ends: rank 1
/// takes the id and acknowledges it, rank 0's wait runs out, its fresh look finds the ack,
/// so it succeeds and cleans up, within a second of its deadline.
#[test]
fn rank_0_succeeds_when_every_ack_is_there_after_the_wait_ran_out() {
    let store = TestStore::start_with(Faults {
        ack_waits_never_end: true,
        ..Faults::default()
    });
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{}", store.port))
        .unwrap()
        .key("late")
        .timeout(Duration::from_millis(800));
    let t = Instant::now();
    let ids: Vec<_> = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([3; 128]))));
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        [r0, r1].map(|h| h.join().unwrap()).into_iter().collect()
    });
    let took = t.elapsed();
    assert_every_rank_took(&ids, UniqueId([3; 128]));
    assert!(took < Duration::from_millis(1800), "{took:?}");
    assert_eq!(store.keys(), Vec::<String>::new());
}

/// The "port taken" error advises what moves the port: the address given in code, the
/// variable NCCL_CHANNEL_RENDEZVOUS, or MASTER_PORT when the address was derived.
#[test]
fn the_port_taken_advice_names_where_the_address_came_from() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let taken = |rdv: Rendezvous| {
        rdv.timeout(Duration::from_millis(200))
            .exchange_with(0, 2, || Ok(UniqueId([1; 128])))
            .unwrap_err()
            .to_string()
    };
    let code = taken(Rendezvous::tcp(&addr).unwrap());
    assert!(
        code.ends_with(
            "(still taken after 200ms; choose another port in the address given to \
             Rendezvous::tcp)"
        ),
        "{code}"
    );
    assert!(!code.contains("MASTER_PORT"), "{code}");
    let from_var = taken(
        derive(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("NCCL_CHANNEL_RENDEZVOUS", &addr),
        ])
        .unwrap()
        .unwrap(),
    );
    assert!(
        from_var.ends_with(
            "(still taken after 200ms; choose another port for every rank in \
             NCCL_CHANNEL_RENDEZVOUS)"
        ),
        "{from_var}"
    );
    assert!(!from_var.contains("MASTER_PORT"), "{from_var}");
    let port_s = port.to_string();
    let derived = taken(
        derive(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port_s),
        ])
        .unwrap()
        .unwrap(),
    );
    assert!(
        derived.ends_with(
            "(still taken after 200ms; choose another port for every rank with MASTER_PORT, \
             or NCCL_CHANNEL_RENDEZVOUS=host:port)"
        ),
        "{derived}"
    );
    drop(held);
}

/// Rank 0 of a TCPStore exchange names the ranks that did not acknowledge, removes its id
/// (so that a later exchange under the key cannot read it), and is done within a second
/// of its deadline.
#[test]
fn torch_store_rank_0_names_the_missing_rank_and_removes_its_id() {
    let store = TestStore::start();
    let port = store.port;
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{port}"))
        .unwrap()
        .key("miss")
        .timeout(Duration::from_millis(600));
    let t = Instant::now();
    let (r0, r1) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 3, || Ok(UniqueId([4; 128]))));
        let r1 = s.spawn(|| rdv.exchange_with(1, 3, || unreachable!()));
        (r0.join().unwrap(), r1.join().unwrap())
    });
    let took = t.elapsed();
    assert_eq!(r1.unwrap(), UniqueId([4; 128]));
    assert_eq!(
        r0.unwrap_err().to_string(),
        format!(
            "torchrun's TCPStore at 127.0.0.1:{port} (derived from code) did not see rank 2 \
             take the id (key /nccl-channel/miss#0) within 600ms"
        )
    );
    assert!(took < Duration::from_millis(1600), "{took:?}");
    assert_eq!(store.keys(), Vec::<String>::new());
}

/// An ack of an earlier exchange that appears after rank 0 removed the old ones (a rank of
/// that exchange acknowledging late) carries another nonce: rank 0 does not count it, and
/// waits for this exchange's rank to overwrite it; if none does, its error says so.
#[test]
fn torch_store_rank_0_does_not_count_an_ack_with_another_nonce() {
    let store = TestStore::start();
    let port = store.port;
    let key = "/nccl-channel/nonce#0";
    let late_stale_ack = || {
        let t = Instant::now();
        while store.value(key).is_none() {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
        store.set(&format!("{key}/ack/1"), b"0123456789abcdef");
    };
    // No rank 1 of this exchange: rank 0 fails, naming the foreign ack.
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{port}"))
        .unwrap()
        .key("nonce")
        .timeout(Duration::from_millis(700));
    let r0 = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([6; 128]))));
        late_stale_ack();
        r0.join().unwrap()
    });
    assert_eq!(
        r0.unwrap_err().to_string(),
        format!(
            "torchrun's TCPStore at 127.0.0.1:{port} (derived from code) did not see rank 1 \
             take the id (key {key}) within 700ms (rank 1 acknowledged another exchange's id \
             under that key: an earlier program's?)"
        )
    );
    // Rank 1 comes after the foreign ack: both agree, rank 0 only once rank 1 took the id.
    let rdv = Rendezvous::torch_store(&format!("localhost:{port}"))
        .unwrap()
        .key("nonce")
        .timeout(Duration::from_secs(5));
    let (r0, r1) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([7; 128]))));
        late_stale_ack();
        std::thread::sleep(Duration::from_millis(400));
        assert!(!r0.is_finished(), "rank 0 counted the foreign ack");
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        (r0.join().unwrap(), r1.join().unwrap())
    });
    assert_eq!(r0.unwrap(), UniqueId([7; 128]));
    assert_eq!(r1.unwrap(), UniqueId([7; 128]));
    assert_eq!(store.keys(), Vec::<String>::new());
}

/// When rank 0's wait ran out and the store then fails a CHECK, rank 0 stops there and
/// says the store could not be asked, rather than counting every rank as missing.
#[test]
fn torch_store_rank_0_stops_at_the_first_failed_check() {
    let store = TestStore::start_with(Faults {
        ack_waits_never_end: true,
        ack_checks_fail: true,
        ..Faults::default()
    });
    let port = store.port;
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{port}"))
        .unwrap()
        .key("nocheck")
        .timeout(Duration::from_millis(500));
    let t = Instant::now();
    let e = rdv
        .exchange_with(0, 3, || Ok(UniqueId([8; 128])))
        .unwrap_err()
        .to_string();
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(
        e.starts_with(&format!(
            "torchrun's TCPStore at 127.0.0.1:{port} (derived from code) did not see every \
             rank take the id (key /nccl-channel/nocheck#0) within 500ms (then the store could \
             not be asked which ranks: checking /nccl-channel/nocheck#0/ack/1: "
        )),
        "{e}"
    );
    let log = store.log();
    let checks = log
        .iter()
        .filter(|q| q.starts_with("CHECK /nccl-channel/nocheck#0/ack/"));
    assert_eq!(checks.count(), 1, "{log:?}");
}
