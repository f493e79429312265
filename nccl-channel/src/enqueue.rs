//! One call issued to NCCL for the program ([`Enqueue`]), in the one order every call takes.
//!
//! 1. [`Communicator::enqueue`]: the element type exists in the loaded NCCL, the
//!    communicator is live and not suspended, the stream is of its context; the stream's
//!    order lock is taken (no capture begins or ends until the call is over) and the
//!    communicator is held for an open capture or group.
//! 2. [`Enqueue::buf`], per buffer: its context and length; its use noted on the stream
//!    ([`Enqueuing::begin`]: its free waits for this work, an open capture or group holds
//!    it); the pool's registration and the registry's record; and only then its address,
//!    from the guard it returns. No address exists before its use is noted.
//! 3. [`Enqueue::call`]: the checked mode's comparison, then the raw call, then its status.
//!    Every local check of the call came before (the raw call needs the addresses, and
//!    the closure that makes it cannot fail on its own), so a rank refused locally never
//!    takes part in a comparison that its peers then act on.
//!
//! The guards report the enqueue when dropped, after the raw call; the order lock goes
//! last, with the `Enqueue`, which callers declare first.

use std::ffi::c_void;

use cuda_hal::{DeviceSlice, EnqueueLock, Enqueuing, Stream};
use cuda_sys::{CUdeviceptr, CUstream};
use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::call_check::Call;
use crate::collective_kind::Method;
use crate::{Communicator, Error, NcclType, Result};

/// What the raw call answers: NCCL's status and the function's name.
pub(crate) type Raw = (ncclResult_t, &'static str);

/// A device address as the pointer NCCL takes.
pub(crate) fn dptr(addr: CUdeviceptr) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

/// The address `elems` elements of `T` past `base`.
pub(crate) fn past<T>(base: CUdeviceptr, elems: usize) -> *mut c_void {
    dptr(base + (elems * size_of::<T>()) as u64)
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

/// One call being issued: see the module's docs.
pub(crate) struct Enqueue<'a> {
    comm: &'a Communicator,
    method: Method,
    stream: &'a Stream,
    /// Where the send and the receive buffer lie in symmetric windows (looked up in the
    /// checked mode only, which compares them).
    at: [Option<(u64, u64)>; 2],
    _order: EnqueueLock<'a>,
}

impl Communicator {
    /// `Ok` when the loaded NCCL has `T` ([`Error::Unsupported`] naming the release that
    /// added it otherwise).
    pub(crate) fn check_type<T: NcclType>(&self) -> Result<()> {
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

    /// Begins a call of `method` on elements of `T` on `stream` (step 1 of enqueue.rs).
    #[inline(always)]
    pub(crate) fn enqueue<'a, T: NcclType>(
        &'a self,
        method: Method,
        stream: &'a Stream,
    ) -> Result<Enqueue<'a>> {
        self.check_type::<T>()?;
        self.enqueue_untyped(method, stream)
    }

    /// [`enqueue`](Self::enqueue) of a call that moves no typed data (a signal, a wait).
    #[inline(always)]
    pub(crate) fn enqueue_untyped<'a>(
        &'a self,
        method: Method,
        stream: &'a Stream,
    ) -> Result<Enqueue<'a>> {
        let what = method.name;
        self.handle()?;
        self.shared().suspend.refuse(what)?;
        let order = stream.enqueue_lock();
        self.hold_for(stream);
        self.same_context(what, "stream", stream.context())?;
        Ok(Enqueue {
            comm: self,
            method,
            stream,
            at: [None; 2],
            _order: order,
        })
    }
}

impl<'a> Enqueue<'a> {
    /// `buf` is of the communicator's context and holds `expected` elements; the work
    /// about to be enqueued uses it. Returns the guard whose [`ptr`](Enqueuing::ptr) is its
    /// address for this call; keep it until after [`call`](Self::call). `buffer` names it
    /// in errors: `"send"`, `"recv"`, or `"buffer"` for one that is both.
    #[inline(always)]
    pub(crate) fn buf<'b, T: NcclType, S: DeviceSlice<Elem = T> + ?Sized>(
        &mut self,
        buffer: &'static str,
        buf: &'b S,
        expected: usize,
    ) -> Result<Enqueuing<'b, S>>
    where
        'a: 'b,
    {
        let (comm, what) = (self.comm, self.method.name);
        comm.same_context(what, buffer_object(buffer), buf.context())?;
        if buf.len() != expected {
            return Err(Error::LengthMismatch {
                what,
                buffer,
                expected,
                got: buf.len(),
            });
        }
        let guard = Enqueuing::begin(buf, self.stream)?;
        let (ptr, bytes) = (guard.ptr(), buf.size_bytes());
        // Kept until the use is noted on the registration it may have made.
        let registered = comm.register_pooled(self.method, buffer, ptr, bytes)?;
        comm.shared().registry.used(ptr, bytes, self.stream);
        drop(registered);
        if comm.checks_calls() {
            let at = comm.shared().registry.symmetric_offset(ptr, bytes);
            match buffer {
                "send" | "source" => self.at[0] = at,
                "recv" => self.at[1] = at,
                _ => self.at = [at; 2],
            }
        }
        Ok(guard)
    }

    /// In the checked mode, compares `call` between the ranks; then makes the raw call
    /// `raw(communicator, stream)` and checks its status (step 3 of enqueue.rs).
    #[inline(always)]
    pub(crate) fn call(
        &self,
        call: Call,
        raw: impl FnOnce(ncclComm_t, CUstream) -> Raw,
    ) -> Result<()> {
        self.compare(call)?;
        self.call_unchecked(raw)
    }

    /// [`call`](Self::call) whose raw calls go in an NCCL group of their own (the
    /// point-to-point form of a collective): compared first, outside the group (which
    /// could not wait for it). The group ends before this returns, so what the buffers'
    /// notes promised (their uses on the stream, noted by [`buf`](Self::buf) before the
    /// comparison, and reported when their guards drop after it) holds for the work it
    /// enqueues: they are not noted again inside, where a slice that cannot outlive an open
    /// group would be refused only after its peers compared. The communicator is held by
    /// the group (an abort waits for its end; a failed group aborts it).
    pub(crate) fn call_grouped(
        &self,
        call: Call,
        raw: impl FnOnce(ncclComm_t, CUstream) -> Raw,
    ) -> Result<()> {
        self.compare(call)?;
        crate::group::group(self.comm.nccl(), || {
            self.comm.hold_for(self.stream);
            self.call_unchecked(raw)
        })
    }

    /// The checked mode's comparison of `call`, with where the buffers lie in symmetric
    /// windows; nothing without the checked mode.
    #[inline(always)]
    fn compare(&self, call: Call) -> Result<()> {
        if self.comm.checks_calls() {
            let call = call.symmetric_at(self.at[0], self.at[1]);
            self.comm.check_call(self.method.name, call, self.stream)?;
        }
        Ok(())
    }

    /// The raw call without the comparison: the crate's own exchanges, which are no call
    /// of the program's.
    #[inline(always)]
    pub(crate) fn call_unchecked(
        &self,
        raw: impl FnOnce(ncclComm_t, CUstream) -> Raw,
    ) -> Result<()> {
        let (rc, name) = raw(self.comm.as_raw(), self.stream.as_raw());
        self.comm.check(rc, name)
    }
}
