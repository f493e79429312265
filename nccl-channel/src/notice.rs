//! One line on stderr for a wait that lasts: what it waits for, for how long so far, its
//! deadline and the likely causes, printed once per wait after [`WAIT_NOTICE_AFTER`]
//! (`NCCL_CHANNEL_WAIT_NOTICE_SECS`). Polling loops tick a [`Notice`]; calls that block
//! inside NCCL or in a socket are covered by a [`Watch`], which the process's one
//! watchdog thread reports on while it lives, and never after it was dropped.

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a wait lasts before nccl-channel says on stderr what it waits for: 10 s,
/// unless the environment variable `NCCL_CHANNEL_WAIT_NOTICE_SECS` (read once, at the
/// first wait) gives another number of seconds (`0.5`, `30`; `0` turns the notices off;
/// any other text is ignored).
///
/// The line names the wait, how long it has lasted, its deadline
/// ([`CommConfig::timeout`](crate::CommConfig::timeout), or the rendezvous's), and the
/// likely causes; the wait itself goes on until it ends or its deadline passes:
///
/// ```text
/// nccl-channel: still waiting after 10 s for init of rank 0 of 2 on device 0 (ncclCommInitRankConfig); it fails at its deadline of 300s (CommConfig::timeout). Likely causes: a second rank driven from this thread outside a group (group the ranks' calls, or use one thread per rank); ranks disagreeing on the world size or the unique id; a peer that died or never started.
/// ```
///
/// ```
/// assert_eq!(nccl_channel::WAIT_NOTICE_AFTER, std::time::Duration::from_secs(10));
/// ```
pub const WAIT_NOTICE_AFTER: Duration = Duration::from_secs(10);

/// The variable that overrides [`WAIT_NOTICE_AFTER`].
const VARIABLE: &str = "NCCL_CHANNEL_WAIT_NOTICE_SECS";

/// What bounds a wait, for the notice.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// A communicator's [`CommConfig::timeout`](crate::CommConfig::timeout).
    Config(Duration),
    /// A rendezvous's timeout.
    Rendezvous(Duration),
    /// A blocking communicator's call inside NCCL: none.
    Blocking,
}

/// When a wait is noticed, once per process: `None` when notices are off.
pub(crate) fn notice_after() -> Option<Duration> {
    static AFTER: OnceLock<Option<Duration>> = OnceLock::new();
    *AFTER.get_or_init(|| {
        let secs = std::env::var(VARIABLE)
            .ok()
            .and_then(|t| crate::decimal::parse_seconds(&t))
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        match secs {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => Some(WAIT_NOTICE_AFTER),
        }
    })
}

/// The notice's line (without the newline).
pub(crate) fn line(what: &str, waited: Duration, deadline: Deadline) -> String {
    let bound = match deadline {
        Deadline::Config(t) => format!("it fails at its deadline of {t:?} (CommConfig::timeout)"),
        Deadline::Rendezvous(t) => {
            format!("it fails at its deadline of {t:?} (the rendezvous timeout)")
        }
        Deadline::Blocking => "it has no deadline: a blocking communicator waits inside NCCL \
                               (CommConfig::non_blocking(timeout) bounds the wait)"
            .into(),
    };
    format!(
        "nccl-channel: still waiting after {} s for {what}; {bound}. Likely causes: a second \
         rank driven from this thread outside a group (group the ranks' calls, or use one \
         thread per rank); ranks disagreeing on the world size or the unique id; a peer that \
         died or never started.",
        waited.as_secs()
    )
}

