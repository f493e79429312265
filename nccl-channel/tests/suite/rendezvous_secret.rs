//! A rendezvous with a secret: ranks holding it get the id; a peer without it, with
//! another, or replaying a recorded exchange, gets nothing of the id and a typed refusal,
//! and rank 0 goes on serving; an eavesdropper sees no id; the TCPStore path seals the id
//! too; the secret comes from a file only its owner can read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::tcpstore::TestStore;
use nccl_channel::{Error, Rendezvous, RendezvousSecret, UniqueId};

const ID: UniqueId = UniqueId([0x5a; 128]);

fn free_addr() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// A connection to `addr` once something listens there (within 10 s), reads limited to 5 s.
fn connect_when_listening(addr: &str) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(addr) {
            Ok(c) => {
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                return c;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    }
}

fn secret(b: u8) -> RendezvousSecret {
    RendezvousSecret::new([b; 32]).unwrap()
}

fn rdv(addr: &str, secret: Option<RendezvousSecret>, timeout: Duration) -> Rendezvous {
    let r = Rendezvous::tcp(addr).unwrap().timeout(timeout);
    match secret {
        Some(s) => r.secret(s),
        None => r,
    }
}

fn refused(r: &nccl_channel::Result<UniqueId>) -> bool {
    matches!(r, Err(Error::RendezvousRefused { .. }))
}

#[test]
fn ranks_holding_the_secret_all_get_rank_0s_id() {
    let addr = free_addr();
    let r = rdv(&addr, Some(secret(1)), Duration::from_secs(20));
    let ids: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..5)
            .map(|rank| {
                let r = &r;
                s.spawn(move || r.exchange_with(rank, 5, || Ok(ID)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), ID);
    }
    assert!(
        r.to_string().ends_with(", authenticated by a secret"),
        "{r}"
    );
}

/// Peers that speak the protocol by hand, without the secret: one greets without a secret
/// (told `secret` at once), one greets with a made-up nonce and sends a made-up proof
/// (told `denied`). Neither sees the id; rank 0 goes on and serves its real rank after
/// both. (Through `Rendezvous`, the same two are refused with a typed error: the lib's
/// tests of the client.)
#[test]
fn peers_without_the_secret_or_with_another_are_refused_and_rank_0_goes_on() {
    let addr = free_addr();
    let talk = |lines: &[String]| -> Vec<String> {
        let c = connect_when_listening(&addr);
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut answers = Vec::new();
        for l in lines {
            (&c).write_all(l.as_bytes()).unwrap();
            let mut a = String::new();
            r.read_line(&mut a).unwrap();
            answers.push(a);
        }
        answers
    };
    let (zero, none, other, one) = std::thread::scope(|s| {
        let zero = s.spawn(|| {
            rdv(&addr, Some(secret(1)), Duration::from_secs(20)).exchange_with(0, 2, || Ok(ID))
        });
        let none = talk(&["nccl-channel-rendezvous 1 hello nccl-channel#0 1 2\n".into()]);
        let other = talk(&[
            format!(
                "nccl-channel-rendezvous 2 hello nccl-channel#0 1 2 {}\n",
                "ab".repeat(32)
            ),
            format!("nccl-channel-rendezvous 2 proof {}\n", "cd".repeat(32)),
        ]);
        let one = rdv(&addr, Some(secret(1)), Duration::from_secs(20)).exchange_with(
            1,
            2,
            || unreachable!(),
        );
        (zero.join().unwrap(), none, other, one)
    });
    assert_eq!(none, ["nccl-channel-rendezvous 1 secret\n"]);
    assert!(
        other[0].starts_with("nccl-channel-rendezvous 2 challenge nccl-channel#0 2 "),
        "{other:?}"
    );
    assert_eq!(other[1], "nccl-channel-rendezvous 2 denied\n");
    for answer in none.iter().chain(&other) {
        assert!(!answer.contains(&hex(&ID.0)[..32]), "{answer}");
    }
    assert_eq!(one.unwrap(), ID);
    assert_eq!(zero.unwrap(), ID);
}

/// Another job's rank 0 on the port (an earlier launch still serving), with a secret or
/// without one, is waited out whatever this rank's secret: it answers with its key, and
/// this rank takes the id from its own rank 0 once that one listens.
#[test]
fn another_jobs_rank_0_is_waited_out_whatever_the_secrets() {
    for (theirs, ours) in [(None, Some(1)), (Some(2), None), (Some(2), Some(1))] {
        let addr = free_addr();
        let (first, mine, one) = std::thread::scope(|s| {
            let first = s.spawn(|| {
                rdv(&addr, theirs.map(secret), Duration::from_millis(1500))
                    .key("earlier")
                    .exchange_with(0, 2, || Ok(UniqueId([1; 128])))
            });
            std::thread::sleep(Duration::from_millis(200));
            // Ours waits for the port, then serves.
            let mine = s.spawn(|| {
                rdv(&addr, ours.map(secret), Duration::from_secs(20))
                    .key("later")
                    .exchange_with(0, 2, || Ok(ID))
            });
            let one = rdv(&addr, ours.map(secret), Duration::from_secs(20))
                .key("later")
                .exchange_with(1, 2, || unreachable!());
            (first.join().unwrap(), mine.join().unwrap(), one)
        });
        assert!(first.is_err());
        assert_eq!(one.unwrap(), ID, "theirs {theirs:?}, ours {ours:?}");
        assert_eq!(mine.unwrap(), ID);
    }
}

