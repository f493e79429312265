//! The default that needs no thought: [`Communicator::buffer`] hands out NCCL memory
//! (`ncclMemAlloc`) and takes it back on drop for the next request of the same type and
//! length. A pooled buffer is registered with the communicator (`ncclCommRegister`) the
//! first time a collective that gains from registration uses at least
//! [`REGISTER_FROM`] bytes of it, and stays registered while the pool keeps it
//! (registering costs far more than a collective: a training loop pays it once).
//!
//! Which collectives, from the measurements in BENCHMARKS.md (2 × H200 over NVLink,
//! NCCL 2.28.3 and 2.28.9): local registration made all-gather, all-to-all and
//! send/receive up to 1.3× faster from a few MiB on, left all-reduce, reduce and
//! reduce-scatter unchanged, and made broadcast 4–13 % *slower* from 2 MiB on; NCCL
//! memory without registration changed nothing. So the pool registers a buffer only for
//! the first three, and a buffer only ever broadcast or reduced stays unregistered NCCL
//! memory, exactly as fast as plain memory. Windows are not the pool's: they win small
//! all-reduce latency but cost large all-reduce bandwidth (up to 1.3× slower).
//! Where the loaded NCCL has no registration or NCCL memory (< 2.19) the pool hands out
//! plain memory.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, Weak};

use cuda_hal::{DeviceBuffer, DeviceSlice, DeviceSliceMut, KeepAlive, Stream};
use cuda_sys::CUdeviceptr;

use crate::comm::CommShared;
use crate::registration::RegShared;
use crate::sync::lock;
use crate::{Communicator, Error, NcclType, Result};

/// Buffers kept per (type, length): enough for a few in flight at once.
const KEEP_PER_SHAPE: usize = 8;

/// The smallest use (bytes of one buffer in one call) that registers a pooled buffer:
/// below it registration gained nothing measurable.
pub const REGISTER_FROM: usize = 1 << 20;

/// Whether the collective `what` (the names of collective.rs) gains from registered
/// buffers (see the module docs).
fn gains(what: &str) -> bool {
    matches!(
        what,
        "all_gather" | "all_gather_in_place" | "all_to_all" | "send" | "recv"
    )
}

/// Where a pooled buffer's registration stands.
enum SlotReg {
    /// Not registered yet (no use that gains so far).
    No,
    Yes(Arc<RegShared>),
    /// NCCL refused it, or cannot register: never tried again.
    Never,
}

/// One pooled allocation: its range, a shared owner of its memory (for the registration)
/// and its registration. Known to the communicator's registry (weakly) so that a
/// collective can register it.
pub(crate) struct Slot {
    comm: Arc<CommShared>,
    start: u64,
    bytes: usize,
    memory: KeepAlive,
    reg: Mutex<SlotReg>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.comm.registry.forget_slot(self);
    }
}

impl Slot {
    fn registration(&self) -> Option<Arc<RegShared>> {
        match &*lock(&self.reg) {
            SlotReg::Yes(r) => Some(r.clone()),
            _ => None,
        }
    }

    pub(crate) fn range(&self) -> (u64, u64) {
        (self.start, self.start + self.bytes as u64)
    }
}

type Entry = (Box<dyn Any + Send>, Arc<Slot>);

type Free = HashMap<(TypeId, usize), Vec<Entry>>;

/// A communicator's free buffers, by element type and length. Shared with the buffers
/// it handed out (which may drop on any thread); the registrations and slots keep the
/// communicator's state alive, never this (no cycle).
#[derive(Default)]
pub(crate) struct Pool {
    free: Arc<Mutex<Free>>,
}

