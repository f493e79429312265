//! [`Communicator::buffer`]: pooled NCCL memory that registers itself for the
//! collectives that gain from it, the default that needs no thought. The pool and its
//! policy (which collectives, from what size) are in pool.rs and policy.rs; this is its
//! methods on the communicator.

use std::sync::Arc;

use cuda_hal::DeviceBuffer;

use crate::registered::policy::PoolPolicy;
use crate::registered::pool::PooledBuffer;
use crate::registered::registry::{CommState, Slot};
use crate::{Communicator, Error, NcclType, Result};

impl Communicator {
    /// A buffer of `len` elements from this communicator's pool of NCCL memory, which
    /// registers itself the first time a collective uses it at a size that gains from
    /// registration (the communicator's [`PoolPolicy`], by default the measured one:
    /// [`PoolPolicy::measured`]): the default, as fast as plain memory or faster, except
    /// a buffer that an all-gather registered and that is then broadcast (registered
    /// broadcasts are slower: give them their own buffer). Its
    /// contents are whatever the last user left (like [`DeviceBuffer::alloc`]). On drop
    /// it returns to the pool if nothing else holds it then (no graph, open group or
    /// registration of yours; otherwise it is released like any buffer, after them), up
    /// to 8 buffers of one type and length; [`trim_pool`](Self::trim_pool) releases what
    /// the pool keeps. Plain memory where the loaded NCCL has no NCCL memory (< 2.19).
    ///
    /// The first call chooses the table unless [`set_pool_policy`](Self::set_pool_policy)
    /// did: the file [`POOL_POLICY_ENV`](crate::POOL_POLICY_ENV) names, else the measured
    /// one; a variable that names no readable table is an [`Error::Env`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::Cuda;
    /// # use cuda_mock::MockDriver;
    /// # use nccl_mock::MockNccl;
    /// use nccl_channel::{Communicator, ReduceOp};
    /// # let (cuda, world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
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
        self.pool.choose_policy()?;
        if let Some(b) = self.pool.reuse(self, len) {
            return Ok(b);
        }
        let (buf, can_register) = match self.alloc_nccl::<T>(len) {
            Ok(b) => (b, self.nccl().fns().ncclCommRegister.is_some()),
            Err(Error::Unsupported { .. }) => (DeviceBuffer::alloc(self.context(), len)?, false),
            Err(e) => return Err(e),
        };
        let state: Arc<dyn CommState> = self.shared().clone();
        Ok(self.pool.lend_new(state, buf, can_register))
    }

    /// A collective `what` is about to use `[ptr, ptr + bytes)` as its buffer `buffer`
    /// ("send", "recv", "buffer"): a pooled buffer that holds it and is not registered yet
    /// is registered now if the pool's table says so for the collective's size. Inside a
    /// group too: NCCL looks registrations up when the group ends.
    ///
    /// Returns the slot registered, which the caller keeps until the work's use of the
    /// memory is noted ([`Registry::used`](crate::registered::registry::Registry::used)): the
    /// slot holds the new registration, and its pooled buffer may drop on another thread
    /// meanwhile (when the memory was swapped out of it), which would release the
    /// registration before NCCL's use of it is known. An error only when the attempt
    /// left the communicator aborted (a failure NCCL cannot recover from, or an abort
    /// asked for through an [`AbortHandle`](crate::AbortHandle) meanwhile): the
    /// collective must not be issued then.
    #[inline]
    pub(crate) fn register_pooled(
        &self,
        what: crate::collective_kind::Method,
        buffer: &str,
        ptr: u64,
        bytes: usize,
    ) -> Result<Option<Arc<Slot>>> {
        if self.shared().registry.has_slots()
            && self
                .pool
                .registers(what.collective, buffer, bytes, self.size())
        {
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
        if !slot.may_register() {
            return Ok(None);
        }
        // Not under the slot's lock: the registration may first release others (the
        // owner's deferred releases), whose memory owners may run any code, e.g. wait
        // for a thread that drops a pooled buffer of this slot, which takes the lock.
        // Only this communicator's owner registers the slot, so nobody else changes it.
        let (start, len, memory) = slot.target();
        let (reg, failed) = match self.register_range(start, len, memory) {
            Ok(r) => (Some(r.into_shared()), None),
            Err(e) => (None, Some(e)),
        };
        slot.settle(reg);
        self.shared().registry.forget_slot(Arc::as_ptr(&slot));
        match failed {
            Some(e) if self.is_aborted() => Err(e),
            _ => Ok(Some(slot)),
        }
    }

    /// Sets the table the pool follows from now on: which collectives register the
    /// pooled buffers they use, from which sizes (a buffer registered already stays so).
    /// A table measured on your machine: `bench ... -R 0,nccl,1 > run.txt`, then
    /// `pool-policy run.txt` (BENCHMARKS.md, "The pool's table"). Communicators made from
    /// this one (split, shrink, grow) have pools of their own, which start from the
    /// process's default, not from this table.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::{Cuda, Stream};
    /// # use cuda_mock::MockDriver;
    /// # use nccl_mock::MockNccl;
    /// use nccl_channel::{Communicator, PoolPolicy, ReduceOp};
    /// # let (cuda, world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// # let (nccl, _) = MockNccl::new(&world).build()?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&Arc::new(nccl), &[ctx.clone()])?.remove(0);
    /// let stream = Stream::new(&ctx)?;
    /// comm.set_pool_policy(PoolPolicy::parse("all_reduce 4K registered")?);
    /// let mut grads = comm.buffer::<f32>(1024)?;
    /// comm.all_reduce_in_place(&mut grads, ReduceOp::Sum, &stream)?;
    /// assert!(grads.is_registered());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_pool_policy(&self, policy: PoolPolicy) {
        self.pool.set_policy(policy);
    }

    /// How many free buffers the pool keeps.
    pub fn pooled_buffers(&self) -> usize {
        self.pool.count()
    }

    /// Releases every free buffer the pool keeps (deregistered, then freed after their
    /// work).
    pub fn trim_pool(&self) -> Result<()> {
        self.pool.trim(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use cuda_hal::{Cuda, Stream};
    use cuda_mock::MockDriver;
    use nccl_mock::MockNccl;

    use crate::{Communicator, PoolPolicy};

    /// What the test's table registers all-gathers from.
    const REGISTER_FROM: usize = 1 << 20;

    /// Every collective skips the pool's lookup while the registry knows no pooled buffer
    /// waiting for registration: it knows exactly the live, unregistered, non-empty ones.
    #[test]
    fn the_registry_knows_exactly_the_pooled_buffers_a_collective_may_register() {
        let (cuda, gpus) = MockDriver::with_devices(1)
            .build_with(Cuda::from_driver)
            .unwrap();
        let (nccl, _world) = MockNccl::new(&gpus).build().unwrap();
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))
            .unwrap()
            .remove(0);
        let stream = Stream::new(&ctx).unwrap();
        comm.set_pool_policy(PoolPolicy::parse("all_gather 1M registered").unwrap());
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
