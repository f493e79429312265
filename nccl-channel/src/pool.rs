//! The default that needs no thought: [`Communicator::buffer`] hands out NCCL memory
//! registered with the communicator, and takes it back on drop for the next request of
//! the same type and length (registering costs far more than a collective, so a training
//! loop must not pay it every step).
//!
//! Local registration (`ncclCommRegister`) is the pool's kind, not windows: it never made
//! a collective slower than plain memory in our measurements, while windows trade large
//! all-reduce bandwidth for small-message latency (BENCHMARKS.md has the table). Where
//! the loaded NCCL has no registration (< 2.19) the pool hands out plain memory.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use cuda_hal::{DeviceBuffer, DeviceSlice, DeviceSliceMut, KeepAlive, Stream};
use cuda_sys::CUdeviceptr;

use crate::registration::RegShared;
use crate::{Communicator, Error, NcclType, Result};

/// Buffers kept per (type, length): enough for a few in flight at once.
const KEEP_PER_SHAPE: usize = 8;

type Entry = (Box<dyn Any + Send>, Option<Arc<RegShared>>);

type Free = HashMap<(TypeId, usize), Vec<Entry>>;

/// A communicator's free buffers, by element type and length. Shared with the buffers
/// it handed out (which may drop on any thread); never with the registrations, which
/// keep the communicator's state alive (no cycle).
#[derive(Default)]
pub(crate) struct Pool {
    free: Arc<Mutex<Free>>,
}

impl Communicator {
    /// A buffer of `len` elements from this communicator's pool of registered NCCL
    /// memory: the memory NCCL's fastest paths want, registered once and reused. Its
    /// contents are whatever the last user left (like [`DeviceBuffer::alloc`]). On drop
    /// it returns to the pool once no graph or open group holds it (otherwise it is
    /// released like any buffer); [`trim_pool`](Self::trim_pool) releases what the pool
    /// keeps. Falls back to plain memory when the loaded NCCL cannot register (< 2.19).
    ///
    /// ```
    /// # #[cfg(feature = "mock")] {
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
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffer<T: NcclType>(&self, len: usize) -> Result<PooledBuffer<'_, T>> {
        let key = (TypeId::of::<T>(), len);
        loop {
            let popped = crate::comm::lock(&self.pool.free)
                .get_mut(&key)
                .and_then(Vec::pop);
            let Some((b, reg)) = popped else {
                break;
            };
            let Ok(b) = b.downcast::<DeviceBuffer<T>>() else {
                continue;
            };
            // The last user's work must be done before a new one writes.
            if b.synchronize_uses().is_ok() {
                return Ok(PooledBuffer {
                    origin: (b.as_raw(), b.len(), b.context().clone()),
                    buf: Some(*b),
                    reg,
                    pool: self.pool.free.clone(),
                    _comm: PhantomData,
                });
            }
            if let Some(r) = reg {
                let _ = self.release_registration(r);
            }
        }
        let buf = match self.alloc_nccl::<T>(len) {
            Ok(b) => b,
            Err(Error::Unsupported { .. }) => DeviceBuffer::alloc(self.context(), len)?,
            Err(e) => return Err(e),
        };
        let reg = if len == 0 {
            None
        } else {
            match self.register(&buf) {
                Ok(r) => Some(r.into_shared()),
                Err(Error::Unsupported { .. }) => None,
                Err(e) => return Err(e),
            }
        };
        Ok(PooledBuffer {
            origin: (buf.as_raw(), buf.len(), buf.context().clone()),
            buf: Some(buf),
            reg,
            pool: self.pool.free.clone(),
            _comm: PhantomData,
        })
    }

    /// How many free buffers the pool keeps.
    pub fn pooled_buffers(&self) -> usize {
        crate::comm::lock(&self.pool.free)
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Releases every free buffer the pool keeps (deregistered, then freed after their
    /// work).
    pub fn trim_pool(&self) -> Result<()> {
        let all: Vec<Entry> = crate::comm::lock(&self.pool.free)
            .drain()
            .flat_map(|(_, v)| v)
            .collect();
        let mut first = Ok(());
        for (b, reg) in all {
            if let Some(r) = reg {
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

/// A buffer from [`Communicator::buffer`]: a [`DeviceBuffer`] (through `Deref`) of
/// registered NCCL memory, given back to the pool on drop. It borrows the communicator,
/// whose registration it uses.
pub struct PooledBuffer<'c, T: NcclType> {
    buf: Option<DeviceBuffer<T>>,
    reg: Option<Arc<RegShared>>,
    /// The memory handed out (address, length, context): `DerefMut` lets the caller swap
    /// another buffer in, which the pool must not take for its own.
    origin: (CUdeviceptr, usize, cuda_hal::Context),
    pool: Arc<Mutex<Free>>,
    _comm: PhantomData<&'c ()>,
}

static_assertions::assert_impl_all!(PooledBuffer<'static, f32>: Send, Sync);

impl<T: NcclType> std::fmt::Debug for PooledBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuffer")
            .field("buffer", &self.buf)
            .field("registered", &self.reg.is_some())
            .finish()
    }
}

impl<T: NcclType> PooledBuffer<'_, T> {
    /// Whether the memory is registered with the communicator (false where NCCL cannot
    /// register).
    pub fn is_registered(&self) -> bool {
        self.reg.is_some()
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
        let reg = self.reg.take();
        let holders = 1 + usize::from(reg.is_some());
        let (ptr, len, ctx) = &self.origin;
        let reusable = (buf.as_raw(), buf.len()) == (*ptr, *len)
            && buf.context() == ctx
            && buf.owners() == holders
            && reg
                .as_ref()
                .is_none_or(|r| Arc::strong_count(r) == 1 && r.is_live());
        if reusable {
            let mut free = crate::comm::lock(&self.pool);
            let v = free.entry((TypeId::of::<T>(), buf.len())).or_default();
            if v.len() < KEEP_PER_SHAPE {
                v.push((Box::new(buf), reg));
                return;
            }
        }
        // Released by the communicator (on its owner's thread), then the memory.
        drop(reg);
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
