//! Collectives on raw device addresses, for code that only has addresses (a framework's
//! tensor pointer, memory from a C library). `unsafe`: nothing can check an address.

use cuda_hal::cuda_sys::CUdeviceptr;
use cuda_hal::{DeviceView, DeviceViewMut, Stream};

use crate::{Communicator, NcclType, ReduceOp, Result};

/// The collectives of a [`Communicator`] on raw device addresses ([`Communicator::raw`]).
///
/// Each call makes views of the addresses ([`DeviceView::from_raw_parts`]) and runs the
/// safe collective of the same name, so every check but the addresses' still applies
/// (ranks, divisibility, element types, the stream's device). In-place forms are NCCL's:
/// pass the same address (for all-gather, `send = recv + rank * count` elements).
///
/// # Safety (every method)
/// Each address is device memory of the communicator's context holding the number of
/// elements of `T` the method states, readable (`send`) or writable (`recv`); and that
/// memory stays allocated until the work enqueued on `stream` has run, including the
/// launches of a graph captured from it and work deferred by an open group (nothing
/// tracks raw addresses).
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, ReduceOp, group};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
/// let comms = Communicator::init_all(&nccl, &ctxs)?;
/// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
/// // Memory another library owns; all this code has is its address.
/// let bufs = [
///     DeviceBuffer::from_slice(&ctxs[0], &[1.0f32, 2.0])?,
///     DeviceBuffer::from_slice(&ctxs[1], &[10.0f32, 20.0])?,
/// ];
/// let addrs = [bufs[0].as_raw(), bufs[1].as_raw()];
/// group(&nccl, || {
///     for r in 0..2 {
///         // SAFETY: `addrs[r]` is 2 f32 of device memory in the context of `comms[r]`;
///         // `bufs` keeps it allocated past the group's end and the synchronisation
///         // below, and nothing else touches it meanwhile; no capture is open.
///         unsafe {
///             comms[r].raw().all_reduce::<f32>(addrs[r], addrs[r], 2, ReduceOp::Sum, &streams[r])?
///         };
///     }
///     Ok(())
/// })?;
/// for r in 0..2 {
///     streams[r].synchronize()?;
///     assert_eq!(bufs[r].to_vec()?, [11.0, 22.0]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RawCollectives<'c> {
    comm: &'c Communicator,
}

impl Communicator {
    /// The collectives on raw device addresses ([`RawCollectives`], all `unsafe`).
    pub fn raw(&self) -> RawCollectives<'_> {
        RawCollectives { comm: self }
    }
}

