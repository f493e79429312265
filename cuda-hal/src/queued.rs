//! Releases that could not finish when their owner was dropped, because a stream they are
//! ordered on was locked for a capture (one beginning, ending or being joined): kept whole
//! (the memory with its context, streams and releaser, in the owner's value) and finished
//! when that lock is let go, or at this crate's next release. A contended lock never
//! decides between freeing and leaking; only a process that ends first leaks them, whole.

use std::any::Any;
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::tracking::lock;

/// The owners waiting for their release (each one's drop releases it).
static QUEUE: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());
/// Whether `QUEUE` may hold anything: the calls that retry read only this.
static WAITING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while this thread retries: a release it runs that calls [`retry`] again
    /// returns at once (its own item, queued again, waits for the next chance).
    static RETRYING: Cell<bool> = const { Cell::new(false) };
}

/// Keeps `owner` until [`retry`] drops it: its drop is the release that had to wait.
pub(crate) fn queue(owner: Box<dyn Any + Send>) {
    lock(&QUEUE).push(owner);
    WAITING.store(true, Ordering::Release);
}

/// Drops every queued owner (each release either finishes or queues itself again).
/// One atomic load when nothing waits.
#[inline]
pub(crate) fn retry() {
    if WAITING.load(Ordering::Acquire) {
        retry_now();
    }
}

#[cold]
fn retry_now() {
    if RETRYING.try_with(|r| r.replace(true)).unwrap_or(true) {
        return;
    }
    let owners = {
        let mut q = lock(&QUEUE);
        WAITING.store(false, Ordering::Release);
        std::mem::take(&mut *q)
    };
    // Outside the queue's lock: a release that cannot finish yet queues itself again.
    drop(owners);
    let _ = RETRYING.try_with(|r| r.set(false));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::mpsc;
    use std::time::Duration;

    use cuda_mock::MockDriver;

    use crate::{CaptureMode, Cuda, DeviceBuffer, Stream};

    /// Waits (bounded) until a capture waits for `s`'s order lock.
    fn until_capture_waits(s: &Stream) {
        for _ in 0..20_000 {
            if s.capture_waiting() {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        panic!("the capture never waited for the stream's lock");
    }

    /// Three threads: one inside an enqueue on a stream, one beginning a capture of it
    /// (waiting for the first), one dropping memory whose home is that stream. The release
    /// cannot take the stream's lock: it waits, whole, and finishes once the capture has
    /// taken and let go of the lock (into the capture's graph, which frees it when it
    /// goes). The context is never released under the memory.
    #[test]
    fn a_release_contended_by_a_beginning_capture_waits_whole_and_then_finishes() {
        let (cuda, world) = MockDriver::with_devices(1)
            .build_with(Cuda::from_driver)
            .unwrap();
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let buf = DeviceBuffer::<u8>::alloc_on(&s, 64).unwrap();
        let (entered, leave) = (mpsc::channel::<()>(), mpsc::channel::<()>());
        let enqueuer = {
            let (s, entered, leave) = (s.clone(), entered.0, leave.1);
            std::thread::spawn(move || {
                let _order = s.enqueue_lock();
                entered.send(()).unwrap();
                leave.recv().unwrap();
            })
        };
        entered.1.recv().unwrap();
        let capturer = {
            let s = s.clone();
            std::thread::spawn(move || s.begin_capture(CaptureMode::Relaxed))
        };
        until_capture_waits(&s);
        drop(buf);
        drop((ctx, cuda));
        assert_eq!(world.used_memory(0), 64, "neither freed nor lost");
        leave.0.send(()).unwrap();
        enqueuer.join().unwrap();
        capturer.join().unwrap().unwrap();
        // The capture's graph took the memory when the lock was let go.
        let graph = s.end_capture().unwrap();
        drop(graph);
        s.synchronize().unwrap();
        drop(s);
        assert_eq!(world.used_memory(0), 0);
        assert_eq!(world.order_violations(), 0, "{:?}", world.violations());
        assert_eq!(world.live().context_retains, 0);
    }
}
