//! One line on stderr for an exchange that lasts: what it waits for, for how long so far,
//! its deadline and the likely cause, printed once per exchange after 10 s (the variable
//! `NCCL_CHANNEL_WAIT_NOTICE_SECS`, shared with nccl-channel's waits, gives another number
//! of seconds; `0` turns the notices off). The exchange blocks in sockets, so one watchdog
//! thread of the process prints the line while the exchange's [`Watch`] lives, never
//! after it was dropped; what the exchange learnt by then (rank 0 answered and could not
//! prove the secret) replaces the generic causes, because ranks holding different secrets
//! otherwise wait their whole deadline with no word of why.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long an exchange lasts before its notice, unless the variable says otherwise.
const NOTICE_AFTER: Duration = Duration::from_secs(10);

/// The variable that overrides [`NOTICE_AFTER`].
const VARIABLE: &str = "NCCL_CHANNEL_WAIT_NOTICE_SECS";

/// The causes said when the exchange learnt nothing more specific.
const GENERIC: &str = "Likely causes: a second rank driven from this thread outside a group \
                       (group the ranks' calls, or use one thread per rank); ranks disagreeing \
                       on the world size or the unique id; a peer that died or never started.";

/// When an exchange is noticed, once per process: `None` when notices are off.
fn notice_after() -> Option<Duration> {
    static AFTER: OnceLock<Option<Duration>> = OnceLock::new();
    *AFTER.get_or_init(|| {
        let secs = std::env::var(VARIABLE)
            .ok()
            .and_then(|t| crate::decimal::parse_seconds(&t))
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        match secs {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => Some(NOTICE_AFTER),
        }
    })
}

/// What an exchange learnt that explains its wait better than the generic causes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Something answered at rank 0's address and could not prove it knows the secret.
    Unproven,
    /// The store holds a value under this exchange's key that is not sealed with this
    /// rank's secret.
    UnprovenValue,
}

impl Cause {
    fn text(self) -> &'static str {
        match self {
            Cause::Unproven => {
                "Rank 0's address answered, but what answered could not prove it knows the \
                 secret: the ranks hold different secrets (give every rank the same \
                 NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE), or something else answers there; this \
                 rank waits for a proven answer."
            }
            Cause::UnprovenValue => {
                "The store holds a value under this exchange's key that is not sealed with this \
                 rank's secret: rank 0 holds another secret (give every rank the same \
                 NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE), or something else stored it; this rank \
                 waits for rank 0's sealed value."
            }
        }
    }
}

/// The cause an exchange found so far, shared with the watchdog.
pub(crate) type Found = Arc<Mutex<Option<Cause>>>;

/// Records `cause` for the exchange's notice.
pub(crate) fn found(slot: &Found, cause: Cause) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause);
}

/// The notice's line (without the newline).
pub(crate) fn line(
    what: &str,
    waited: Duration,
    deadline: Duration,
    cause: Option<Cause>,
) -> String {
    format!(
        "nccl-channel: still waiting after {} s for {what}; it fails at its deadline of \
         {deadline:?} (the rendezvous timeout). {}",
        waited.as_secs(),
        cause.map_or(GENERIC, Cause::text)
    )
}

fn emit(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

struct Watched {
    id: u64,
    start: Instant,
    due: Instant,
    what: String,
    deadline: Duration,
    found: Found,
}

struct Board {
    next_id: u64,
    started: bool,
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

/// An exchange watched while this lives.
#[must_use = "the exchange is watched only while the Watch lives"]
pub(crate) struct Watch {
    id: Option<u64>,
    found: Found,
}

impl Watch {
    /// Where the exchange records what it learnt.
    pub(crate) fn found(&self) -> &Found {
        &self.found
    }
}

/// Watches the exchange that follows, bounded by `deadline`. Without notices, or when the
/// watchdog thread cannot start, it watches nothing.
pub(crate) fn watch(deadline: Duration, what: impl FnOnce() -> String) -> Watch {
    let found = Found::default();
    let Some(after) = notice_after() else {
        return Watch { id: None, found };
    };
    let start = Instant::now();
    let Some(due) = start.checked_add(after) else {
        return Watch { id: None, found };
    };
    let mut b = board();
    if !b.started {
        let spawned = std::thread::Builder::new()
            .name("nccl-rendezvous-wait-notice".into())
            .spawn(watchdog);
        if spawned.is_err() {
            return Watch { id: None, found };
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
        found: Arc::clone(&found),
    });
    WAKE.notify_one();
    Watch {
        id: Some(id),
        found,
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            board().waits.retain(|w| w.id != id);
        }
    }
}

/// The process's one watchdog thread (started at the first watched exchange).
fn watchdog() {
    let mut b = board();
    loop {
        let now = Instant::now();
        if let Some(i) = b.waits.iter().position(|w| w.due <= now) {
            let w = b.waits.swap_remove(i);
            let cause = *w.found.lock().unwrap_or_else(|e| e.into_inner());
            emit(&line(&w.what, now - w.start, w.deadline, cause));
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
    fn the_line_says_the_secret_failed_when_that_is_what_was_seen() {
        let t = Duration::from_secs(300);
        let generic = line("x", Duration::from_secs(10), t, None);
        assert!(
            generic.contains(
                "for x; it fails at its deadline of 300s (the rendezvous timeout). Likely causes:"
            ),
            "{generic}"
        );
        let unproven = line("x", Duration::from_secs(10), t, Some(Cause::Unproven));
        assert!(
            unproven.contains("could not prove it knows the secret"),
            "{unproven}"
        );
        assert!(!unproven.contains("a second rank"), "{unproven}");
        let value = line("x", Duration::from_secs(10), t, Some(Cause::UnprovenValue));
        assert!(
            value.contains("not sealed with this rank's secret"),
            "{value}"
        );
    }
}
