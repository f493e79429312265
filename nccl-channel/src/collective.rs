//! Every NCCL collective and point-to-point call, typed and checked before the FFI call.

use std::ffi::c_void;
use std::ops::Range;

use cuda_hal::{
    DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut, EnqueueLock, Enqueuing, Stream,
};
use nccl_sys::{ncclRedOp_t, ncclScalarResidence_t};

use crate::call_check::Call;
use crate::collective_kind::Method;
use crate::{Collective, Communicator, Error, NcclType, ReduceOp, Result, group};

/// A device address as the pointer NCCL takes.
fn dptr(addr: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

fn offset<S: DeviceSlice + ?Sized>(buf: &S, elems: usize) -> *mut c_void {
    dptr(buf.device_ptr() + (elems * size_of::<S::Elem>()) as u64)
}

/// The device address of `buf` as NCCL takes it.
fn at<S: DeviceSlice + ?Sized>(buf: &S) -> *mut c_void {
    dptr(buf.device_ptr())
}

/// A buffer argument as errors about its device name it: `"send"` is the "send buffer".
pub(crate) fn buffer_object(buffer: &'static str) -> &'static str {
    match buffer {
        "send" => "send buffer",
        "recv" => "recv buffer",
        "source" => "source buffer",
        other => other,
    }
}

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
    fn check_type<T: NcclType>(&self) -> Result<()> {
        if let Some(since) = T::SINCE
            && self.nccl().version() < since
        {
            return Err(Error::Unsupported {
                feature: T::NAME,
                needed: since.to_string(),
                found: self.nccl().version().to_string(),
            });
        }
        Ok(())
    }

    /// The checks every operation starts with: live, a type this NCCL has, our stream.
    /// The returned lock is held until the work is enqueued (no capture begins or ends
    /// between the noting of what the work uses and its enqueue).
    pub(crate) fn begin<'s, T: NcclType>(
        &self,
        what: &'static str,
        stream: &'s Stream,
    ) -> Result<EnqueueLock<'s>> {
        self.check_type::<T>()?;
        self.check_stream(what, stream)
    }

    /// Live, and `stream` is ours; the work about to be enqueued on it needs this
    /// communicator (held by an open capture or group).
    pub(crate) fn check_stream<'s>(
        &self,
        what: &'static str,
        stream: &'s Stream,
    ) -> Result<EnqueueLock<'s>> {
        self.handle()?;
        self.shared().suspend.refuse(what)?;
        let order = stream.enqueue_lock();
        self.hold_for(stream);
        self.same_context(what, "stream", stream.context())?;
        Ok(order)
    }

    /// `buf` is ours and holds `expected` elements; the work about to be enqueued on
    /// `stream` uses it (its free waits for that work; an open capture or group holds it).
    /// The guard tells `buf` when the call is done ([`DeviceSlice::enqueued_on`]): keep it
    /// until after the NCCL call.
    pub(crate) fn check_buf<'b, T: NcclType, S: DeviceSlice<Elem = T> + ?Sized>(
        &self,
        what: Method,
        buffer: &'static str,
        buf: &'b S,
        expected: usize,
        stream: &'b Stream,
    ) -> Result<Enqueuing<'b, S>> {
        self.check_buf_noted(what, buffer, buf, expected, stream)?;
        Ok(Enqueuing::new(buf, stream))
    }

    /// As [`check_buf`](Self::check_buf), without the guard: the caller makes one for a
    /// value that outlives this call (a root-only view moved back out).
    fn check_buf_noted<T: NcclType, S: DeviceSlice<Elem = T> + ?Sized>(
        &self,
        method: Method,
        buffer: &'static str,
        buf: &S,
        expected: usize,
        stream: &Stream,
    ) -> Result<()> {
        let what = method.name;
        self.same_context(what, buffer_object(buffer), buf.context())?;
        if buf.len() != expected {
            return Err(Error::LengthMismatch {
                what,
                buffer,
                expected,
                got: buf.len(),
            });
        }
        buf.used_on(stream)?;
        // Kept until the use is noted on the registration it may have made.
        let registered =
            self.register_pooled(method, buffer, buf.device_ptr(), buf.size_bytes())?;
        self.shared()
            .registry
            .used(buf.device_ptr(), buf.size_bytes(), stream);
        drop(registered);
        Ok(())
    }

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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let _send_done = self.check_buf(M, "send", send, send.len(), stream)?;
        let _recv_done = self.check_buf(M, "recv", recv, send.len(), stream)?;
        self.raw_all_reduce(W, at(send), at(recv), send.len(), op, stream)
    }

    /// All-reduce in place.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllReduce, "all_reduce_in_place");
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let _buffer_done = self.check_buf(M, "buffer", buf, buf.len(), stream)?;
        let p = at(buf);
        self.raw_all_reduce(W, p, p, buf.len(), op, stream)
    }

    /// `what`: the method, as the checked mode's error names it.
    fn raw_all_reduce<T: NcclType>(
        &self,
        what: &'static str,
        send: *mut c_void,
        recv: *mut c_void,
        count: usize,
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::AllReduce, count).op(&op);
        self.check_call(what, call, stream)?;
        let op = self.op(op)?;
        // SAFETY: both ranges were checked: `count` elements of T in device memory of this
        // communicator's context; the stream is of the same context.
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclAllReduce(
                    send,
                    recv,
                    count,
                    T::DTYPE,
                    op.raw,
                    self.as_raw(),
                    stream.as_raw(),
                )
            )
        };
        self.check(rc, call)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let count = send.len();
        let _send_done = self.check_buf(M, "send", send, count, stream)?;
        let _recv_done =
            self.check_buf(M, "recv", recv, count.saturating_mul(self.size()), stream)?;
        if checked {
            self.check_call(W, Call::new::<T>(Collective::AllGather, count), stream)?;
        }
        self.raw_all_gather::<T>(at(send), at(recv), count, stream)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let _buffer_done = self.check_buf(M, "buffer", buf, buf.len(), stream)?;
        let count = self.divisible(W, "buffer", buf.len())?;
        self.check_call(W, Call::new::<T>(Collective::AllGather, count), stream)?;
        self.raw_all_gather::<T>(offset(buf, self.rank() * count), at(buf), count, stream)
    }

    fn raw_all_gather<T: NcclType>(
        &self,
        send: *mut c_void,
        recv: *mut c_void,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: ranges checked by the callers (count and size*count elements).
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclAllGather(send, recv, count, T::DTYPE, self.as_raw(), stream.as_raw(),)
            )
        };
        self.check(rc, call)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let count = recv.len();
        let _send_done =
            self.check_buf(M, "send", send, count.saturating_mul(self.size()), stream)?;
        let _recv_done = self.check_buf(M, "recv", recv, count, stream)?;
        self.raw_reduce_scatter(W, at(send), at(recv), count, op, stream)
    }

    /// Reduce-scatter in place: the result is `buf[rank * n / size ..][.. n / size]`.
    pub fn reduce_scatter_in_place<T: NcclType>(
        &self,
        buf: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::ReduceScatter, "reduce_scatter_in_place");
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let _buffer_done = self.check_buf(M, "buffer", buf, buf.len(), stream)?;
        let count = self.divisible(W, "buffer", buf.len())?;
        let recv = offset(buf, self.rank() * count);
        self.raw_reduce_scatter(W, at(buf), recv, count, op, stream)
    }

    /// `what`: the method, as the checked mode's error names it.
    fn raw_reduce_scatter<T: NcclType>(
        &self,
        what: &'static str,
        send: *mut c_void,
        recv: *mut c_void,
        count: usize,
        op: ReduceOp<T>,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::ReduceScatter, count).op(&op);
        self.check_call(what, call, stream)?;
        let op = self.op(op)?;
        // SAFETY: ranges checked by the callers.
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclReduceScatter(
                    send,
                    recv,
                    count,
                    T::DTYPE,
                    op.raw,
                    self.as_raw(),
                    stream.as_raw(),
                )
            )
        };
        self.check(rc, call)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let r = self.check_rank(W, root)?;
        let _recv_done = self.check_buf(M, "recv", recv, recv.len(), stream)?;
        let send = self.root_send(M, send, root, recv.len(), stream)?;
        let _send_done = send.as_ref().map(|v| Enqueuing::new(v, stream));
        let sendp = send.as_ref().map_or(at(recv), at);
        self.raw_broadcast::<T>(W, sendp, at(recv), recv.len(), r, stream)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let r = self.check_rank(W, root)?;
        let _buffer_done = self.check_buf(M, "buffer", buf, buf.len(), stream)?;
        let p = at(buf);
        self.raw_broadcast::<T>(W, p, p, buf.len(), r, stream)
    }

    /// The root's send pointer: required on the root (with `len` elements), ignored
    /// elsewhere.
    fn root_send<'v, T: NcclType>(
        &self,
        method: Method,
        send: Option<DeviceView<'v, T>>,
        root: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<Option<DeviceView<'v, T>>> {
        let what = method.name;
        if self.rank() != root {
            return Ok(None);
        }
        let Some(s) = send else {
            return Err(Error::InvalidArgument {
                what,
                problem: format!("rank {root} is the root and must pass the send buffer"),
            });
        };
        self.check_buf_noted(method, "send", &s, len, stream)?;
        Ok(Some(s))
    }

    /// `what`: the method, as the checked mode's error names it.
    fn raw_broadcast<T: NcclType>(
        &self,
        what: &'static str,
        send: *mut c_void,
        recv: *mut c_void,
        count: usize,
        root: i32,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::Broadcast, count).root(root as usize);
        self.check_call(what, call, stream)?;
        // SAFETY: ranges checked by the callers.
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclBroadcast(
                    send,
                    recv,
                    count,
                    T::DTYPE,
                    root,
                    self.as_raw(),
                    stream.as_raw(),
                )
            )
        };
        self.check(rc, call)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let r = self.check_rank(W, root)?;
        let _send_done = self.check_buf(M, "send", send, send.len(), stream)?;
        let recv = self.root_recv(M, recv, root, send.len(), stream)?;
        let _recv_done = recv.as_ref().map(|v| Enqueuing::new(v, stream));
        let recvp = recv.as_ref().map_or(at(send), at);
        self.raw_reduce(W, at(send), recvp, send.len(), op, r, stream)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let r = self.check_rank(W, root)?;
        let _buffer_done = self.check_buf(M, "buffer", buf, buf.len(), stream)?;
        let p = at(buf);
        self.raw_reduce(W, p, p, buf.len(), op, r, stream)
    }

    fn root_recv<'v, T: NcclType>(
        &self,
        method: Method,
        recv: Option<DeviceViewMut<'v, T>>,
        root: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<Option<DeviceViewMut<'v, T>>> {
        let what = method.name;
        if self.rank() != root {
            return Ok(None);
        }
        let Some(r) = recv else {
            return Err(Error::InvalidArgument {
                what,
                problem: format!("rank {root} is the root and must pass the receive buffer"),
            });
        };
        self.check_buf_noted(method, "recv", &r, len, stream)?;
        Ok(Some(r))
    }

    /// `what`: the method, as the checked mode's error names it.
    #[allow(clippy::too_many_arguments)] // ncclReduce's, and the method's name
    fn raw_reduce<T: NcclType>(
        &self,
        what: &'static str,
        send: *mut c_void,
        recv: *mut c_void,
        count: usize,
        op: ReduceOp<T>,
        root: i32,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::new::<T>(Collective::Reduce, count)
            .op(&op)
            .root(root as usize);
        self.check_call(what, call, stream)?;
        let op = self.op(op)?;
        // SAFETY: ranges checked by the callers.
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclReduce(
                    send,
                    recv,
                    count,
                    T::DTYPE,
                    op.raw,
                    root,
                    self.as_raw(),
                    stream.as_raw(),
                )
            )
        };
        self.check(rc, call)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let p = self.check_rank(W, peer)?;
        let _send_done = self.check_buf(M, "send", buf, buf.len(), stream)?;
        self.raw_send::<T>(at(buf), buf.len(), p, stream)
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
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let p = self.check_rank(W, peer)?;
        let _recv_done = self.check_buf(M, "recv", buf, buf.len(), stream)?;
        self.raw_recv::<T>(at(buf), buf.len(), p, stream)
    }

    fn raw_send<T: NcclType>(
        &self,
        p: *mut c_void,
        count: usize,
        peer: i32,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: range checked by the callers.
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclSend(p, count, T::DTYPE, peer, self.as_raw(), stream.as_raw())
            )
        };
        self.check(rc, call)
    }

    fn raw_recv<T: NcclType>(
        &self,
        p: *mut c_void,
        count: usize,
        peer: i32,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: range checked by the callers.
        let (rc, call) = unsafe {
            nccl_raw_call!(
                self.nccl(),
                ncclRecv(p, count, T::DTYPE, peer, self.as_raw(), stream.as_raw())
            )
        };
        self.check(rc, call)
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
        if self.nccl().fns().ncclAlltoAll.is_none() {
            // The fallback's own group: opened before the checks, so that it holds what
            // its calls use (and counts as a group for abort decisions) like the user's.
            return group(self.nccl(), || self.all_to_all_in(send, recv, stream));
        }
        self.all_to_all_in(send, recv, stream)
    }

    fn all_to_all_in<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::AllToAll, "all_to_all");
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        // The send buffer's split first: a receive buffer sized from a bad split would
        // otherwise be blamed for it.
        let m = self.divisible(W, "send", send.len())?;
        let _send_done = self.check_buf(M, "send", send, send.len(), stream)?;
        let _recv_done = self.check_buf(M, "recv", recv, send.len(), stream)?;
        // Checked here, after this rank's own checks; inside the group of the fallback
        // below (NCCL before 2.28.3), the check is skipped, as in any group.
        self.check_call(W, Call::new::<T>(Collective::AllToAll, m), stream)?;
        if let Ok((f, call)) = optional!(self.nccl(), ncclAlltoAll) {
            // SAFETY: both buffers hold n * m elements of T on our device.
            let rc = unsafe {
                f(
                    at(send),
                    at(recv),
                    m,
                    T::DTYPE,
                    self.as_raw(),
                    stream.as_raw(),
                )
            };
            return self.check(rc, call);
        }
        // Inside the group `all_to_all` opened.
        for p in 0..self.size() {
            self.raw_send::<T>(offset(send, p * m), m, p as i32, stream)?;
            self.raw_recv::<T>(offset(recv, p * m), m, p as i32, stream)?;
        }
        Ok(())
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
        // Everything is checked before the group opens: a refused call makes no NCCL call.
        self.check_type::<T>()?;
        self.handle()?;
        self.shared().suspend.refuse(W)?;
        self.same_context(W, "stream", stream.context())?;
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
        self.check_call(W, Call::uncounted::<T>(Collective::AllToAllV), stream)?;
        // The group is opened before the buffers are noted, so that it holds them (and
        // counts as a group for abort decisions), as `all_to_all`'s fallback does.
        group(self.nccl(), || {
            let _order = self.begin::<T>(W, stream)?;
            let _send_done = self.check_buf(M, "send", send, send_len, stream)?;
            let _recv_done = self.check_buf(M, "recv", recv, recv_len, stream)?;
            for p in 0..self.size() {
                if send_counts[p] > 0 {
                    let at = offset(send, send_displs[p]);
                    self.raw_send::<T>(at, send_counts[p], p as i32, stream)?;
                }
                if recv_counts[p] > 0 {
                    let at = offset(recv, recv_displs[p]);
                    self.raw_recv::<T>(at, recv_counts[p], p as i32, stream)?;
                }
            }
            Ok(())
        })
    }

    /// The non-empty regions `displs[p] .. displs[p] + counts[p]` of a variable all-to-all's
    /// buffer of `len` elements, with their peers; `Err` unless both slices have one entry
    /// per rank and every region (empty ones too) ends within the buffer.
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
        if self.nccl().fns().ncclGather.is_none() {
            // The fallback's own group, opened before the checks (see `all_to_all`).
            return group(self.nccl(), || self.gather_in(send, recv, root, stream));
        }
        self.gather_in(send, recv, root, stream)
    }

    fn gather_in<T: NcclType>(
        &self,
        send: &(impl DeviceSlice<Elem = T> + ?Sized),
        recv: Option<DeviceViewMut<'_, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Gather, "gather");
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let r = self.check_rank(W, root)?;
        let m = send.len();
        let _send_done = self.check_buf(M, "send", send, m, stream)?;
        let recv = self.root_recv(M, recv, root, m.saturating_mul(self.size()), stream)?;
        let _recv_done = recv.as_ref().map(|v| Enqueuing::new(v, stream));
        let recvp = recv.as_ref().map(at);
        self.check_call(W, Call::new::<T>(Collective::Gather, m).root(root), stream)?;
        if let Ok((f, call)) = optional!(self.nccl(), ncclGather) {
            let recvp = recvp.unwrap_or(std::ptr::null_mut());
            // SAFETY: ranges checked; non-roots pass no receive buffer, which NCCL ignores.
            let rc = unsafe {
                f(
                    at(send),
                    recvp,
                    m,
                    T::DTYPE,
                    r,
                    self.as_raw(),
                    stream.as_raw(),
                )
            };
            return self.check(rc, call);
        }
        // Inside the group `gather` opened.
        self.raw_send::<T>(at(send), m, r, stream)?;
        if let Some(base) = recvp {
            for p in 0..self.size() {
                let at = dptr(base.addr() as u64 + (p * m * size_of::<T>()) as u64);
                self.raw_recv::<T>(at, m, p as i32, stream)?;
            }
        }
        Ok(())
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
        if self.nccl().fns().ncclScatter.is_none() {
            // The fallback's own group, opened before the checks (see `all_to_all`).
            return group(self.nccl(), || self.scatter_in(send, recv, root, stream));
        }
        self.scatter_in(send, recv, root, stream)
    }

    fn scatter_in<T: NcclType>(
        &self,
        send: Option<DeviceView<'_, T>>,
        recv: &mut (impl DeviceSliceMut<Elem = T> + ?Sized),
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const M: Method = Method::of(Collective::Scatter, "scatter");
        const W: &str = M.name;
        let _order = self.begin::<T>(W, stream)?;
        let r = self.check_rank(W, root)?;
        let m = recv.len();
        let _recv_done = self.check_buf(M, "recv", recv, m, stream)?;
        let send = self.root_send(M, send, root, m.saturating_mul(self.size()), stream)?;
        let _send_done = send.as_ref().map(|v| Enqueuing::new(v, stream));
        let sendp = send.as_ref().map(at);
        self.check_call(W, Call::new::<T>(Collective::Scatter, m).root(root), stream)?;
        if let Ok((f, call)) = optional!(self.nccl(), ncclScatter) {
            let sendp = sendp.unwrap_or(std::ptr::null_mut());
            // SAFETY: ranges checked; non-roots pass no send buffer, which NCCL ignores.
            let rc = unsafe {
                f(
                    sendp,
                    at(recv),
                    m,
                    T::DTYPE,
                    r,
                    self.as_raw(),
                    stream.as_raw(),
                )
            };
            return self.check(rc, call);
        }
        // Inside the group `scatter` opened.
        if let Some(base) = sendp {
            for p in 0..self.size() {
                let at = dptr(base.addr() as u64 + (p * m * size_of::<T>()) as u64);
                self.raw_send::<T>(at, m, p as i32, stream)?;
            }
        }
        self.raw_recv::<T>(at(recv), m, r, stream)
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
        let order = self.check_stream("barrier", stream)?;
        let scratch = self.scratch()?;
        scratch.used_on(stream)?;
        // NCCL matches registrations by page: the scratch element may share one with the
        // user's registered memory, whose release must then wait for (and an open group
        // or capture hold it for) this all-reduce too.
        self.shared()
            .registry
            .used(scratch.as_raw(), size_of::<i32>(), stream);
        let p = at(scratch);
        self.raw_all_reduce::<i32>("barrier", p, p, 1, ReduceOp::Sum, stream)?;
        drop(order);
        stream.synchronize()?;
        Ok(())
    }
}
