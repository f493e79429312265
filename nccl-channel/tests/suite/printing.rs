//! No `Debug` or `Display` of a public type that can hold a unique id or a secret shows
//! their bytes: the id's first 8 bytes are NCCL's bootstrap magic, and whoever reads the
//! id (or the secret) in a log can join or disturb the communicator's setup.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use nccl_channel::{ChannelBuilder, Encryption, IdSource, UniqueId};

/// An id whose bytes are easy to find in any rendering: `a7` in hex, `167` in decimal.
const BYTE: u8 = 0xa7;

/// Fails when `text` shows `BYTE` as hex digits (either case) or as a decimal number.
fn assert_hidden(what: &str, text: &str) {
    let lower = text.to_lowercase();
    assert!(
        !lower.contains("a7a7"),
        "{what} shows the bytes as hex: {text}"
    );
    assert!(
        !text.contains("167"),
        "{what} shows the bytes as numbers: {text}"
    );
}

#[test]
fn no_debug_of_an_id_or_of_what_holds_one_shows_its_bytes() {
    let id = UniqueId([BYTE; 128]);
    assert_eq!(format!("{id:?}"), "UniqueId(..)");
    assert_hidden("UniqueId", &format!("{id:?} {id:#?}"));
    let given = IdSource::Given(id);
    assert_hidden("IdSource::Given", &format!("{given:?} {given:#?}"));
    let builder = ChannelBuilder::new().unique_id(IdSource::Given(id));
    assert_hidden("ChannelBuilder", &format!("{builder:?} {builder:#?}"));
    let file = IdSource::File {
        path: "/tmp/id".into(),
        timeout: Duration::from_secs(1),
    };
    assert_hidden("IdSource::File", &format!("{file:?}"));
    // Its hex digits are there for the program that asks for them, and read back.
    assert_eq!(id.to_hex(), "a7".repeat(128));
    assert_eq!(id.to_hex().parse::<UniqueId>().unwrap(), id);
}

#[test]
fn no_debug_of_a_key_shows_it() {
    let key = Encryption::Psk("a7".repeat(16));
    assert_eq!(format!("{key:?}"), "Psk(..)");
    assert_hidden("Encryption", &format!("{key:#?}"));
}

#[cfg(feature = "rendezvous")]
#[test]
fn no_debug_or_display_of_a_secret_or_of_what_holds_one_shows_it() {
    use nccl_channel::{Rendezvous, RendezvousSecret};
    let secret = RendezvousSecret::new(vec![BYTE; 32]).unwrap();
    let hex = RendezvousSecret::new("a7".repeat(16)).unwrap();
    for s in [&secret, &hex] {
        assert_eq!(format!("{s:?}"), "RendezvousSecret(..)");
        assert_hidden("RendezvousSecret", &format!("{s:#?}"));
        let psk = Encryption::derived_from(s);
        assert_hidden("Encryption::derived_from", &format!("{psk:?}"));
        let rdv = Rendezvous::tcp("127.0.0.1:29500")
            .unwrap()
            .secret(s.clone())
            .encrypt_nccl(true);
        for text in [format!("{rdv:?}"), format!("{rdv:#?}"), rdv.to_string()] {
            assert_hidden("Rendezvous", &text);
        }
        let inner = rdv.as_inner();
        assert_hidden("nccl_rendezvous::Rendezvous", &format!("{inner:?} {inner}"));
        let source = IdSource::Rendezvous(rdv.clone());
        assert_hidden("IdSource::Rendezvous", &format!("{source:?}"));
        let builder = ChannelBuilder::new().unique_id(IdSource::Rendezvous(rdv));
        assert_hidden("ChannelBuilder", &format!("{builder:#?}"));
    }
}
