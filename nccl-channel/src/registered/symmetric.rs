//! Symmetric memory ([`Communicator::symmetric`]): NCCL memory every rank allocates
//! together and registers as a symmetric window, so that collectives on it take NCCL's
//! symmetric kernels (and, with [`CtaPolicy::ZERO`](crate::CtaPolicy::ZERO), its copy
//! engines instead of the SMs).
//!
//! The allocation is collective, and every way it can go wrong is told to every rank:
//! the ranks first allocate, then exchange what each allocated (the crate's own
//! exchange, agreement/, which no user collective can answer), and register the window
//! only when every rank has memory of the same size (the registration exchanges the
//! window's size too); a last exchange tells every rank whether every rank's NCCL made
//! the window.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cuda_hal::{DeviceBuffer, DeviceSlice, DeviceSliceMut, KeepAlive, Stream};
use cuda_sys::CUdeviceptr;

use crate::agreement::{Topic, values_of};
use crate::registered::register::WindowFlags;
use crate::registered::registry::RegShared;
use crate::{Communicator, Error, NcclType, Result};

/// What a rank sends when its allocation failed: no size is this large.
const FAILED: u64 = u64::MAX;

/// `len` elements of `T` on every rank of a communicator, allocated by NCCL
/// (`ncclMemAlloc`) and registered as a symmetric window
/// ([`WindowFlags::COLL_SYMMETRIC`]): collectives whose buffers lie in it, at the same
/// offsets on every rank, may take NCCL's symmetric kernels. Made with
/// [`Communicator::symmetric`]; use it as a [`DeviceBuffer`] (it derefs to one, and views
/// of it work), and drop it as any buffer, on any thread: its window is released on the
/// communicator's thread (at its next call, or with it) after the work that may use it,
/// then the memory. (Swapping another buffer in through `DerefMut` takes that memory out
/// of the window; the window keeps its own until it is released.)
///
/// **Every rank passes the same offsets.** NCCL's symmetric kernels reach a peer's buffer
/// at this rank's offset in the window: a collective whose ranks pass views at different
/// offsets (or one a view of symmetric memory, another plain memory) reads and writes the
/// wrong places, and neither NCCL nor this crate says so. The checked mode
/// ([`CommConfig::check_calls`](crate::CommConfig::check_calls)) compares the offsets too:
/// [`Error::CallMismatch`] on every rank, before NCCL gets the call.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, ReduceOp, group};
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let nccl = Arc::new(MockNccl::new(&gpus).build()?.0);
/// let ctxs = [cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?];
/// let comms = Communicator::init_all(&nccl, &ctxs)?;
/// let streams = [Stream::new(&ctxs[0])?, Stream::new(&ctxs[1])?];
/// // One thread drives both ranks: both allocate at once.
/// let mut grads = Communicator::symmetric_all::<f32>(&[&comms[0], &comms[1]], 1024)?;
/// grads[0].fill(1.0)?;
/// grads[1].fill(2.0)?;
/// group(&nccl, || {
///     for (r, g) in grads.iter_mut().enumerate() {
///         comms[r].all_reduce_in_place(g, ReduceOp::Sum, &streams[r])?;
///     }
///     Ok(())
/// })?;
/// streams[1].synchronize()?;
/// assert_eq!(grads[1].to_vec()?, vec![3.0; 1024]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SymmetricBuffer<'c, T: NcclType> {
    buf: DeviceBuffer<T>,
    /// The window: it keeps the memory allocated until NCCL has released it.
    window: Arc<RegShared>,
    /// Borrows its communicator, as a window does (it is released through it).
    _comm: PhantomData<&'c ()>,
}

