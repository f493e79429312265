//! The lines of the protocol (see the parent module): what each side says, written and
//! parsed, and the transcript both sides prove over.

use crate::Id;
use crate::decimal::parse_decimal;
use crate::decimal::{hex, unhex};
use crate::proof::{NONCE_LEN, SEALED_LEN, TAG_LEN};

pub(crate) const MAGIC: &str = "nccl-channel-rendezvous";
/// The version of the exchange without a secret.
const PLAIN: u32 = 1;
/// The version of the exchange with a secret.
const SEALED: u32 = 2;
/// The longest line either side reads.
pub(crate) const MAX_LINE: usize = 512;

/// What a connecting rank says first. `nonce` is its nonce with a secret (version 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) key: String,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) nonce: Option<[u8; NONCE_LEN]>,
}

/// What a rank says after its greeting.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum After {
    Proof([u8; TAG_LEN]),
    Ack {
        rank: usize,
        tag: Option<[u8; TAG_LEN]>,
    },
}

/// What rank 0 answers.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Id(Id),
    Key(String),
    Size(usize),
    Rank(usize),
    /// Rank 0 has a secret; the greeting had none.
    Secret,
    Challenge {
        key: String,
        size: usize,
        nonce: [u8; NONCE_LEN],
        tag: [u8; TAG_LEN],
    },
    /// Rank 0 has no secret; the greeting had one.
    NoSecret,
    Sealed(Box<[u8; SEALED_LEN]>),
    Denied,
}

pub(crate) fn hello_line(h: &Hello) -> String {
    match &h.nonce {
        None => format!("{MAGIC} {PLAIN} hello {} {} {}\n", h.key, h.rank, h.size),
        Some(n) => format!(
            "{MAGIC} {SEALED} hello {} {} {} {}\n",
            h.key,
            h.rank,
            h.size,
            hex(n)
        ),
    }
}

pub(crate) fn after_line(a: &After) -> String {
    match a {
        After::Proof(tag) => format!("{MAGIC} {SEALED} proof {}\n", hex(tag)),
        After::Ack { rank, tag: None } => format!("{MAGIC} {PLAIN} ack {rank}\n"),
        After::Ack {
            rank,
            tag: Some(tag),
        } => format!("{MAGIC} {SEALED} ack {rank} {}\n", hex(tag)),
    }
}

pub(crate) fn reply_line(r: &Reply) -> String {
    match r {
        Reply::Id(id) => format!("{MAGIC} {PLAIN} id {}\n", hex(id)),
        Reply::Key(k) => format!("{MAGIC} {PLAIN} key {k}\n"),
        Reply::Size(n) => format!("{MAGIC} {PLAIN} size {n}\n"),
        Reply::Rank(n) => format!("{MAGIC} {PLAIN} rank {n}\n"),
        Reply::Secret => format!("{MAGIC} {PLAIN} secret\n"),
        Reply::Challenge {
            key,
            size,
            nonce,
            tag,
        } => format!(
            "{MAGIC} {SEALED} challenge {key} {size} {} {}\n",
            hex(nonce),
            hex(tag)
        ),
        Reply::NoSecret => format!("{MAGIC} {SEALED} nosecret\n"),
        Reply::Sealed(sealed) => format!("{MAGIC} {SEALED} id {}\n", hex(&sealed[..])),
        Reply::Denied => format!("{MAGIC} {SEALED} denied\n"),
    }
}

/// The version and the words after `MAGIC VERSION`, if the line starts so with a version
/// this side speaks.
pub(crate) fn words(line: &[u8]) -> Option<(u32, Vec<&str>)> {
    let text = std::str::from_utf8(line).ok()?;
    let mut w = text.split(' ');
    if w.next()? != MAGIC {
        return None;
    }
    let version = parse_decimal::<u32>(w.next()?)?;
    matches!(version, PLAIN | SEALED).then(|| (version, w.collect()))
}

/// A key as `Rendezvous` writes one (sanitized, then `#` and the exchange's number):
/// nothing else from the other side reaches an error message.
fn is_key(key: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:/+@#".contains(c);
    !key.is_empty() && key.chars().all(allowed)
}