/// A rank holding a secret does not take an id from a rank 0 that has none.
#[test]
fn a_rank_with_a_secret_refuses_a_rank_0_without_one() {
    let addr = free_addr();
    let (zero, one) = std::thread::scope(|s| {
        let zero = s
            .spawn(|| rdv(&addr, None, Duration::from_millis(1500)).exchange_with(0, 2, || Ok(ID)));
        let one = rdv(&addr, Some(secret(1)), Duration::from_secs(10)).exchange_with(
            1,
            2,
            || unreachable!(),
        );
        (zero.join().unwrap(), one)
    });
    assert!(refused(&one), "{one:?}");
    assert!(one.unwrap_err().to_string().contains("has no secret"));
    let e = zero.unwrap_err().to_string();
    assert!(e.contains("refused for the rendezvous's secret"), "{e}");
}

/// A relay between one rank and rank 0 that records both directions.
struct Recorder {
    addr: String,
    to_server: Arc<Mutex<Vec<u8>>>,
    to_client: Arc<Mutex<Vec<u8>>>,
}

fn recorder(server: String) -> Recorder {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let to_server = Arc::new(Mutex::new(Vec::new()));
    let to_client = Arc::new(Mutex::new(Vec::new()));
    let (ts, tc) = (to_server.clone(), to_client.clone());
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(up) = TcpStream::connect(&server) else {
                continue;
            };
            let pipe = |mut from: TcpStream, mut to: TcpStream, log: Arc<Mutex<Vec<u8>>>| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                })
            };
            pipe(c.try_clone().unwrap(), up.try_clone().unwrap(), ts.clone());
            pipe(up, c, tc.clone());
        }
    });
    Recorder {
        addr,
        to_server,
        to_client,
    }
}

fn lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| [l, b"\n"].concat())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An eavesdropper records an exchange: the id is nowhere in it. Replaying the rank's
/// words to a fresh rank 0 gets no id (rank 0's nonce is new, so the recorded proof fails
/// and rank 0 answers `denied`); replaying rank 0's words to a rank gets that rank
/// nothing (its nonce is new, so the recorded proof of rank 0 fails) and a typed refusal.
#[test]
fn a_recorded_exchange_reveals_no_id_and_replays_to_nothing() {
    let addr = free_addr();
    let rec = recorder(addr.clone());
    std::thread::scope(|s| {
        // Rank 0 is told the address the rank names (the recorder's): the proofs bind it.
        let zero = s.spawn(|| {
            let at = nccl_channel::nccl_rendezvous::Rendezvous::tcp(&addr)
                .unwrap()
                .reached_as(&rec.addr)
                .unwrap()
                .timeout(Duration::from_secs(20))
                .secret(secret(1));
            Rendezvous::from(at).exchange_with(0, 2, || Ok(ID))
        });
        let one = Rendezvous::tcp(&rec.addr)
            .unwrap()
            .timeout(Duration::from_secs(20))
            .secret(secret(1))
            .exchange_with(1, 2, || unreachable!());
        assert_eq!(one.unwrap(), ID);
        assert_eq!(zero.join().unwrap().unwrap(), ID);
    });
    std::thread::sleep(Duration::from_millis(100));
    let up = rec.to_server.lock().unwrap().clone();
    let down = rec.to_client.lock().unwrap().clone();
    assert_eq!(lines(&up).len(), 3, "{}", String::from_utf8_lossy(&up));
    assert_eq!(lines(&down).len(), 2, "{}", String::from_utf8_lossy(&down));
    for bytes in [&up, &down] {
        let text = String::from_utf8_lossy(bytes).to_lowercase();
        assert!(!text.contains(&hex(&ID.0)[..32]), "{text}");
        assert!(!bytes.windows(16).any(|w| w == &ID.0[..16]));
    }

    // The rank's recorded words, to a fresh rank 0 with the same secret and id: denied.
    let addr2 = free_addr();
    std::thread::scope(|s| {
        let zero = s.spawn(|| {
            rdv(&addr2, Some(secret(1)), Duration::from_millis(1500)).exchange_with(0, 2, || Ok(ID))
        });
        let c = connect_when_listening(&addr2);
        let mut r = BufReader::new(c.try_clone().unwrap());
        let recorded = lines(&up);
        (&c).write_all(&recorded[0]).unwrap();
        let mut challenge = String::new();
        r.read_line(&mut challenge).unwrap();
        assert!(challenge.contains(" challenge "), "{challenge}");
        (&c).write_all(&recorded[1]).unwrap();
        let mut answer = String::new();
        r.read_line(&mut answer).unwrap();
        assert_eq!(answer, "nccl-channel-rendezvous 2 denied\n");
        let e = zero.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("refused for the rendezvous's secret"), "{e}");
    });

    // Rank 0's recorded words, served to a rank with the secret: it takes nothing.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake = l.local_addr().unwrap().to_string();
    let recorded = lines(&down);
    let proofs = Arc::new(Mutex::new(0));
    let seen = proofs.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut hello = String::new();
            let _ = r.read_line(&mut hello);
            let _ = (&c).write_all(&recorded[0]);
            let mut next = String::new();
            let _ = r.read_line(&mut next);
            if next.contains(" proof ") {
                *seen.lock().unwrap() += 1;
                let _ = (&c).write_all(&recorded[1]);
            }
        }
    });
    let one = Rendezvous::tcp(&fake)
        .unwrap()
        .timeout(Duration::from_millis(800))
        .secret(secret(1))
        .exchange_with(1, 2, || unreachable!());
    assert!(refused(&one), "{one:?}");
    assert_eq!(
        *proofs.lock().unwrap(),
        0,
        "the rank proved itself to an impostor"
    );
}

