//! Every NCCL collective and point-to-point call, typed and checked before the FFI call.

use std::ffi::c_void;
use std::ops::Range;

use cuda_hal::{DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut, Enqueuing, Stream};
use cuda_sys::CUdeviceptr;
use nccl_sys::{ncclRedOp_t, ncclResult_t, ncclScalarResidence_t};

use crate::call_check::Call;
use crate::collective_kind::Method;
use crate::enqueue::{Enqueue, Raw, buffer_object, dptr, past};
use crate::{Collective, Communicator, Error, NcclType, ReduceOp, Result};

/// Which side of a variable all-to-all a layout describes.
#[derive(Clone, Copy)]
enum Side {
    Send,
    Recv,
}

impl Side {
    /// The names of its counts and displacements.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Side::Send => ("send_counts", "send_displs"),
            Side::Recv => ("recv_counts", "recv_displs"),
        }
    }

    /// Its buffer, as errors name it.
    fn buffer(self) -> &'static str {
        match self {
            Side::Send => "send",
            Side::Recv => "recv",
        }
    }
}

/// `Err` when two of the (non-empty) receive regions overlap. Sorted by start, any
/// overlap shows between neighbours.
fn disjoint(what: &'static str, mut regions: Vec<(usize, Range<usize>)>) -> Result<()> {
    regions.sort_unstable_by_key(|(p, r)| (r.start, *p));
    for pair in regions.windows(2) {
        let [(p, a), (q, b)] = pair else { continue };
        if b.start < a.end {
            return Err(Error::InvalidArgument {
                what,
                problem: format!(
                    "the receive regions from rank {p} (elements {a:?}) and rank {q} (elements \
                     {b:?}) overlap: both would be written at once"
                ),
            });
        }
    }
    Ok(())
}

/// A reduction op handle; a pre-multiplied sum is created for one call and destroyed after.
struct Op<'a> {
    comm: &'a Communicator,
    raw: ncclRedOp_t,
    created: bool,
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        // An abort (after a failed call) freed the op with the communicator.
        if let (true, Some(comm)) = (self.created, self.comm.live_handle()) {
            // SAFETY: created on this live communicator by ncclRedOpCreatePreMulSum; NCCL
            // allows destroying it once the calls that use it have returned (also when
            // they are deferred by a group).
            unsafe { (self.comm.nccl().fns().ncclRedOpDestroy)(self.raw, comm) };
        }
    }
}

impl Communicator {
    pub(crate) fn check_rank(&self, what: &'static str, rank: usize) -> Result<i32> {
        if rank >= self.size() {
            return Err(Error::InvalidRank {
                what,
                rank,
                size: self.size(),
            });
        }
        Ok(rank as i32)
    }

    fn divisible(&self, what: &'static str, buffer: &'static str, len: usize) -> Result<usize> {
        if self.size() == 0 || !len.is_multiple_of(self.size()) {
            return Err(Error::InvalidArgument {
                what,
                problem: format!(
                    "the {} holds {len} elements, not a multiple of the {} ranks",
                    crate::error::buffer_name(buffer),
                    self.size()
                ),
            });
        }
        Ok(len / self.size())
    }

