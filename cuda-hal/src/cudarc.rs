//! cudarc's contexts, streams and memory, used by this crate and nccl-channel without a
//! copy (feature `cudarc`). Memory needs no `unsafe` in the caller's code; enqueueing
//! this crate's work on a cudarc stream ([`Stream::from_cudarc`]) needs one promise about
//! cudarc's captures.
//!
//! Two ways to hand over memory, both ordering each crate's work after the other's:
//!
//! * **Moved in** ([`DeviceBuffer::from_cudarc`], back with
//!   [`DeviceBuffer::into_cudarc`]): the buffer owns the `CudaSlice`, so the whole memory
//!   model holds: groups, captures, frees while work is pending. The slice's stream is
//!   the buffer's home stream: the first use on another stream waits for cudarc's work on
//!   it (and for the slice's pending events), and the release, or the way back out, waits
//!   on the host for every other stream that used the memory (cudarc may capture its own
//!   stream at any moment, so nothing the free depends on is enqueued there); cudarc then
//!   frees, or goes on, in its order.
//! * **Borrowed** ([`Borrowed`], [`BorrowedMut`]): a slice or view lent for immediate
//!   work. Each use waits for cudarc's pending work, then records cudarc's read (or
//!   write) event after this crate's work and makes the slice's stream wait for it, so
//!   cudarc's next use and its free come after. Work that would outlive the borrow (in
//!   an NCCL group, in a capture) is refused with [`Error::Deferred`]: move the slice in
//!   for that.
//!
//! cudarc may begin capturing its stream on another thread at any moment, also in the
//! middle of a call of this crate. So no ordering after cudarc's stream trusts a question
//! asked before it: it goes through a private stream of this crate, and the driver is asked
//! *after* the wait whether that stream joined a capture. If it did, the use is refused as
//! if the capture had begun before the call ([`Error::Deferred`] for a loan,
//! [`Error::Capturing`] for memory moved in), the private stream is joined back into
//! cudarc's capture (which ends cleanly) and kept by its graph, and the stream the work was
//! for has joined nothing, so none of this crate's work lands in cudarc's graph.
//!
//! Both crates must drive the same driver: the adapters check that cudarc's context is
//! known to this crate's [`Cuda`] (the same `libcuda`, or the same drop-in simulator);
//! an in-process simulated driver is refused with [`Error::ForeignDriver`].
//!
//! cudarc's CUDA version is chosen by its own feature (`cuda-12080`, …) in the
//! dependency on cudarc that a project using this has anyway.

use std::marker::PhantomData;
use std::sync::Arc;

use ::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use cuda_sys::{CUdeviceptr, CUevent};

use crate::relay::Relay;
use crate::{Context, Cuda, DeviceBuffer, DeviceRepr, DeviceSlice, Error, Event, Result, Stream};

impl Context {
    /// cudarc's context (primary, non-primary or green), kept alive by this value and
    /// everything made in it.
    ///
    /// [`Error::ForeignDriver`] when `cuda` does not know the context (another driver
    /// library than cudarc's, or an in-process simulated one).
    pub fn from_cudarc(cuda: &Cuda, ctx: &Arc<CudaContext>) -> Result<Context> {
        let foreign = Err(Error::ForeignDriver {
            what: "Context::from_cudarc",
        });
        if !same_driver(cuda) {
            return foreign;
        }
        let raw = ctx.cu_ctx().cast();
        let mut dev = -1;
        // SAFETY: pushes a handle of this very driver that cudarc keeps alive (we hold
        // its `Arc`), and pops it at once.
        let pushed = unsafe { (cuda.fns().cuCtxPushCurrent)(raw) };
        if pushed.0 == 0 {
            // SAFETY: valid out-pointers; the pushed context is current.
            unsafe {
                let _ = (cuda.fns().cuCtxGetDevice)(&mut dev);
                let mut popped = std::ptr::null_mut();
                let _ = (cuda.fns().cuCtxPopCurrent)(&mut popped);
            }
        }
        if pushed.0 != 0 || dev != ctx.cu_device() {
            return foreign;
        }
        let device = cuda.device(ctx.ordinal())?;
        // SAFETY: a context of `device` (checked just above), which the `Arc` keeps alive.
        Ok(unsafe { Context::from_raw(&device, raw, ctx.clone()) })
    }
}

