//! Rank 0's side of one connection, as a state machine of lines: a line in, at most one
//! line out, until the connection comes to an [`Outcome`]. No sockets here (serve.rs
//! drives many at once), so every path is testable line by line.

use std::net::SocketAddr;
use std::sync::Arc;

use super::wire::{After, Hello, Reply, parse_after, parse_hello, reply_line, transcript};
use crate::Id;
use crate::net::describe;
use crate::proof::{Keys, NONCE_LEN, Role, nonce};

/// What rank 0 serves, the same for every connection of one exchange.
pub(crate) struct Offer {
    /// The rendezvous's address as the ranks name it, bound into every transcript.
    pub(crate) address: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) size: usize,
    pub(crate) id: Id,
    pub(crate) keys: Option<Keys>,
}

/// What one connection came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// That rank has the id and confirmed it.
    Served(usize),
    /// A greeting with this key and another world size (told rank 0's).
    WrongSize { rank: usize, size: usize },
    /// Not one of this exchange's ranks, or one that went away: why.
    Ignored(String),
    /// Refused for the secret (none, another, a wrong proof): why. Said on stderr.
    Refused(String),
}

/// Where a connection stands.
enum State {
    Greeting,
    /// Rank 0 proved itself; the rank's proof is awaited.
    Proof {
        rank: usize,
        transcript: Vec<u8>,
    },
    /// The id was sent; its ack is awaited (with a secret, proved over the transcript).
    Ack {
        rank: usize,
        transcript: Option<Vec<u8>>,
    },
    Done,
}

/// One connection's exchange.
pub(crate) struct Conversation {
    peer: SocketAddr,
    state: State,
}

/// What a line made rank 0 do: a reply to send (before closing, when the outcome is
/// there too) and the connection's outcome once it has one.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) reply: Option<String>,
    pub(crate) outcome: Option<Outcome>,
}

impl Step {
    fn reply(reply: Reply) -> Step {
        Step {
            reply: Some(reply_line(&reply)),
            outcome: None,
        }
    }

    fn last(reply: Option<Reply>, outcome: Outcome) -> Step {
        Step {
            reply: reply.map(|r| reply_line(&r)),
            outcome: Some(outcome),
        }
    }
}

impl Conversation {
    pub(crate) fn new(peer: SocketAddr) -> Conversation {
        Conversation {
            peer,
            state: State::Greeting,
        }
    }

    /// Takes one line the peer sent (without its `\n`).
    pub(crate) fn on_line(&mut self, line: &[u8], offer: &Offer) -> Step {
        let peer = self.peer;
        match std::mem::replace(&mut self.state, State::Done) {
            State::Greeting => self.on_hello(line, offer),
            State::Proof { rank, transcript } => {
                let Some(After::Proof(tag)) = parse_after(line) else {
                    return Step::last(None, self.garbage(line));
                };
                let Some(keys) = &offer.keys else {
                    return Step::last(None, self.garbage(line));
                };
                if !keys.verify(Role::Client, &transcript, &tag) {
                    return Step::last(
                        Some(Reply::Denied),
                        Outcome::Refused(format!(
                            "{peer} (rank {rank}) proved a secret other than rank 0's"
                        )),
                    );
                }
                let sealed = keys.seal(&transcript, &offer.id);
                self.state = State::Ack {
                    rank,
                    transcript: Some(transcript),
                };
                Step::reply(Reply::Sealed(Box::new(sealed)))
            }
            State::Ack { rank, transcript } => {
                let confirmed = match (parse_after(line), &transcript, &offer.keys) {
                    (Some(After::Ack { rank: r, tag: None }), None, None) => r == rank,
                    (
                        Some(After::Ack {
                            rank: r,
                            tag: Some(tag),
                        }),
                        Some(t),
                        Some(keys),
                    ) => r == rank && keys.verify(Role::Ack, t, &tag),
                    _ => false,
                };
                Step::last(
                    None,
                    match confirmed {
                        true => Outcome::Served(rank),
                        false => {
                            Outcome::Ignored(format!("{peer} (rank {rank}) did not confirm the id"))
                        }
                    },
                )
            }
            State::Done => Step::last(None, Outcome::Ignored(format!("{peer}: already done"))),
        }
    }