/// Through torchrun's TCPStore: the stored value is sealed (no id in it), ranks with the
/// secret take the id, a rank without it or with another is refused.
#[test]
fn through_a_tcpstore_the_id_is_sealed_and_only_the_secret_opens_it() {
    let store = TestStore::start();
    let addr = format!("127.0.0.1:{}", store.port);
    let rdv = |s: Option<RendezvousSecret>, key: &str, t: Duration| {
        let r = Rendezvous::torch_store(&addr).unwrap().key(key).timeout(t);
        match s {
            Some(s) => r.secret(s),
            None => r,
        }
    };
    let long = Duration::from_secs(20);
    let ids: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let r = rdv(Some(secret(1)), "sealed", long);
                s.spawn(move || r.exchange_with(rank, 3, || Ok(ID)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for id in ids {
        assert_eq!(id.unwrap(), ID);
    }
    // A rank 0 stores; strangers read what it stored and are refused: one without a
    // secret at once, one with another secret at its deadline (what it read proves
    // nothing, so it waits for a value sealed with its own).
    for (theirs, want) in [
        (None, "has none"),
        (Some(secret(2)), "not sealed with this rank's secret"),
    ] {
        let short = Duration::from_millis(1500);
        let (zero, one) = std::thread::scope(|s| {
            let zero =
                s.spawn(|| rdv(Some(secret(1)), "strangers", short).exchange_with(0, 2, || Ok(ID)));
            let one = rdv(theirs, "strangers", short).exchange_with(1, 2, || unreachable!());
            (zero.join().unwrap(), one)
        });
        assert!(refused(&one), "{one:?}");
        assert!(one.unwrap_err().to_string().contains(want));
        // Nobody with the secret acknowledged: rank 0 fails at its deadline.
        assert!(zero.is_err());
    }
    // A rank with a secret refuses an id stored without one (at its deadline).
    let short = Duration::from_millis(1500);
    let (zero, one) = std::thread::scope(|s| {
        let zero = s.spawn(|| rdv(None, "plain", short).exchange_with(0, 2, || Ok(ID)));
        let one = rdv(Some(secret(1)), "plain", short).exchange_with(1, 2, || unreachable!());
        (zero.join().unwrap(), one)
    });
    assert!(refused(&one), "{one:?}");
    assert!(
        one.unwrap_err()
            .to_string()
            .contains("stored without a secret")
    );
    assert!(zero.is_err());
}

#[cfg(unix)]
#[test]
fn the_environment_names_the_secret_file_and_an_open_one_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("rdv-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let world = nccl_channel::World::from_lookup(|name| match name {
        "NCCL_CHANNEL_NPROCS" => Some("2".into()),
        "NCCL_CHANNEL_PROCID" => Some("1".into()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    let p = path.display().to_string();
    let vars = |extra: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("NCCL_CHANNEL_RENDEZVOUS", "127.0.0.1:29500".to_string()),
            ("NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE", p.clone()),
        ];
        v.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        v
    };
    let from = |v: Vec<(&str, String)>| {
        Rendezvous::from_lookup(&world, |name| {
            v.iter().find(|(k, _)| *k == name).map(|(_, x)| x.clone())
        })
    };
    let r = from(vars(&[])).unwrap().unwrap();
    assert!(r.has_secret());
    assert!(!r.encrypts_nccl());
    let r = from(vars(&[("NCCL_CHANNEL_RENDEZVOUS_ENCRYPT_NCCL", "1")]))
        .unwrap()
        .unwrap();
    assert!(r.encrypts_nccl());
    let e = from(vars(&[("NCCL_CHANNEL_RENDEZVOUS_ENCRYPT_NCCL", "yes")])).unwrap_err();
    assert!(matches!(e, Error::Env { .. }), "{e:?}");
    let e = from(vec![
        ("NCCL_CHANNEL_RENDEZVOUS", "127.0.0.1:29500".to_string()),
        ("NCCL_CHANNEL_RENDEZVOUS_ENCRYPT_NCCL", "1".to_string()),
    ])
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE"),
        "{e}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = from(vars(&[])).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("mode 644"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `encrypt_nccl` hands NCCL a key derived from the secret before the exchange; without a
/// secret the exchange is refused before anything is sent.
#[test]
fn encrypting_nccls_sockets_needs_the_secret_and_happens_before_the_exchange() {
    let (_cuda, gpus) = cuda_mock::MockDriver::with_devices(1).build().unwrap();
    let (nccl, _sim) = nccl_mock::MockNccl::new(&gpus).build().unwrap();
    let addr = free_addr();
    let e = rdv(&addr, None, Duration::from_secs(1))
        .encrypt_nccl(true)
        .exchange(&nccl, 0, 1)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                what: "Rendezvous::encrypt_nccl",
                ..
            }
        ),
        "{e:?}"
    );
    let id = rdv(&addr, Some(secret(1)), Duration::from_secs(1))
        .encrypt_nccl(true)
        .exchange(&nccl, 0, 1);
    assert!(id.is_ok(), "{id:?}");
}

