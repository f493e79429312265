//! The other ranks' side: connect to rank 0 and ask, retrying (with growing, jittered
//! pauses, so that thousands of ranks do not come back in one wave) until rank 0 answers
//! or the deadline passes.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Instant;

use super::wire::{After, Hello, MAX_LINE, Reply, after_line, hello_line, parse_reply, transcript};
use crate::net::{self, STEP, describe, read_line, step_until, time_for_attempt};
use crate::point::Rendezvous;
use crate::proof::{Keys, Role, nonce};
use crate::{Id, Result};

/// What one attempt to reach rank 0 came to.
enum Attempt {
    Got(Box<Id>),
    /// Stop: retrying cannot help.
    Fatal(crate::Error),
    /// Try again; the text says what happened, for the deadline's error.
    Retry(String),
    /// A rendezvous for another key answered: try again.
    Foreign(String),
    /// What answered could not prove it knows the secret (another job's rank 0 with
    /// another secret, or not a rank 0 at all): try again.
    Unproven(String),
}

/// Ranks other than 0: connect and ask until rank 0 answers or the deadline passes.
pub(crate) fn receive(
    rdv: &Rendezvous,
    key: &str,
    rank: usize,
    size: usize,
    found: &crate::notice::Found,
) -> Result<Id> {
    let deadline = crate::backoff::deadline_after(rdv.timeout);
    let keys = rdv.secret.as_ref().map(Keys::new);
    let mut backoff = net::attempts_backoff();
    // A rendezvous of another key, or one that could not prove the secret, that answered:
    // said in the deadline's error even when later attempts met something else.
    let mut foreign: Option<String> = None;
    let mut unproven: Option<String> = None;
    loop {
        let hello = Hello {
            key: key.to_string(),
            rank,
            size,
            nonce: match &keys {
                Some(_) => Some(nonce()?),
                None => None,
            },
        };
        let last = match attempt(rdv, &hello, keys.as_ref(), deadline) {
            Attempt::Got(id) => return Ok(*id),
            Attempt::Fatal(e) => return Err(e),
            Attempt::Foreign(why) => {
                foreign = Some(why.clone());
                why
            }
            Attempt::Unproven(why) => {
                crate::notice::found(found, crate::notice::Cause::Unproven);
                unproven = Some(why.clone());
                why
            }
            Attempt::Retry(why) => why,
        };
        std::thread::sleep(net::jittered(backoff.pause_until(deadline), deadline));
        if !time_for_attempt(deadline) {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            let earlier = unproven.as_ref().or(foreign.as_ref());
            let problem = match earlier {
                Some(f) if *f != last => format!(
                    "did not answer within {:?} ({f}; last attempt: {last})",
                    rdv.timeout
                ),
                _ => format!(
                    "did not answer within {:?} (last attempt: {last})",
                    rdv.timeout
                ),
            };
            // Only what proved it knows the secret could have handed the id over: when
            // something answered and could not, the secret is what failed.
            return Err(match unproven {
                Some(_) => rdv.refused(problem),
                None => rdv.error(problem),
            });
        }
    }
}