/// Whether cudarc's driver library is the one `cuda`'s table was resolved from: the two
/// functions lie in one loaded object. (Handles cannot tell: two simulators, or two
/// drivers, may well number their contexts alike.)
fn same_driver(cuda: &Cuda) -> bool {
    type Init = unsafe extern "C" fn(u32) -> u32;
    // SAFETY: cudarc opened its driver library already (a context of it exists), so this
    // returns it; `cuInit` has this signature, and the symbol is only compared.
    let theirs = unsafe { ::cudarc::driver::sys::culib().get::<Init>(b"cuInit") };
    let Ok(theirs) = theirs else { return false };
    let (theirs, ours) = (
        *theirs as *const std::ffi::c_void,
        cuda.fns().cuInit as *const std::ffi::c_void,
    );
    let base = |f: *const std::ffi::c_void| {
        // SAFETY: a zeroed `Dl_info` is a valid out-value; `dladdr` only reads the address.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let found = unsafe { libc::dladdr(f, &mut info) };
        (found != 0).then_some(info.dli_fbase)
    };
    matches!((base(theirs), base(ours)), (Some(a), Some(b)) if a == b && !a.is_null())
}

impl Stream {
    /// cudarc's stream of `ctx`'s context, kept alive by the returned value (and by every
    /// buffer whose use log holds it), to enqueue this crate's work on. A capture cudarc
    /// begins on it is seen: work enqueued meanwhile keeps what it uses alive (see
    /// [`Stream::from_owner`]).
    ///
    /// # Safety
    /// cudarc does not begin or end a capture of `stream` (`CudaStream::begin_capture`,
    /// `end_capture`) on another thread while work is being enqueued on the returned
    /// value: work enqueued just as a capture begins or ends is recorded into cudarc's
    /// graph without what it uses being held, and that graph may run it after the memory
    /// is freed. Nothing in cudarc's types prevents it, and no question asked of the
    /// driver after the work is enqueued can tell (the capture may begin and end between
    /// the two), so the promise is the caller's, as for any two libraries sharing a stream.
    /// Orderings are not part of it: when the returned stream is ordered after cudarc's
    /// memory (moved in with [`DeviceBuffer::from_cudarc`] or lent with [`Borrowed`]),
    /// a capture cudarc begins of *that memory's* stream at that moment is found after the
    /// fact and the use refused, never joined.
    ///
    /// ```no_run
    /// # #[cfg(feature = "cudarc")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use cuda_hal::{Context, Cuda, DeviceBuffer, Stream};
    /// use cudarc::driver::CudaContext;
    ///
    /// let cuda = Cuda::load()?;
    /// let theirs = CudaContext::new(0)?;
    /// let ctx = Context::from_cudarc(&cuda, &theirs)?;
    /// let their_stream = theirs.new_stream()?;
    /// // SAFETY: this program never captures `their_stream` through cudarc.
    /// let stream = unsafe { Stream::from_cudarc(&ctx, &their_stream)? };
    /// let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4)?;
    /// buf.fill_async(1.0, &stream)?;
    /// stream.synchronize()?;
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "cudarc"))]
    /// # fn main() {}
    /// ```
    pub unsafe fn from_cudarc(ctx: &Context, stream: &Arc<CudaStream>) -> Result<Stream> {
        same_context(ctx, stream.context(), "Stream::from_cudarc")?;
        // SAFETY: a stream of `ctx` (checked), which the `Arc` keeps alive; the caller
        // promises what `from_owner` asks of captures.
        Ok(unsafe { Stream::from_owner(ctx, stream.cu_stream().cast(), stream.clone()) })
    }

    /// cudarc's stream as the home of memory moved in or lent: this crate enqueues there
    /// only orderings (event records and waits), never work that uses the memory, so a
    /// capture cudarc begins there on another thread can at most record an ordering of
    /// contents; what frees depend on is waited for on the host
    /// (the release of memory with a foreign home stream) or recorded on
    /// this crate's streams (cudarc's events, which its free waits for).
    fn cudarc_home(ctx: &Context, stream: &Arc<CudaStream>) -> Result<Stream> {
        same_context(ctx, stream.context(), "cudarc memory's stream")?;
        // SAFETY: a stream of `ctx` (checked), which the `Arc` keeps alive. `from_owner`'s
        // capture promise covers work enqueued through the returned value; this crate
        // enqueues none there but orderings (above), whose capture frees nothing early.
        Ok(unsafe { Stream::from_owner(ctx, stream.cu_stream().cast(), stream.clone()) })
    }
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Moves cudarc's slice in, without a copy (see the [module](crate::cudarc) docs).
    /// `ctx` is cudarc's context adopted with [`Context::from_cudarc`].
    pub fn from_cudarc(ctx: &Context, mut slice: CudaSlice<T>) -> Result<Self> {
        same_context(ctx, slice.context(), "DeviceBuffer::from_cudarc")?;
        let theirs = slice.stream().clone();
        let home = Stream::cudarc_home(ctx, &theirs)?;
        // cudarc's own ordering: its stream waits for the slice's pending reads and writes
        // on other streams (when cudarc tracks them), so the home stream covers them all.
        let (ptr, record) = slice.device_ptr_mut(&theirs);
        drop(record);
        let len = slice.len();
        // SAFETY: cudarc's allocation of `len` elements of `T` in `ctx`, owned by the
        // slice moved in (which frees it in order on its stream, `home`), and used by
        // nothing else while this buffer has it; its pending work is on `home` now.
        Ok(unsafe { Self::from_owner_on(&home, ptr, len, slice) })
    }

    /// Gives cudarc's slice back once the host has waited for every other stream this
    /// crate used it on (cudarc may be capturing its own stream, where a wait would be
    /// recorded instead of run); its write event is recorded on the slice's stream, so
    /// cudarc's other streams wait for cudarc's own work there. Returns the buffer unchanged when it was not moved in
    /// from cudarc, while a graph or open group still holds it, or while a stream that
    /// used it is captured.
    #[allow(clippy::result_large_err)]
    pub fn into_cudarc(self) -> std::result::Result<CudaSlice<T>, Self> {
        let mut slice = self.into_owner::<CudaSlice<T>>()?;
        let theirs = slice.stream().clone();
        drop(slice.device_ptr_mut(&theirs));
        Ok(slice)
    }
}

