//! One-sided communication on windows (NCCL ≥ 2.29.2): [`Window::put_signal`] writes
//! into a peer's window without the peer taking part, [`Communicator::signal`] signals
//! without data, [`Communicator::wait_signal`] waits on the stream for signals, and
//! [`Window::user_ptr`] gives a window's address as NCCL knows it.
//!
//! Windows are symmetric: every rank registers its n-th window together (same size), and
//! a rank names a peer's window by its own handle of the same place. NCCL maps the peers'
//! memory into that handle, so a put needs this rank's window to live until the put is
//! done: the put notes its stream on the window (its deregistration waits for the put;
//! an open capture or group holds it, as for collectives), and on its source (whose free
//! waits for the put). The source must lie in a window of this communicator registered
//! with [`WindowFlags::COLL_SYMMETRIC`](crate::WindowFlags::COLL_SYMMETRIC), as NCCL
//! requires. The peer sees the data once its [`wait_signal`](Communicator::wait_signal)
//! for the put's signal is done on its stream; puts and signals to one peer arrive in
//! program order.

use std::ffi::{c_int, c_void};

use cuda_hal::{DeviceSlice, Stream};
use nccl_sys::ncclWaitSignalDesc_t;

use crate::collective_kind::Method;
use crate::{Communicator, Error, NcclType, Result, Window};

/// Which signal a one-sided operation updates or waits for: NCCL's signal index and
/// context (`sigIdx`, `ctx`). NCCL 2.29–2.32 have only [`Signal::DEFAULT`] (both 0) and
/// answer others with `ncclInvalidArgument`.
///
/// ```
/// use nccl_channel::Signal;
/// assert_eq!(Signal::default(), Signal::DEFAULT);
/// assert_eq!((Signal::DEFAULT.index, Signal::DEFAULT.context), (0, 0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Signal {
    /// NCCL's signal index (`sigIdx`).
    pub index: i32,
    /// NCCL's context (`ctx`).
    pub context: i32,
}

impl Signal {
    /// Signal index 0 of context 0: the one NCCL has so far.
    pub const DEFAULT: Signal = Signal {
        index: 0,
        context: 0,
    };
}

/// What [`Communicator::wait_signal`] waits for: `count` signals of `peer` (puts or
/// plain signals), on `signal` (an `ncclWaitSignalDesc_t`).
///
/// ```
/// use nccl_channel::{Signal, SignalWait};
/// let w = SignalWait::new(1, 2);
/// assert_eq!(w, SignalWait { peer: 1, count: 2, signal: Signal::DEFAULT });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SignalWait {
    /// The rank whose signals are awaited.
    pub peer: usize,
    /// How many (NCCL needs at least 1).
    pub count: u32,
    /// Which signal.
    pub signal: Signal,
}

impl SignalWait {
    /// `count` signals of `peer` on [`Signal::DEFAULT`].
    #[must_use]
    pub fn new(peer: usize, count: u32) -> SignalWait {
        SignalWait {
            peer,
            count,
            signal: Signal::DEFAULT,
        }
    }
}