impl Communicator {
    /// A buffer of `len` elements from this communicator's pool of NCCL memory, which
    /// registers itself the first time a collective that gains from registration uses it
    /// (see [`REGISTER_FROM`] and the table in BENCHMARKS.md): the default, as fast as
    /// plain memory or faster, except a buffer that an all-gather registered and that is
    /// then broadcast (registered broadcasts are slower: give them their own buffer). Its
    /// contents are whatever the last user left (like [`DeviceBuffer::alloc`]). On drop
    /// it returns to the pool if nothing else holds it then (no graph, open group or
    /// registration of yours; otherwise it is released like any buffer, after them), up
    /// to 8 buffers of one type and length; [`trim_pool`](Self::trim_pool) releases what
    /// the pool keeps. Plain memory where the loaded NCCL has no NCCL memory (< 2.19).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::{Cuda, mock::MockDriver};
    /// # use nccl_sys::mock::MockNccl;
    /// use nccl_channel::{Communicator, ReduceOp};
    /// # let (cuda, world) = Cuda::mock(MockDriver::with_devices(1))?;
    /// # let (nccl, _) = MockNccl::new(&world).build()?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), &[ctx.clone()])?.remove(0);
    /// let stream = cuda_hal::Stream::new(&ctx)?;
    /// for step in 0..3 {
    ///     let mut grads = comm.buffer::<f32>(256)?; // the same memory every step
    ///     grads.fill(step as f32)?;
    ///     comm.all_reduce_in_place(&mut grads, ReduceOp::Sum, &stream)?;
    /// }
    /// assert_eq!(comm.pooled_buffers(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer<T: NcclType>(&self, len: usize) -> Result<PooledBuffer<'_, T>> {
        let key = (TypeId::of::<T>(), len);
        loop {
            let popped = lock(&self.pool.free).get_mut(&key).and_then(Vec::pop);
            let Some((b, slot)) = popped else {
                break;
            };
            let Ok(b) = b.downcast::<DeviceBuffer<T>>() else {
                continue;
            };
            // The last user's work must be done before a new one writes.
            if b.synchronize_uses().is_ok() {
                return Ok(self.pooled(*b, slot));
            }
            if let Some(r) = slot.registration() {
                *lock(&slot.reg) = SlotReg::Never;
                let _ = self.release_registration(r);
            }
        }
        let (buf, can_register) = match self.alloc_nccl::<T>(len) {
            Ok(b) => (b, self.nccl().fns().ncclCommRegister.is_some()),
            Err(Error::Unsupported { .. }) => (DeviceBuffer::alloc(self.context(), len)?, false),
            Err(e) => return Err(e),
        };
        let slot = Arc::new(Slot {
            comm: self.shared().clone(),
            start: buf.as_raw(),
            bytes: buf.size_bytes(),
            memory: buf.keep_alive(),
            reg: Mutex::new(if can_register && !buf.is_empty() {
                SlotReg::No
            } else {
                SlotReg::Never
            }),
        });
        if matches!(*lock(&slot.reg), SlotReg::No) {
            self.shared().registry.add_slot(&slot);
        }
        Ok(self.pooled(buf, slot))
    }

    fn pooled<T: NcclType>(&self, buf: DeviceBuffer<T>, slot: Arc<Slot>) -> PooledBuffer<'_, T> {
        PooledBuffer {
            origin: (buf.as_raw(), buf.len(), buf.context().clone()),
            buf: Some(buf),
            slot,
            pool: self.pool.free.clone(),
            _comm: PhantomData,
        }
    }

    /// A collective `what` is about to use `[ptr, ptr + bytes)`: a pooled buffer that
    /// holds it and is not registered yet is registered now if the collective gains from
    /// it. Inside a group too: NCCL looks registrations up when the group ends.
    ///
    /// Returns the slot registered, which the caller keeps until the work's use of the
    /// memory is noted ([`Registry::used`](crate::registration::Registry::used)): the
    /// slot holds the new registration, and its pooled buffer may drop on another thread
    /// meanwhile (when the memory was swapped out of it), which would release the
    /// registration before NCCL's use of it is known. An error only when the attempt
    /// left the communicator aborted (a failure NCCL cannot recover from, or an abort
    /// asked for through an [`AbortHandle`](crate::AbortHandle) meanwhile): the
    /// collective must not be issued then.
    #[inline]
    pub(crate) fn register_pooled(
        &self,
        what: &str,
        ptr: u64,
        bytes: usize,
    ) -> Result<Option<Arc<Slot>>> {
        if bytes >= REGISTER_FROM && gains(what) && self.shared().registry.has_slots() {
            self.register_pooled_slow(ptr, bytes)
        } else {
            Ok(None)
        }
    }

    #[cold]
    fn register_pooled_slow(&self, ptr: u64, bytes: usize) -> Result<Option<Arc<Slot>>> {
        let Some(slot) = self.shared().registry.slot_of(ptr, bytes) else {
            return Ok(None);
        };
        if !matches!(*lock(&slot.reg), SlotReg::No) {
            return Ok(None);
        }
        // Not under the slot's lock: the registration may first release others (the
        // owner's deferred releases), whose memory owners may run any code, e.g. wait
        // for a thread that drops a pooled buffer of this slot, which takes the lock.
        // Only this communicator's owner registers the slot, so nobody else changes it.
        let (reg, failed) = match self.register_range(slot.start, slot.bytes, slot.memory.clone()) {
            Ok(r) => (SlotReg::Yes(r.into_shared()), None),
            Err(e) => (SlotReg::Never, Some(e)),
        };
        *lock(&slot.reg) = reg;
        self.shared().registry.forget_slot(Arc::as_ptr(&slot));
        match failed {
            Some(e) if self.is_aborted() => Err(e),
            _ => Ok(Some(slot)),
        }
    }

    /// How many free buffers the pool keeps.
    pub fn pooled_buffers(&self) -> usize {
        lock(&self.pool.free).values().map(Vec::len).sum()
    }

    /// Releases every free buffer the pool keeps (deregistered, then freed after their
    /// work).
    pub fn trim_pool(&self) -> Result<()> {
        let all: Vec<Entry> = lock(&self.pool.free).drain().flat_map(|(_, v)| v).collect();
        let mut first = Ok(());
        for (b, slot) in all {
            let reg = std::mem::replace(&mut *lock(&slot.reg), SlotReg::Never);
            if let SlotReg::Yes(r) = reg {
                let r = self.release_registration(r);
                if first.is_ok() {
                    first = r;
                }
            }
            drop(b);
        }
        first
    }
}

