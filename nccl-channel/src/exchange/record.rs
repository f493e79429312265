//! An exchange's record: a mark, the number of the exchange among the communicator's
//! exchanges, and the caller's [`Payload`].

/// What a rank says in an exchange.
pub(crate) const PAYLOAD: usize = 7;

/// What a rank says in an exchange: its caller's words.
pub(crate) type Payload = [u64; PAYLOAD];

/// The record's mark: "nccl-channel exchange" in ASCII, 16 bytes.
const MARK: [u64; 2] = [
    u64::from_be_bytes(*b"nccl-cha"),
    u64::from_be_bytes(*b"nnel-xch"),
];

/// A record's words: the mark (two), the exchange's number, the payload.
pub(crate) const WORDS: usize = 3 + PAYLOAD;

/// One rank's record.
pub(super) fn record(seq: u64, payload: &Payload) -> [u64; WORDS] {
    let mut r = [0; WORDS];
    r[..2].copy_from_slice(&MARK);
    r[2] = seq;
    r[3..].copy_from_slice(payload);
    r
}

/// Every rank's payload from the records in `got`, when each is a record of exchange
/// `seq`; else which rank's is not.
pub(super) fn payloads(
    seq: u64,
    got: &[u64],
    ranks: usize,
) -> std::result::Result<Vec<Payload>, String> {
    if got.len() != WORDS * ranks {
        return Err(format!(
            "{} words came back, not {}",
            got.len(),
            WORDS * ranks
        ));
    }
    got.chunks_exact(WORDS)
        .enumerate()
        .map(|(rank, r)| {
            if r[..2] != MARK || r[2] != seq {
                return Err(format!(
                    "rank {rank}'s record is not of exchange {seq}: the ranks' exchanges are \
                     out of step"
                ));
            }
            let mut p = [0; PAYLOAD];
            p.copy_from_slice(&r[3..]);
            Ok(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn records_of_one_exchange_give_every_ranks_payload() {
        let a = record(3, &[1, 2, 3, 4, 5, 6, 7]);
        let b = record(3, &[7; PAYLOAD]);
        let got = [a, b].concat();
        assert_eq!(
            payloads(3, &got, 2).unwrap(),
            [[1, 2, 3, 4, 5, 6, 7], [7; PAYLOAD]]
        );
    }

    #[test]
    fn a_record_of_another_exchange_or_of_nothing_is_refused() {
        let a = record(3, &[0; PAYLOAD]);
        for (w, v) in [(0, 0), (1, 1), (2, 2), (2, 4)] {
            let mut b = a;
            b[w] = v;
            let e = payloads(3, &[a, b].concat(), 2).unwrap_err();
            assert!(e.starts_with("rank 1's record is not of exchange 3"), "{e}");
        }
        assert!(payloads(3, &a, 2).is_err());
        assert!(payloads(3, &[a, a].concat(), 1).is_err());
    }
}