pub(crate) fn parse_hello(line: &[u8]) -> Option<Hello> {
    let (version, words) = words(line)?;
    let (key, rank, size, nonce) = match (version, words.as_slice()) {
        (PLAIN, ["hello", key, rank, size]) => (key, rank, size, None),
        (SEALED, ["hello", key, rank, size, nonce]) => (key, rank, size, Some(unhex(nonce)?)),
        _ => return None,
    };
    is_key(key).then_some(())?;
    Some(Hello {
        key: key.to_string(),
        rank: parse_decimal(rank)?,
        size: parse_decimal(size)?,
        nonce,
    })
}

pub(crate) fn parse_after(line: &[u8]) -> Option<After> {
    match words(line)? {
        (SEALED, w) => match w.as_slice() {
            ["proof", tag] => Some(After::Proof(unhex(tag)?)),
            ["ack", r, tag] => Some(After::Ack {
                rank: parse_decimal(r)?,
                tag: Some(unhex(tag)?),
            }),
            _ => None,
        },
        (_, w) => match w.as_slice() {
            ["ack", r] => Some(After::Ack {
                rank: parse_decimal(r)?,
                tag: None,
            }),
            _ => None,
        },
    }
}

pub(crate) fn parse_reply(line: &[u8]) -> Option<Reply> {
    match words(line)? {
        (SEALED, w) => match w.as_slice() {
            ["challenge", key, size, nonce, tag] if is_key(key) => Some(Reply::Challenge {
                key: key.to_string(),
                size: parse_decimal(size)?,
                nonce: unhex(nonce)?,
                tag: unhex(tag)?,
            }),
            ["nosecret"] => Some(Reply::NoSecret),
            ["id", sealed] => Some(Reply::Sealed(Box::new(unhex(sealed)?))),
            ["denied"] => Some(Reply::Denied),
            _ => None,
        },
        (_, w) => match w.as_slice() {
            ["id", digits] => unhex(digits).map(Reply::Id),
            ["key", k] if is_key(k) => Some(Reply::Key(k.to_string())),
            ["size", n] => parse_decimal(n).map(Reply::Size),
            ["rank", n] => parse_decimal(n).map(Reply::Rank),
            ["secret"] => Some(Reply::Secret),
            _ => None,
        },
    }
}

