//! Honest ranks get their id whatever else reaches rank 0's address: a flood of
//! connections that greet and then say nothing, a squatter on the port that answers
//! `nosecret` before rank 0 binds it, an impostor on `[::1]` beside rank 0's 127.0.0.1, a
//! relay that splices ranks of one address to a rank 0 of another. Every peer here is on
//! loopback; every loop is bounded in count and in time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use nccl_rendezvous::{Error, Id, Rendezvous, RendezvousSecret};

/// A port free on 127.0.0.1 just now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects to `port` until something listens there, for at most 5 s.
fn wait_listening(port: u16) {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing listens on {port}");
}

/// The descriptors this process may open, raised to `want` if the hard limit allows;
/// what it may open then.
fn raise_descriptor_limit(want: u64) -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit`, which `l` is, and keeps no pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 1024;
    }
    #[allow(clippy::useless_conversion)]
    let (cur, max) = (u64::from(l.rlim_cur), u64::from(l.rlim_max));
    if cur >= want {
        return cur;
    }
    let new = want.min(max);
    // `rlim_t` is `u64` on Linux, another width elsewhere.
    #[allow(clippy::useless_conversion)]
    {
        l.rlim_cur = new.try_into().unwrap_or(l.rlim_cur);
    }
    // SAFETY: setrlimit reads one `rlimit`, which `l` is, and keeps no pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } == 0 {
        new
    } else {
        cur
    }
}

/// Rank 0 holds a secret; an attacker fills every connection slot rank 0 serves at once
/// and part of the backlog with connections that greet as rank 1 of this exchange (the
/// key is no secret, a hello needs none, and rank 0 answers it with a challenge) and then
/// say nothing. The honest rank, whose deadline
/// (4 s) is shorter than the step a connection may take (5 s), still gets the id: a
/// greeted connection silent past a round trip's allowance gives up its slot.
#[test]
fn an_honest_rank_gets_through_a_flood_of_greeted_then_silent_connections() {
    let limit = raise_descriptor_limit(8192);
    // Rank 0 serves min(1024, limit / 2) at once; the attacker takes them all, and more
    // wait in the backlog, while keeping within the limit (its ends and rank 0's).
    let slots = (limit / 2).clamp(16, 1024) as usize;
    let attackers = (slots + slots / 4).min(limit as usize - slots - 64);
    let port = free_port();
    let secret = RendezvousSecret::generate().unwrap();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(4))
        .secret(secret);
    let id: Id = [5; 128];
    thread::scope(|s| {
        let zero = s.spawn(|| rdv.exchange_with(0, 2, || Ok(id)));
        wait_listening(port);
        let hello = format!(
            "nccl-channel-rendezvous 2 hello nccl-channel#0 1 2 {}\n",
            "00".repeat(32)
        );
        let mut flood = Vec::with_capacity(attackers);
        for _ in 0..attackers {
            let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
                break;
            };
            let _ = c.write_all(hello.as_bytes());
            flood.push(c);
        }
        assert!(flood.len() > slots, "only {} connections", flood.len());
        // Give rank 0 time to accept and challenge the first `slots`.
        thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let one = rdv.exchange_with(1, 2, || unreachable!());
        let took = started.elapsed();
        let zero = zero.join().unwrap();
        drop(flood);
        assert_eq!(one, Ok(id), "after {took:?} behind {attackers} connections");
        assert_eq!(zero, Ok(id));
    });
}

/// The same flood, timed: with every slot taken by connections silent for a few hundred
/// milliseconds and more of them waiting in the backlog, the honest rank is not held until
/// they have been silent for a second: each gives its slot to a waiting connection once
/// silent past a round trip's allowance, the longest silent first.
#[test]
fn an_honest_rank_gets_through_a_flood_well_within_a_second() {
    let limit = raise_descriptor_limit(8192);
    let slots = (limit / 2).clamp(16, 1024) as usize;
    let attackers = (slots + slots / 4).min(limit as usize - slots - 64);
    let port = free_port();
    let secret = RendezvousSecret::generate().unwrap();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(4))
        .secret(secret);
    let id: Id = [6; 128];
    thread::scope(|s| {
        let zero = s.spawn(|| rdv.exchange_with(0, 2, || Ok(id)));
        wait_listening(port);
        let hello = format!(
            "nccl-channel-rendezvous 2 hello nccl-channel#0 1 2 {}\n",
            "00".repeat(32)
        );
        let mut flood = Vec::with_capacity(attackers);
        for _ in 0..attackers {
            let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
                break;
            };
            let _ = c.write_all(hello.as_bytes());
            flood.push(c);
        }
        thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let one = rdv.exchange_with(1, 2, || unreachable!());
        let took = started.elapsed();
        let zero = zero.join().unwrap();
        drop(flood);
        assert_eq!(one, Ok(id));
        assert_eq!(zero, Ok(id));
        assert!(
            took < Duration::from_millis(500),
            "{took:?} behind {attackers} connections"
        );
    });
}

/// Something squats rank 0's port before rank 0 binds it and answers every greeting with
/// `nosecret`, a line anyone may write. A rank holding the secret does not believe it:
/// it keeps asking, and gets the id from rank 0 once rank 0 has the port.
#[test]
fn an_unproven_nosecret_from_a_squatter_does_not_end_a_rank_holding_the_secret() {
    let port = free_port();
    let squatter = TcpListener::bind(("127.0.0.1", port)).unwrap();
    squatter.set_nonblocking(true).unwrap();
    let rdv = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .secret(RendezvousSecret::generate().unwrap());
    let id: Id = [6; 128];
    thread::scope(|s| {
        let squatting = s.spawn(move || {
            // Answers for 1 s, then leaves the port to rank 0.
            let until = Instant::now() + Duration::from_secs(1);
            let mut answered = 0;
            while Instant::now() < until {
                match squatter.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.write_all(b"nccl-channel-rendezvous 2 nosecret\n");
                        answered += 1;
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
            answered
        });
        let zero = s.spawn(|| rdv.exchange_with(0, 2, || Ok(id)));
        let one = rdv.exchange_with(1, 2, || unreachable!());
        let answered = squatting.join().unwrap();
        assert!(answered > 0, "the squatter answered nobody");
        assert_eq!(one, Ok(id));
        assert_eq!(zero.join().unwrap(), Ok(id));
    });
}

/// `localhost`: rank 0 listens on 127.0.0.1 alone, so the others connect there, not to
/// whatever the resolver gives first: an impostor on `[::1]` at the same port (any local
/// user may listen there) catches nobody. (Where the resolver gives 127.0.0.1 alone, the
/// impostor is not reached either way.)
#[test]
fn localhost_connects_where_rank_0_listens_not_to_an_impostor_on_ipv6() {
    let port = free_port();
    let Ok(impostor) = TcpListener::bind(("::1", port)) else {
        eprintln!("no IPv6 loopback here: nothing to impersonate");
        return;
    };
    impostor.set_nonblocking(true).unwrap();
    let rdv = Rendezvous::tcp(&format!("localhost:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(10));
    let (real, fake): (Id, Id) = ([7; 128], [9; 128]);
    let fake_line = format!(
        "nccl-channel-rendezvous 1 id {}\n",
        fake.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    thread::scope(|s| {
        let imposting = s.spawn(move || {
            let until = Instant::now() + Duration::from_secs(3);
            let mut caught = 0;
            while Instant::now() < until {
                match impostor.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.write_all(fake_line.as_bytes());
                        caught += 1;
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
            caught
        });
        let zero = s.spawn(|| rdv.exchange_with(0, 2, || Ok(real)));
        let one = rdv.exchange_with(1, 2, || unreachable!());
        assert_eq!(one, Ok(real));
        assert_eq!(zero.join().unwrap(), Ok(real));
        assert_eq!(imposting.join().unwrap(), 0, "the impostor caught a rank");
    });
}

/// Copies what `from` sends to `to` until either ends.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 4096];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Two jobs share a key and a secret (torchrun's default run id, one secret file for
/// both). Something relays the ranks of one job's address to the other job's rank 0:
/// the proofs bind the address each side names, so the relayed ranks are refused (at
/// their deadline) and take no id of the other job.
#[test]
fn a_rank_relayed_to_the_rank_0_of_another_address_is_refused() {
    let (theirs, relay_port) = (free_port(), free_port());
    let secret = RendezvousSecret::generate().unwrap();
    let at = |port: u16| {
        Rendezvous::tcp(&format!("127.0.0.1:{port}"))
            .unwrap()
            .key("shared")
            .timeout(Duration::from_secs(2))
            .secret(secret.clone())
    };
    let (zero, one) = (at(theirs), at(relay_port));
    let relay = TcpListener::bind(("127.0.0.1", relay_port)).unwrap();
    relay.set_nonblocking(true).unwrap();
    thread::scope(|s| {
        s.spawn(move || {
            let until = Instant::now() + Duration::from_secs(3);
            let mut relayed = 0;
            while Instant::now() < until && relayed < 64 {
                let Ok((rank, _)) = relay.accept() else {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = rank.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", theirs)) else {
                    continue;
                };
                let (r2, s2) = (rank.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || pump(rank, server));
                thread::spawn(move || pump(s2, r2));
                relayed += 1;
            }
        });
        let served = s.spawn(|| zero.exchange_with(0, 2, || Ok([8; 128])));
        let got = one.exchange_with(1, 2, || unreachable!());
        let Err(Error::RendezvousRefused { problem, .. }) = &got else {
            panic!("a relayed rank took another address's id: {got:?}")
        };
        assert!(problem.contains("could not prove"), "{problem}");
        assert!(
            served.join().unwrap().is_err(),
            "rank 0 served the relayed rank"
        );
    });
}
