//! Events: markers in a stream, for ordering across streams and for timing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_sys::{CUevent, CUevent_flags, CUresult};

use crate::hold::core::CaptureLog;
use crate::hold::lock::lock;
use crate::{Context, Error, Result, Stream};

/// A CUDA event of one context: a point in a stream's work that the host or another
/// stream can wait for.
///
/// ```
/// use cuda_hal::{DeviceBuffer, Event, Stream};
/// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 8)?;
/// buf.fill_async(0.25, &stream)?;
/// let done = Event::new(&ctx)?;
/// stream.record(&done)?; // the same as done.record(&stream)
/// done.synchronize()?;
/// assert!(done.is_complete()?);
/// assert_eq!(buf.to_vec()?, [0.25; 8]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct Event {
    ctx: Context,
    raw: CUevent,
    /// The capture its last record was part of: a stream that waits for it joins it.
    capture: Mutex<Option<Arc<CaptureLog>>>,
    /// Whether `capture` may be set: records outside captures then skip the mutex.
    in_capture: AtomicBool,
}

// SAFETY: event handles are usable from any thread; the driver serialises access.
unsafe impl Send for Event {}
// SAFETY: as above for the handle. Its interior mutability is made for threads: the
// capture slot behind a mutex and the `in_capture` flag, an atomic.
unsafe impl Sync for Event {}

static_assertions::assert_impl_all!(Event: Send, Sync, std::fmt::Debug);

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.ctx.device().ordinal())
            .finish()
    }
}

impl Event {
    /// A timing event.
    #[doc(alias = "cuEventCreate")]
    pub fn new(ctx: &Context) -> Result<Event> {
        Self::create(ctx, CUevent_flags::CU_EVENT_DEFAULT.0)
    }

    /// An event without timing (cheaper, for ordering only).
    pub fn without_timing(ctx: &Context) -> Result<Event> {
        Self::create(ctx, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
    }

    fn create(ctx: &Context, flags: u32) -> Result<Event> {
        let _g = ctx.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        unsafe { call!(ctx.cuda(), cuEventCreate(&mut raw, flags)) }?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
            capture: Mutex::new(None),
            in_capture: AtomicBool::new(false),
        })
    }

    /// The raw handle.
    pub fn as_raw(&self) -> CUevent {
        self.raw
    }

    /// The event's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Records the event at this point of `stream` (of the same context).
    #[doc(alias = "cuEventRecord")]
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.same_context(&self.ctx, "Event::record")?;
        let _order = stream.enqueue_lock();
        let log = stream.capture_log();
        if log.is_none() && !self.in_capture.load(Ordering::Acquire) {
            return self.record_unlocked(stream);
        }
        // The slot stays locked across the driver call, as in `Stream::wait_event`: a
        // wait sees the capture of exactly the record it waits for.
        let mut slot = lock(&self.capture);
        self.in_capture.store(log.is_some(), Ordering::Release);
        let old = std::mem::replace(&mut *slot, log);
        let r = self.record_unlocked(stream);
        drop(slot);
        // After the slot's lock: the last reference to an ended capture's record may hold
        // memory whose release takes capture slots.
        drop(old);
        r
    }

    /// `cuEventRecord` alone (the caller holds the order lock, or knows the stream is
    /// not captured).
    pub(crate) fn record_unlocked(&self, stream: &Stream) -> Result<()> {
        let _g = stream.bind_if_legacy()?;
        // SAFETY: event and stream of the same context (checked by the callers).
        unsafe { call!(self.ctx.cuda(), cuEventRecord(self.raw, stream.as_raw())) }
    }

    /// The capture slot, locked: held across a wait on the event, so that no record of it
    /// into a capture slips between reading the slot and the driver's wait.
    pub(crate) fn capture_slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<CaptureLog>>> {
        lock(&self.capture)
    }

    /// Blocks until the work before the recorded point is done.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a valid event.
        unsafe { call!(self.ctx.cuda(), cuEventSynchronize(self.raw)) }
    }

    /// Whether the work before the recorded point is done, without blocking.
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: a valid event.
        let (rc, name) = unsafe { raw_call!(self.ctx.cuda(), cuEventQuery(self.raw)) };
        if rc == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.ctx.cuda().check(rc, name)?;
        Ok(true)
    }

    /// The time from `self` to `end` (both recorded, both timing events), to the
    /// driver's resolution of about half a microsecond.
    ///
    /// The driver measures in `f32` milliseconds, and gives a negative value when `end`
    /// completed before `self`: that, or a value that is not a finite number of
    /// nanoseconds within `u64`, is [`Error::InvalidElapsed`] with the raw value, never a
    /// panic or a clamped duration.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cuda_hal::{Error, Event, Stream};
    /// # let (cuda, _machine) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::new(&ctx)?;
    /// let (start, end) = (Event::new(&ctx)?, Event::new(&ctx)?);
    /// start.record(&stream)?;
    /// // (The simulated GPU's clock is the host's, and its work is done at once.)
    /// std::thread::sleep(Duration::from_millis(20));
    /// end.record(&stream)?;
    /// end.synchronize()?;
    /// assert!(start.elapsed(&end)? >= Duration::from_millis(20));
    /// // Backwards, the driver's time is negative: an error that keeps it.
    /// assert!(matches!(end.elapsed(&start), Err(Error::InvalidElapsed { ms }) if ms <= -20.0));
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuEventElapsedTime")]
    pub fn elapsed(&self, end: &Event) -> Result<Duration> {
        let mut ms = 0f32;
        // SAFETY: valid events and out-pointer.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuEventElapsedTime(&mut ms, self.raw, end.raw)
            )
        }?;
        duration_from_ms(ms).ok_or(Error::InvalidElapsed { ms })
    }
}

