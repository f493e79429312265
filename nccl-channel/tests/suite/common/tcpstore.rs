//! A minimal server side of PyTorch's TCPStore protocol (as torchrun's agent hosts it), for
//! testing nccl-channel's client without torch: the libuv server's rules (the first query
//! must be VALIDATE with the magic number, else nothing is answered), and the queries the
//! client uses: SET, GET, CHECK, WAIT, DELETE_KEY. Like torch 2.4 and older it knows no
//! PING (query 13): an unknown query closes the connection, as both of torch's servers do.
//! Integers in the host's byte order, strings as a u64 length and the bytes (torch's
//! TCPStore.cpp / TCPStoreBackend.hpp).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const DELETE_KEY: u8 = 8;
const MAGIC: u32 = 0x3C85_F7CE;

/// Misbehaviours a test can ask of the store.
#[derive(Debug, Default, Clone, Copy)]
pub struct Faults {
    /// A WAIT for acknowledgements only (every key holds `/ack/`) is never answered (until
    /// the client goes): rank 0's wait runs out although the acks are there.
    pub ack_waits_never_end: bool,
    /// A DELETE_KEY of a key that holds a value closes the connection instead of answering
    /// (deleting an absent key is answered 0 as usual).
    pub refuse_deleting_present_keys: bool,
    /// A CHECK of an acknowledgement closes the connection instead of answering.
    pub ack_checks_fail: bool,
    /// Every WAIT closes the connection instead of answering.
    pub waits_fail: bool,
}

#[derive(Default)]
struct State {
    faults: Faults,
    data: Mutex<BTreeMap<String, Vec<u8>>>,
    changed: Condvar,
    /// Queries seen, by name, in order (VALIDATE, SET key, ...).
    log: Mutex<Vec<String>>,
}

/// A TCPStore server on 127.0.0.1 (an ephemeral port), serving until the process ends.
pub struct TestStore {
    pub port: u16,
    state: Arc<State>,
}

impl TestStore {
    pub fn start() -> TestStore {
        Self::start_with(Faults::default())
    }

    /// A store that misbehaves as `faults` says.
    pub fn start_with(faults: Faults) -> TestStore {
        Self::serve_on(TcpListener::bind("127.0.0.1:0").unwrap(), faults)
    }

    /// A store on `port` of 127.0.0.1 (one that comes up after the ranks started).
    pub fn start_on(port: u16) -> TestStore {
        Self::serve_on(
            TcpListener::bind(("127.0.0.1", port)).unwrap(),
            Faults::default(),
        )
    }

    fn serve_on(listener: TcpListener, faults: Faults) -> TestStore {
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            faults,
            ..State::default()
        });
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        TestStore { port, state }
    }

    /// The keys stored, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.state.data.lock().unwrap().keys().cloned().collect()
    }

    pub fn value(&self, key: &str) -> Option<Vec<u8>> {
        self.state.data.lock().unwrap().get(key).cloned()
    }

    pub fn set(&self, key: &str, value: &[u8]) {
        self.state
            .data
            .lock()
            .unwrap()
            .insert(key.into(), value.to_vec());
        self.state.changed.notify_all();
    }

    /// The queries seen so far.
    pub fn log(&self) -> Vec<String> {
        self.state.log.lock().unwrap().clone()
    }
}

fn read_n<const N: usize>(c: &mut TcpStream) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    c.read_exact(&mut b).ok()?;
    Some(b)
}

fn read_u64(c: &mut TcpStream) -> Option<u64> {
    read_n::<8>(c).map(u64::from_ne_bytes)
}

fn read_bytes(c: &mut TcpStream) -> Option<Vec<u8>> {
    let len = read_u64(c)?;
    if len > 1 << 20 {
        return None;
    }
    let mut v = vec![0u8; len as usize];
    c.read_exact(&mut v).ok()?;
    Some(v)
}

fn read_key(c: &mut TcpStream) -> Option<String> {
    String::from_utf8(read_bytes(c)?).ok()
}

fn read_keys(c: &mut TcpStream) -> Option<Vec<String>> {
    let n = read_u64(c)?;
    if n > 1024 {
        return None;
    }
    (0..n).map(|_| read_key(c)).collect()
}

/// Whether the client closed its end (a read would say end of file at once).
fn gone(c: &TcpStream) -> bool {
    if c.set_nonblocking(true).is_err() {
        return true;
    }
    let closed = match c.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    closed || c.set_nonblocking(false).is_err()
}

fn serve(mut c: TcpStream, s: &State) -> Option<()> {
    let log = |what: String| s.log.lock().unwrap().push(what);
    // The libuv server answers nothing before a valid VALIDATE.
    if read_n::<1>(&mut c)?[0] != VALIDATE || u32::from_ne_bytes(read_n::<4>(&mut c)?) != MAGIC {
        log("refused".into());
        return None;
    }
    log("VALIDATE".into());
    loop {
        let q = read_n::<1>(&mut c)?[0];
        match q {
            DELETE_KEY => {
                let key = read_key(&mut c)?;
                if s.faults.refuse_deleting_present_keys
                    && s.data.lock().unwrap().contains_key(&key)
                {
                    log(format!("DELETE refused {key}"));
                    return None;
                }
                log(format!("DELETE {key}"));
                let removed = s.data.lock().unwrap().remove(&key).is_some();
                c.write_all(&i64::from(removed).to_ne_bytes()).ok()?;
            }
            SET => {
                let key = read_key(&mut c)?;
                let value = read_bytes(&mut c)?;
                log(format!("SET {key}"));
                s.data.lock().unwrap().insert(key, value);
                s.changed.notify_all();
            }
            GET => {
                let key = read_key(&mut c)?;
                log(format!("GET {key}"));
                let value = s
                    .data
                    .lock()
                    .unwrap()
                    .get(&key)
                    .cloned()
                    .unwrap_or_default();
                let mut out = (value.len() as u64).to_ne_bytes().to_vec();
                out.extend_from_slice(&value);
                c.write_all(&out).ok()?;
            }
            CHECK => {
                let keys = read_keys(&mut c)?;
                log(format!("CHECK {}", keys.join(",")));
                if s.faults.ack_checks_fail && keys.iter().any(|k| k.contains("/ack/")) {
                    return None;
                }
                let data = s.data.lock().unwrap();
                let ready = keys.iter().all(|k| data.contains_key(k));
                drop(data);
                c.write_all(&[if ready { 0 } else { 1 }]).ok()?;
            }
            WAIT => {
                let keys = read_keys(&mut c)?;
                log(format!("WAIT {}", keys.join(",")));
                if s.faults.waits_fail {
                    return None;
                }
                if s.faults.ack_waits_never_end && keys.iter().all(|k| k.contains("/ack/")) {
                    while !gone(&c) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    log(format!("WAIT abandoned {}", keys.join(",")));
                    return None;
                }
                let mut data = s.data.lock().unwrap();
                while !keys.iter().all(|k| data.contains_key(k)) {
                    data = s
                        .changed
                        .wait_timeout(data, Duration::from_millis(100))
                        .unwrap()
                        .0;
                    // A client that gave up and closed: stop waiting for it.
                    if gone(&c) {
                        log(format!("WAIT abandoned {}", keys.join(",")));
                        return None;
                    }
                }
                drop(data);
                c.write_all(&[0]).ok()?;
            }
            other => {
                log(format!("unknown query {other}"));
                return None;
            }
        }
    }
}