impl<'c> RawCollectives<'c> {
    /// # Safety
    /// `ptr` holds `len` elements of `T` as the type's Safety section says.
    unsafe fn view<T: NcclType>(&self, ptr: CUdeviceptr, len: usize) -> DeviceView<'c, T> {
        // SAFETY: the caller's promise, for the communicator's context.
        unsafe { DeviceView::from_raw_parts(self.comm.context(), ptr, len) }
    }

    /// # Safety
    /// As for [`view`](Self::view), and writable.
    unsafe fn view_mut<T: NcclType>(&self, ptr: CUdeviceptr, len: usize) -> DeviceViewMut<'c, T> {
        // SAFETY: the caller's promise, for the communicator's context.
        unsafe { DeviceViewMut::from_raw_parts(self.comm.context(), ptr, len) }
    }

    fn n(&self, count: usize) -> usize {
        count.saturating_mul(self.comm.size())
    }

    /// [`Communicator::all_reduce`] of `count` elements at `send` into `recv`.
    ///
    /// # Safety
    /// See [`RawCollectives`]: `send` and `recv` hold `count` elements.
    #[doc(alias = "ncclAllReduce")]
    pub unsafe fn all_reduce<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        let (s, mut r) = unsafe { (self.view::<T>(send, count), self.view_mut(recv, count)) };
        self.comm.all_reduce(&s, &mut r, op, stream)
    }

    /// [`Communicator::all_gather`]: `send` holds `count` elements, `recv` `size * count`.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclAllGather")]
    pub unsafe fn all_gather<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        let (s, mut r) = unsafe {
            (
                self.view::<T>(send, count),
                self.view_mut(recv, self.n(count)),
            )
        };
        self.comm.all_gather(&s, &mut r, stream)
    }

    /// [`Communicator::reduce_scatter`]: `send` holds `size * count` elements, `recv`
    /// `count`.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclReduceScatter")]
    pub unsafe fn reduce_scatter<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        let (s, mut r) = unsafe {
            (
                self.view::<T>(send, self.n(count)),
                self.view_mut(recv, count),
            )
        };
        self.comm.reduce_scatter(&s, &mut r, op, stream)
    }

    /// [`Communicator::broadcast`] of `count` elements from `root`'s `send` (read on the
    /// root only) into every rank's `recv`.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclBroadcast")]
    pub unsafe fn broadcast<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let on_root = self.comm.rank() == root;
        // SAFETY: the caller's promise.
        let (s, mut r) = unsafe {
            (
                on_root.then(|| self.view::<T>(send, count)),
                self.view_mut(recv, count),
            )
        };
        self.comm.broadcast(s, &mut r, root, stream)
    }

    /// [`Communicator::reduce`] of `count` elements into `root`'s `recv` (written on the
    /// root only).
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclReduce")]
    pub unsafe fn reduce<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        op: ReduceOp<T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let on_root = self.comm.rank() == root;
        // SAFETY: the caller's promise.
        let (s, r) = unsafe {
            (
                self.view::<T>(send, count),
                on_root.then(|| self.view_mut(recv, count)),
            )
        };
        self.comm.reduce(&s, r, op, root, stream)
    }

    /// [`Communicator::send`] of `count` elements at `buf` to `peer`.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclSend")]
    pub unsafe fn send<T: NcclType>(
        &self,
        buf: CUdeviceptr,
        count: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        let b = unsafe { self.view::<T>(buf, count) };
        self.comm.send(&b, peer, stream)
    }

    /// [`Communicator::recv`] of `count` elements into `buf` from `peer`.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclRecv")]
    pub unsafe fn recv<T: NcclType>(
        &self,
        buf: CUdeviceptr,
        count: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        let mut b = unsafe { self.view_mut::<T>(buf, count) };
        self.comm.recv(&mut b, peer, stream)
    }

    /// [`Communicator::all_to_all`]: both hold `size * count` elements.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclAlltoAll")]
    pub unsafe fn all_to_all<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let n = self.n(count);
        // SAFETY: the caller's promise.
        let (s, mut r) = unsafe { (self.view::<T>(send, n), self.view_mut(recv, n)) };
        self.comm.all_to_all(&s, &mut r, stream)
    }

    /// [`Communicator::gather`]: `send` holds `count` elements, `root`'s `recv`
    /// `size * count` (written on the root only).
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclGather")]
    pub unsafe fn gather<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let on_root = self.comm.rank() == root;
        // SAFETY: the caller's promise.
        let (s, r) = unsafe {
            (
                self.view::<T>(send, count),
                on_root.then(|| self.view_mut(recv, self.n(count))),
            )
        };
        self.comm.gather(&s, r, root, stream)
    }

    /// [`Communicator::scatter`]: `root`'s `send` holds `size * count` elements (read on
    /// the root only), `recv` `count`.
    ///
    /// # Safety
    /// See [`RawCollectives`].
    #[doc(alias = "ncclScatter")]
    pub unsafe fn scatter<T: NcclType>(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let on_root = self.comm.rank() == root;
        // SAFETY: the caller's promise.
        let (s, mut r) = unsafe {
            (
                on_root.then(|| self.view::<T>(send, self.n(count))),
                self.view_mut(recv, count),
            )
        };
        self.comm.scatter(s, &mut r, root, stream)
    }
}
