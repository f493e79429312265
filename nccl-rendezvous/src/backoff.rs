//! Pauses between attempts at something that cannot be waited on (a peer that is not
//! listening yet, a store's key rank 0 has not written): short at first, as most waits
//! are short, then doubling up to a cap, so that a long wait costs little CPU.

use std::time::{Duration, Instant};

/// `start + after`, or the latest instant the clock can hold when that overflows: a
/// deadline computed from a user's timeout never panics.
pub(crate) fn deadline_from(start: Instant, after: Duration) -> Instant {
    if let Some(t) = start.checked_add(after) {
        return t;
    }
    let mut step = after;
    let mut t = start;
    // Approaches the clock's limit from below, halving what does not fit.
    while !step.is_zero() {
        match t.checked_add(step) {
            Some(later) => t = later,
            None => step /= 2,
        }
    }
    t
}

/// `deadline_from(Instant::now(), after)`.
pub(crate) fn deadline_after(after: Duration) -> Instant {
    deadline_from(Instant::now(), after)
}

/// The growing pause of one polling loop.
pub(crate) struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `cap`.
    pub(crate) const fn new(first: Duration, cap: Duration) -> Self {
        Backoff { next: first, cap }
    }

    /// The pause to take now; the next one is twice as long, up to the cap.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let now = self.next;
        self.next = (now * 2).min(self.cap);
        now
    }

    /// The pause to take now, cut short at `deadline`.
    pub(crate) fn pause_until(&mut self, deadline: Instant) -> Duration {
        self.next_pause()
            .min(deadline.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_the_clocks_limit_saturates_instead_of_panicking() {
        let now = Instant::now();
        let far = deadline_from(now, Duration::MAX);
        assert!(far > now + Duration::from_secs(100 * 365 * 24 * 3600));
        assert_eq!(
            far.checked_add(Duration::from_secs(1)),
            None,
            "as late as it gets"
        );
        assert_eq!(
            deadline_from(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(deadline_after(Duration::MAX) >= far);
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_micros(20), Duration::from_millis(1));
        let us: Vec<u128> = (0..9).map(|_| b.next_pause().as_micros()).collect();
        assert_eq!(us, [20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        let ms: Vec<u128> = (0..8).map(|_| b.next_pause().as_millis()).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 320, 500, 500]);
    }

    #[test]
    fn a_pause_ends_at_the_deadline() {
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
        let p = b.pause_until(Instant::now() + Duration::from_secs(2));
        assert!(
            p <= Duration::from_secs(2) && p > Duration::from_millis(1500),
            "{p:?}"
        );
        assert_eq!(b.pause_until(Instant::now()), Duration::ZERO);
        let mut b = Backoff::new(Duration::from_micros(20), Duration::from_millis(1));
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(b.pause_until(far), Duration::from_micros(20));
    }
}
