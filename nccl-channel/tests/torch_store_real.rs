//! nccl-channel's TCPStore client against real torch TCPStore servers, libuv and legacy
//! backends, started by `tests/torch_store_server.py` with the python that `TORCH_PY`
//! names (any torch from 2.4 on; torch 2.4 has no PING, which this client must not need).
//! Ignored by default; run with `TORCH_PY=/path/to/python3 cargo test -p nccl-channel
//! --all-features --test torch_store_real -- --ignored`. Run without `TORCH_PY`, it fails
//! rather than passing without having checked anything.
#![cfg(feature = "mock")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use nccl_channel::{Rendezvous, UniqueId};

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
        let mut child = Command::new(&py)
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

    /// How many keys the store holds, and whether each of `keys` is there, as torch's own
    /// client sees them.
    fn check(&mut self, keys: &[String]) -> (usize, Vec<bool>) {
        writeln!(self.stdin, "{}", keys.join(" ")).unwrap();
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
