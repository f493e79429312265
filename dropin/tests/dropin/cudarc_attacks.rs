//! Attacks on the cudarc adapters found in review, each in a child on the drop-in, from
//! safe code only: the child's exit status is the sanitizer's verdict, and each test
//! asserts the sound outcome (each failed before its fix).

use std::panic::{AssertUnwindSafe, catch_unwind};

use cuda_hal::cudarc::Borrowed;
use cuda_hal::{CaptureMode, Context, DeviceBuffer, Error, Stream};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::{child, dropin_dir, is_child, stderr};

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