/// A buffer from [`Communicator::buffer`]: a [`DeviceBuffer`] (through `Deref`) of NCCL
/// memory, given back to the pool on drop. It borrows the communicator, whose
/// registration it may use.
///
/// It registers itself when a collective that gains from registration (all-gather,
/// all-to-all, send/receive) first uses at least [`REGISTER_FROM`] bytes of it, and
/// stays registered in the pool; a buffer only all-reduced or broadcast does not.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, Stream, mock::MockDriver};
/// use nccl_channel::{Communicator, REGISTER_FROM, ReduceOp};
/// use nccl_sys::mock::MockNccl;
///
/// let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(1))?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
/// let stream = Stream::new(&ctx)?;
/// let n = REGISTER_FROM / size_of::<f32>(); // 1 MiB of f32
///
/// let mut grads = comm.buffer::<f32>(n)?;
/// grads.fill(0.5)?;
/// comm.all_reduce_in_place(&mut grads, ReduceOp::Sum, &stream)?;
/// assert!(!grads.is_registered()); // all-reduce gains nothing from it
///
/// let mut gathered = comm.buffer::<f32>(n)?; // a second buffer: `grads` is still out
/// comm.all_gather(&grads, &mut gathered, &stream)?;
/// assert!(gathered.is_registered() && grads.is_registered());
/// stream.synchronize()?;
/// assert_eq!(gathered.to_vec()?, vec![0.5; n]);
///
/// drop((grads, gathered)); // back to the pool, registered
/// assert_eq!(comm.pooled_buffers(), 2);
/// assert!(comm.buffer::<f32>(n)?.is_registered()); // handed out again as it was
/// assert_eq!(world.calls("ncclCommRegister"), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PooledBuffer<'c, T: NcclType> {
    buf: Option<DeviceBuffer<T>>,
    slot: Arc<Slot>,
    /// The memory handed out (address, length, context): `DerefMut` lets the caller swap
    /// another buffer in, which the pool must not take for its own.
    origin: (CUdeviceptr, usize, cuda_hal::Context),
    pool: Arc<Mutex<Free>>,
    _comm: PhantomData<&'c ()>,
}

static_assertions::assert_impl_all!(PooledBuffer<'static, f32>: Send, Sync, std::fmt::Debug);

impl<T: NcclType> std::fmt::Debug for PooledBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuffer")
            .field("buffer", &self.buf)
            .field("registered", &self.is_registered())
            .finish()
    }
}

impl<T: NcclType> PooledBuffer<'_, T> {
    /// Whether the memory is registered with the communicator by now (a collective that
    /// gains from it used the buffer; never where NCCL cannot register).
    #[must_use]
    pub fn is_registered(&self) -> bool {
        matches!(*lock(&self.slot.reg), SlotReg::Yes(_))
    }
}

impl<T: NcclType> Deref for PooledBuffer<'_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        match &self.buf {
            Some(b) => b,
            None => unreachable_buffer(),
        }
    }
}

impl<T: NcclType> DerefMut for PooledBuffer<'_, T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        match &mut self.buf {
            Some(b) => b,
            None => unreachable_buffer(),
        }
    }
}

/// The buffer is taken only in `drop`.
#[cold]
fn unreachable_buffer() -> ! {
    unreachable!("a PooledBuffer's buffer is taken only when it drops")
}

