//! Attacks on the cudarc adapters found in review, each in a child on the drop-in, from
//! safe code only: the child's exit status is the sanitizer's verdict, and each test
//! asserts the sound outcome (each failed before its fix).

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cuda_hal::cudarc::{Borrowed, BorrowedMut};
use cuda_hal::{CaptureMode, Context, DeviceBuffer, DeviceViewMut, Error, Stream};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream};

use super::{child, dropin_dir, is_child, library, stderr};

fn on_the_dropin(me: &str) -> String {
    let dir = dropin_dir();
    let o = child(
        me,
        &[
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
            ("CUDA_MOCK_DEVICES", "2"),
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    err
}

const CAPTURED: Error = Error::Deferred {
    what: "borrowed cudarc memory",
    why: "the stream is being captured",
};

/// A loan whose cudarc stream cudarc is capturing: ordering our stream after it would make
/// ours join cudarc's capture (our later safe work, on our own memory, recorded into
/// cudarc's graph with nothing held). Refused before any ordering; ours stays free.
#[test]
fn a_loan_of_a_stream_cudarc_captures_is_refused_and_ours_stays_out() {
    const ME: &str =
        "cudarc_attacks::a_loan_of_a_stream_cudarc_captures_is_refused_and_ours_stays_out";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    let cuda = cuda_hal::Cuda::load().unwrap();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let src = home.clone_htod(&[1u32, 2, 3, 4]).unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    let from = Borrowed::new(&ctx, &src).unwrap();
    home.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    assert_eq!(dst.copy_from_async(&from, &ours), Err(CAPTURED));
    ours.expect_immediate("our stream").unwrap();
    drop(from);
    dst.fill_async(9, &ours).unwrap();
    let graph = home.end_capture(CUgraphInstantiate_flags(0)).unwrap();
    ours.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [9; 4], "the fill ran, on our stream");
    drop(graph);
}

/// The same with this crate's own capture of cudarc's stream, through another wrapper of
/// it: the loan's home is a second wrapper, which asks the driver.
#[test]
fn a_loan_of_a_stream_this_crate_captures_through_another_wrapper_is_refused() {
    const ME: &str =
        "cudarc_attacks::a_loan_of_a_stream_this_crate_captures_through_another_wrapper_is_refused";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    let cuda = cuda_hal::Cuda::load().unwrap();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let their_stream = theirs.new_stream().unwrap();
    // SAFETY: cudarc never captures this stream; this crate does, through `wrapped`.
    let wrapped = unsafe { Stream::from_cudarc(&ctx, &their_stream) }.unwrap();
    let src = their_stream.clone_htod(&[1u32, 2, 3, 4]).unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    let from = Borrowed::new(&ctx, &src).unwrap();
    wrapped.begin_capture(CaptureMode::Relaxed).unwrap();
    assert_eq!(dst.copy_from_async(&from, &ours), Err(CAPTURED));
    drop(from);
    dst.fill_async(9, &ours).unwrap();
    let graph = wrapped.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 0, "nothing of ours was captured");
    ours.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [9; 4]);
}

/// A user's `after_enqueue` hook that panics, released with the loan's call: the copy is
/// still ordered before cudarc's free (the loan hears of the call from the call itself,
/// and every hook runs even when one panics).
#[test]
fn a_panicking_hook_does_not_lose_the_loans_ordering() {
    const ME: &str = "cudarc_attacks::a_panicking_hook_does_not_lose_the_loans_ordering";
    if !is_child(ME) {
        let err = on_the_dropin(ME);
        assert!(
            err.contains("cuda-hal: a Stream::after_enqueue hook panicked; the others ran"),
            "{err}"
        );
        return;
    }
    let cuda = cuda_hal::Cuda::load().unwrap();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let src = home.clone_htod(&[1u32, 2, 3, 4]).unwrap();
    home.synchronize().unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        let from = Borrowed::new(&ctx, &src).unwrap();
        let _order = ours.enqueue_lock();
        ours.after_enqueue(|| panic!("a user's hook panics"))
            .unwrap();
        dst.copy_from_async(&from, &ours).unwrap();
    }));
    assert!(
        r.is_ok(),
        "the hook's panic does not escape the lock's release"
    );
    // cudarc frees the source on its stream: after our copy (the sanitizer checks).
    drop(src);
    ours.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [1, 2, 3, 4]);
}

/// Another library's thread begins a relaxed capture of `theirs` just before the next
/// `cuEventRecord` of this process does anything (the drop-in runs that thread at that
/// very moment, and waits for it): the race of a capture begun while an ordering is made.
fn capture_at_the_next_record(theirs: &Arc<CudaStream>) {
    unsafe extern "C" fn begin(user: *mut c_void) {
        // SAFETY: the box made below, handed to this function once.
        let stream = unsafe { Box::from_raw(user.cast::<Arc<CudaStream>>()) };
        std::thread::scope(|s| {
            s.spawn(|| {
                stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                    .unwrap()
            })
            .join()
            .unwrap()
        });
    }
    type BeforeCall = unsafe extern "C" fn(
        *const c_char,
        u64,
        Option<unsafe extern "C" fn(*mut c_void)>,
        *mut c_void,
    ) -> c_int;
    // SAFETY: the drop-in this process runs on (the loader opens one file once).
    let lib = unsafe { libloading::Library::new(library()) }.unwrap();
    // SAFETY: the drop-in exports it with this signature.
    let before_call = unsafe { lib.get::<BeforeCall>(b"simgpu_before_call") }.unwrap();
    let user = Box::into_raw(Box::new(theirs.clone())).cast::<c_void>();
    // SAFETY: a NUL-terminated name; `begin` takes `user` once, from any thread.
    let rc = unsafe { before_call(c"cuEventRecord".as_ptr(), 0, Some(begin), user) };
    assert_eq!(rc, 0);
}