fn attempt(rdv: &Rendezvous, hello: &Hello, keys: Option<&Keys>, deadline: Instant) -> Attempt {
    let stream = match net::connect(connect_host(rdv), rdv.port, step_until(deadline)) {
        Ok(s) => s,
        Err(e) => return Attempt::Retry(e.to_string()),
    };
    if let Err(e) = (&stream).write_all(hello_line(hello).as_bytes()) {
        return Attempt::Retry(format!("sending the greeting: {e}"));
    }
    // Rank 0 answers at once; something silent gets one STEP, then the next attempt.
    let read_by = deadline.min(Instant::now() + STEP);
    let mut reader = BufReader::new(&stream);
    let reply = match next_reply(&mut reader, read_by) {
        Ok(r) => r,
        Err(a) => return a,
    };
    match (reply, keys, &hello.nonce) {
        (
            Reply::Challenge {
                key,
                size,
                nonce,
                tag,
            },
            Some(keys),
            Some(mine),
        ) => {
            let t = transcript(&rdv.bound_address(), hello, mine, &key, size, &nonce);
            if !keys.verify(Role::Server, &t, &tag) {
                return Attempt::Unproven(
                    "what answered could not prove it knows the secret (rank 0 holds \
                     another secret, or it is not rank 0)"
                        .into(),
                );
            }
            if let Some(a) = mismatch(rdv, hello, &key, size) {
                return a;
            }
            proved(&stream, &mut reader, hello, keys, &t, read_by)
        }
        // Said without proof, so not believed: whatever answered first at the address (a
        // squatter on the port before rank 0 binds it, anything in the path) could say it.
        // Waited out like every other unproven answer; at the deadline the refusal says it.
        (Reply::NoSecret, Some(_), _) => Attempt::Unproven(format!(
            "what answered said it has no secret, and rank {} has one (give every rank the \
             same secret, or none); said without proof, so this rank waited for a proven \
             answer",
            hello.rank
        )),
        (Reply::Secret, None, _) => Attempt::Fatal(rdv.refused(format!(
            "asks for a secret, and rank {} has none: give every rank the same secret \
             ({})",
            hello.rank,
            crate::secret::SECRET_FILE_ENV
        ))),
        (Reply::Id(id), None, _) => {
            // Rank 0 counts this rank as served only on the ack; if it is lost, rank 0
            // reports this rank missing at its deadline, which is the truth as it sees it.
            let ack = after_line(&After::Ack {
                rank: hello.rank,
                tag: None,
            });
            let _ = (&stream).write_all(ack.as_bytes());
            Attempt::Got(Box::new(id))
        }
        // Told without proof, but only to be waited out: another job's rank 0 answers so
        // whatever its secret.
        (Reply::Key(theirs), _, _) => mismatch(rdv, hello, &theirs, hello.size)
            .unwrap_or_else(|| Attempt::Retry("rank 0 answered its own key".into())),
        (Reply::Size(theirs), None, _) => mismatch(rdv, hello, &hello.key, theirs)
            .unwrap_or_else(|| Attempt::Retry("rank 0 answered its own size".into())),
        (Reply::Rank(theirs), None, _) => Attempt::Fatal(rank_refused(rdv, hello, theirs)),
        // An answer that does not prove the secret: nothing of it is believed.
        (_, Some(_), _) => Attempt::Unproven(
            "what answered did not prove it knows the secret (it answered as a rendezvous \
             without one)"
                .into(),
        ),
        (other, None, _) => Attempt::Retry(format!(
            "something answered that is not a rendezvous without a secret: {other:?}"
        )),
    }
}

/// With a secret: rank 0 proved itself; this rank proves itself, opens the id, proves it
/// got it.
fn proved(
    stream: &TcpStream,
    reader: &mut BufReader<&TcpStream>,
    hello: &Hello,
    keys: &Keys,
    t: &[u8],
    read_by: Instant,
) -> Attempt {
    let proof = after_line(&After::Proof(keys.prove(Role::Client, t)));
    if let Err(e) = (&*stream).write_all(proof.as_bytes()) {
        return Attempt::Retry(format!("sending the proof: {e}"));
    }
    match next_reply(reader, read_by) {
        Ok(Reply::Sealed(sealed)) => match keys.open(t, &sealed[..]) {
            Some(id) => {
                let ack = after_line(&After::Ack {
                    rank: hello.rank,
                    tag: Some(keys.prove(Role::Ack, t)),
                });
                let _ = (&*stream).write_all(ack.as_bytes());
                Attempt::Got(Box::new(id))
            }
            None => Attempt::Unproven("the sealed id did not open: it changed on its way".into()),
        },
        // Rank 0 proved the secret and still refused this rank's proof of the same
        // secret: something between them changed the words.
        Ok(Reply::Denied) => Attempt::Unproven(
            "rank 0 refused this rank's proof: something between them changed the exchange".into(),
        ),
        Ok(other) => Attempt::Retry(format!("rank 0 answered the proof with {other:?}")),
        Err(a) => a,
    }
}

/// The host to connect to: `localhost` is 127.0.0.1, where rank 0 listens for it
/// ([`Rendezvous::listen_addrs`]), not whatever the resolver gives first (often `::1`,
/// where any local user could listen on the same port and answer first).
fn connect_host(rdv: &Rendezvous) -> &str {
    if rdv.host.eq_ignore_ascii_case("localhost") {
        "127.0.0.1"
    } else {
        &rdv.host
    }
}