impl<T: NcclType> Drop for PooledBuffer<'_, T> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let reg = self.slot.registration();
        // The buffer, the slot's hold, and the registration's when registered: any other
        // owner is a graph or an open group that may still use the memory.
        let holders = 2 + usize::from(reg.is_some());
        let (ptr, len, ctx) = &self.origin;
        let reusable = (buf.as_raw(), buf.len()) == (*ptr, *len)
            && buf.context() == ctx
            && Arc::strong_count(&self.slot) == 1
            && buf.owners() == holders
            && reg
                .as_ref()
                .is_none_or(|r| Arc::strong_count(r) == 2 && r.is_live());
        drop(reg);
        if reusable {
            let mut free = lock(&self.pool);
            let v = free.entry((TypeId::of::<T>(), buf.len())).or_default();
            if v.len() < KEEP_PER_SHAPE {
                v.push((Box::new(buf), self.slot.clone()));
                return;
            }
        }
        // The slot's registration is released by the communicator (on its owner's
        // thread), then the memory.
        drop(buf);
    }
}

// SAFETY: forwards to the `DeviceBuffer`, which keeps the promises; the buffer is there
// for as long as the value is borrowed (taken only in `drop`).
unsafe impl<T: NcclType> DeviceSlice for PooledBuffer<'_, T> {
    type Elem = T;
    fn device_ptr(&self) -> CUdeviceptr {
        self.deref().as_raw()
    }
    fn len(&self) -> usize {
        self.deref().len()
    }
    fn context(&self) -> &cuda_hal::Context {
        self.deref().context()
    }
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        self.deref().used_on(stream)
    }
    fn used_synchronously(&self) -> cuda_hal::Result<()> {
        DeviceSlice::used_synchronously(self.deref())
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(self.deref().keep_alive())
    }
}

// SAFETY: NCCL memory is writable, and `&mut` of the pooled buffer is its only writer.
unsafe impl<T: NcclType> DeviceSliceMut for PooledBuffer<'_, T> {}

/// The registry's weak list of pooled buffers not registered yet.
#[derive(Default)]
pub(crate) struct Slots {
    list: Mutex<Vec<Weak<Slot>>>,
    count: std::sync::atomic::AtomicUsize,
}

impl Slots {
    pub(crate) fn add(&self, s: &Arc<Slot>) {
        let mut l = lock(&self.list);
        l.push(Arc::downgrade(s));
        self.count
            .store(l.len(), std::sync::atomic::Ordering::Release);
    }

    /// Removes `s`'s entry: every slot is forgotten as it drops (or once registered), so
    /// the list holds no entry of a slot that is gone.
    pub(crate) fn forget(&self, s: *const Slot) {
        let mut l = lock(&self.list);
        l.retain(|w| w.as_ptr() != s);
        self.count
            .store(l.len(), std::sync::atomic::Ordering::Release);
    }

    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.count.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// The unregistered pooled buffer holding all of `[ptr, ptr + bytes)`.
    pub(crate) fn find(&self, ptr: u64, bytes: usize) -> Option<Arc<Slot>> {
        let end = ptr.checked_add(bytes as u64)?;
        // Upgraded outside the lock: a slot whose last owner lets go meanwhile drops
        // here, and its drop takes the lock.
        let weak: Vec<Weak<Slot>> = lock(&self.list).clone();
        weak.iter().filter_map(Weak::upgrade).find(|s| {
            let (a, b) = s.range();
            a <= ptr && end <= b
        })
    }
}

#[cfg(all(test, feature = "mock"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use cuda_hal::{Cuda, Stream, mock::MockDriver};
    use nccl_sys::mock::MockNccl;

    use super::REGISTER_FROM;
    use crate::Communicator;

    /// Every collective skips the pool's lookup while the registry knows no pooled buffer
    /// waiting for registration: it knows exactly the live, unregistered, non-empty ones.
    #[test]
    fn the_registry_knows_exactly_the_pooled_buffers_a_collective_may_register() {
        let (cuda, gpus) = Cuda::mock(MockDriver::with_devices(1)).unwrap();
        let (nccl, _world) = MockNccl::new(&gpus).build().unwrap();
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))
            .unwrap()
            .remove(0);
        let stream = Stream::new(&ctx).unwrap();
        let has = || comm.shared().registry.has_slots();
        assert!(!has(), "a new communicator");
        let empty = comm.buffer::<f32>(0).unwrap();
        assert!(!has(), "an empty buffer is never registered");
        let mut a = comm.buffer::<f32>(REGISTER_FROM / 4).unwrap();
        let b = comm.buffer::<f32>(REGISTER_FROM / 4).unwrap();
        assert!(has());
        comm.all_gather_in_place(&mut a, &stream).unwrap();
        assert!(a.is_registered() && !b.is_registered());
        assert!(has(), "b still may be registered");
        drop(b);
        assert!(has(), "b is pooled, still unregistered");
        stream.synchronize().unwrap();
        comm.trim_pool().unwrap();
        assert!(!has(), "b is gone, a is registered");
        drop((a, empty));
        comm.trim_pool().unwrap();
        assert!(!has());
    }
}
