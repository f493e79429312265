//! The pool behind the default that needs no thought:
//! [`Communicator::buffer`](crate::Communicator::buffer) hands out NCCL memory
//! (`ncclMemAlloc`) and takes it back on drop for the next request of the same type and
//! length. A pooled buffer is registered with the communicator (`ncclCommRegister`) the
//! first time a collective uses it at a size that gains from registration, and stays
//! registered while the pool keeps it (registering costs far more than a collective: a
//! training loop pays it once).
//!
//! Which collectives and sizes register is a table the benchmark writes from
//! measurements, [`PoolPolicy`] (policy.rs): by default the one measured on 2 × H200 over
//! NVLink (BENCHMARKS.md, "The pool's table"), where registration made all-gather,
//! all-to-all and send/receive faster from a few MiB on, left all-reduce, reduce and
//! reduce-scatter unchanged, and made broadcast slower; NCCL memory without registration
//! changed nothing, so a buffer its collectives do not gain from stays unregistered NCCL
//! memory, exactly as fast as plain memory. Windows are not the pool's: registering one
//! is collective (every rank must call it), which a buffer's first use cannot promise.
//! Where the loaded NCCL has no registration or NCCL memory (< 2.19) the pool hands out
//! plain memory.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use cuda_hal::{DeviceBuffer, DeviceSlice, DeviceSliceMut, KeepAlive, Stream};
use cuda_sys::CUdeviceptr;

use super::policy::{PoolMemory, PoolPolicy, collective_bytes};
use super::registry::{CommState, Slot, SlotReg};
use super::release::{CommOwner, release_registration};
use crate::Collective;
use crate::sync::lock;
use crate::{NcclType, Result};

/// Buffers kept per (type, length): enough for a few in flight at once.
const KEEP_PER_SHAPE: usize = 8;

type Entry = (Box<dyn Any + Send>, Arc<Slot>);

type Free = HashMap<(TypeId, usize), Vec<Entry>>;

/// A communicator's free buffers, by element type and length. Shared with the buffers
/// it handed out (which may drop on any thread); the registrations and slots keep the
/// communicator's state alive, never this (no cycle).
#[derive(Default)]
pub(crate) struct Pool {
    free: Arc<Mutex<Free>>,
    /// Its table: chosen by the first [`buffer`](crate::Communicator::buffer) call (the
    /// process's default) unless set before. Read on the communicator's thread only.
    policy: RefCell<Option<Arc<PoolPolicy>>>,
}

impl Pool {
    /// Chooses the table now if nothing chose it yet (an error where
    /// `NCCL_CHANNEL_POOL_POLICY` names no readable table).
    pub(crate) fn choose_policy(&self) -> Result<()> {
        if self.policy.borrow().is_none() {
            let p = PoolPolicy::from_env()?;
            *self.policy.borrow_mut() = Some(p);
        }
        Ok(())
    }

    pub(crate) fn set_policy(&self, policy: PoolPolicy) {
        *self.policy.borrow_mut() = Some(Arc::new(policy));
    }

    /// Whether the table registers the `bytes` bytes of the buffer `buffer` that a call
    /// of `collective` uses on `ranks` ranks (never before a table was chosen: no buffer
    /// was handed out then; never for a one-sided operation: the table has no rules for
    /// them).
    #[inline]
    pub(crate) fn registers(
        &self,
        collective: Option<Collective>,
        buffer: &str,
        bytes: usize,
        ranks: usize,
    ) -> bool {
        let Some(c) = collective else {
            return false;
        };
        let size = collective_bytes(c, buffer, bytes, ranks);
        self.policy
            .borrow()
            .as_ref()
            .is_some_and(|p| p.memory(c, size) == PoolMemory::Registered)
    }

    /// A free buffer of `len` elements of `T`, lent again once its last user's work is
    /// done; one whose wait fails is dropped instead, its registration released.
    pub(crate) fn reuse<'c, T: NcclType, C: CommOwner + ?Sized>(
        &'c self,
        comm: &C,
        len: usize,
    ) -> Option<PooledBuffer<'c, T>> {
        let key = (TypeId::of::<T>(), len);
        loop {
            let popped = lock(&self.free).get_mut(&key).and_then(Vec::pop);
            let (b, slot) = popped?;
            let Ok(b) = b.downcast::<DeviceBuffer<T>>() else {
                continue;
            };
            // The last user's work must be done before a new one writes.
            if b.synchronize_uses().is_ok() {
                return Some(self.lend(*b, slot));
            }
            if let Some(r) = slot.registration() {
                *lock(&slot.reg) = SlotReg::Never;
                let _ = release_registration(comm, r);
            }
        }
    }

    /// Lends new memory of `comm`'s, which NCCL may register when `can_register` (never
    /// when it is empty).
    pub(crate) fn lend_new<'c, T: NcclType>(
        &'c self,
        comm: Arc<dyn CommState>,
        buf: DeviceBuffer<T>,
        can_register: bool,
    ) -> PooledBuffer<'c, T> {
        let slot = Slot::new(
            comm,
            buf.as_raw(),
            buf.size_bytes(),
            buf.keep_alive(),
            can_register && !buf.is_empty(),
        );
        self.lend(buf, slot)
    }

    fn lend<T: NcclType>(&self, buf: DeviceBuffer<T>, slot: Arc<Slot>) -> PooledBuffer<'_, T> {
        PooledBuffer {
            origin: (buf.as_raw(), buf.len(), buf.context().clone()),
            buf: Some(buf),
            slot,
            pool: self.free.clone(),
            _comm: PhantomData,
        }
    }

    /// How many free buffers it keeps.
    pub(crate) fn count(&self) -> usize {
        lock(&self.free).values().map(Vec::len).sum()
    }

    /// Releases every free buffer it keeps (deregistered, then freed after their work).
    pub(crate) fn trim<C: CommOwner + ?Sized>(&self, comm: &C) -> Result<()> {
        let all: Vec<Entry> = lock(&self.free).drain().flat_map(|(_, v)| v).collect();
        let mut first = Ok(());
        for (b, slot) in all {
            let reg = std::mem::replace(&mut *lock(&slot.reg), SlotReg::Never);
            if let SlotReg::Yes(r) = reg {
                let r = release_registration(comm, r);
                if first.is_ok() {
                    first = r;
                }
            }
            drop(b);
        }
        first
    }
}

/// A buffer from [`Communicator::buffer`](crate::Communicator::buffer): a
/// [`DeviceBuffer`] (through `Deref`) of NCCL memory, given back to the pool on drop. It
/// borrows the communicator, whose registration it may use.
///
/// It registers itself when a collective first uses it at a size for which the
/// communicator's [`PoolPolicy`] says [`Registered`](crate::PoolMemory::Registered)
/// (measured: all-gather, all-to-all and send/receive from a few MiB), and stays
/// registered in the pool; a buffer only all-reduced or broadcast does not.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Collective, Communicator, PoolMemory, PoolPolicy, ReduceOp};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let (nccl, world) = MockNccl::new(&gpus).build()?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
/// let stream = Stream::new(&ctx)?;
/// # comm.set_pool_policy(PoolPolicy::measured().clone()); // whatever the environment says
/// let n = 16 << 20 >> 2; // 16 MiB of f32
/// let table = PoolPolicy::measured();
/// assert_eq!(table.memory(Collective::AllReduce, 16 << 20), PoolMemory::Plain);
/// assert_eq!(table.memory(Collective::AllGather, 16 << 20), PoolMemory::Registered);
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
