//! Pauses between polls of something the host cannot block on (NCCL's asynchronous state,
//! a stream, a peer that is not listening yet): short at first, as most waits are short,
//! then doubling up to a cap, so that a long wait costs little CPU.

use std::time::{Duration, Instant};

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

    /// The polls of NCCL's asynchronous state and of streams: 20 µs up to 1 ms.
    pub(crate) const fn poll() -> Self {
        Self::new(Duration::from_micros(20), Duration::from_millis(1))
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
    fn pauses_double_up_to_the_cap() {
        let mut b = Backoff::poll();
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
        let mut b = Backoff::poll();
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(b.pause_until(far), Duration::from_micros(20));
    }
}