impl Window<'_> {
    /// Writes `src` into rank `peer`'s window of this place at byte `offset`, then
    /// updates `signal` there (`ncclPutSignal`, NCCL ≥ 2.29.2): one-sided, the peer
    /// makes no matching call; it sees the data after its
    /// [`wait_signal`](Communicator::wait_signal) for it. `src` must lie in a
    /// [`COLL_SYMMETRIC`](crate::WindowFlags::COLL_SYMMETRIC) window of this
    /// communicator. A put past the end of the smallest window of this place on any
    /// rank is [`Error::OutOfWindow`] (NCCL lets the sizes differ, agreed at
    /// registration, and does not check a put against the peer's). This window and `src`
    /// stay alive until the put is done (and as long as a capture or group that recorded
    /// it can launch it). The peer's window is the peer's: NCCL keeps its peers' mappings
    /// of it, so a put that lands after the peer released it writes memory nobody reads
    /// any more (NCCL's guarantee, not this crate's).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::{Cuda, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, Signal, SignalWait, WindowFlags};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
    /// let mut src = [comms[0].alloc_nccl::<u32>(1024)?, comms[1].alloc_nccl::<u32>(1024)?];
    /// let mut dst = [comms[0].alloc_nccl::<u32>(1024)?, comms[1].alloc_nccl::<u32>(1024)?];
    /// src[0].fill(7)?;
    /// dst[1].fill(0)?;
    /// let sym = WindowFlags::COLL_SYMMETRIC;
    /// let _src_windows = Communicator::register_windows(&[(&comms[0], &src[0]), (&comms[1], &src[1])], sym)?;
    /// let windows = Communicator::register_windows(&[(&comms[0], &dst[0]), (&comms[1], &dst[1])], sym)?;
    /// // Rank 0 writes 4 elements at byte 16 of rank 1's window, and signals it.
    /// windows[0].put_signal(&src[0].slice(0..4)?, 1, 16, Signal::DEFAULT, &streams[0])?;
    /// // Rank 1 waits for that signal on its stream; then the data is there.
    /// comms[1].wait_signal(&[SignalWait::new(0, 1)], &streams[1])?;
    /// streams[1].synchronize()?;
    /// assert_eq!(dst[1].to_vec()?[..8], [0, 0, 0, 0, 7, 7, 7, 7]);
    /// # streams[0].synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclPutSignal")]
    pub fn put_signal<T: NcclType>(
        &self,
        src: &(impl DeviceSlice<Elem = T> + ?Sized),
        peer: usize,
        offset: usize,
        signal: Signal,
        stream: &Stream,
    ) -> Result<()> {
        let target = Target {
            raw: self.raw(),
            start: self.device_ptr(),
            bytes: self.size_bytes(),
            peer_bytes: self.peer_bytes(),
        };
        put_signal(
            self.comm(),
            "Window::put_signal",
            &target,
            src,
            peer,
            offset,
            signal,
            stream,
        )
    }

    /// The window's address as NCCL knows it (`ncclWinGetUserPtr`, NCCL ≥ 2.29.2);
    /// `None` for a window NCCL declined (no symmetric support).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use cuda_hal::Cuda;
    /// # use cuda_mock::MockDriver;
    /// # use nccl_mock::MockNccl;
    /// use nccl_channel::{Communicator, WindowFlags};
    /// # let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// # let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))?.remove(0);
    /// let buf = comm.alloc_nccl::<u8>(4096)?;
    /// let window = comm.register_window(&buf, WindowFlags::COLL_SYMMETRIC)?;
    /// assert_eq!(window.user_ptr()?, Some(buf.as_raw()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclWinGetUserPtr")]
    pub fn user_ptr(&self) -> Result<Option<u64>> {
        let comm = self.comm();
        let (f, call) = optional!(comm.nccl(), ncclWinGetUserPtr)?;
        let raw = comm.handle()?;
        let Some(win) = self.raw() else {
            return Ok(None);
        };
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live communicator, an active window of it (this one, alive while
        // borrowed), a valid out-pointer.
        let rc = unsafe { f(raw, win, &mut out) };
        comm.check(rc, call)?;
        Ok((!out.is_null()).then(|| out.expose_provenance() as u64))
    }
}

/// The window a put writes into on the peer: this rank's window of the same place.
pub(crate) struct Target {
    /// NCCL's handle, while the window is active.
    pub(crate) raw: Option<nccl_sys::ncclWindow_t>,
    /// This rank's window: its address and size.
    pub(crate) start: u64,
    pub(crate) bytes: usize,
    /// The smallest size of the window among the ranks.
    pub(crate) peer_bytes: usize,
}

/// `ncclPutSignal` of `src` into rank `peer`'s window of `target`'s place (see
/// [`Window::put_signal`]), on `comm`, the window's communicator.
#[allow(clippy::too_many_arguments)] // ncclPutSignal's operands, and the method's name
pub(crate) fn put_signal<T: NcclType>(
    comm: &Communicator,
    what: &'static str,
    target: &Target,
    src: &(impl DeviceSlice<Elem = T> + ?Sized),
    peer: usize,
    offset: usize,
    signal: Signal,
    stream: &Stream,
) -> Result<()> {
    let (f, call) = optional!(comm.nccl(), ncclPutSignal)?;
    let mut enq = comm.enqueue::<T>(Method::other(what), stream)?;
    let p = comm.check_rank(what, peer)?;
    let Some(win) = target.raw else {
        return Err(Error::InvalidArgument {
            what,
            problem: "the window is not active (NCCL declined it)".into(),
        });
    };
    let bytes = src.size_bytes();
    // The smallest window of this place on any rank: NCCL lets the sizes differ and
    // does not check that a put fits the peer's.
    if offset
        .checked_add(bytes)
        .is_none_or(|end| end > target.peer_bytes)
    {
        return Err(Error::OutOfWindow {
            what,
            offset,
            bytes,
            window: target.peer_bytes,
        });
    }
    comm.same_context(what, crate::enqueue::buffer_object("source"), src.context())?;
    let s = enq.buf("send", src, src.len())?;
    let registry = &comm.shared().registry;
    if !src.is_empty() && !registry.in_window(s.ptr(), bytes) {
        return Err(Error::InvalidArgument {
            what,
            problem: "the source must lie in a window of this communicator (registered \
                      with WindowFlags::COLL_SYMMETRIC)"
                .into(),
        });
    }
    // NCCL reaches the peer's memory through this window: its release waits for the
    // put, and an open capture or group holds it.
    registry.used(target.start, target.bytes, stream);
    let ptr: *const c_void = crate::enqueue::dptr(s.ptr());
    let n = src.len();
    enq.call_unchecked(|raw_comm, raw_stream| {
        // SAFETY: a live communicator; `src` is `n` elements of T of its device, kept
        // allocated until the put is done (noted on the stream by `Enqueue::buf`); `win` is
        // an active window of this communicator, kept until the put is done (noted
        // above), and the write fits the smallest window of this place on any rank
        // (checked above).
        let rc = unsafe {
            f(
                ptr,
                n,
                T::DTYPE,
                p,
                win,
                offset,
                signal.index as c_int,
                signal.context as c_int,
                0,
                raw_comm,
                raw_stream,
            )
        };
        (rc, call)
    })
}

