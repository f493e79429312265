//! nccl-channel's TCPStore client against real torch TCPStore servers, libuv and legacy
//! backends, started by `tests/torch_store_server.py` with the python that `TORCH_PY`
//! names (any torch from 2.4 on; torch 2.4 has no PING, which this client must not need).
//! Ignored by default; run with `TORCH_PY=/path/to/python3 cargo test -p nccl-channel
//! --all-features --test suite torch_store_real -- --ignored`. Run without `TORCH_PY`, it fails
//! rather than passing without having checked anything.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use nccl_channel::{Rendezvous, UniqueId};

use test_support::env;

/// A torch TCPStore server in a python process, stopped when dropped.
struct TorchStore {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    port: u16,
}

impl TorchStore {
    fn start(libuv: bool) -> TorchStore {
        let py = std::env::var("TORCH_PY").unwrap_or_else(|_| {
            panic!(
                "TORCH_PY is not set: set it to a python3 with torch (2.4 or newer), e.g. \
                 TORCH_PY=/opt/torch/.venv/bin/python3"
            )
        });
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/torch_store_server.py");
        let mut child = env::scrubbed(&py)
            .args([script, if libuv { "1" } else { "0" }])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {py} {script}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{script} printed {line:?}, not a port"));
        TorchStore {
            child,
            stdin,
            stdout,
            port,
        }
    }

    /// How many keys the store holds, and whether each of `keys` (as on the wire) is there,
    /// as torch's own client sees them. Torch's client puts `/` before every key it is
    /// given, so it is asked for each key without its leading `/`.
    fn check(&mut self, keys: &[String]) -> (usize, Vec<bool>) {
        let asked: Vec<&str> = keys
            .iter()
            .map(|k| k.strip_prefix('/').expect("keys here start with /"))
            .collect();
        writeln!(self.stdin, "{}", asked.join(" ")).unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let mut words = line.split_whitespace();
        let n = words.next().unwrap().parse().unwrap();
        (n, words.map(|w| w == "present").collect())
    }
}

impl Drop for TorchStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three ranks agree on an id through the store, twice under the same key (a second
/// program under the same torchrun attempt: the address spelled differently restarts the
/// per-process numbering), and the store is empty after each.
fn exchange_twice(libuv: bool) {
    let mut store = TorchStore::start(libuv);
    for (round, host) in [(1u8, "127.0.0.1"), (2, "localhost")] {
        let rdv = Rendezvous::torch_store(&format!("{host}:{}", store.port))
            .unwrap()
            .key("real")
            .timeout(Duration::from_secs(20));
        let ids: Vec<UniqueId> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let rdv = &rdv;
                    // The later ranks come first, so they wait for rank 0's id.
                    s.spawn(move || {
                        if r == 0 {
                            std::thread::sleep(Duration::from_millis(300));
                        }
                        rdv.exchange_with(r, 3, || Ok(UniqueId([round; 128])))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        assert_eq!(ids, vec![UniqueId([round; 128]); 3], "round {round}");
        let key = "/nccl-channel/real#0";
        let keys = [
            key.to_string(),
            format!("{key}/ack/1"),
            format!("{key}/ack/2"),
        ];
        assert_eq!(store.check(&keys), (0, vec![false; 3]), "round {round}");
    }
}

/// Sets `key` to `value` with a raw client of the store's protocol (VALIDATE, then SET),
/// as a rank of an earlier exchange acknowledging late would.
fn raw_set(port: u16, key: &str, value: &[u8]) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut buf = vec![0u8];
    buf.extend_from_slice(&0x3C85_F7CEu32.to_ne_bytes());
    buf.push(1);
    for s in [key.as_bytes(), value] {
        buf.extend_from_slice(&(s.len() as u64).to_ne_bytes());
        buf.extend_from_slice(s);
    }
    c.write_all(&buf).unwrap();
    // The store has the key once a later request on this connection is answered: CHECK.
    c.write_all(&[5]).unwrap();
    c.write_all(&1u64.to_ne_bytes()).unwrap();
    c.write_all(&(key.len() as u64).to_ne_bytes()).unwrap();
    c.write_all(key.as_bytes()).unwrap();
    let mut answer = [9u8];
    std::io::Read::read_exact(&mut c, &mut answer).unwrap();
    assert_eq!(answer, [0], "{key} not set");
}

/// Rank 0's paths other than the plain one, against the real store: a rank that never
/// comes (rank 0's wait runs out; it asks on a fresh connection with CHECK and GET, names
/// the rank, and removes its id); an ack with another nonce written after rank 0 stored
/// the id (rank 0 reads it again until this exchange's rank overwrites it).
fn missing_rank_and_foreign_ack(libuv: bool) {
    let mut store = TorchStore::start(libuv);
    let port = store.port;
    let rdv = Rendezvous::torch_store(&format!("127.0.0.1:{port}"))
        .unwrap()
        .key("paths")
        .timeout(Duration::from_millis(1500));
    let (r0, r1) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 3, || Ok(UniqueId([9; 128]))));
        let r1 = s.spawn(|| rdv.exchange_with(1, 3, || unreachable!()));
        (r0.join().unwrap(), r1.join().unwrap())
    });
    assert_eq!(r1.unwrap(), UniqueId([9; 128]));
    let e = r0.unwrap_err().to_string();
    assert!(
        e.ends_with("did not see rank 2 take the id (key /nccl-channel/paths#0) within 1.5s"),
        "{e}"
    );
    let key = "/nccl-channel/paths#0";
    let keys = [
        key.to_string(),
        format!("{key}/ack/1"),
        format!("{key}/ack/2"),
    ];
    assert_eq!(store.check(&keys), (0, vec![false; 3]));

    let rdv = Rendezvous::torch_store(&format!("localhost:{port}"))
        .unwrap()
        .key("paths")
        .timeout(Duration::from_secs(20));
    let (r0, r1) = std::thread::scope(|s| {
        let r0 = s.spawn(|| rdv.exchange_with(0, 2, || Ok(UniqueId([10; 128]))));
        let t = Instant::now();
        while !store.check(&[key.to_string()]).1[0] {
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(10));
        }
        raw_set(port, &format!("{key}/ack/1"), b"0123456789abcdef");
        std::thread::sleep(Duration::from_millis(500));
        assert!(!r0.is_finished(), "rank 0 counted the foreign ack");
        let r1 = s.spawn(|| rdv.exchange_with(1, 2, || unreachable!()));
        (r0.join().unwrap(), r1.join().unwrap())
    });
    assert_eq!(r0.unwrap(), UniqueId([10; 128]));
    assert_eq!(r1.unwrap(), UniqueId([10; 128]));
    assert_eq!(store.check(&keys[..2]), (0, vec![false; 2]));
}

#[test]
#[ignore = "needs torch: set TORCH_PY"]
fn a_real_torch_store_libuv() {
    exchange_twice(true);
}

#[test]
#[ignore = "needs torch: set TORCH_PY"]
fn a_real_torch_store_legacy() {
    exchange_twice(false);
}

#[test]
#[ignore = "needs torch: set TORCH_PY"]
fn a_real_torch_store_libuv_other_paths() {
    missing_rank_and_foreign_ack(true);
}

#[test]
#[ignore = "needs torch: set TORCH_PY"]
fn a_real_torch_store_legacy_other_paths() {
    missing_rank_and_foreign_ack(false);
}