static_assertions::assert_impl_all!(SymmetricBuffer<'static, f32>: Send, Sync, std::fmt::Debug);

impl<T: NcclType> SymmetricBuffer<'_, T> {
    /// The size of its window in bytes: the buffer's, the same on every rank.
    #[must_use]
    pub fn window_bytes(&self) -> usize {
        self.window.bytes()
    }

    /// Writes `src` into rank `peer`'s symmetric buffer of this allocation at byte
    /// `offset`, then updates `signal` there (`ncclPutSignal`, NCCL ≥ 2.29.2): one-sided,
    /// as [`Window::put_signal`](crate::Window::put_signal) for a window registered by
    /// hand. `comm` is the communicator that allocated it ([`Error::InvalidArgument`]
    /// otherwise); `src` must lie in symmetric memory of it too.
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
    /// let ranks = [&comms[0], &comms[1]];
    /// let mut src = Communicator::symmetric_all::<u32>(&ranks, 8)?;
    /// let mut dst = Communicator::symmetric_all::<u32>(&ranks, 8)?;
    /// src[0].fill(7)?;
    /// dst[1].fill(0)?;
    /// // Rank 0 writes 4 elements at byte 16 of rank 1's buffer, and signals it.
    /// dst[0].put_signal(&comms[0], &src[0].slice(0..4)?, 1, 16, Signal::DEFAULT, &streams[0])?;
    /// comms[1].wait_signal(&[SignalWait::new(0, 1)], &streams[1])?;
    /// streams[1].synchronize()?;
    /// assert_eq!(dst[1].to_vec()?, [0, 0, 0, 0, 7, 7, 7, 7]);
    /// # streams[0].synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclPutSignal")]
    pub fn put_signal<U: NcclType>(
        &self,
        comm: &Communicator,
        src: &(impl DeviceSlice<Elem = U> + ?Sized),
        peer: usize,
        offset: usize,
        signal: crate::Signal,
        stream: &Stream,
    ) -> Result<()> {
        const WHAT: &str = "SymmetricBuffer::put_signal";
        if !std::ptr::addr_eq(Arc::as_ptr(&self.window.comm), Arc::as_ptr(comm.shared())) {
            return Err(Error::InvalidArgument {
                what: WHAT,
                problem: "this communicator did not allocate the symmetric buffer".into(),
            });
        }
        let target = crate::onesided::Target {
            raw: self
                .window
                .handle()
                .map(std::ptr::with_exposed_provenance_mut::<nccl_sys::ncclWindow_vidmem>),
            start: self.window.start(),
            bytes: self.window.bytes(),
            // The same size on every rank: agreed when it was allocated.
            peer_bytes: self.window.bytes(),
        };
        crate::onesided::put_signal(comm, WHAT, &target, src, peer, offset, signal, stream)
    }
}

impl<T: NcclType> std::fmt::Debug for SymmetricBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("buffer", &self.buf)
            .field("window", &format_args!("{:#x}", self.window.start()))
            .finish()
    }
}

impl<T: NcclType> Deref for SymmetricBuffer<'_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.buf
    }
}

impl<T: NcclType> DerefMut for SymmetricBuffer<'_, T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        &mut self.buf
    }
}

// SAFETY: forwards to the `DeviceBuffer`, which keeps the promises.
unsafe impl<T: NcclType> DeviceSlice for SymmetricBuffer<'_, T> {
    type Elem = T;
    fn device_ptr(&self) -> CUdeviceptr {
        self.buf.as_raw()
    }
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn context(&self) -> &cuda_hal::Context {
        self.buf.context()
    }
    fn used_on(&self, stream: &Stream) -> cuda_hal::Result<()> {
        self.buf.used_on(stream)
    }
    fn used_synchronously(&self) -> cuda_hal::Result<()> {
        DeviceSlice::used_synchronously(&self.buf)
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(self.buf.keep_alive())
    }
}

// SAFETY: NCCL memory is writable device memory of the buffer's context, as the trait
// requires; the peers' puts and collectives that also write it do so in stream order, as
// any collective writes any buffer.
unsafe impl<T: NcclType> DeviceSliceMut for SymmetricBuffer<'_, T> {}