/// `ms` milliseconds, rounded to the nanosecond; `None` for a negative, non-finite or
/// too large value (where `Duration::from_secs_f32` would panic).
fn duration_from_ms(ms: f32) -> Option<Duration> {
    let ns = f64::from(ms) * 1e6;
    // `u64::MAX as f64` is 2^64, one past the largest u64: `<` keeps the cast exact.
    let limit = u64::MAX as f64;
    if !(ns >= 0.0 && ns < limit) {
        return None;
    }
    // In range and non-negative (NaN failed the test above), so the cast keeps the value.
    Some(Duration::from_nanos(ns.round() as u64))
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_g) = self.ctx.bind() {
            // SAFETY: created by us, destroyed once.
            let _ = unsafe { (self.ctx.cuda().fns().cuEventDestroy)(self.raw) };
        }
    }
}

/// Ordering a stream by events: waiting for one (which may join its capture), recording one.
impl Stream {
    /// Makes later work on this stream wait for `event` (which may be of another device).
    ///
    /// If `event` was recorded on a stream being captured, this stream joins that capture
    /// (as in CUDA): its later work is recorded into the same graph, and kept alive for it.
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // Exclusive: this stream may join a capture. The event's slot stays locked until
        // the driver has made the wait, so the capture read is the one the wait joins.
        let _join = self.capture_lock();
        let slot = event.capture_slot();
        let joined = slot.clone().filter(|l| !l.is_ended());
        let joins = joined.is_some() && self.capture_log().is_none();
        if joins {
            self.set_capture(joined);
        }
        let r = self.wait_event_unlocked(event);
        if r.is_err() && joins {
            self.set_capture(None);
        }
        r
    }

    /// `cuStreamWaitEvent` alone (the caller holds the order lock, or knows neither side
    /// is captured).
    pub(crate) fn wait_event_unlocked(&self, event: &Event) -> Result<()> {
        let _g = self.bind_if_legacy()?;
        // SAFETY: valid stream and event handles.
        unsafe {
            call!(
                self.context().cuda(),
                cuStreamWaitEvent(self.as_raw(), event.as_raw(), 0)
            )
        }
    }

    /// Records `event` at this point of the stream. The event must be of the same context.
    #[doc(alias = "cuEventRecord")]
    pub fn record(&self, event: &Event) -> Result<()> {
        event.record(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_become_a_duration_rounded_to_the_nanosecond() {
        assert_eq!(duration_from_ms(0.0), Some(Duration::ZERO));
        assert_eq!(duration_from_ms(-0.0), Some(Duration::ZERO));
        assert_eq!(duration_from_ms(1.5), Some(Duration::from_micros(1500)));
        assert_eq!(duration_from_ms(0.0005), Some(Duration::from_nanos(500)));
        assert_eq!(duration_from_ms(2500.0), Some(Duration::from_millis(2500)));
        // 2^64 ns is one past what a u64 holds: the largest f32 below it converts, the
        // next one up does not.
        assert_eq!(
            duration_from_ms(18_446_744_027_136.0),
            Some(Duration::from_nanos(18_446_744_027_136_000_000))
        );
        assert_eq!(duration_from_ms(18_446_746_124_288.0), None);
    }

    #[test]
    fn negative_and_non_finite_milliseconds_are_no_duration() {
        for ms in [
            -0.001,
            -1.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
        ] {
            assert_eq!(duration_from_ms(ms), None, "{ms}");
        }
    }
}