/// What both sides prove over: the greeting, rank 0's key and size, both nonces. Keys hold
/// no newline (a line ends there), so the fields cannot be shifted into one another.
pub(crate) fn transcript(
    address: &str,
    hello: &Hello,
    nonce: &[u8; NONCE_LEN],
    server_key: &str,
    server_size: usize,
    server_nonce: &[u8; NONCE_LEN],
) -> Vec<u8> {
    let mut t = format!(
        "{MAGIC} {SEALED}\n{address}\n{}\n{}\n{}\n{server_key}\n{server_size}\n",
        hello.key, hello.rank, hello.size
    )
    .into_bytes();
    t.extend_from_slice(nonce);
    t.extend_from_slice(server_nonce);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_garbage_is_refused() {
        let h = Hello {
            key: "slurm-1.0#2".into(),
            rank: 2,
            size: 3,
            nonce: None,
        };
        let line = hello_line(&h);
        assert_eq!(line, "nccl-channel-rendezvous 1 hello slurm-1.0#2 2 3\n");
        assert_eq!(parse_hello(line.trim_end().as_bytes()), Some(h.clone()));
        let sealed_hello = Hello {
            nonce: Some([0xa5; NONCE_LEN]),
            ..h
        };
        let line = hello_line(&sealed_hello);
        assert_eq!(
            line,
            format!(
                "nccl-channel-rendezvous 2 hello slurm-1.0#2 2 3 {}\n",
                "a5".repeat(32)
            )
        );
        assert_eq!(
            parse_hello(line.trim_end().as_bytes()),
            Some(sealed_hello.clone())
        );
        let id = [0xab; 128];
        for r in [
            Reply::Id(id),
            Reply::Key("k".into()),
            Reply::Size(4),
            Reply::Rank(3),
            Reply::Secret,
            Reply::Challenge {
                key: "k".into(),
                size: 4,
                nonce: [1; NONCE_LEN],
                tag: [2; TAG_LEN],
            },
            Reply::NoSecret,
            Reply::Sealed(Box::new([3; SEALED_LEN])),
            Reply::Denied,
        ] {
            let line = reply_line(&r);
            assert!(line.len() <= MAX_LINE, "{line}");
            assert_eq!(parse_reply(line.trim_end().as_bytes()), Some(r));
        }
        for a in [
            After::Proof([4; TAG_LEN]),
            After::Ack { rank: 2, tag: None },
            After::Ack {
                rank: 2,
                tag: Some([5; TAG_LEN]),
            },
        ] {
            let line = after_line(&a);
            assert_eq!(parse_after(line.trim_end().as_bytes()), Some(a));
        }
        // The longest key with the longest numbers still fits a line.
        let longest = Hello {
            key: "k".repeat(200),
            rank: usize::MAX,
            size: usize::MAX,
            nonce: Some([0; NONCE_LEN]),
        };
        assert!(hello_line(&longest).len() <= MAX_LINE);
        let challenge = Reply::Challenge {
            key: "k".repeat(200),
            size: usize::MAX,
            nonce: [0; NONCE_LEN],
            tag: [0; TAG_LEN],
        };
        assert!(reply_line(&challenge).len() <= MAX_LINE);
        for bad in [
            &b""[..],
            b"GET / HTTP/1.1",
            b"nccl-channel-rendezvous 3 hello k 1 3",
            b"nccl-channel-rendezvous 1 hello k 1",
            b"nccl-channel-rendezvous 1 hello k -1 3",
            b"nccl-channel-rendezvous 1 hello  1 3",
            b"nccl-channel-rendezvous 1 hello k\x1b[2J 1 3",
            b"nccl-channel-rendezvous 1 hello k\r 1 3",
            b"nccl-channel-rendezvous 1 key k\x07",
            b"nccl-channel-rendezvous 2 hello k 1 3",
            b"nccl-channel-rendezvous 2 hello k 1 3 00",
            b"nccl-channel-rendezvous 1 id 00",
            b"nccl-channel-rendezvous 2 id 00",
            b"nccl-channel-rendezvous 2 proof 00",
            b"nccl-channel-rendezvous 2 challenge  1 00 00",
            b"nccl-channel-rendezvous 2 ack 1",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_hello(bad), None, "{bad:?}");
            assert_eq!(parse_reply(bad), None, "{bad:?}");
            assert_eq!(parse_after(bad), None, "{bad:?}");
        }
        // Each version's words only: an id in the clear is no sealed id, and the other way.
        assert_eq!(parse_reply(b"nccl-channel-rendezvous 2 secret"), None);
        assert_eq!(parse_reply(b"nccl-channel-rendezvous 1 nosecret"), None);
        assert_eq!(
            parse_reply(format!("nccl-channel-rendezvous 2 id {}", hex(&id)).as_bytes()),
            None
        );
    }

    #[test]
    fn a_transcript_changes_with_every_field() {
        let h = Hello {
            key: "k".into(),
            rank: 1,
            size: 2,
            nonce: None,
        };
        let t = |h: &Hello, n: u8, k: &str, s: usize, m: u8| {
            transcript("127.0.0.1:1", h, &[n; NONCE_LEN], k, s, &[m; NONCE_LEN])
        };
        let base = t(&h, 1, "k", 2, 2);
        let other_key = Hello {
            key: "j".into(),
            ..h.clone()
        };
        let other_rank = Hello {
            rank: 0,
            ..h.clone()
        };
        let other_size = Hello {
            size: 3,
            ..h.clone()
        };
        for other in [
            t(&other_key, 1, "k", 2, 2),
            t(&other_rank, 1, "k", 2, 2),
            t(&other_size, 1, "k", 2, 2),
            t(&h, 3, "k", 2, 2),
            t(&h, 1, "j", 2, 2),
            t(&h, 1, "k", 3, 2),
            t(&h, 1, "k", 2, 3),
        ] {
            assert_ne!(other, base);
        }
    }
}
