//! nccl-channel's own rendezvous: rank 0 listens and serves the id; the others connect.
//!
//! One line at a time each way, ASCII, at most [`MAX_LINE`] bytes. Without a secret
//! (version 1):
//!
//! ```text
//! rank r  → rank 0:  nccl-channel-rendezvous 1 hello <key> <rank> <size>
//! rank 0  → rank r:  nccl-channel-rendezvous 1 id <256 hex digits>   (same key, size and a valid rank)
//!                    nccl-channel-rendezvous 1 key <rank 0's key>    (another job or channel)
//!                    nccl-channel-rendezvous 1 size <rank 0's size>  (the ranks disagree)
//!                    nccl-channel-rendezvous 1 rank <rank 0's size>  (rank 0 or out of range)
//!                    nccl-channel-rendezvous 1 secret                (rank 0 has a secret)
//! rank r  → rank 0:  nccl-channel-rendezvous 1 ack <rank>            (after an id)
//! ```
//!
//! With a [secret](crate::RendezvousSecret) (version 2), each side proves it knows the
//! secret on the other's fresh nonce before the id, sealed, is sent:
//!
//! ```text
//! rank r  → rank 0:  nccl-channel-rendezvous 2 hello <key> <rank> <size> <nonce r>
//! rank 0  → rank r:  nccl-channel-rendezvous 2 challenge <rank 0's key> <rank 0's size> <nonce 0> <rank 0's proof>
//!                    nccl-channel-rendezvous 2 nosecret              (rank 0 has no secret)
//! rank r  → rank 0:  nccl-channel-rendezvous 2 proof <rank r's proof>   (key, size and rank agree)
//! rank 0  → rank r:  nccl-channel-rendezvous 2 id <the id, sealed: 288 hex digits>
//!                    nccl-channel-rendezvous 2 denied                (the proof is wrong)
//! rank r  → rank 0:  nccl-channel-rendezvous 2 ack <rank> <rank r's proof of the id>
//! ```
//!
//! Nonces and proofs are 64 hex digits (32 bytes). A proof is HMAC-SHA256, under a key
//! derived from the secret, over the role (rank 0, rank r, the ack) and the transcript:
//! the greeting's key, rank and size, rank 0's key and size, and both nonces. The id is
//! sealed with ChaCha20-Poly1305 under a key derived from the secret and the transcript,
//! which it also authenticates. Rank r checks rank 0's proof before it proves anything
//! itself or believes rank 0's key and size; so a recording of an exchange is worth
//! nothing in another (the other side's nonce differs), and a peer without the secret
//! learns no more than the key and world size, which are no secrets.
//!
//! A peer that sends anything else, or does not finish its lines within
//! [`STEP`](super::net::STEP) of connecting, is dropped and rank 0 goes on serving; so is
//! one that says `hello` with another world size (it is told rank 0's, and fails at once
//! on its side), and one that cannot prove it knows the secret (said on rank 0's stderr,
//! the first few times): no single connection can make rank 0 fail, only its deadline can,
//! and that error names what it saw. A rank that meets a server of another key keeps
//! retrying (an earlier channel or another job may still hold the port) until its
//! deadline, which then says that a foreign key answered.

mod conversation;
mod receive;
mod serve;
mod wire;

pub(crate) use receive::receive;
pub(crate) use serve::serve;