impl Communicator {
    /// Allocates `len` elements of `T` on every rank together, as a [`SymmetricBuffer`]:
    /// NCCL memory registered as a symmetric window, on which collectives take NCCL's
    /// symmetric kernels. **Collective**: every rank calls it with the same `len`, in the
    /// same order among its window registrations (from one thread driving several ranks,
    /// use [`symmetric_all`](Self::symmetric_all)).
    ///
    /// When it wins, measured on two H200s with NCCL 2.28.9 (BENCHMARKS.md): all-reduces
    /// of up to 16 KiB replayed in CUDA graphs take 0.60–0.68 × the time (NCCL's symmetric
    /// kernels: what gradient buckets and decode-time activations are); large all-gathers
    /// gain with [`CtaPolicy::ZERO`](crate::CtaPolicy::ZERO) (1.39 × the default
    /// policy's speed at 1 GiB, the SMs left to compute) or few CTAs (1.7–1.9 × at `max_ctas(4)`); all-reduces and
    /// reduce-scatters of hundreds of MiB under NCCL's default CTA counts are slower
    /// (0.71–0.82 ×): give those plain memory or [`buffer`](Self::buffer).
    ///
    /// Every rank gets the same answer: an [`Error::Disagreement`] when the ranks asked
    /// different sizes or one of them could not allocate (that rank gets its own error),
    /// [`Error::InvalidArgument`] for an empty buffer, [`Error::Unsupported`] when a
    /// rank's NCCL made no window (windows disabled with `NCCL_WIN_ENABLE=0`, or no
    /// symmetric memory on that machine) or an NCCL before 2.27. Refused inside an open
    /// group ([`Error::InvalidArgument`] on that rank) and while a capture forbids this
    /// thread host waits (`Error::Cuda` of [`cuda_hal::Error::Capturing`]); the others
    /// wait for such a rank as for any collective, within their communicator's deadline.
    ///
    /// ```
    /// use nccl_channel::{Communicator, ReduceOp};
    /// # let doc_support::OneRank { ctx, comm, stream, .. } = doc_support::one_rank()?;
    /// let mut grads = comm.symmetric::<f32>(4096)?;
    /// grads.fill(0.5)?;
    /// comm.all_reduce_in_place(&mut grads, ReduceOp::Sum, &stream)?;
    /// // Views of it are in the window too: a bucket at the same offset on every rank.
    /// comm.all_reduce_in_place(&mut grads.slice_mut(1024..2048)?, ReduceOp::Sum, &stream)?;
    /// # stream.synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "ncclMemAlloc")]
    #[doc(alias = "ncclCommWindowRegister")]
    pub fn symmetric<T: NcclType>(&self, len: usize) -> Result<SymmetricBuffer<'_, T>> {
        let mut all = Communicator::symmetric_all(&[self], len)?;
        Ok(all.remove(0))
    }

    /// [`symmetric`](Self::symmetric) for every rank this thread drives (`ranks[i]` gets
    /// the i-th buffer): the exchanges and the window registrations of all of them in
    /// one group each.
    #[doc(alias = "ncclMemAlloc")]
    #[doc(alias = "ncclCommWindowRegister")]
    pub fn symmetric_all<'c, T: NcclType>(
        ranks: &[&'c Communicator],
        len: usize,
    ) -> Result<Vec<SymmetricBuffer<'c, T>>> {
        const WHAT: &str = "Communicator::symmetric";
        let Some(first) = ranks.first() else {
            return Ok(Vec::new());
        };
        // Local checks every rank makes alike (the same NCCL, the same thread's group).
        for c in ranks {
            c.handle()?;
            c.shared().suspend.refuse(WHAT)?;
        }
        optional!(first.nccl(), ncclCommWindowRegister)?;
        optional!(first.nccl(), ncclCommWindowDeregister)?;
        optional!(first.nccl(), ncclMemAlloc)?;
        if cuda_hal::DeferScope::is_open() {
            return Err(Error::InvalidArgument {
                what: WHAT,
                problem: "called inside an open group: every rank allocates and registers \
                          its part at once, which a group would defer to its end"
                    .into(),
            });
        }
        // The exchanges wait for their all-gathers on the host, which a strict capture of
        // this thread forbids (the driver would refuse the wait and spoil the capture).
        if Stream::non_blocking(first.context())?.host_waits_forbidden() {
            return Err(cuda_hal::Error::Capturing {
                what: "Communicator::symmetric (every rank allocates at once, waiting on the \
                       host; allocate before capturing)",
            }
            .into());
        }
        // Allocated first, so that a rank that cannot allocate says so in the exchange
        // instead of leaving the others waiting in the window's registration.
        let bytes = len.checked_mul(size_of::<T>());
        let mut allocated = Vec::with_capacity(ranks.len());
        for c in ranks {
            allocated.push(match bytes {
                Some(0) => Ok(None),
                Some(_) => c.alloc_nccl::<T>(len).map(Some),
                None => Err(Error::InvalidArgument {
                    what: WHAT,
                    problem: format!("{len} elements of {} overflow the address space", T::NAME),
                }),
            });
        }
        let sent: Vec<(&Communicator, u64)> = ranks
            .iter()
            .zip(&allocated)
            .map(|(c, a)| {
                let v = match a {
                    Ok(_) => bytes.map_or(FAILED, |b| b as u64),
                    Err(_) => FAILED,
                };
                (*c, v)
            })
            .collect();
        let seen = values_of(WHAT, Topic::SymmetricSize, &sent)?;
        let mut bufs = Vec::with_capacity(ranks.len());
        for (a, values) in allocated.into_iter().zip(&seen) {
            let buf = a?;
            sizes_agree(values)?;
            bufs.push(buf.ok_or_else(|| Error::InvalidArgument {
                what: WHAT,
                problem: "the buffer is empty: a window needs at least one element".into(),
            })?);
        }
        let targets: Vec<(&Communicator, &DeviceBuffer<T>)> =
            ranks.iter().copied().zip(&bufs).collect();
        let windows = Communicator::register_windows(&targets, WindowFlags::COLL_SYMMETRIC)?;
        let active: Vec<(&Communicator, u64)> = ranks
            .iter()
            .zip(&windows)
            .map(|(c, w)| (*c, u64::from(w.is_active())))
            .collect();
        let seen = values_of(WHAT, Topic::SymmetricWindow, &active)?;
        if let Some(rank) = seen.iter().find_map(|v| v.iter().position(|&a| a == 0)) {
            return Err(Error::Unsupported {
                feature: "symmetric memory",
                needed: "2.27 with windows enabled on every rank".into(),
                found: format!(
                    "a version whose rank {} made no window (NCCL_WIN_ENABLE=0, or no \
                     symmetric memory support on its machine)",
                    rank
                ),
            });
        }
        Ok(bufs
            .into_iter()
            .zip(windows)
            .map(|(buf, window)| SymmetricBuffer {
                buf,
                window: window.into_shared(),
                _comm: PhantomData,
            })
            .collect())
    }
}

