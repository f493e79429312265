//! The streams whose enqueued work used an allocation, or anything else whose release
//! must wait for that work: [`UseLog`] for this crate's memory and code, [`StreamLog`] for
//! other crates' owners.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::Result;
use crate::hold::core::Stream;
use crate::hold::lock::lock;

/// The streams whose enqueued work used one allocation.
///
/// The common case, the same stream again, costs one relaxed load and a compare. A stream
/// in the log is kept alive by it, so its key (the address of its shared state) is not
/// reused while it is there, and `last` only ever holds a key that is in the log.
#[derive(Default)]
pub(crate) struct UseLog {
    last: AtomicUsize,
    streams: Mutex<Vec<Stream>>,
    /// How many times the slow path ran (under the lock): `retain` sees notes it raced.
    epoch: std::sync::atomic::AtomicU64,
}

impl UseLog {
    /// Notes `stream`. The first time it is seen, `first` runs (under the log's lock, and
    /// before the stream counts as noted, so a concurrent user of the same stream waits for
    /// it); its error leaves the stream un-noted.
    #[inline]
    pub(crate) fn note(&self, stream: &Stream, first: impl FnOnce() -> Result<()>) -> Result<()> {
        let key = stream.key();
        if self.last.load(Ordering::Acquire) == key {
            return Ok(());
        }
        self.note_new(stream, key, first)
    }

    #[cold]
    fn note_new(
        &self,
        stream: &Stream,
        key: usize,
        first: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut v = lock(&self.streams);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if !v.iter().any(|s| s.key() == key) {
            first()?;
            v.push(stream.held());
        }
        self.last.store(key, Ordering::Release);
        Ok(())
    }

    /// The streams noted so far (the log is left empty).
    pub(crate) fn take(&mut self) -> Vec<Stream> {
        self.last.store(0, Ordering::Relaxed);
        std::mem::take(self.streams.get_mut().unwrap_or_else(|e| e.into_inner()))
    }

    /// The streams noted so far (the log keeps them).
    pub(crate) fn streams(&self) -> Vec<Stream> {
        lock(&self.streams).iter().map(Stream::held).collect()
    }

    /// Keeps the noted streams `keep` says yes to. `keep` runs outside the log's lock (it
    /// may use the log), on user handles (what it does with them counts as a user's); if
    /// any stream was noted meanwhile, nothing is forgotten (keeping is always safe).
    pub(crate) fn retain(&self, mut keep: impl FnMut(&Stream) -> bool) {
        let (asked, epoch) = {
            let v = lock(&self.streams);
            // Every note from now on takes the slow path, which counts itself.
            self.last.store(0, Ordering::Release);
            let asked: Vec<Stream> = v.iter().map(Stream::clone).collect();
            (asked, self.epoch.load(Ordering::Acquire))
        };
        let gone: Vec<usize> = asked.iter().filter(|s| !keep(s)).map(Stream::key).collect();
        let removed: Vec<Stream> = {
            let mut v = lock(&self.streams);
            if self.epoch.load(Ordering::Acquire) != epoch {
                Vec::new()
            } else {
                self.last.store(0, Ordering::Release);
                let (out, kept) = std::mem::take(&mut *v)
                    .into_iter()
                    .partition(|s| gone.contains(&s.key()));
                *v = kept;
                out
            }
        };
        // Outside the lock (a stream's last reference may go here), after the handles.
        drop(asked);
        drop(removed);
    }

    /// Waits for the work enqueued so far on every noted stream; refused (`what` names
    /// the caller) while one of them is being captured: the wait would spoil the capture.
    pub(crate) fn synchronize(&self, what: &'static str) -> Result<()> {
        for s in self.streams() {
            s.refuse_host_wait(what)?;
            s.synchronize()?;
        }
        Ok(())
    }

    /// A log that starts with `streams`.
    pub(crate) fn with(streams: Vec<Stream>) -> UseLog {
        UseLog {
            last: AtomicUsize::new(0),
            streams: Mutex::new(streams),
            epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

/// The streams whose work used something another crate owns (an NCCL registration, a
/// framework's handle), so that its release can wait for exactly that work. The same
/// log this crate keeps for each allocation; noting the stream noted last is one load.
///
/// ```
/// use cuda_hal::{Stream, StreamLog};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let (s1, s2) = (Stream::non_blocking(&ctx)?, Stream::non_blocking(&ctx)?);
/// let log = StreamLog::new();
/// for s in [&s1, &s2, &s1] {
///     log.note(s); // before each enqueue that uses the thing
/// }
/// assert_eq!(log.streams().len(), 2);
/// log.synchronize()?; // before releasing it
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Default)]
pub struct StreamLog(UseLog);

impl std::fmt::Debug for StreamLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLog")
            .field("streams", &self.0.streams().len())
            .finish()
    }
}

impl StreamLog {
    /// An empty log.
    #[must_use]
    pub fn new() -> StreamLog {
        StreamLog::default()
    }

    /// Notes that work about to be enqueued on `stream` uses the thing.
    #[inline]
    pub fn note(&self, stream: &Stream) {
        let _ = self.0.note(stream, || Ok(()));
    }

    /// The streams noted so far.
    pub fn streams(&self) -> Vec<Stream> {
        self.0.streams().iter().map(Stream::clone).collect()
    }

    /// Forgets the noted streams `keep` says no to (those whose work is known done).
    /// `keep` is called without the log locked, so it may use the log; if a stream is
    /// noted meanwhile, nothing is forgotten this time.
    ///
    /// ```
    /// use cuda_hal::{Stream, StreamLog};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let (s1, s2) = (Stream::non_blocking(&ctx)?, Stream::non_blocking(&ctx)?);
    /// let log = StreamLog::new();
    /// log.note(&s1);
    /// log.note(&s2);
    /// log.retain(|s| s.as_raw() == s2.as_raw());
    /// assert_eq!(log.streams().len(), 1);
    /// log.note(&s1); // noted again
    /// assert_eq!(log.streams().len(), 2);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn retain(&self, keep: impl FnMut(&Stream) -> bool) {
        self.0.retain(keep);
    }

    /// Waits until the work enqueued so far on every noted stream is done (refused while
    /// one of them is being captured: the wait would spoil the capture).
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize("StreamLog::synchronize")
    }
}
