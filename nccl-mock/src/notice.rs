//! One line on stderr for a blocking call that waits long for a peer: nccl-channel's wait
//! notice, said by the simulated NCCL itself (real NCCL hangs without a word).
//!
//! Why a notice and not an error for one thread driving two ranks outside a group: a
//! call that waits for a peer cannot prove that the peer's call would come from the same
//! thread. The peer has not called yet (a thread blocked here makes no other call), and
//! which thread drove a rank before says nothing about which thread drives it next (one
//! thread may init every rank in a group, then hand each to a thread of its own). An
//! error there would fail correct programs; the notice names the likely causes instead.

use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The threshold when `NCCL_CHANNEL_WAIT_NOTICE_SECS` does not give one (nccl-channel's).
const AFTER: Duration = Duration::from_secs(10);

/// When a wait is noticed (`NCCL_CHANNEL_WAIT_NOTICE_SECS` seconds, read once; `0`
/// turns notices off); `None` when off.
fn notice_after() -> Option<Duration> {
    static CELL: OnceLock<Option<Duration>> = OnceLock::new();
    *CELL.get_or_init(|| {
        let text = std::env::var("NCCL_CHANNEL_WAIT_NOTICE_SECS").ok();
        let secs = text.filter(|t| {
            let (whole, fraction) = t.split_once('.').unwrap_or((t, ""));
            !(whole.is_empty() && fraction.is_empty())
                && whole
                    .bytes()
                    .chain(fraction.bytes())
                    .all(|b| b.is_ascii_digit())
        });
        match secs.and_then(|t| t.parse::<f64>().ok()) {
            Some(s) => {
                Duration::try_from_secs_f64(s).map_or(Some(AFTER), |d| (!d.is_zero()).then_some(d))
            }
            None => Some(AFTER),
        }
    })
}

/// The notice's line (without the newline).
pub(crate) fn line(what: &str, waited: Duration, timeout: Duration) -> String {
    format!(
        "simulated NCCL: still waiting after {} s for {what}; it fails at the simulator's \
         deadline of {timeout:?} (MockNccl::timeout). Likely causes: a second rank driven \
         from this thread outside a group (group the ranks' calls, or use one thread per \
         rank); ranks disagreeing on the world size or the unique id; a peer that died or \
         never started.",
        waited.as_secs()
    )
}

/// The notice of one blocking wait: wake at [`until`](Self::until), then
/// [`tick`](Self::tick). `what` is formatted only when the notice is due.
pub(crate) struct Notice<F: FnOnce() -> String> {
    start: Instant,
    due: Option<Instant>,
    what: Option<F>,
    timeout: Duration,
}

impl<F: FnOnce() -> String> Notice<F> {
    /// A wait beginning now, which fails after `timeout`; `None` for `what`: no notice.
    pub(crate) fn new(timeout: Duration, what: Option<F>) -> Self {
        let start = Instant::now();
        let due = what
            .is_some()
            .then(notice_after)
            .flatten()
            .and_then(|a| start.checked_add(a));
        Notice {
            start,
            due,
            what,
            timeout,
        }
    }

    /// When to wake up next: the notice's time, or `deadline` when earlier or done.
    pub(crate) fn until(&self, deadline: Instant) -> Instant {
        self.due.map_or(deadline, |d| d.min(deadline))
    }

    /// Prints the notice once, if it is due.
    pub(crate) fn tick(&mut self, now: Instant) {
        if self.due.is_some_and(|d| now >= d) {
            self.due = None;
            if let Some(what) = self.what.take() {
                let l = line(&what(), now - self.start, self.timeout);
                let _ = writeln!(std::io::stderr().lock(), "{l}");
            }
        }
    }
}