/// A key, size or rank of rank 0's that differs from this rank's, as the attempt it makes.
fn mismatch(rdv: &Rendezvous, hello: &Hello, key: &str, size: usize) -> Option<Attempt> {
    if key != hello.key {
        return Some(Attempt::Foreign(format!(
            "a rendezvous for key {key} answered, not {} (another job, or an earlier \
             channel still serving)",
            hello.key
        )));
    }
    if size != hello.size {
        return Some(Attempt::Fatal(rdv.error(format!(
            "serves a world of {size} ranks, but rank {} has a world of {}; every rank must \
             see the same world size",
            hello.rank, hello.size
        ))));
    }
    // The rank is in range: it is not 0 (rank 0 serves) and below its size, which is
    // rank 0's.
    None
}

fn rank_refused(rdv: &Rendezvous, hello: &Hello, size: usize) -> crate::Error {
    rdv.error(format!(
        "refused rank {}: ranks go from 1 to {} there",
        hello.rank,
        size.saturating_sub(1)
    ))
}

/// The next line of rank 0, parsed; what else came, as the attempt it makes.
fn next_reply(reader: &mut BufReader<&TcpStream>, read_by: Instant) -> Result<Reply, Attempt> {
    let line = match read_line(reader, MAX_LINE, read_by) {
        Ok(Some(line)) => line,
        Ok(None) => {
            return Err(Attempt::Retry(
                "something accepted the connection and closed it without a word".into(),
            ));
        }
        Err(e) if net::timed_out(&e) => {
            return Err(Attempt::Retry(
                "something accepted the connection but sent no complete answer in time".into(),
            ));
        }
        Err(e) => {
            return Err(Attempt::Retry(format!(
                "something answered that is not a rendezvous: {e}"
            )));
        }
    };
    parse_reply(&line).ok_or_else(|| {
        Attempt::Retry(format!(
            "something answered that is not a rendezvous: {}",
            describe(&line)
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Error;
    use crate::secret::RendezvousSecret;

    /// Rank 0 (with `zero`'s secret, waiting `zero_waits`) and rank 1 (with `one`'s,
    /// waiting `timeout`): what rank 1 gets, and how long it took.
    fn pair(
        (zero, zero_waits): (Option<u8>, Duration),
        one: Option<u8>,
        timeout: Duration,
    ) -> (Result<Id>, Duration) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let make = |s: Option<u8>, t: Duration| {
            let r = Rendezvous::tcp(&format!("127.0.0.1:{port}"))
                .unwrap()
                .timeout(t);
            match s {
                Some(b) => r.secret(RendezvousSecret::new([b; 16]).unwrap()),
                None => r,
            }
        };
        let (r0, r1) = (make(zero, zero_waits), make(one, timeout));
        std::thread::scope(|s| {
            let server = s.spawn(|| r0.exchange_with(0, 2, || Ok([2; 128])));
            let start = Instant::now();
            let got = r1.exchange_with(1, 2, || unreachable!());
            let took = start.elapsed();
            let _ = server.join();
            (got, took)
        })
    }

    #[test]
    fn the_same_secret_gets_the_id() {
        let long = Duration::from_secs(20);
        let (got, _) = pair((Some(1), long), Some(1), long);
        assert_eq!(got.unwrap(), [2; 128]);
    }

    /// A rank without a secret is told at once that rank 0 wants one (nothing to protect
    /// on its side). A rank holding one does not believe an unproven `nosecret`: whatever
    /// answers first at the address could say it; it waits for a proven answer until its
    /// deadline, whose refusal says what was answered.
    #[test]
    fn a_rank_with_a_secret_waits_out_an_unproven_nosecret() {
        let (got, took) = pair(
            (Some(1), Duration::from_secs(1)),
            None,
            Duration::from_secs(20),
        );
        let Err(Error::RendezvousRefused { problem, .. }) = &got else {
            panic!("{got:?}")
        };
        assert!(problem.contains("asks for a secret"), "{problem}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        let timeout = Duration::from_millis(1500);
        let (got, took) = pair((None, Duration::from_secs(3)), Some(1), timeout);
        let Err(Error::RendezvousRefused { problem, .. }) = &got else {
            panic!("{got:?}")
        };
        assert!(problem.contains("said it has no secret"), "{problem}");
        assert!(problem.contains("without proof"), "{problem}");
        assert!(took >= timeout, "ended before its deadline: {took:?}");
    }

    #[test]
    fn another_secret_is_refused_at_the_deadline() {
        let timeout = Duration::from_millis(600);
        let (got, took) = pair((Some(1), Duration::from_secs(1)), Some(2), timeout);
        let Err(Error::RendezvousRefused { problem, .. }) = &got else {
            panic!("{got:?}")
        };
        // What every attempt met, said once.
        assert_eq!(
            problem,
            "did not answer within 600ms (last attempt: what answered could not prove it \
             knows the secret (rank 0 holds another secret, or it is not rank 0))"
        );
        assert!(took >= timeout, "{took:?}");
    }

    /// With a secret, rank 0's proved size and key decide as without one: another size
    /// fails at once, another key is waited out and named.
    #[test]
    fn a_proved_rank_0_of_another_size_or_key_is_told_apart() {
        let secret = RendezvousSecret::new([1u8; 16]).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at = |key: &str, t: Duration| {
            Rendezvous::tcp(&format!("127.0.0.1:{port}"))
                .unwrap()
                .key(key)
                .timeout(t)
                .secret(secret.clone())
        };
        let (zero, one) = (
            at("k", Duration::from_secs(2)),
            at("k", Duration::from_secs(20)),
        );
        let other = at("other", Duration::from_millis(600));
        let (size, key) = std::thread::scope(|s| {
            let server = s.spawn(|| zero.exchange_with(0, 3, || Ok([2; 128])));
            let start = Instant::now();
            let size = one.exchange_with(1, 2, || unreachable!());
            assert!(start.elapsed() < Duration::from_secs(10));
            let key = other.exchange_with(1, 3, || unreachable!());
            let _ = server.join();
            (size, key)
        });
        let Err(Error::Rendezvous { problem, .. }) = &size else {
            panic!("{size:?}")
        };
        assert!(
            problem.starts_with("serves a world of 3 ranks"),
            "{problem}"
        );
        let Err(Error::Rendezvous { problem, .. }) = &key else {
            panic!("{key:?}")
        };
        assert!(
            problem.contains("a rendezvous for key k#0 answered, not other#0"),
            "{problem}"
        );
    }

    /// Something that accepts and says nothing is named so at the deadline; something
    /// that answers garbage, as not a rendezvous.
    #[test]
    fn a_silent_or_foreign_server_is_named_at_the_deadline() {
        for (answer, says) in [
            (None, "sent no complete answer in time"),
            (Some(&b"HTTP/1.1 400\n"[..]), "not a rendezvous"),
        ] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for c in l.incoming().flatten() {
                    if let Some(a) = answer {
                        let _ = (&c).write_all(a);
                    }
                    held.push(c);
                }
            });
            let got = Rendezvous::tcp(&addr.to_string())
                .unwrap()
                .timeout(Duration::from_millis(600))
                .exchange_with(1, 2, || unreachable!());
            let Err(Error::Rendezvous { problem, .. }) = &got else {
                panic!("{got:?}")
            };
            assert!(problem.contains(says), "{problem}");
        }
    }

    /// What could not prove the secret is named even when a later attempt met something
    /// else (here: nothing listening any more), and the error is still a refusal.
    #[test]
    fn an_unproven_answer_is_named_beside_the_last_attempt() {
        let (got, _) = pair(
            (Some(1), Duration::from_millis(800)),
            Some(2),
            Duration::from_millis(2500),
        );
        let Err(Error::RendezvousRefused { problem, .. }) = &got else {
            panic!("{got:?}")
        };
        assert!(
            problem.starts_with(
                "did not answer within 2.5s (what answered could not prove it knows the \
                 secret (rank 0 holds another secret, or it is not rank 0); last attempt: "
            ),
            "{problem}"
        );
    }
}
