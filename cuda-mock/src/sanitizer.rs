//! The sanitizer: what makes misuse of asynchronous work fail a CPU test.
//!
//! Stream work runs eagerly, at enqueue time, so a real race never shows up as wrong data.
//! Three mechanisms stand in for the device's own faults:
//!
//! - **Quarantine**: freed device memory is filled with `0xDD`, kept allocated (so its
//!   address is not handed out again) and remembered with the call that freed it.
//! - **Address checks**: every range an op touches is checked when the op executes (now,
//!   or at graph replay): it must lie in one live allocation of the stream's device.
//! - **Vector clocks**: each stream (each context's legacy stream too) and the host carry
//!   a clock of what they are ordered after; an op's stamp is recorded on the allocations
//!   it touches, so a stream-ordered free that is not ordered after earlier work on other
//!   streams is reported even though that work already ran.
//!
//! This module holds what the sanitizer keeps (ranges, clocks, allocations and the
//! quarantine): a leaf, below the state that stores it. The checks themselves are methods
//! of the state, in `checks`.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A device range an op reads or writes, checked when the op executes.
///
/// How a simulation layered on the mock driver (the NCCL mock) has its own work checked:
///
/// ```
/// use std::sync::Arc;
/// use cuda_mock::{MockDriver, Touch};
/// use cuda_sys::{CUdeviceptr, CUresult};
///
/// let (driver, world) = MockDriver::with_devices(1).build()?;
/// let f = driver.fns();
/// let (mut ctx, mut p): (_, CUdeviceptr) = (std::ptr::null_mut(), 0);
/// // SAFETY: valid out-pointers and a current context.
/// unsafe {
///     (f.cuInit)(0);
///     (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
///     (f.cuCtxSetCurrent)(ctx);
///     (f.cuMemAlloc)(&mut p, 64);
/// }
/// let legacy = std::ptr::null_mut(); // the current context's legacy default stream
/// let op = Arc::new(|| CUresult::CUDA_SUCCESS);
/// let fits = vec![Touch { ptr: p, len: 64, what: "writes" }];
/// assert_eq!(world.enqueue_op(legacy, "myCopy", fits, op.clone()), CUresult::CUDA_SUCCESS);
/// let past_the_end = vec![Touch { ptr: p + 32, len: 64, what: "writes" }];
/// let rc = world.enqueue_op(legacy, "myCopy", past_the_end, op);
/// assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
/// let found = world.take_violations();
/// assert_eq!(found.len(), 1);
/// assert!(found[0].starts_with(&format!("myCopy writes {:#x}+64", p + 32)), "{found:?}");
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Touch {
    /// Device address of the first byte.
    pub ptr: u64,
    /// Length in bytes (0 touches nothing).
    pub len: usize,
    /// A verb for reports, such as `"reads"` or `"writes"`.
    pub what: &'static str,
}

/// How a side of an op must be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Device memory of the stream's device (or any device, for peer ops).
    Device,
    /// Host memory by the API's contract (device memory is accepted, as with UVA).
    Host,
    /// Either (unified addressing): device rules if it starts in an allocation.
    Unified,
}

/// One range an op touches, with how it must be placed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
    pub(crate) what: &'static str,
    pub(crate) side: Side,
}

/// A vector clock over stream keys (a stream handle, or a context handle for its legacy
/// stream): entry `k` is the newest op of stream `k` that the owner is ordered after.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock(pub(crate) HashMap<usize, u64>);

impl Clock {
    pub(crate) fn get(&self, key: usize) -> u64 {
        self.0.get(&key).copied().unwrap_or(0)
    }

    /// Pointwise maximum: afterwards this is ordered after everything `other` is.
    pub(crate) fn join(&mut self, other: &Clock) {
        for (k, v) in &other.0 {
            let e = self.0.entry(*k).or_insert(0);
            *e = (*e).max(*v);
        }
    }

    pub(crate) fn tick(&mut self, key: usize) -> u64 {
        let e = self.0.entry(key).or_insert(0);
        *e += 1;
        *e
    }
}

/// The newest op of one stream that touched an allocation.
#[derive(Clone, Debug)]
pub(crate) struct Use {
    pub(crate) stamp: u64,
    pub(crate) call: String,
}