/// Through a TCPStore with a secret, an acknowledgement is a proof: one written by someone
/// without the secret (the nonce anyone reads in the stored value, as acks are without a
/// secret, or anything else) does not count, and rank 0 names the rank as missing.
#[test]
fn a_forged_acknowledgement_in_the_store_does_not_count() {
    let store = TestStore::start();
    let addr = format!("127.0.0.1:{}", store.port);
    let zero = Rendezvous::torch_store(&addr)
        .unwrap()
        .key("forged")
        .timeout(Duration::from_millis(2500))
        .secret(secret(1));
    let (got, forged) = std::thread::scope(|s| {
        let zero = s.spawn(|| zero.exchange_with(0, 2, || Ok(ID)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let value = loop {
            if let Some(v) = store.value("/nccl-channel/forged#0") {
                break v;
            }
            assert!(Instant::now() < deadline, "rank 0 stored nothing");
            std::thread::sleep(Duration::from_millis(10));
        };
        let text = String::from_utf8(value).unwrap();
        let nonce = text.split(' ').nth(3).unwrap().to_string();
        for ack in [nonce.as_bytes(), &[b'0'; 64][..], b""] {
            store.set("/nccl-channel/forged#0/ack/1", ack);
            std::thread::sleep(Duration::from_millis(200));
        }
        (zero.join().unwrap(), nonce)
    });
    let e = got.unwrap_err().to_string();
    assert!(e.contains("did not see rank 1 take the id"), "{e}");
    assert_eq!(forged.len(), 64);
}

/// Through a TCPStore whose key anyone can guess: a stranger stores a value there before
/// rank 0 does. A rank holding the secret reads it first, is not ended by it (nothing in
/// it is proven), and takes rank 0's sealed id once rank 0 stores it.
#[test]
fn through_a_tcpstore_a_strangers_value_read_first_does_not_decide() {
    let store = TestStore::start();
    let addr = format!("127.0.0.1:{}", store.port);
    let rdv = |t: Duration| {
        Rendezvous::torch_store(&addr)
            .unwrap()
            .key("guessed")
            .timeout(t)
            .secret(secret(1))
    };
    let strangers = format!(
        "nccl-channel-rendezvous 2 2 0123456789abcdef {}",
        "ab".repeat(128)
    );
    store.set("/nccl-channel/guessed#0", strangers.as_bytes());
    let (zero, one) = std::thread::scope(|s| {
        let one = s.spawn(|| rdv(Duration::from_secs(20)).exchange_with(1, 2, || unreachable!()));
        // Rank 0 comes late: rank 1 has read the stranger's value by then.
        std::thread::sleep(Duration::from_millis(700));
        let zero = rdv(Duration::from_secs(20)).exchange_with(0, 2, || Ok(ID));
        (zero, one.join().unwrap())
    });
    assert_eq!(one, Ok(ID));
    assert_eq!(zero, Ok(ID));
}
