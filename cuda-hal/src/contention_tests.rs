//! What the release queue (`queued.rs`) promises, seen through buffers, streams and
//! captures (here, where every type can be named without tying the queue to them).
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