/// What a capture cudarc begins at the moment of an ordering leaves: our stream in no
/// capture, and cudarc's capture ending cleanly (the ordering's private stream joined back).
fn end_theirs(home: &Arc<CudaStream>, ours: &Stream) {
    assert!(
        !ours.is_capturing().unwrap(),
        "our stream joined no capture"
    );
    let graph = home.end_capture(CUgraphInstantiate_flags(0));
    assert!(
        graph.is_ok(),
        "cudarc's capture ends cleanly: {:?}",
        graph.err()
    );
}

/// cudarc begins capturing a loan's stream on another thread while the loan orders our
/// stream after it: our copy is refused as if the capture had begun before, and our stream
/// joins nothing (had it joined, the copy and the fill after it would be recorded into
/// cudarc's graph, which would write our freed buffer at its launch).
#[test]
fn a_capture_begun_during_a_loans_ordering_records_none_of_our_work() {
    const ME: &str =
        "cudarc_attacks::a_capture_begun_during_a_loans_ordering_records_none_of_our_work";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    let cuda = cuda_hal::Cuda::load().unwrap();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let src = home.clone_htod(&[1u32, 2, 3, 4]).unwrap();
    let ours = Stream::non_blocking(&ctx).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    let from = Borrowed::new(&ctx, &src).unwrap();
    capture_at_the_next_record(&home);
    assert_eq!(dst.copy_from_async(&from, &ours), Err(CAPTURED));
    drop(from);
    dst.fill_async(9, &ours).unwrap();
    end_theirs(&home, &ours);
    ours.synchronize().unwrap();
    assert_eq!(dst.to_vec().unwrap(), [9; 4], "the fill ran, on our stream");
}

/// The same for a writable loan, and for a stream of ours that is itself cudarc's (never
/// captured): [`Stream::from_cudarc`] streams meet the same rule.
#[test]
fn a_capture_begun_during_a_writable_loans_ordering_records_none_of_our_work() {
    const ME: &str =
        "cudarc_attacks::a_capture_begun_during_a_writable_loans_ordering_records_none_of_our_work";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    let cuda = cuda_hal::Cuda::load().unwrap();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let mut slice = home.alloc_zeros::<u32>(4).unwrap();
    let other = theirs.new_stream().unwrap();
    for ours in [
        Stream::non_blocking(&ctx).unwrap(),
        // SAFETY: cudarc never captures `other`.
        unsafe { Stream::from_cudarc(&ctx, &other) }.unwrap(),
    ] {
        let src = DeviceBuffer::from_slice(&ctx, &[5u32; 4]).unwrap();
        let mut to = BorrowedMut::new(&ctx, &mut slice).unwrap();
        capture_at_the_next_record(&home);
        assert_eq!(
            DeviceViewMut::new(&mut to).copy_from_async(&src, &ours),
            Err(CAPTURED)
        );
        drop(to);
        end_theirs(&home, &ours);
        let mut to = BorrowedMut::new(&ctx, &mut slice).unwrap();
        DeviceViewMut::new(&mut to).fill_async(3, &ours).unwrap();
        drop(to);
        assert_eq!(home.clone_dtoh(&slice).unwrap(), [3; 4]);
    }
}

/// cudarc begins capturing the stream of memory moved in from it while that memory's
/// first use on our stream orders ours after it: the use is refused as if the capture had
/// begun before, and our stream joins nothing; once the capture is over, the same use runs.
#[test]
fn a_capture_begun_during_moved_in_memorys_first_ordering_records_none_of_our_work() {
    const ME: &str = "cudarc_attacks::a_capture_begun_during_moved_in_memorys_first_ordering_records_none_of_our_work";
    if !is_child(ME) {
        on_the_dropin(ME);
        return;
    }
    let cuda = cuda_hal::Cuda::load().unwrap();
    let theirs = CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cuda, &theirs).unwrap();
    let home = theirs.new_stream().unwrap();
    let other = theirs.new_stream().unwrap();
    for ours in [
        Stream::non_blocking(&ctx).unwrap(),
        // SAFETY: cudarc never captures `other`.
        unsafe { Stream::from_cudarc(&ctx, &other) }.unwrap(),
    ] {
        let slice = home.alloc_zeros::<u32>(4).unwrap();
        let mut buf = DeviceBuffer::from_cudarc(&ctx, slice).unwrap();
        capture_at_the_next_record(&home);
        assert_eq!(
            buf.fill_async(7, &ours),
            Err(Error::Capturing {
                what: "ordering stream-ordered memory"
            })
        );
        end_theirs(&home, &ours);
        buf.fill_async(7, &ours).unwrap();
        assert_eq!(buf.to_vec().unwrap(), [7; 4]);
    }
}