/// Writes the line to stderr, past any test harness's capture (a notice is for people).
fn emit(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The notice of one polling loop: [`tick`](Self::tick) it at each turn; `what` is
/// formatted only if the notice is due.
pub(crate) struct Notice<F: FnOnce() -> String> {
    start: Instant,
    due: Option<Instant>,
    what: Option<F>,
    deadline: Deadline,
}

impl<F: FnOnce() -> String> Notice<F> {
    /// A wait that began at `start`.
    pub(crate) fn new(start: Instant, deadline: Deadline, what: F) -> Self {
        Self::after(notice_after(), start, deadline, what)
    }

    /// A wait that began at `start`, noticed `after` it began (never when `None`).
    fn after(after: Option<Duration>, start: Instant, deadline: Deadline, what: F) -> Self {
        Notice {
            start,
            due: after.and_then(|a| start.checked_add(a)),
            what: Some(what),
            deadline,
        }
    }

    /// Prints the notice if it is due (`now`) and was not printed yet.
    pub(crate) fn tick(&mut self, now: Instant) {
        if self.due.is_some_and(|due| now >= due) {
            self.due = None;
            if let Some(what) = self.what.take() {
                emit(&line(&what(), now - self.start, self.deadline));
            }
        }
    }
}

/// A wait the watchdog thread reports on.
struct Watched {
    id: u64,
    start: Instant,
    due: Instant,
    what: String,
    deadline: Deadline,
}

#[derive(Default)]
struct Board {
    next_id: u64,
    started: bool,
    /// Waits not yet noticed (a noticed one leaves the board, its `Watch` finds nothing).
    waits: Vec<Watched>,
}

static BOARD: Mutex<Board> = Mutex::new(Board {
    next_id: 0,
    started: false,
    waits: Vec::new(),
});
static WAKE: Condvar = Condvar::new();

fn board() -> MutexGuard<'static, Board> {
    BOARD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A call that blocks (inside NCCL, or in a socket) while this lives: if it lives past
/// the notice's time, the watchdog thread prints the notice. The line is printed with
/// the board locked, and the drop removes the wait under the same lock: nothing is
/// printed for a wait once its `Watch` was dropped.
#[must_use = "the wait is watched only while the Watch lives"]
pub(crate) struct Watch {
    id: Option<u64>,
}

/// Watches the blocking call that follows (until the `Watch` drops). Without notices, or
/// when the watchdog thread cannot start, it watches nothing.
pub(crate) fn watch(deadline: Deadline, what: impl FnOnce() -> String) -> Watch {
    let Some(after) = notice_after() else {
        return Watch { id: None };
    };
    let start = Instant::now();
    let Some(due) = start.checked_add(after) else {
        return Watch { id: None };
    };
    let mut b = board();
    if !b.started {
        let spawned = std::thread::Builder::new()
            .name("nccl-channel-wait-notice".into())
            .spawn(watchdog);
        if spawned.is_err() {
            return Watch { id: None };
        }
        b.started = true;
    }
    let id = b.next_id;
    b.next_id = b.next_id.wrapping_add(1);
    b.waits.push(Watched {
        id,
        start,
        due,
        what: what(),
        deadline,
    });
    WAKE.notify_one();
    Watch { id: Some(id) }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            board().waits.retain(|w| w.id != id);
        }
    }
}

/// The process's one watchdog thread: prints each watched wait's notice when it is due,
/// with the board locked; sleeps on the condition variable otherwise. It lives as long as
/// the process (started at the first watched wait).
fn watchdog() {
    let mut b = board();
    loop {
        let now = Instant::now();
        if let Some(i) = b.waits.iter().position(|w| w.due <= now) {
            let w = b.waits.swap_remove(i);
            emit(&line(&w.what, now - w.start, w.deadline));
            continue;
        }
        b = match b.waits.iter().map(|w| w.due).min() {
            Some(due) => {
                WAKE.wait_timeout(b, due - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => WAKE.wait(b).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_wait_the_time_the_deadline_and_the_causes() {
        let l = line(
            "init of rank 1 of 2 on device 0 (ncclCommInitRank)",
            Duration::from_millis(12_400),
            Deadline::Blocking,
        );
        assert_eq!(
            l,
            "nccl-channel: still waiting after 12 s for init of rank 1 of 2 on device 0 \
             (ncclCommInitRank); it has no deadline: a blocking communicator waits inside NCCL \
             (CommConfig::non_blocking(timeout) bounds the wait). Likely causes: a second rank \
             driven from this thread outside a group (group the ranks' calls, or use one \
             thread per rank); ranks disagreeing on the world size or the unique id; a peer \
             that died or never started."
        );
        let l = line(
            "x",
            Duration::from_secs(10),
            Deadline::Rendezvous(Duration::from_secs(300)),
        );
        assert!(
            l.contains("for x; it fails at its deadline of 300s (the rendezvous timeout)."),
            "{l}"
        );
    }

    #[test]
    fn a_notice_is_formatted_only_when_due_and_only_once() {
        let start = Instant::now();
        let mut calls = 0;
        {
            let after = Some(WAIT_NOTICE_AFTER);
            let config = Deadline::Config(Duration::from_secs(1));
            let mut n = Notice::after(after, start, config, || {
                calls += 1;
                String::from("w")
            });
            n.tick(start);
            n.tick(start + WAIT_NOTICE_AFTER * 2);
            n.tick(start + WAIT_NOTICE_AFTER * 3);
        }
        assert_eq!(calls, 1);
    }
}