    fn on_hello(&mut self, line: &[u8], offer: &Offer) -> Step {
        let peer = self.peer;
        let Some(hello) = parse_hello(line) else {
            return Step::last(None, self.garbage(line));
        };
        // Another job's or channel's rank first, whatever its secret: told rank 0's key
        // (no secret), it goes on trying until its own rank 0 answers.
        if hello.key != *offer.key {
            return Step::last(
                Some(Reply::Key(offer.key.to_string())),
                Outcome::Ignored(format!("{peer} asked for key {}", hello.key)),
            );
        }
        match (&hello.nonce, &offer.keys) {
            (None, None) => self.plain(hello, offer),
            (Some(n), Some(keys)) => self.challenge(&hello, n, keys, offer),
            (None, Some(_)) => Step::last(
                Some(Reply::Secret),
                Outcome::Refused(format!(
                    "{peer} (rank {}) has no secret, and rank 0 has one",
                    hello.rank
                )),
            ),
            (Some(_), None) => Step::last(
                Some(Reply::NoSecret),
                Outcome::Refused(format!(
                    "{peer} (rank {}) has a secret, and rank 0 has none",
                    hello.rank
                )),
            ),
        }
    }

    /// Version 1: the id, or why not.
    fn plain(&mut self, hello: Hello, offer: &Offer) -> Step {
        let peer = self.peer;
        if hello.size != offer.size {
            return Step::last(
                Some(Reply::Size(offer.size)),
                Outcome::WrongSize {
                    rank: hello.rank,
                    size: hello.size,
                },
            );
        }
        if hello.rank == 0 || hello.rank >= offer.size {
            return Step::last(
                Some(Reply::Rank(offer.size)),
                Outcome::Ignored(format!("{peer} claimed rank {}", hello.rank)),
            );
        }
        self.state = State::Ack {
            rank: hello.rank,
            transcript: None,
        };
        Step::reply(Reply::Id(offer.id))
    }

    /// Version 2: rank 0's key, size and proof; the rank decides from them (they are
    /// proved) whether to go on.
    fn challenge(
        &mut self,
        hello: &Hello,
        their_nonce: &[u8; NONCE_LEN],
        keys: &Keys,
        offer: &Offer,
    ) -> Step {
        let peer = self.peer;
        let ours = match nonce() {
            Ok(n) => n,
            Err(e) => return Step::last(None, Outcome::Ignored(format!("{peer}: {e}"))),
        };
        let transcript = transcript(
            &offer.address,
            hello,
            their_nonce,
            &offer.key,
            offer.size,
            &ours,
        );
        let reply = Reply::Challenge {
            key: offer.key.to_string(),
            size: offer.size,
            nonce: ours,
            tag: keys.prove(Role::Server, &transcript),
        };
        let text = reply_line(&reply);
        let done = |o| Step {
            reply: Some(text.clone()),
            outcome: Some(o),
        };
        if hello.size != offer.size {
            return done(Outcome::WrongSize {
                rank: hello.rank,
                size: hello.size,
            });
        }
        if hello.rank == 0 || hello.rank >= offer.size {
            return done(Outcome::Ignored(format!(
                "{peer} claimed rank {}",
                hello.rank
            )));
        }
        self.state = State::Proof {
            rank: hello.rank,
            transcript,
        };
        Step {
            reply: Some(text),
            outcome: None,
        }
    }

    /// Whether the peer has not completed its greeting yet.
    pub(crate) fn greeting(&self) -> bool {
        matches!(self.state, State::Greeting)
    }

    /// Whether rank 0 sent the id and waits for its ack: `Some(true)` when the peer proved
    /// it holds the secret, `Some(false)` without a secret, `None` before the id.
    pub(crate) fn awaits_ack(&self) -> Option<bool> {
        match &self.state {
            State::Ack { transcript, .. } => Some(transcript.is_some()),
            _ => None,
        }
    }

