//! A host-bound kernel's read with a bogus length: the range is checked before anything is
//! allocated for the result, so the length is reported as a violation instead of being
//! handed to the host allocator (where it could exhaust host memory).
//!
//! This binary's allocator records the largest request and refuses any above 1 GiB, so a
//! regression (the result allocated before the check) fails the assertions here instead
//! of taking the host's memory: the check is bounded either way.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuda_mock::MockDriver;
use cuda_sys::CUresult;

/// The largest request the host allocator has seen (since the last reset).
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Requests above this are refused (a null pointer), not attempted.
const CAP: usize = 1 << 30;

/// The system allocator, recording the largest request and refusing those above [`CAP`].
struct Capped;

// SAFETY: every request is either refused (null, which callers handle) or forwarded
// unchanged to the system allocator, which upholds `GlobalAlloc`'s contract.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        if new_size > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's block, layout and size, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated by `System` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;

const OK: CUresult = CUresult::CUDA_SUCCESS;

/// What the kernel saw: the length of what `read` returned, and whether it had faulted.
type Seen = Arc<Mutex<Vec<(usize, bool)>>>;

/// `huge(p: u64, len: u64)` reads `len` u64 at `p`; a 64-byte buffer at `p`.
#[test]
fn a_read_with_a_bogus_length_is_a_violation_and_allocates_nothing() {
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let (d, world) = MockDriver::with_devices(1)
        .kernel("huge", &[8, 8], move |k| {
            let (p, len) = (k.param::<u64>(0), k.param::<u64>(1));
            let v = k.read::<u64>(p, len as usize);
            s2.lock().unwrap().push((v.len(), k.failed()));
        })
        .build()
        .unwrap();
    let f = d.fns();
    let ptx = c".version 8.0\n.target sm_90\n.visible .entry huge(.param .u64 p, .param .u64 len) { ret; }";
    let (mut ctx, mut module, mut func) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let mut buf = 0;
    // SAFETY: mock driver calls with valid out-pointers and a NUL-terminated PTX string.
    unsafe {
        assert_eq!((f.cuInit)(0), OK);
        assert_eq!((f.cuDevicePrimaryCtxRetain)(&mut ctx, 0), OK);
        assert_eq!((f.cuCtxSetCurrent)(ctx), OK);
        assert_eq!((f.cuModuleLoadData)(&mut module, ptx.as_ptr().cast()), OK);
        assert_eq!(
            (f.cuModuleGetFunction)(&mut func, module, c"huge".as_ptr()),
            OK
        );
        assert_eq!((f.cuMemAlloc)(&mut buf, 64), OK);
        assert_eq!((f.cuMemsetD8)(buf, 7, 64), OK);
    }
    let launch = |len: u64| {
        let (mut p, mut n) = (buf, len);
        let mut params: [*mut c_void; 2] = [(&raw mut p).cast(), (&raw mut n).cast()];
        // SAFETY: a live function; one pointer per declared parameter, each to 8 bytes.
        unsafe {
            (f.cuLaunchKernel)(
                func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    };

    // A legal read first: the kernel and the allocator's bookkeeping work.
    assert_eq!(launch(8), OK);
    assert_eq!(seen.lock().unwrap().pop(), Some((8, false)));
    assert!(world.violations().is_empty(), "{:?}", world.violations());

    // Lengths that fit no allocation: two that are valid host layouts, which a read
    // allocating before the check hands to the allocator (`1 << 31`: 16 GiB, which a
    // large host would really allocate and zero-fill; `isize::MAX / 8`: ~8 EiB), and
    // `usize::MAX / 8` (its bytes fit a usize, but no host layout).
    for len in [1 << 31, isize::MAX as usize / 8, usize::MAX / 8] {
        LARGEST.store(0, Ordering::Relaxed);
        let rc = launch(len as u64);
        let largest = LARGEST.load(Ordering::Relaxed);
        assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "len {len}");
        assert_eq!(
            seen.lock().unwrap().pop(),
            Some((0, true)),
            "len {len}: nothing read, the kernel faulted"
        );
        assert!(
            largest < 1 << 20,
            "len {len}: the host allocator was asked for {largest} bytes"
        );
        assert_eq!(
            world.take_violations(),
            [format!(
                "cuLaunchKernel huge reads {buf:#x}+{}: out of bounds of the allocation at {buf:#x} (64 bytes)",
                len * 8
            )],
            "len {len}"
        );
    }

    // SAFETY: live handles of this test.
    unsafe {
        assert_eq!((f.cuMemFree)(buf), OK);
        assert_eq!((f.cuModuleUnload)(module), OK);
        assert_eq!((f.cuDevicePrimaryCtxRelease)(0), OK);
    }
    assert!(world.live().is_empty(), "{:?}", world.live());
    assert!(world.violations().is_empty(), "{:?}", world.violations());
}
