//! Device memory of other allocators and holds on it, for simulations layered on this
//! one (the NCCL mock's `ncclMemAlloc` and registrations): the same sanitizer covers them.

use crate::alloc::alloc_device;
use crate::current::current_context;
use crate::queue::{running_op, stream_key};
use crate::state::State;
use crate::world::MockWorld;
use cuda_sys::{CUresult, CUstream};

/// One live device allocation, as [`MockWorld::allocation_of`] describes it.
///
/// ```
/// use cuda_mock::{AllocationInfo, MockDriver};
/// let (driver, world) = MockDriver::with_devices(1).build()?;
/// let f = driver.fns();
/// let mut ctx = std::ptr::null_mut();
/// // SAFETY: a valid out-pointer; the retained context is made current.
/// unsafe {
///     (f.cuInit)(0);
///     (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
///     (f.cuCtxSetCurrent)(ctx);
/// }
/// // Memory of another allocator (as `ncclMemAlloc` has), which only it may free.
/// let p = world.alloc_foreign(4096, "myAlloc").expect("a context is current");
/// let info = AllocationInfo { start: p, len: 4096, device: 0, foreign: Some("myAlloc") };
/// assert_eq!(world.allocation_of(p + 100, 8), Some(info));
/// assert_eq!(world.allocation_of(p + 4090, 8), None, "runs past its end");
/// assert_eq!(world.free_foreign(p, "myFree", "myAlloc"), Ok(()));
/// assert_eq!(world.allocation_of(p, 1), None);
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationInfo {
    /// Its first byte.
    pub start: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Its device ordinal.
    pub device: i32,
    /// The allocator that made it, when not the driver (see [`MockWorld::alloc_foreign`]).
    pub foreign: Option<&'static str>,
}

impl State {
    /// Reports uses of the allocation at `start` that the host has not waited for, before
    /// `call` frees it from the host without waiting itself.
    fn check_host_order(&mut self, call: &str, start: usize) {
        let Some(a) = self.allocs.get(&start) else {
            return;
        };
        let mut late: Vec<(usize, String)> = a
            .last_use
            .iter()
            .filter(|(k, u)| self.host_clock.get(**k) < u.stamp)
            .map(|(k, u)| (*k, u.call.clone()))
            .collect();
        late.sort();
        let len = a.len;
        for (k, what) in late {
            let m = format!(
                "{call} frees {start:#x}+{len} while work enqueued on {} ({what}) may still run: the host did not wait for it",
                self.stream_name(k)
            );
            self.violation(m);
        }
    }
}

impl MockWorld {
    /// Allocates `bytes` of device memory in the calling thread's current context for
    /// another allocator named `by` (e.g. `"ncclMemAlloc"`): `cuMemFree` of it is a
    /// violation; only [`free_foreign`](Self::free_foreign) with the same name releases it.
    pub fn alloc_foreign(&self, bytes: usize, by: &'static str) -> Result<u64, CUresult> {
        let ctx = current_context(self.world.id).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let mut s = self.world.lock();
        let p = alloc_device(&self.world, &mut s, ctx, bytes)?;
        if let Some(a) = s.allocs.get_mut(&p) {
            a.foreign = Some(by);
        }
        Ok(p as u64)
    }

    /// Frees memory of [`alloc_foreign`](Self::alloc_foreign) by `by` from the host,
    /// without waiting for the device (as `ncclMemFree` does): uses the host has not
    /// waited for are reported, and so are holds ([`pin`](Self::pin)) and frees of
    /// anything else (`call` names the free in reports). `CUDA_ERROR_INVALID_VALUE` when
    /// `ptr` is not the start of a live allocation of `by`.
    pub fn free_foreign(
        &self,
        ptr: u64,
        call: &'static str,
        by: &'static str,
    ) -> Result<(), CUresult> {
        let p = ptr as usize;
        let mut s = self.world.lock();
        match s.allocs.get(&p).map(|a| a.foreign) {
            Some(Some(f)) if f == by => {}
            Some(_) => {
                s.violation(format!("{call} of {p:#x}: not allocated by {by}"));
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            None => {
                let m = s.bad_free(call, p);
                s.violation(m);
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
        }
        s.check_host_order(call, p);
        s.report_pins(call, p);
        s.quarantine(p, call);
        Ok(())
    }

    /// The live device allocation that holds all of `[ptr, ptr + len)`, if any.
    pub fn allocation_of(&self, ptr: u64, len: usize) -> Option<AllocationInfo> {
        let s = self.world.lock();
        let (start, a) = s.allocs.range(..=ptr as usize).next_back()?;
        let end = (ptr as usize).checked_add(len)?;
        (end <= start + a.len).then_some(AllocationInfo {
            start: *start as u64,
            len: a.len,
            device: a.device,
            foreign: a.foreign,
        })
    }

    /// Holds the allocation that contains `ptr` for another simulation: freeing it before
    /// [`unpin`](Self::unpin)`(id)` is reported, naming `what`. `false` when `ptr` is in
    /// no live allocation.
    pub fn pin(&self, ptr: u64, id: u64, what: String) -> bool {
        let mut s = self.world.lock();
        let Some((start, a)) = s.allocs.range_mut(..=ptr as usize).next_back() else {
            return false;
        };
        if ptr as usize >= start + a.len {
            return false;
        }
        a.pins.push((id, what));
        true
    }

    /// Releases the hold `id` (wherever it is; nothing if it is gone with its memory).
    pub fn unpin(&self, id: u64) {
        let mut s = self.world.lock();
        for a in s.allocs.values_mut() {
            a.pins.retain(|(i, _)| *i != id);
        }
    }

    /// Where `stream` stands: its key and the stamp of the newest op enqueued on it (0
    /// before any), for checking later whether the host waited for that op
    /// ([`host_waited_for`](Self::host_waited_for)). `stream` 0 is the current context's
    /// legacy stream.
    pub fn stream_position(&self, stream: CUstream) -> Option<(usize, u64)> {
        let s = self.world.lock();
        let (key, _) = stream_key(&self.world, &s, stream).ok()?;
        Some((key, s.latest.get(key)))
    }

    /// Inside the op of [`enqueue_op`](Self::enqueue_op) (or [`enqueue`](Self::enqueue))
    /// this thread is executing, now or at a graph's replay: where it stands, as
    /// [`stream_position`](Self::stream_position) gives it (the launch stream's key at a
    /// replay). `None` outside such an op.
    pub fn running_op(&self) -> Option<(usize, u64)> {
        running_op(&self.world)
    }

    /// Whether the host has waited for op `stamp` of stream `key` (a stream or event
    /// synchronisation, or a synchronous call that waits for everything).
    pub fn host_waited_for(&self, key: usize, stamp: u64) -> bool {
        self.world.lock().host_clock.get(key) >= stamp
    }
}