impl Communicator {
    /// Updates `signal` on rank `peer` without data (`ncclSignal`, NCCL ≥ 2.29.2), after
    /// this rank's earlier puts and signals to `peer`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cuda_hal::{Cuda, Stream};
    /// use cuda_mock::MockDriver;
    /// use nccl_channel::{Communicator, Signal, SignalWait};
    /// use nccl_mock::MockNccl;
    ///
    /// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
    /// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
    /// let comms = Communicator::init_all(&nccl, &ctxs)?;
    /// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
    /// comms[0].signal(1, Signal::DEFAULT, &streams[0])?;
    /// comms[0].signal(1, Signal::DEFAULT, &streams[0])?;
    /// comms[1].wait_signal(&[SignalWait::new(0, 2)], &streams[1])?;
    /// streams[1].synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclSignal")]
    pub fn signal(&self, peer: usize, signal: Signal, stream: &Stream) -> Result<()> {
        const W: &str = "Communicator::signal";
        let (f, call) = optional!(self.nccl(), ncclSignal)?;
        let enq = self.enqueue_untyped(Method::other(W), stream)?;
        let p = self.check_rank(W, peer)?;
        enq.call_unchecked(|comm, stream| {
            // SAFETY: a live communicator and a stream of its context.
            let rc = unsafe {
                f(
                    p,
                    signal.index as c_int,
                    signal.context as c_int,
                    0,
                    comm,
                    stream,
                )
            };
            (rc, call)
        })
    }

    /// Makes `stream` wait until the signals `waits` names have arrived, and consumes
    /// them (`ncclWaitSignal`, NCCL ≥ 2.29.2): after it, the data of the puts they
    /// signal is in this rank's windows. Signals that never come end in the
    /// communicator's deadline ([`Error::Timeout`] on a non-blocking communicator), not
    /// a hang. See [`Window::put_signal`] and [`signal`](Self::signal) for examples.
    #[doc(alias = "ncclWaitSignal")]
    pub fn wait_signal(&self, waits: &[SignalWait], stream: &Stream) -> Result<()> {
        const W: &str = "Communicator::wait_signal";
        let (f, call) = optional!(self.nccl(), ncclWaitSignal)?;
        let enq = self.enqueue_untyped(Method::other(W), stream)?;
        let mut descs = Vec::with_capacity(waits.len());
        for w in waits {
            let peer = self.check_rank(W, w.peer)?;
            let count = i32::try_from(w.count).map_err(|_| Error::InvalidArgument {
                what: W,
                problem: format!("{} signals: NCCL counts at most {}", w.count, i32::MAX),
            })?;
            descs.push(ncclWaitSignalDesc_t {
                opCnt: count,
                peer,
                sigIdx: w.signal.index,
                ctx: w.signal.context,
            });
        }
        let n = c_int::try_from(descs.len()).map_err(|_| Error::InvalidArgument {
            what: W,
            problem: "too many descriptors".into(),
        })?;
        enq.call_unchecked(|comm, stream| {
            // SAFETY: a live communicator, a stream of its context, `n` descriptors that
            // NCCL copies at the call (and does not keep).
            (unsafe { f(n, descs.as_mut_ptr(), comm, stream) }, call)
        })
    }
}