/// Device memory: host memory aligned to 256 bytes, like the driver's allocations.
pub(crate) struct Alloc {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) ctx: usize,
    pub(crate) device: i32,
    /// Per stream key, the newest op that touched this allocation (for stream-ordered frees).
    pub(crate) last_use: HashMap<usize, Use>,
    /// The module whose global this is: freed when the module is unloaded, never by a
    /// free call.
    pub(crate) module: Option<usize>,
    /// The allocator that made it when it is not the driver's (e.g. `ncclMemAlloc`): only
    /// that allocator's free may release it.
    pub(crate) foreign: Option<&'static str>,
    /// Holds of other simulations on parts of it (an NCCL registration): id and what holds
    /// it. Freeing it while held is a violation.
    pub(crate) pins: Vec<(u64, String)>,
}

// SAFETY: the allocation is plain memory owned by the state; access is serialised by the
// world's mutex or, for stream work, by the caller's stream order, as on a real device.
unsafe impl Send for Alloc {}

pub(crate) const ALIGN: usize = 256;

/// Whole pages (as a granularity-aligned allocation such as `ncclMemAlloc`'s is) are
/// aligned to the page: no other allocation shares a page with them.
pub(crate) const PAGE: usize = 4096;

impl Alloc {
    /// The layout of `len` bytes, the same at allocation and release.
    pub(crate) fn layout(len: usize) -> Option<std::alloc::Layout> {
        let align = if len.is_multiple_of(PAGE) {
            PAGE
        } else {
            ALIGN
        };
        std::alloc::Layout::from_size_align(len, align).ok()
    }
}

/// Freed device memory the quarantine keeps, in bytes: beyond it (or beyond
/// [`QUARANTINE_BLOCKS`]) the oldest is evicted, really freed and no longer recognised.
pub const QUARANTINE_BYTES: usize = 1 << 30;
/// Freed device allocations the quarantine keeps: freeing one more evicts the oldest.
pub const QUARANTINE_BLOCKS: usize = 4096;

/// The byte freed device memory is filled with.
pub(crate) const POISON: u8 = 0xDD;

struct Freed {
    ptr: *mut u8,
    len: usize,
    by: &'static str,
}

/// Freed device memory, still allocated: address -> (memory, freeing call), bounded FIFO.
#[derive(Default)]
pub(crate) struct Quarantine {
    map: BTreeMap<usize, Freed>,
    order: VecDeque<usize>,
    bytes: usize,
}

// SAFETY: the quarantined memory is owned by the quarantine and only touched (poisoned,
// freed) under the world's mutex.
unsafe impl Send for Quarantine {}

impl Quarantine {
    /// Poisons `a` and keeps it; evicts (really frees) the oldest beyond the bounds.
    pub(crate) fn insert(&mut self, a: Alloc, by: &'static str) {
        // SAFETY: `a.ptr` is a live allocation of `a.len` bytes, now owned here.
        unsafe { std::ptr::write_bytes(a.ptr, POISON, a.len) };
        let addr = a.ptr.addr();
        self.map.insert(
            addr,
            Freed {
                ptr: a.ptr,
                len: a.len,
                by,
            },
        );
        self.order.push_back(addr);
        self.bytes += a.len;
        while self.bytes > QUARANTINE_BYTES || self.order.len() > QUARANTINE_BLOCKS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(f) = self.map.remove(&old) {
                self.bytes -= f.len;
                dealloc(f);
            }
        }
    }

    /// The freeing call of quarantined memory overlapping `[ptr, ptr + len)`.
    pub(crate) fn overlapping(&self, ptr: usize, len: usize) -> Option<&'static str> {
        let end = ptr.saturating_add(len.max(1));
        let (start, f) = self.map.range(..end).next_back()?;
        (start + f.len > ptr).then_some(f.by)
    }

    /// Really frees everything.
    pub(crate) fn clear(&mut self) {
        self.order.clear();
        self.bytes = 0;
        for (_, f) in std::mem::take(&mut self.map) {
            dealloc(f);
        }
    }
}

fn dealloc(f: Freed) {
    if let Some(layout) = Alloc::layout(f.len) {
        // SAFETY: allocated with this layout in `alloc_device`, moved from the live map to
        // the quarantine and removed from it now, so freed exactly once.
        unsafe { std::alloc::dealloc(f.ptr, layout) };
    }
}