    /// The connection ended (closed, timed out, cut off) before an outcome: what that
    /// says of the peer.
    pub(crate) fn on_end(&self, why: &str) -> Outcome {
        let peer = self.peer;
        match &self.state {
            State::Greeting => Outcome::Ignored(format!("{peer}: {why}")),
            // A rank with another secret finds rank 0's proof wrong and goes away.
            State::Proof { rank, .. } => Outcome::Refused(format!(
                "{peer} (rank {rank}) gave no proof of the secret ({why}): it holds \
                 another secret, is no rank of this job, or gave up"
            )),
            State::Ack { rank, .. } => Outcome::Ignored(format!(
                "{peer} (rank {rank}) did not confirm the id ({why})"
            )),
            State::Done => Outcome::Ignored(format!("{peer}: {why}")),
        }
    }

    fn garbage(&self, line: &[u8]) -> Outcome {
        Outcome::Ignored(format!("{} sent {}", self.peer, describe(line)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::{After, after_line, hello_line, parse_reply};
    use super::*;
    use crate::secret::RendezvousSecret;

    fn offer(secret: Option<u8>) -> Offer {
        Offer {
            address: Arc::from("127.0.0.1:1"),
            key: Arc::from("k#0"),
            size: 3,
            id: [7; 128],
            keys: secret.map(|b| Keys::new(&RendezvousSecret::new([b; 16]).unwrap())),
        }
    }

    fn peer() -> SocketAddr {
        "127.0.0.1:4000".parse().unwrap()
    }

    fn line(s: &str) -> &[u8] {
        s.trim_end().as_bytes()
    }

    fn hello(rank: usize, size: usize, nonce: Option<[u8; NONCE_LEN]>) -> String {
        hello_line(&Hello {
            key: "k#0".into(),
            rank,
            size,
            nonce,
        })
    }

    #[test]
    fn without_a_secret_a_rank_gets_the_id_and_is_served_on_its_ack() {
        let o = offer(None);
        let mut s = Conversation::new(peer());
        let step = s.on_line(line(&hello(1, 3, None)), &o);
        assert_eq!(
            parse_reply(line(step.reply.as_deref().unwrap())),
            Some(Reply::Id(o.id))
        );
        assert_eq!(step.outcome, None);
        let ack = after_line(&After::Ack { rank: 1, tag: None });
        assert_eq!(s.on_line(line(&ack), &o).outcome, Some(Outcome::Served(1)));
    }

    #[test]
    fn with_a_secret_the_id_is_sealed_after_both_proofs() {
        let o = offer(Some(1));
        let keys = Keys::new(&RendezvousSecret::new([1u8; 16]).unwrap());
        let mine = [9u8; NONCE_LEN];
        let mut s = Conversation::new(peer());
        let step = s.on_line(line(&hello(2, 3, Some(mine))), &o);
        let Some(Reply::Challenge {
            key,
            size,
            nonce,
            tag,
        }) = parse_reply(line(step.reply.as_deref().unwrap()))
        else {
            panic!("{step:?}")
        };
        let h = Hello {
            key: "k#0".into(),
            rank: 2,
            size: 3,
            nonce: Some(mine),
        };
        let t = transcript("127.0.0.1:1", &h, &mine, &key, size, &nonce);
        assert!(keys.verify(Role::Server, &t, &tag));
        // Rank 0's own proof sent back (in the same exchange, over the same transcript) is
        // no proof of the rank's.
        let mut reflected = Conversation {
            peer: peer(),
            state: State::Proof {
                rank: 2,
                transcript: t.clone(),
            },
        };
        let step = reflected.on_line(line(&after_line(&After::Proof(tag))), &o);
        assert!(
            matches!(step.outcome, Some(Outcome::Refused(_))),
            "{step:?}"
        );
        assert_eq!(
            parse_reply(line(step.reply.as_deref().unwrap())),
            Some(Reply::Denied)
        );
        let proof = after_line(&After::Proof(keys.prove(Role::Client, &t)));
        let step = s.on_line(line(&proof), &o);
        let Some(Reply::Sealed(sealed)) = parse_reply(line(step.reply.as_deref().unwrap())) else {
            panic!("{step:?}")
        };
        assert_eq!(keys.open(&t, &sealed[..]), Some(o.id));
        // An ack proved over another transcript does not count.
        let mut other = t.clone();
        other.push(0);
        let bad_ack = after_line(&After::Ack {
            rank: 2,
            tag: Some(keys.prove(Role::Ack, &other)),
        });
        let mut copy = Conversation {
            peer: peer(),
            state: State::Ack {
                rank: 2,
                transcript: Some(t.clone()),
            },
        };
        assert!(matches!(
            copy.on_line(line(&bad_ack), &o).outcome,
            Some(Outcome::Ignored(_))
        ));
        let ack = after_line(&After::Ack {
            rank: 2,
            tag: Some(keys.prove(Role::Ack, &t)),
        });
        assert_eq!(s.on_line(line(&ack), &o).outcome, Some(Outcome::Served(2)));
    }

    #[test]
    fn a_proof_of_another_secret_is_denied() {
        let o = offer(Some(1));
        let wrong = Keys::new(&RendezvousSecret::new([2u8; 16]).unwrap());
        let mine = [9u8; NONCE_LEN];
        let mut s = Conversation::new(peer());
        let step = s.on_line(line(&hello(1, 3, Some(mine))), &o);
        let Some(Reply::Challenge {
            key, size, nonce, ..
        }) = parse_reply(line(step.reply.as_deref().unwrap()))
        else {
            panic!("{step:?}")
        };
        let h = Hello {
            key: "k#0".into(),
            rank: 1,
            size: 3,
            nonce: Some(mine),
        };
        let t = transcript("127.0.0.1:1", &h, &mine, &key, size, &nonce);
        let step = s.on_line(
            line(&after_line(&After::Proof(wrong.prove(Role::Client, &t)))),
            &o,
        );
        assert_eq!(
            parse_reply(line(step.reply.as_deref().unwrap())),
            Some(Reply::Denied)
        );
        assert!(matches!(step.outcome, Some(Outcome::Refused(_))));
    }

    #[test]
    fn a_greeting_of_the_other_kind_is_refused_and_told_why() {
        let step = Conversation::new(peer()).on_line(line(&hello(1, 3, None)), &offer(Some(1)));
        assert_eq!(
            parse_reply(line(step.reply.as_deref().unwrap())),
            Some(Reply::Secret)
        );
        assert!(matches!(step.outcome, Some(Outcome::Refused(_))));
        let step = Conversation::new(peer())
            .on_line(line(&hello(1, 3, Some([1; NONCE_LEN]))), &offer(None));
        assert_eq!(
            parse_reply(line(step.reply.as_deref().unwrap())),
            Some(Reply::NoSecret)
        );
        assert!(matches!(step.outcome, Some(Outcome::Refused(_))));
    }

    #[test]
    fn mismatches_are_answered_and_end_the_connection() {
        for secret in [None, Some(1)] {
            let o = offer(secret);
            let nonce = secret.map(|_| [1; NONCE_LEN]);
            let step = Conversation::new(peer()).on_line(line(&hello(1, 4, nonce)), &o);
            assert_eq!(step.outcome, Some(Outcome::WrongSize { rank: 1, size: 4 }));
            assert!(step.reply.is_some());
            for rank in [0, 3] {
                let step = Conversation::new(peer()).on_line(line(&hello(rank, 3, nonce)), &o);
                assert!(
                    matches!(step.outcome, Some(Outcome::Ignored(_))),
                    "{step:?}"
                );
                assert!(step.reply.is_some());
            }
            let other_key = hello_line(&Hello {
                key: "j".into(),
                rank: 1,
                size: 3,
                nonce,
            });
            let step = Conversation::new(peer()).on_line(line(&other_key), &o);
            assert!(matches!(step.outcome, Some(Outcome::Ignored(_))));
            let step = Conversation::new(peer()).on_line(b"GET / HTTP/1.1", &o);
            assert_eq!(
                step,
                Step::last(
                    None,
                    Outcome::Ignored(format!("{} sent \"GET / HTTP/1.1\"", peer()))
                )
            );
        }
    }
}