/// cudarc memory lent to this crate for immediate work, read-only: a `CudaSlice`, a
/// `CudaView` or a `CudaViewMut` (see the [module](crate::cudarc) docs).
pub struct Borrowed<'a, T: DeviceRepr> {
    lent: Lent,
    _borrow: PhantomData<&'a [T]>,
}

/// cudarc memory lent to this crate for immediate work, writable: a `CudaSlice` or a
/// `CudaViewMut` (see the [module](crate::cudarc) docs).
pub struct BorrowedMut<'a, T: DeviceRepr> {
    lent: Lent,
    _borrow: PhantomData<&'a mut [T]>,
}

/// What both kinds of loan know.
struct Lent {
    ctx: Context,
    /// The slice's stream (cudarc's home for it).
    home: Stream,
    ptr: CUdeviceptr,
    len: usize,
    /// cudarc's event to record after this crate's work: the slice's read event for a
    /// read, its write event for a write (`None` when cudarc tracks no events).
    event: Option<CUevent>,
    what: &'static str,
    /// What other streams wait for the home stream through (see `used_on`).
    relay: Relay,
}

// SAFETY: the raw event is cudarc's, valid while the borrow lasts, and events may be
// recorded from any thread; the rest is `Send + Sync`.
unsafe impl Send for Lent {}
// SAFETY: as above; nothing is mutated through `&Lent` but by driver calls.
unsafe impl Sync for Lent {}