    fn op<T: NcclType>(&self, op: ReduceOp<T>) -> Result<Op<'_>> {
        let builtin = |raw| {
            Ok(Op {
                comm: self,
                raw,
                created: false,
            })
        };
        match op {
            ReduceOp::Sum => builtin(ncclRedOp_t::ncclSum),
            ReduceOp::Prod => builtin(ncclRedOp_t::ncclProd),
            ReduceOp::Max => builtin(ncclRedOp_t::ncclMax),
            ReduceOp::Min => builtin(ncclRedOp_t::ncclMin),
            ReduceOp::Avg => builtin(ncclRedOp_t::ncclAvg),
            ReduceOp::PreMulSum(mut scalar) => {
                let mut raw = ncclRedOp_t(0);
                // SAFETY: a host scalar of type T, read during the call (host-immediate).
                let (rc, call) = unsafe {
                    nccl_raw_call!(
                        self.nccl(),
                        ncclRedOpCreatePreMulSum(
                            &mut raw,
                            (&raw mut scalar).cast(),
                            T::DTYPE,
                            ncclScalarResidence_t::ncclScalarHostImmediate,
                            self.as_raw(),
                        )
                    )
                };
                self.check(rc, call)?;
                Ok(Op {
                    comm: self,
                    raw,
                    created: true,
                })
            }
        }
    }

    /// `recv = op(send of every rank)`; `send` and `recv` have the same length.
    ///
    /// ```
    /// use nccl_channel::{ReduceOp, group};
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20])?,
    /// ];
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 2)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].all_reduce(&send[r], &mut recv[r], ReduceOp::Sum, &streams[r])?;
    ///     }
    ///     Ok(())
    /// })?;
    /// for r in 0..2 {
    ///     streams[r].synchronize()?;
    ///     assert_eq!(recv[r].to_vec()?, [11, 22]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllReduce, "all_reduce");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let s = enq.buf("send", send, send.len())?;
        let r = enq.buf("recv", recv, send.len())?;
        self.all_reduce_on(&enq, (s.ptr(), r.ptr()), send.len(), op)
    }

    /// All-reduce in place.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllReduce, "all_reduce_in_place");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let b = enq.buf("buffer", buf, buf.len())?;
        self.all_reduce_on(&enq, (b.ptr(), b.ptr()), buf.len(), op)
    }

    /// `recv = concat(send of rank 0, …, send of rank n-1)`; `recv.len() == n * send.len()`.
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20])?,
    /// ];
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 4)?, DeviceBuffer::zeroed(&ctxs[1], 4)?];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].all_gather(&send[r], &mut recv[r], &streams[r])?;
    ///     }
    ///     Ok(())
    /// })?;
    /// for r in 0..2 {
    ///     streams[r].synchronize()?;
    ///     assert_eq!(recv[r].to_vec()?, [1, 2, 10, 20]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclAllGather")]
    pub fn all_gather<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        stream: &Stream,
    ) -> Result<()> {
        self.all_gather_checked(send, recv, stream, true)
    }

    /// [`all_gather`](Self::all_gather) without the checked mode's comparison (the
    /// comparison's own exchange, and the crate's own agreements).
    pub(crate) fn all_gather_unchecked<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        stream: &Stream,
    ) -> Result<()> {
        self.all_gather_checked(send, recv, stream, false)
    }

    fn all_gather_checked<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        stream: &Stream,
        checked: bool,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllGather, "all_gather");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let count = send.len();
        let s = enq.buf("send", send, count)?;
        let r = enq.buf("recv", recv, count.saturating_mul(self.size()))?;
        let raw = |comm, stream| {
            // SAFETY: `count` elements of T at `s`, `size * count` at `r`, device memory of
            // this communicator's context noted as used on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclAllGather(dptr(s.ptr()), dptr(r.ptr()), count, T::DTYPE, comm, stream)
                )
            }
        };
        if checked {
            enq.call(Call::new::<T>(Collective::AllGather, count), raw)
        } else {
            enq.call_unchecked(raw)
        }
    }

    /// All-gather in place: this rank's part is `buf[rank * n / size ..][.. n / size]`.
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// // Each rank writes its own part, at rank * 2; the rest is filled in.
    /// let mut bufs = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2, 0, 0])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[0, 0, 10, 20])?,
    /// ];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].all_gather_in_place(&mut bufs[r], &streams[r])?;
    ///     }
    ///     Ok(())
    /// })?;
    /// for r in 0..2 {
    ///     streams[r].synchronize()?;
    ///     assert_eq!(bufs[r].to_vec()?, [1, 2, 10, 20]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllGather, "all_gather_in_place");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let b = enq.buf("buffer", buf, buf.len())?;
        let count = self.divisible(M.name, "buffer", buf.len())?;
        let base = b.ptr();
        let mine = past::<T>(base, self.rank() * count);
        enq.call(
            Call::new::<T>(Collective::AllGather, count),
            |comm, stream| {
                // SAFETY: `size * count` elements of T at `base` (this rank's part at `mine`),
                // noted as used on the stream (enqueue.rs).
                unsafe {
                    nccl_raw_call!(
                        self.nccl(),
                        ncclAllGather(mine, dptr(base), count, T::DTYPE, comm, stream)
                    )
                }
            },
        )
    }

    /// Rank `r` gets `op` over every rank's `send[r * m ..][.. m]`, `m = recv.len()`;
    /// `send.len() == n * recv.len()`.
    ///
    /// ```
    /// use nccl_channel::{ReduceOp, group};
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2, 3, 4])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20, 30, 40])?,
    /// ];
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 2)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].reduce_scatter(&send[r], &mut recv[r], ReduceOp::Sum, &streams[r])?;
    ///     }
    ///     Ok(())
    /// })?;
    /// streams[0].synchronize()?;
    /// streams[1].synchronize()?;
    /// assert_eq!(recv[0].to_vec()?, [11, 22]); // the sums of elements 0 and 1
    /// assert_eq!(recv[1].to_vec()?, [33, 44]); // the sums of elements 2 and 3
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclReduceScatter")]
    pub fn reduce_scatter<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::ReduceScatter, "reduce_scatter");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let count = recv.len();
        let s = enq.buf("send", send, count.saturating_mul(self.size()))?;
        let r = enq.buf("recv", recv, count)?;
        self.reduce_scatter_on(&enq, (dptr(s.ptr()), dptr(r.ptr())), count, op)
    }

    /// Reduce-scatter in place: the result is `buf[rank * n / size ..][.. n / size]`.
    pub fn reduce_scatter_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::ReduceScatter, "reduce_scatter_in_place");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let b = enq.buf("buffer", buf, buf.len())?;
        let count = self.divisible(M.name, "buffer", buf.len())?;
        let mine = past::<T>(b.ptr(), self.rank() * count);
        self.reduce_scatter_on(&enq, (dptr(b.ptr()), mine), count, op)
    }

    /// Copies `root`'s `send` into every rank's `recv`. Only the root passes `send`
    /// (same length as `recv`).
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let src = DeviceBuffer::from_slice(&ctxs[0], &[7, 8, 9])?;
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 3)?, DeviceBuffer::zeroed(&ctxs[1], 3)?];
    /// group(&nccl, || {
    ///     comms[0].broadcast(Some(src.as_view()), &mut recv[0], 0, &streams[0])?; // the root
    ///     comms[1].broadcast(None, &mut recv[1], 0, &streams[1])
    /// })?;
    /// for r in 0..2 {
    ///     streams[r].synchronize()?;
    ///     assert_eq!(recv[r].to_vec()?, [7, 8, 9]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclBroadcast")]
    pub fn broadcast<T: NcclType>(
        &self,
        send: Option<DeviceView<'_, T>>,
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Broadcast, "broadcast");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let root_arg = self.check_rank(M.name, root)?;
        let n = recv.len();
        let r = enq.buf("recv", recv, n)?;
        let send = self.at_root(M.name, send, root, "send")?;
        let s = send.as_ref().map(|v| enq.buf("send", v, n)).transpose()?;
        let sendp = s.as_ref().map_or(r.ptr(), Enqueuing::ptr);
        self.broadcast_on::<T>(&enq, (sendp, r.ptr()), n, (root, root_arg))
    }

    /// Broadcast in place (`ncclBcast`).
    #[doc(alias = "ncclBcast")]
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Broadcast, "broadcast_in_place");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let root_arg = self.check_rank(M.name, root)?;
        let b = enq.buf("buffer", buf, buf.len())?;
        self.broadcast_on::<T>(&enq, (b.ptr(), b.ptr()), buf.len(), (root, root_arg))
    }

    /// `root`'s `recv = op(send of every rank)`. Only the root passes `recv`.
    ///
    /// ```
    /// use nccl_channel::{ReduceOp, group};
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 20])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 2])?,
    /// ];
    /// let mut max = DeviceBuffer::zeroed(&ctxs[1], 2)?;
    /// group(&nccl, || {
    ///     comms[0].reduce(&send[0], None, ReduceOp::Max, 1, &streams[0])?;
    ///     comms[1].reduce(&send[1], Some(max.as_view_mut()), ReduceOp::Max, 1, &streams[1]) // the root
    /// })?;
    /// streams[1].synchronize()?;
    /// assert_eq!(max.to_vec()?, [10, 20]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclReduce")]
    pub fn reduce<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: Option<DeviceViewMut<'_, T>>,
        op: ReduceOp<T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Reduce, "reduce");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let root_arg = self.check_rank(M.name, root)?;
        let n = send.len();
        let s = enq.buf("send", send, n)?;
        let recv = self.at_root(M.name, recv, root, "receive")?;
        let r = recv.as_ref().map(|v| enq.buf("recv", v, n)).transpose()?;
        let recvp = r.as_ref().map_or(s.ptr(), Enqueuing::ptr);
        self.reduce_on(&enq, (s.ptr(), recvp), n, op, (root, root_arg))
    }

    /// Reduce in place: the root's `buf` gets the result.
    pub fn reduce_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Reduce, "reduce_in_place");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let root_arg = self.check_rank(M.name, root)?;
        let b = enq.buf("buffer", buf, buf.len())?;
        self.reduce_on(&enq, (b.ptr(), b.ptr()), buf.len(), op, (root, root_arg))
    }

    /// Sends `buf` to `peer` (which must call [`recv`](Self::recv) with the same length).
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// // The ranks swap their buffers: sends and receives of one step go in one group.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20])?,
    /// ];
    /// let mut recv = [DeviceBuffer::<i32>::zeroed(&ctxs[0], 2)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].send(&send[r], 1 - r, &streams[r])?;
    ///         comms[r].recv(&mut recv[r], 1 - r, &streams[r])?;
    ///     }
    ///     Ok(())
    /// })?;
    /// streams[0].synchronize()?;
    /// streams[1].synchronize()?;
    /// assert_eq!(recv[0].to_vec()?, [10, 20]);
    /// assert_eq!(recv[1].to_vec()?, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclSend")]
    pub fn send<T: NcclType>(
        &self,
        buf: &(impl DeviceSlice<Elem = T> + ?Sized),
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::SendRecv, "send");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let p = self.check_rank(M.name, peer)?;
        let b = enq.buf("send", buf, buf.len())?;
        let n = buf.len();
        enq.call_unchecked(|comm, stream| {
            // SAFETY: `n` elements of T at `b`, noted as used on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclSend(dptr(b.ptr()), n, T::DTYPE, p, comm, stream)
                )
            }
        })
    }

    /// Receives into `buf` from `peer` (which must call [`send`](Self::send) with the same
    /// length; see its example).
    #[doc(alias = "ncclRecv")]
    pub fn recv<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::SendRecv, "recv");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let p = self.check_rank(M.name, peer)?;
        let b = enq.buf("recv", buf, buf.len())?;
        let n = buf.len();
        enq.call_unchecked(|comm, stream| {
            // SAFETY: `n` elements of T at `b`, noted as used on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclRecv(dptr(b.ptr()), n, T::DTYPE, p, comm, stream)
                )
            }
        })
    }

    /// Rank `r` gets `send[r * m ..][.. m]` of every rank, in rank order; both buffers hold
    /// `n * m` elements. Native `ncclAlltoAll` on NCCL ≥ 2.28.3, grouped send/recv before.
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2, 3, 4])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20, 30, 40])?,
    /// ];
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 4)?, DeviceBuffer::zeroed(&ctxs[1], 4)?];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].all_to_all(&send[r], &mut recv[r], &streams[r])?;
    ///     }
    ///     Ok(())
    /// })?;
    /// streams[0].synchronize()?;
    /// streams[1].synchronize()?;
    /// assert_eq!(recv[0].to_vec()?, [1, 2, 10, 20]); // every rank's first half
    /// assert_eq!(recv[1].to_vec()?, [3, 4, 30, 40]); // every rank's second half
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclAlltoAll")]
    pub fn all_to_all<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllToAll, "all_to_all");
        let mut enq = self.enqueue::<T>(M, stream)?;
        // The send buffer's split first: a receive buffer sized from a bad split would
        // otherwise be blamed for it.
        let m = self.divisible(M.name, "send", send.len())?;
        let s = enq.buf("send", send, send.len())?;
        let r = enq.buf("recv", recv, send.len())?;
        let (sp, rp) = (s.ptr(), r.ptr());
        let call = Call::new::<T>(Collective::AllToAll, m);
        if let Ok((f, name)) = optional!(self.nccl(), ncclAlltoAll) {
            return enq.call(call, |comm, stream| {
                // SAFETY: both buffers hold n * m elements of T on our device, noted as
                // used on the stream (enqueue.rs).
                (
                    unsafe { f(dptr(sp), dptr(rp), m, T::DTYPE, comm, stream) },
                    name,
                )
            });
        }
        // NCCL before 2.28.3: one send and one receive per peer, in a group.
        enq.call_grouped(call, |comm, stream| {
            self.exchange_with_each::<T>(comm, stream, |p| {
                let (a, b) = (past::<T>(sp, p * m), past::<T>(rp, p * m));
                (Some((a, m)), Some((b, m)))
            })
        })
    }

    /// Variable-size all-to-all (MPI's `Alltoallv`, torch's `all_to_all_single` with split
    /// sizes), e.g. a mixture of experts' dispatch and combine: to each rank `p` this rank
    /// sends `send[send_displs[p] ..][.. send_counts[p]]`, and from each rank `p` it
    /// receives `recv_counts[p]` elements into `recv[recv_displs[p] ..]`. Counts and
    /// displacements are in elements, one of each per rank; the regions may leave gaps (a
    /// receive buffer padded to each expert's capacity). Rank `p`'s `send_counts[r]` must
    /// equal rank `r`'s `recv_counts[p]`, as a [`send`](Self::send) must match its
    /// [`recv`](Self::recv): when only the senders know the counts, exchange them first with
    /// [`all_to_all`](Self::all_to_all). A zero count skips that peer.
    ///
    /// NCCL has no such collective: this is one group of sends and receives (its own, nested
    /// in the caller's when one is open), on every supported release. Like the other
    /// collectives it may be called in a [`group`](crate::group) or while the stream is
    /// captured, and its buffers stay alive until the work ran. Pooled buffers follow the
    /// pool table's `all_to_all` rules.
    ///
    /// Checked before any NCCL call: four slices of one entry per rank, every region inside
    /// its buffer (a sum that overflows is out of it), no two receive regions overlapping
    /// (they would be written at once), this rank's count to itself the same on both sides
    /// ([`Error::InvalidArgument`] for each); the buffers and the stream of the
    /// communicator's context ([`Error::WrongDevice`], [`Error::WrongContext`]).
    ///
    /// ```
    /// use nccl_channel::{Error, group};
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// // Rank 0 keeps its first element and sends two to rank 1; rank 1 sends all three
    /// // of its elements to rank 0. Indexed [rank][peer]:
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2, 3])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20, 30])?,
    /// ];
    /// let (send_counts, send_displs) = ([[1, 2], [3, 0]], [[0, 1], [0, 3]]);
    /// // What each rank gets from each peer: the peer's send count to it.
    /// let (recv_counts, recv_displs) = ([[1, 3], [2, 0]], [[0, 1], [0, 2]]);
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 4)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
    /// group(&nccl, || {
    ///     for r in 0..2 {
    ///         comms[r].all_to_all_v(
    ///             &send[r], &send_counts[r], &send_displs[r],
    ///             &mut recv[r], &recv_counts[r], &recv_displs[r],
    ///             &streams[r],
    ///         )?;
    ///     }
    ///     Ok(())
    /// })?;
    /// streams[0].synchronize()?;
    /// streams[1].synchronize()?;
    /// assert_eq!(recv[0].to_vec()?, [1, 10, 20, 30]);
    /// assert_eq!(recv[1].to_vec()?, [2, 3]);
    ///
    /// // A layout that cannot be right is refused before NCCL sees it: here the receive
    /// // regions of ranks 0 (elements 0..1) and 1 (0..3) overlap.
    /// let e = comms[0]
    ///     .all_to_all_v(&send[0], &[1, 2], &[0, 1], &mut recv[0], &[1, 3], &[0, 0], &streams[0])
    ///     .unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { what: "all_to_all_v", .. }));
    /// assert_eq!(
    ///     e.to_string(),
    ///     "all_to_all_v: the receive regions from rank 0 (elements 0..1) and rank 1 \
    ///      (elements 0..3) overlap: both would be written at once"
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "alltoallv")]
    #[doc(alias = "all_to_all_single")]
    #[allow(clippy::too_many_arguments)] // MPI_Alltoallv's: each side's counts and displacements
    pub fn all_to_all_v<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        recv_counts: &[usize],
        recv_displs: &[usize],
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllToAllV, "all_to_all_v");
        const W: &str = M.name;
        let mut enq = self.enqueue::<T>(M, stream)?;
        self.same_context(W, buffer_object("send"), send.context())?;
        self.same_context(W, buffer_object("recv"), recv.context())?;
        let (send_len, recv_len) = (send.len(), recv.len());
        self.regions(W, Side::Send, send_counts, send_displs, send_len)?;
        let recv_regions = self.regions(W, Side::Recv, recv_counts, recv_displs, recv_len)?;
        disjoint(W, recv_regions)?;
        let me = self.rank();
        if send_counts[me] != recv_counts[me] {
            return Err(Error::InvalidArgument {
                what: W,
                problem: format!(
                    "rank {me} sends {} element{} to itself (send_counts[{me}]) but receives \
                     {} (recv_counts[{me}])",
                    send_counts[me],
                    if send_counts[me] == 1 { "" } else { "s" },
                    recv_counts[me],
                ),
            });
        }
        let s = enq.buf("send", send, send_len)?;
        let r = enq.buf("recv", recv, recv_len)?;
        let (sp, rp) = (s.ptr(), r.ptr());
        enq.call_grouped(
            Call::uncounted::<T>(Collective::AllToAllV),
            |comm, stream| {
                self.exchange_with_each::<T>(comm, stream, |p| {
                    let to = (send_counts[p] > 0)
                        .then(|| (past::<T>(sp, send_displs[p]), send_counts[p]));
                    let from = (recv_counts[p] > 0)
                        .then(|| (past::<T>(rp, recv_displs[p]), recv_counts[p]));
                    (to, from)
                })
            },
        )
    }

    /// The non-empty regions `displs[p] .. displs[p] + counts[p]` of a variable all-to-all's
    /// buffer of `len` elements, with their peers; `Err` unless both slices have one entry
    /// per rank and every region (empty ones too) ends within the buffer.
    /// Every rank's part in the all-reduce of `(send, recv)`'s `count` elements, on
    /// `issue`. The reduction is made before the comparison: nothing local fails after.
    fn all_reduce_on<T: NcclType>(
        &self,
        enq: &Enqueue<'_>,
        (send, recv): (CUdeviceptr, CUdeviceptr),
        count: usize,
        op: ReduceOp<T>,
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::AllReduce, count).op(&op);
        let op = self.op(op)?;
        enq.call(call, |comm, stream| {
            // SAFETY: `count` elements of T at both addresses, device memory of this
            // communicator's context noted as used on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclAllReduce(
                        dptr(send),
                        dptr(recv),
                        count,
                        T::DTYPE,
                        op.raw,
                        comm,
                        stream
                    )
                )
            }
        })
    }

    /// The reduce-scatter of `size * count` elements at `send` into `count` at `recv`.
    fn reduce_scatter_on<T: NcclType>(
        &self,
        enq: &Enqueue<'_>,
        (send, recv): (*mut c_void, *mut c_void),
        count: usize,
        op: ReduceOp<T>,
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::ReduceScatter, count).op(&op);
        let op = self.op(op)?;
        enq.call(call, |comm, stream| {
            // SAFETY: `size * count` elements at `send`, `count` at `recv`, noted as used
            // on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclReduceScatter(send, recv, count, T::DTYPE, op.raw, comm, stream)
                )
            }
        })
    }

    /// The broadcast of `count` elements from `root` (`root_arg` as NCCL takes it).
    fn broadcast_on<T: NcclType>(
        &self,
        enq: &Enqueue<'_>,
        (send, recv): (CUdeviceptr, CUdeviceptr),
        count: usize,
        (root, root_arg): (usize, i32),
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::Broadcast, count).root(root);
        enq.call(call, |comm, stream| {
            // SAFETY: `count` elements of T at both addresses (the send one read on the
            // root only), noted as used on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclBroadcast(
                        dptr(send),
                        dptr(recv),
                        count,
                        T::DTYPE,
                        root_arg,
                        comm,
                        stream
                    )
                )
            }
        })
    }

    /// The reduce of `count` elements to `root` (`root_arg` as NCCL takes it).
    fn reduce_on<T: NcclType>(
        &self,
        enq: &Enqueue<'_>,
        (send, recv): (CUdeviceptr, CUdeviceptr),
        count: usize,
        op: ReduceOp<T>,
        (root, root_arg): (usize, i32),
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::Reduce, count).op(&op).root(root);
        let op = self.op(op)?;
        enq.call(call, |comm, stream| {
            // SAFETY: `count` elements of T at both addresses (the receive one written on
            // the root only), noted as used on the stream (enqueue.rs).
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclReduce(
                        dptr(send),
                        dptr(recv),
                        count,
                        T::DTYPE,
                        op.raw,
                        root_arg,
                        comm,
                        stream
                    )
                )
            }
        })
    }

    /// The point-to-point form of a collective, inside the group its caller opened: for
    /// each peer `p`, `each(p)` gives what to send to it and where to receive from it
    /// (address and count of `T`s); the first failure's status, or success.
    fn exchange_with_each<T: NcclType>(
        &self,
        comm: nccl_sys::ncclComm_t,
        stream: cuda_sys::CUstream,
        mut each: impl FnMut(usize) -> (Option<(*mut c_void, usize)>, Option<(*mut c_void, usize)>),
    ) -> Raw {
        let nccl = self.nccl();
        for p in 0..self.size() {
            let peer = p as i32;
            let (to, from) = each(p);
            if let Some((at, n)) = to {
                // SAFETY: `n` elements of T at `at`, within a buffer noted as used on the
                // stream (enqueue.rs), as the caller computed.
                let r =
                    unsafe { nccl_raw_call!(nccl, ncclSend(at, n, T::DTYPE, peer, comm, stream)) };
                if r.0 != ncclResult_t::ncclSuccess {
                    return r;
                }
            }
            if let Some((at, n)) = from {
                // SAFETY: as above, for the receiving buffer.
                let r =
                    unsafe { nccl_raw_call!(nccl, ncclRecv(at, n, T::DTYPE, peer, comm, stream)) };
                if r.0 != ncclResult_t::ncclSuccess {
                    return r;
                }
            }
        }
        (ncclResult_t::ncclSuccess, "ncclSend")
    }

    /// What only the root passes: required there (naming `which` buffer), ignored
    /// elsewhere.
    fn at_root<V>(
        &self,
        what: &'static str,
        v: Option<V>,
        root: usize,
        which: &str,
    ) -> Result<Option<V>> {
        if self.rank() != root {
            return Ok(None);
        }
        v.map(Some).ok_or_else(|| Error::InvalidArgument {
            what,
            problem: format!("rank {root} is the root and must pass the {which} buffer"),
        })
    }

    fn regions(
        &self,
        what: &'static str,
        side: Side,
        counts: &[usize],
        displs: &[usize],
        len: usize,
    ) -> Result<Vec<(usize, Range<usize>)>> {
        let (counts_name, displs_name) = side.names();
        let n = self.size();
        for (name, got) in [(counts_name, counts.len()), (displs_name, displs.len())] {
            if got != n {
                return Err(Error::InvalidArgument {
                    what,
                    problem: format!(
                        "{name} has {got} entr{}, it needs one per rank ({n})",
                        if got == 1 { "y" } else { "ies" }
                    ),
                });
            }
        }
        let mut regions = Vec::new();
        for (p, (&count, &displ)) in counts.iter().zip(displs).enumerate() {
            let sum = format!("{displs_name}[{p}] + {counts_name}[{p}] = {displ} + {count}");
            let Some(end) = displ.checked_add(count) else {
                return Err(Error::InvalidArgument {
                    what,
                    problem: format!("{sum} overflows"),
                });
            };
            if end > len {
                return Err(Error::InvalidArgument {
                    what,
                    problem: format!(
                        "{sum} = {end} is past the end of the {} buffer ({len} element{})",
                        side.buffer(),
                        if len == 1 { "" } else { "s" },
                    ),
                });
            }
            if count > 0 {
                regions.push((p, displ..end));
            }
        }
        Ok(regions)
    }

    /// The root's `recv` gets every rank's `send` in rank order (`n * m` elements). Only the
    /// root passes `recv`. Native `ncclGather` on NCCL ≥ 2.28.3, grouped send/recv before.
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let send = [
    ///     DeviceBuffer::from_slice(&ctxs[0], &[1, 2])?,
    ///     DeviceBuffer::from_slice(&ctxs[1], &[10, 20])?,
    /// ];
    /// let mut all = DeviceBuffer::zeroed(&ctxs[0], 4)?;
    /// group(&nccl, || {
    ///     comms[0].gather(&send[0], Some(all.as_view_mut()), 0, &streams[0])?; // the root
    ///     comms[1].gather(&send[1], None, 0, &streams[1])
    /// })?;
    /// streams[0].synchronize()?;
    /// assert_eq!(all.to_vec()?, [1, 2, 10, 20]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclGather")]
    pub fn gather<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: Option<DeviceViewMut<'_, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Gather, "gather");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let root_arg = self.check_rank(M.name, root)?;
        let m = send.len();
        let s = enq.buf("send", send, m)?;
        let recv = self.at_root(M.name, recv, root, "receive")?;
        let r = recv
            .as_ref()
            .map(|v| enq.buf("recv", v, m.saturating_mul(self.size())))
            .transpose()?;
        let (sp, rp) = (s.ptr(), r.as_ref().map(Enqueuing::ptr));
        let call = Call::new::<T>(Collective::Gather, m).root(root);
        if let Ok((f, name)) = optional!(self.nccl(), ncclGather) {
            return enq.call(call, |comm, stream| {
                let rp = rp.map_or(std::ptr::null_mut(), dptr);
                // SAFETY: ranges checked and noted as used (enqueue.rs); non-roots pass no
                // receive buffer, which NCCL ignores.
                (
                    unsafe { f(dptr(sp), rp, m, T::DTYPE, root_arg, comm, stream) },
                    name,
                )
            });
        }
        // NCCL before 2.28.3: sends to the root, which receives from each, in a group.
        enq.call_grouped(call, |comm, stream| {
            self.exchange_with_each::<T>(comm, stream, |p| {
                let to_root = (p == root).then(|| (dptr(sp), m));
                (to_root, rp.map(|base| (past::<T>(base, p * m), m)))
            })
        })
    }

    /// Rank `r` gets the root's `send[r * m ..][.. m]`. Only the root passes `send`
    /// (`n * m` elements). Native `ncclScatter` on NCCL ≥ 2.28.3, grouped send/recv before.
    ///
    /// ```
    /// use nccl_channel::group;
    /// # use cuda_hal::DeviceBuffer;
    /// # use nccl_channel::Communicator;
    /// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
    /// // Two ranks driven from this thread (`comms`, `ctxs`, `streams`, as in
    /// // `Communicator`'s example): one group launches both ranks' parts.
    /// let src = DeviceBuffer::from_slice(&ctxs[0], &[1, 2, 10, 20])?;
    /// let mut recv = [DeviceBuffer::zeroed(&ctxs[0], 2)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
    /// group(&nccl, || {
    ///     comms[0].scatter(Some(src.as_view()), &mut recv[0], 0, &streams[0])?; // the root
    ///     comms[1].scatter(None, &mut recv[1], 0, &streams[1])
    /// })?;
    /// streams[0].synchronize()?;
    /// streams[1].synchronize()?;
    /// assert_eq!(recv[0].to_vec()?, [1, 2]);
    /// assert_eq!(recv[1].to_vec()?, [10, 20]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclScatter")]
    pub fn scatter<T: NcclType>(
        &self,
        send: Option<DeviceView<'_, T>>,
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Scatter, "scatter");
        let mut enq = self.enqueue::<T>(M, stream)?;
        let root_arg = self.check_rank(M.name, root)?;
        let m = recv.len();
        let r = enq.buf("recv", recv, m)?;
        let send = self.at_root(M.name, send, root, "send")?;
        let s = send
            .as_ref()
            .map(|v| enq.buf("send", v, m.saturating_mul(self.size())))
            .transpose()?;
        let (sp, rp) = (s.as_ref().map(Enqueuing::ptr), r.ptr());
        let call = Call::new::<T>(Collective::Scatter, m).root(root);
        if let Ok((f, name)) = optional!(self.nccl(), ncclScatter) {
            return enq.call(call, |comm, stream| {
                let sp = sp.map_or(std::ptr::null_mut(), dptr);
                // SAFETY: ranges checked and noted as used (enqueue.rs); non-roots pass no
                // send buffer, which NCCL ignores.
                (
                    unsafe { f(sp, dptr(rp), m, T::DTYPE, root_arg, comm, stream) },
                    name,
                )
            });
        }
        // NCCL before 2.28.3: the root sends to each, every rank receives from it, in a
        // group.
        enq.call_grouped(call, |comm, stream| {
            self.exchange_with_each::<T>(comm, stream, |p| {
                let from_root = (p == root).then(|| (dptr(rp), m));
                (sp.map(|base| (past::<T>(base, p * m), m)), from_root)
            })
        })
    }

    /// Waits until every rank has reached this point: an all-reduce of one element on
    /// `stream`, then a stream synchronise.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use cuda_hal::{Cuda, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, UniqueId};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let id = UniqueId::generate(&nccl)?;
    /// let arrived = AtomicUsize::new(0);
    /// let seen = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = (0..2)
    ///         .map(|rank| {
    ///             let (cuda, nccl, arrived) = (&cuda, &nccl, &arrived);
    ///             s.spawn(move || -> nccl_channel::Result<usize> {
    ///                 let ctx = cuda.device(rank)?.primary_context()?;
    ///                 let comm = Communicator::init_rank(nccl, &ctx, &id, 2, rank)?;
    ///                 let stream = Stream::new(&ctx)?;
    ///                 arrived.fetch_add(1, Ordering::SeqCst);
    ///                 comm.barrier(&stream)?;
    ///                 Ok(arrived.load(Ordering::SeqCst)) // both have arrived by now
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(seen, [2, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        const M: Method = Method::other("barrier");
        let mut enq = self.enqueue_untyped(M, stream)?;
        let scratch = self.scratch()?;
        // NCCL matches registrations by page: the scratch element may share one with the
        // user's registered memory, whose release must then wait for (and an open group
        // or capture hold it for) this all-reduce too (`Enqueue::buf` notes it there).
        let b = enq.buf("buffer", scratch, 1)?;
        let p = b.ptr();
        enq.call(Call::barrier(), |comm, stream| {
            // SAFETY: one i32 at `p`, the scratch element, noted as used on the stream
            // (enqueue.rs); the sum is NCCL's own operation.
            unsafe {
                nccl_raw_call!(
                    self.nccl(),
                    ncclAllReduce(
                        dptr(p),
                        dptr(p),
                        1,
                        i32::DTYPE,
                        nccl_sys::ncclRedOp_t::ncclSum,
                        comm,
                        stream
                    )
                )
            }
        })?;
        drop((b, enq));
        stream.synchronize()?;
        Ok(())
    }
}
