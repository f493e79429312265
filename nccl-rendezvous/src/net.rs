//! Socket helpers shared by both protocols: name resolution, connecting with a limit,
//! reads bounded in size and in time, and a readable form of unexpected bytes.

use std::io::{self, BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// The most one blocking socket operation waits, so a silent peer never holds a rank past
/// its deadline by more than this.
pub(crate) const STEP: Duration = Duration::from_secs(5);

/// The time left before `deadline`, at most [`STEP`], at least 1 ms (a zero timeout means
/// "wait forever" to the socket API).
pub(crate) fn step_until(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .min(STEP)
        .max(Duration::from_millis(1))
}

/// Connects to the first address of `host:port` that accepts, each attempt limited to
/// `limit`; the error is the last attempt's.
pub(crate) fn connect(host: &str, port: u16, limit: Duration) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{host} resolves to no address"),
    );
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, limit) {
            Ok(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(limit))?;
                s.set_write_timeout(Some(limit))?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Reads one `\n`-terminated line of at most `max` bytes (without the `\n`), all of it
/// before `deadline`: the socket's read timeout is set to the time left (at most
/// [`STEP`]) before every read, so a peer that trickles bytes cannot stretch the wait.
/// `Ok(None)`: the peer closed the connection before sending anything. A line that is too
/// long, or cut off by the peer closing, is an `InvalidData` error carrying what was read;
/// one not complete by the deadline is a `TimedOut` error.
pub(crate) fn read_line(
    r: &mut BufReader<&TcpStream>,
    max: usize,
    deadline: Instant,
) -> io::Result<Option<Vec<u8>>> {
    read_line_in_steps(r, max, deadline, STEP)
}

/// [`read_line`] with socket reads of at most `step` each.
fn read_line_in_steps(
    r: &mut BufReader<&TcpStream>,
    max: usize,
    deadline: Instant,
    step: Duration,
) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        set_step(r.get_ref(), deadline, step)?;
        let buf = match r.fill_buf() {
            Ok(buf) => buf,
            // One step without bytes: the deadline, checked by `set_step`, decides.
            Err(e) if timed_out(&e) || e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            if line.is_empty() {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an unterminated line: {}", describe(&line)),
            ));
        }
        let room = max + 1 - line.len();
        let (take, done) = match buf.iter().take(room).position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len().min(room), false),
        };
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            line.pop();
            return Ok(Some(line));
        }
        if line.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an over-long line: {}", describe(&line)),
            ));
        }
    }
}

/// Fills `buf` from `stream`, all of it before `deadline` (see [`read_line`]). A peer that
/// closes first is an `UnexpectedEof` error, a deadline passed a `TimedOut` one.
pub(crate) fn read_exact(stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    read_exact_in_steps(stream, buf, deadline, STEP)
}

/// [`read_exact`] with socket reads of at most `step` each.
fn read_exact_in_steps(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    step: Duration,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        set_step(stream, deadline, step)?;
        match (&*stream).read(&mut buf[got..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the connection closed after {got} of {} bytes", buf.len()),
                ));
            }
            Ok(n) => got += n,
            // One step without bytes: the deadline, checked by `set_step`, decides.
            Err(e) if timed_out(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sets the read timeout to the time left before `deadline` (at most `step`); a deadline
/// already passed is a `TimedOut` error.
fn set_step(stream: &TcpStream, deadline: Instant, step: Duration) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer did not answer in time",
        ));
    }
    stream.set_read_timeout(Some(left.min(step).max(Duration::from_millis(1))))
}