static_assertions::assert_impl_all!(Borrowed<'static, f32>: Send, Sync);
static_assertions::assert_impl_all!(BorrowedMut<'static, f32>: Send, Sync);

fn event_of(record: &SyncOnDrop<'_>) -> Option<CUevent> {
    match record {
        SyncOnDrop::Record(Some((event, _))) => Some(event.cu_event().cast()),
        _ => None,
    }
}

impl<'a, T: DeviceRepr> Borrowed<'a, T> {
    /// Lends `slice` (of `ctx`, adopted with [`Context::from_cudarc`]). Its stream waits
    /// for cudarc's pending writes now; each use waits for its stream.
    pub fn new<S: DevicePtr<T> + ?Sized>(ctx: &Context, slice: &'a S) -> Result<Self> {
        let theirs = slice.stream().clone();
        same_context(ctx, theirs.context(), "cudarc::Borrowed::new")?;
        let (ptr, record) = slice.device_ptr(&theirs);
        let event = event_of(&record);
        drop(record);
        Ok(Borrowed {
            lent: Lent {
                ctx: ctx.clone(),
                home: Stream::cudarc_home(ctx, &theirs)?,
                ptr,
                len: slice.len(),
                event,
                what: "borrowed cudarc memory",
                relay: Relay::new(),
            },
            _borrow: PhantomData,
        })
    }
}

impl<'a, T: DeviceRepr> BorrowedMut<'a, T> {
    /// Lends `slice` (of `ctx`, adopted with [`Context::from_cudarc`]) for writing. Its
    /// stream waits for cudarc's pending reads and writes now; each use waits for its
    /// stream.
    pub fn new<S: DevicePtrMut<T> + ?Sized>(ctx: &Context, slice: &'a mut S) -> Result<Self> {
        let theirs = slice.stream().clone();
        same_context(ctx, theirs.context(), "cudarc::BorrowedMut::new")?;
        let len = slice.len();
        let (ptr, record) = slice.device_ptr_mut(&theirs);
        let event = event_of(&record);
        drop(record);
        Ok(BorrowedMut {
            lent: Lent {
                ctx: ctx.clone(),
                home: Stream::cudarc_home(ctx, &theirs)?,
                ptr,
                len,
                event,
                what: "borrowed cudarc memory",
                relay: Relay::new(),
            },
            _borrow: PhantomData,
        })
    }
}

impl Lent {
    /// Before work on `stream`: refused if it could outlive the borrow (a group, a capture
    /// of `stream` or of the home stream, which an event recorded there would drag
    /// `stream` into); then `stream` waits for the home stream.
    ///
    /// cudarc may begin capturing the home stream on another thread at any moment, so the
    /// question asked of it first only refuses early what is already visible: the
    /// ordering itself goes through a private relay that is asked *after* it waited
    /// whether it joined a capture ([`Relay::order`]). If it did, the call is refused with
    /// the same [`Error::Deferred`] as a capture seen before, and `stream` has joined
    /// nothing. Refused rather than held: borrowed memory cannot be kept alive for a
    /// graph, and the call's other memory was noted already.
    fn used_on(&self, stream: &Stream) -> Result<()> {
        let captured = Error::Deferred {
            what: self.what,
            why: "the stream is being captured",
        };
        stream.expect_immediate(self.what)?;
        self.home.expect_immediate(self.what)?;
        if stream.as_raw() != self.home.as_raw() {
            self.relay.order(&self.home, stream, captured)?;
        }
        Ok(())
    }

    /// After the enqueueing call, while the borrow still lasts: cudarc's event is recorded
    /// after this crate's work, and the home stream waits for it, so cudarc's next use
    /// and its free come after (failing both, the host waits for `stream`).
    fn enqueued_on(&self, stream: &Stream) {
        let cuda = self.ctx.cuda();
        let mut ok = true;
        if let Some(e) = self.event {
            // SAFETY: cudarc's event, alive while the slice is borrowed, which it is for
            // as long as `self` is (this runs from the enqueueing call, which borrows it);
            // `stream` is a live stream of the event's context.
            let rc = unsafe { (cuda.fns().cuEventRecord)(e, stream.as_raw()) };
            ok &= rc.0 == 0;
        }
        if stream.as_raw() != self.home.as_raw() {
            ok &= order(stream, &self.home).is_ok();
        }
        // Without cudarc's event, the home stream's wait is all that orders cudarc's free
        // after this work, and a capture cudarc begins on another thread could record it
        // instead of running it: the host waits.
        ok &= self.event.is_some();
        if !ok && stream.synchronize().is_err() {
            eprintln!(
                "cuda-hal: cudarc memory used on a failed stream: its next use in cudarc is not \
                 ordered after this crate's work"
            );
        }
    }
}

/// Makes `later` wait for the work enqueued so far on `earlier` (an event; failing that,
/// a host wait).
fn order(earlier: &Stream, later: &Stream) -> Result<()> {
    let ordered = Event::without_timing(earlier.context())
        .and_then(|e| e.record_unlocked(earlier).map(|()| e))
        .and_then(|e| later.wait_event_unlocked(&e));
    match ordered {
        Ok(()) => Ok(()),
        Err(_) => earlier.synchronize(),
    }
}

fn same_context(ctx: &Context, theirs: &Arc<CudaContext>, what: &'static str) -> Result<()> {
    if theirs.cu_ctx().cast() == ctx.as_raw() {
        return Ok(());
    }
    let found = i32::try_from(theirs.ordinal()).unwrap_or(i32::MAX);
    let expected = ctx.device().ordinal();
    if expected == found {
        return Err(Error::WrongContext {
            what,
            object: "cudarc memory or stream",
            device: found,
        });
    }
    Err(Error::WrongDevice {
        what,
        object: "cudarc memory or stream",
        expected,
        found,
    })
}

macro_rules! lent_slice {
    ($ty:ident) => {
        // SAFETY: cudarc's memory of `ctx`, `len` elements at `ptr`, borrowed for 'a so it
        // is neither freed nor written by cudarc meanwhile. Work enqueued after `used_on`
        // is enqueued for real by the call that asked (groups and captures, of the stream
        // or of the home stream, are refused), and `enqueued_on`, which that call makes
        // while the borrow lasts, makes cudarc's next use and its free wait for it. A
        // `used_on` without an enqueueing call enqueues nothing that could need ordering.
        unsafe impl<T: DeviceRepr> DeviceSlice for $ty<'_, T> {
            type Elem = T;
            fn device_ptr(&self) -> CUdeviceptr {
                self.lent.ptr
            }
            fn len(&self) -> usize {
                self.lent.len
            }
            fn context(&self) -> &Context {
                &self.lent.ctx
            }
            fn used_on(&self, stream: &Stream) -> Result<()> {
                self.lent.used_on(stream)
            }
            fn enqueued_on(&self, stream: &Stream) {
                self.lent.enqueued_on(stream)
            }
            /// Synchronous calls run on the legacy default stream, which does not wait
            /// for cudarc's (non-blocking) streams: wait for the home stream here.
            fn used_synchronously(&self) -> Result<()> {
                self.lent.home.synchronize()
            }
        }

        impl<T: DeviceRepr> std::fmt::Debug for $ty<'_, T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("device", &self.lent.ctx.device().ordinal())
                    .field("ptr", &format_args!("{:#x}", self.lent.ptr))
                    .field("len", &self.lent.len)
                    .finish()
            }
        }
    };
}

lent_slice!(Borrowed);
lent_slice!(BorrowedMut);

// SAFETY: lent through `&mut`: writable memory (cudarc allocates nothing read-only), with
// no other writer while the borrow lasts.
unsafe impl<T: DeviceRepr> crate::DeviceSliceMut for BorrowedMut<'_, T> {}