/// `Ok` when every rank allocated the same bytes (`values`, in rank order); else what
/// differs, for every rank alike.
fn sizes_agree(values: &[u64]) -> Result<()> {
    let problem = if let Some(rank) = values.iter().position(|&v| v == FAILED) {
        format!("rank {rank} could not allocate its part")
    } else if values.windows(2).any(|w| w[0] != w[1]) {
        let sizes: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(r, v)| format!("rank {r} {v} bytes"))
            .collect();
        format!("the ranks ask different sizes: {}", sizes.join(", "))
    } else {
        return Ok(());
    };
    Err(Error::Disagreement {
        what: "Communicator::symmetric",
        topic: Topic::SymmetricSize.name(),
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_agree_only_when_every_rank_allocated_the_same() {
        assert!(sizes_agree(&[4096]).is_ok());
        assert!(sizes_agree(&[4096, 4096, 4096]).is_ok());
        let problem = |v: &[u64]| match sizes_agree(v) {
            Err(Error::Disagreement { problem, .. }) => problem,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            problem(&[4096, 8192]),
            "the ranks ask different sizes: rank 0 4096 bytes, rank 1 8192 bytes"
        );
        assert_eq!(
            problem(&[4096, 4096, 0]),
            "the ranks ask different sizes: rank 0 4096 bytes, rank 1 4096 bytes, rank 2 0 bytes"
        );
        assert_eq!(
            problem(&[4096, FAILED, 8192]),
            "rank 1 could not allocate its part"
        );
    }
}