/// Unexpected bytes, escaped and cut to 64 of them, for error messages.
pub(crate) fn describe(bytes: &[u8]) -> String {
    let shown: String = bytes
        .iter()
        .take(64)
        .flat_map(|b| b.escape_ascii())
        .map(char::from)
        .collect();
    if bytes.len() > 64 {
        format!("\"{shown}\"… ({} bytes)", bytes.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// Whether an I/O error is a read or write timing out (the two kinds the platforms use).
pub(crate) fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// An attempt is not started with less than this left before the deadline: it could not
/// finish, and its failure would hide what the earlier attempts met.
pub(crate) const LAST_ATTEMPT: Duration = Duration::from_millis(50);

/// Whether there is time for another attempt before `deadline`.
pub(crate) fn time_for_attempt(deadline: Instant) -> bool {
    deadline.saturating_duration_since(Instant::now()) >= LAST_ATTEMPT
}

/// Growing pauses between attempts: 10 ms doubling to 500 ms.
pub(crate) fn attempts_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(10), Duration::from_millis(500))
}

/// `pause` scaled by a random factor from ½ to 1½, cut short at `deadline`: ranks that
/// failed together (all arriving before rank 0 listened) come back spread out, not in one
/// wave. Without random bytes, `pause` as it is.
pub(crate) fn jittered(pause: Duration, deadline: Instant) -> Duration {
    let mut r = [0u8; 2];
    let factor = match getrandom::fill(&mut r) {
        Ok(()) => 0.5 + f64::from(u16::from_le_bytes(r)) / f64::from(u16::MAX),
        Err(_) => 1.0,
    };
    pause
        .mul_f64(factor)
        .min(deadline.saturating_duration_since(Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A connected pair whose server side sends `bytes` after `delay`.
    fn peer_sending_after(delay: Duration, bytes: &'static [u8]) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            std::thread::sleep(delay);
            let _ = s.write_all(bytes);
            std::thread::sleep(Duration::from_secs(2));
        });
        TcpStream::connect(addr).unwrap()
    }

    /// A connected pair whose server side sends `first`, then `second` 100 ms later (two
    /// pieces for the reader).
    fn peer_sending_in_two(first: &'static [u8], second: &'static [u8]) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(first);
            std::thread::sleep(Duration::from_millis(100));
            let _ = s.write_all(second);
            std::thread::sleep(Duration::from_secs(2));
        });
        TcpStream::connect(addr).unwrap()
    }

    /// A connected pair whose server side resets the connection (it closes with the
    /// client's byte unread, so its kernel sends RST, not FIN).
    fn peer_resetting() -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut byte = [0u8; 1];
            let _ = s.peek(&mut byte);
            drop(s);
            let _ = tx.send(());
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"x").unwrap();
        rx.recv().unwrap();
        s
    }

    #[test]
    fn a_read_waits_past_a_step_until_its_deadline() {
        let step = Duration::from_millis(20);
        let deadline = Instant::now() + Duration::from_secs(20);
        let s = peer_sending_after(Duration::from_millis(200), b"abcd");
        let mut buf = [0u8; 4];
        read_exact_in_steps(&s, &mut buf, deadline, step).unwrap();
        assert_eq!(&buf, b"abcd");
        let s = peer_sending_after(Duration::from_millis(200), b"line\n");
        let mut r = BufReader::new(&s);
        let line = read_line_in_steps(&mut r, 16, deadline, step).unwrap();
        assert_eq!(line.as_deref(), Some(&b"line"[..]));
    }

    #[test]
    fn a_read_gives_up_at_its_deadline_saying_so() {
        let step = Duration::from_millis(20);
        let s = peer_sending_after(Duration::from_secs(5), b"late");
        let mut buf = [0u8; 4];
        let e = read_exact_in_steps(
            &s,
            &mut buf,
            Instant::now() + Duration::from_millis(150),
            step,
        )
        .unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (
                io::ErrorKind::TimedOut,
                "the peer did not answer in time".to_string()
            )
        );
        let mut r = BufReader::new(&s);
        let e = read_line_in_steps(
            &mut r,
            16,
            Instant::now() + Duration::from_millis(150),
            step,
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    /// A line longer than the limit is refused also when it arrives in two pieces (the
    /// second piece may only complete the room the first one left).
    #[test]
    fn an_over_long_line_in_two_pieces_is_refused() {
        let s = peer_sending_in_two(b"aaaa", b"bbbbbbbb\n");
        // Reads of at most 4 bytes: the line comes in pieces also when both writes
        // arrived before the first read (a slow reader on a loaded machine).
        let mut r = BufReader::with_capacity(4, &s);
        let deadline = Instant::now() + Duration::from_secs(20);
        let e = read_line_in_steps(&mut r, 8, deadline, Duration::from_millis(20)).unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (
                io::ErrorKind::InvalidData,
                "an over-long line: \"aaaabbbbb\"".to_string()
            )
        );
    }

    /// A line of exactly the limit is taken, also when its end comes in a later piece.
    #[test]
    fn a_line_of_exactly_the_limit_in_two_pieces_is_taken() {
        let s = peer_sending_in_two(b"aaaaaaaa", b"\n");
        // Pieces of at most 4 bytes, whatever the timing (see above).
        let mut r = BufReader::with_capacity(4, &s);
        let deadline = Instant::now() + Duration::from_secs(20);
        let line = read_line_in_steps(&mut r, 8, deadline, Duration::from_millis(20)).unwrap();
        assert_eq!(line.as_deref(), Some(&b"aaaaaaaa"[..]));
    }

    #[test]
    fn jitter_spreads_pauses_from_half_to_one_and_a_half() {
        let far = Instant::now() + Duration::from_secs(60);
        let pause = Duration::from_millis(100);
        let got: Vec<Duration> = (0..200).map(|_| jittered(pause, far)).collect();
        assert!(
            got.iter().all(|d| *d >= pause / 2 && *d <= pause * 3 / 2),
            "{got:?}"
        );
        assert!(got.iter().any(|d| *d < pause * 4 / 5));
        assert!(got.iter().any(|d| *d > pause * 6 / 5));
        // Never past the deadline.
        let near = Instant::now() + Duration::from_millis(10);
        assert!(jittered(Duration::from_secs(1), near) <= Duration::from_millis(10));
    }

    /// Up to 64 bytes are shown whole; beyond, the first 64 and the count.
    #[test]
    fn describe_cuts_at_64_bytes() {
        assert_eq!(describe(&[b'x'; 64]), format!("\"{}\"", "x".repeat(64)));
        assert_eq!(
            describe(&[b'x'; 65]),
            format!("\"{}\"… (65 bytes)", "x".repeat(64))
        );
        assert_eq!(describe(b"a\n\x01"), "\"a\\n\\x01\"");
    }

    /// A reset connection is an error at once, not a step without bytes (which would then
    /// read the closed socket's end as "no line").
    #[test]
    fn a_reset_connection_is_its_error() {
        let deadline = Instant::now() + Duration::from_secs(20);
        let step = Duration::from_millis(20);
        let s = peer_resetting();
        let mut r = BufReader::new(&s);
        let e = read_line_in_steps(&mut r, 16, deadline, step).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        let s = peer_resetting();
        let e = read_exact_in_steps(&s, &mut [0u8; 4], deadline, step).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
    }
}
