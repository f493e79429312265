//! [`DeviceBuffer`]: typed device memory, freed only when no enqueued, captured or grouped
//! work can still touch it, and before its context is released.

use std::any::Any;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::mem::size_of;
use std::ops::RangeBounds;
use std::sync::Arc;

use cuda_sys::CUdeviceptr;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::hold::core::{CaptureLog, Dependency, KeepAlive};
use crate::hold::queued;
use crate::hold::use_log::UseLog;
use crate::relay::Relay;
use crate::view::{Chunks, ChunksMut};
use crate::{
    Context, Device, DeviceRepr, DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut, Error,
    Event, Result, Stream,
};

/// One device allocation, shared by the buffer that owns it and by the graphs and open
/// groups whose work uses it. The last owner frees it, ordered after every stream that
/// used it (see the crate's Safety section).
pub(crate) struct Allocation {
    ctx: Context,
    ptr: CUdeviceptr,
    /// Size in bytes (for the report when the memory has to be leaked).
    bytes: usize,
    /// The stream the memory's owner works on: stream-ordered memory's allocation stream,
    /// or an adopted owner's stream (a cudarc slice's). Its first use on another stream
    /// waits for it, and the release is ordered on it after every other stream's work.
    home: Option<Stream>,
    /// Home-stream memory is usable by other streams and by synchronous calls only after
    /// the home stream reached it; set once the host has waited for that.
    ready: AtomicBool,
    uses: UseLog,
    release: Release,
}

/// How the memory goes back.
pub(crate) enum Release {
    /// `cuMemFree`, or `cuMemFreeAsync` on the home stream.
    Driver,
    /// A foreign allocator's release ([`DeviceBuffer::from_raw_with`]), called once.
    With(Box<dyn FnOnce(CUdeviceptr) + Send + Sync>),
    /// Dropping the owner releases the memory ([`DeviceBuffer::from_owner`]).
    Owner(Box<dyn Any + Send + Sync>),
}

impl Dependency for Allocation {
    fn used_on(&self, stream: &Stream) -> Result<()> {
        self.note(stream)
    }
}

impl Allocation {
    /// Notes work about to be enqueued on `stream`. Stream-ordered memory first used on
    /// another stream than its own makes that stream wait for the allocation (the pool
    /// may hand out memory that earlier work on the allocation stream still uses).
    fn note(&self, stream: &Stream) -> Result<()> {
        self.uses.note(stream, || match &self.home {
            Some(own) if own.key() != stream.key() && !self.ready.load(Ordering::Acquire) => {
                Self::order_after(stream, own)
            }
            _ => Ok(()),
        })
    }

    /// Before synchronous (legacy-stream) work on stream-ordered memory: wait, once, for
    /// the allocation stream to reach the allocation (refused while it is captured: the
    /// wait would spoil the capture).
    fn ready_for_host(&self) -> Result<()> {
        if let Some(own) = &self.home
            && !self.ready.load(Ordering::Acquire)
        {
            let _order = own.try_enqueue_lock().ok_or(Error::Capturing {
                what: "a synchronous call on stream-ordered memory",
            })?;
            own.refuse_host_wait("a synchronous call on stream-ordered memory")?;
            own.synchronize()?;
            self.ready.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Makes `later` wait for the work enqueued so far on `earlier`: an event recorded
    /// there; failing that, or while `later` is captured, a host wait. The caller holds
    /// `later`'s order lock; `earlier`'s is taken here without blocking, and `earlier` must
    /// not be captured (the event would land in its graph): that is refused.
    ///
    /// Another library's stream (cudarc's, for memory moved in) may be captured by that
    /// library on another thread at any moment, between any question and the ordering:
    /// its ordering goes through a private relay asked *after* it waited whether it joined
    /// a capture ([`Relay::order`]), and is refused ([`Error::Capturing`], as for a capture
    /// seen before) if it did; `later` then joined nothing.
    fn order_after(later: &Stream, earlier: &Stream) -> Result<()> {
        let what = "ordering stream-ordered memory";
        let _order = earlier
            .try_enqueue_lock()
            .ok_or(Error::Capturing { what })?;
        earlier.refuse_capture(what)?;
        // Captured behind this crate's back (another library's capture of a foreign stream,
        // or of another wrapper of it): an event recorded there lands in that graph, and
        // `later` waiting for it would join that capture. Asked first only to refuse early
        // what is visible already: for a foreign stream, the relay decides.
        if earlier.is_capturing().unwrap_or(false) {
            return Err(Error::Capturing { what });
        }
        if earlier.inner.foreign && later.capture_log().is_none() {
            return Relay::new().order(earlier, later, Error::Capturing { what });
        }
        if later.capture_log().is_some() {
            // An outside event cannot join the capture: wait on the host instead (the
            // allocation is then complete for every later launch too), unless the capture
            // forbids this thread host waits: the wait would fail and spoil the capture.
            if Stream::strict_capture_here(later.context().cuda()).is_some() {
                return Err(Error::PendingInCapture {
                    what: "the first use of this memory on another stream than its home stream",
                });
            }
            return earlier.synchronize();
        }
        Self::order_locked(later, earlier)
    }

    /// As [`order_after`](Self::order_after), with both order locks held and neither
    /// stream captured (the free's ordering, from `drop`).
    fn order_locked(later: &Stream, earlier: &Stream) -> Result<()> {
        let ordered = Event::without_timing(earlier.context())
            .and_then(|e| e.record_unlocked(earlier).map(|_| e))
            .and_then(|e| later.wait_event_unlocked(&e));
        match ordered {
            Ok(()) => Ok(()),
            Err(_) => earlier.synchronize(),
        }
    }
}

impl Allocation {
    /// Makes the memory idle for its release: the home stream ordered after every other
    /// stream that used it (events; failing that, a host wait), or, without a home stream
    /// or with another library's, a host wait for each. `Err` names what failed: then nothing may be released. The
    /// caller holds the order locks of `used` and the home stream, and no capture records
    /// them.
    fn quiesce(&self, used: &[Stream]) -> Result<()> {
        // A stream captured behind this crate's back (by another library, or through
        // another wrapper of it) records instead of running: an event recorded there lands
        // in its graph, the home stream waiting for it joins that capture (and the release
        // with it), and a host wait spoils it. Nothing proves the memory idle: refuse.
        if used.iter().any(|s| s.is_capturing().unwrap_or(false)) {
            return Err(Error::Capturing {
                what: "releasing memory used on a stream being captured",
            });
        }
        match &self.home {
            // Another library's stream (cudarc's) may be captured by that library on
            // another thread at any moment: waits enqueued there could be recorded instead
            // of run, and its free would then not wait. The host waits instead; the free
            // follows the home stream's own work in its order.
            Some(home) if home.inner.foreign => {
                for s in used.iter().filter(|s| s.key() != home.key()) {
                    s.synchronize()?;
                }
            }
            Some(home) => {
                for s in used.iter().filter(|s| s.key() != home.key()) {
                    Self::order_locked(home, s)?;
                }
            }
            None => {
                for s in used {
                    s.synchronize()?;
                }
            }
        }
        Ok(())
    }

    /// The order locks of `used` and the home stream, taken in one order (by key) without
    /// blocking, when a home stream is involved (its release enqueues there); `None`
    /// when one cannot be had.
    fn lock_streams<'s>(&self, used: &'s [Stream]) -> Option<Vec<crate::EnqueueLock<'s>>>
    where
        Self: 's,
    {
        let mut locks = Vec::new();
        if self.home.is_none() {
            return Some(locks);
        }
        let mut involved: Vec<&'s Stream> = used.iter().collect();
        involved.sort_by_key(|s| s.key());
        involved.dedup_by_key(|s| s.key());
        for s in involved {
            locks.push(s.try_enqueue_lock_now()?);
        }
        Some(locks)
    }

    /// Leaks the memory whole, and says why on stderr: work may still use it (a stream
    /// destroyed behind this crate's back, a lost context), so it is never released, and
    /// neither is anything its release or that work needs (its context, the streams that
    /// used it, its releaser: `release` is already out of the struct and never dropped).
    fn leak(&self, used: Vec<Stream>, why: &dyn std::fmt::Display) {
        eprintln!(
            "cuda-hal: leaking {} bytes of device memory at {:#x} on device {}: {why}; work \
             enqueued on it may still run, so it is never freed (nor its context)",
            self.bytes,
            self.ptr,
            self.ctx.device().ordinal()
        );
        std::mem::forget(used);
        std::mem::forget(self.ctx.clone());
    }

    /// The allocation as a new value that owns everything this one did (this one is left
    /// empty, `ptr` 0): `uses` are the streams that used it, without the home stream.
    fn moved(&mut self, uses: Vec<Stream>, release: Release) -> Allocation {
        Allocation {
            ctx: self.ctx.clone(),
            ptr: std::mem::replace(&mut self.ptr, 0),
            bytes: self.bytes,
            home: self.home.take(),
            ready: AtomicBool::new(self.ready.load(Ordering::Acquire)),
            uses: UseLog::with(uses),
            release,
        }
    }
}

/// Whether a wait was refused because a capture forbids it (this crate's refusal, or the
/// driver's stream-capture errors), rather than because the work failed.
fn refused_for_a_capture(e: &Error) -> bool {
    match e {
        Error::Capturing { .. } => true,
        Error::Driver { code, .. } => (900..=908).contains(&code.0),
        _ => false,
    }
}

/// Hands memory to the capture of `log`, whose graph then owns it. A capture that ended
/// since it was found (its graph took its holds already) gets nothing: the memory is
/// released as if no capture had recorded it, by `moved`'s own drop.
fn give_to_capture(log: &CaptureLog, moved: Allocation) {
    drop(log.keep(KeepAlive::new(Arc::new(moved))));
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // Out of the struct, and released only on the path that proves the memory idle:
        // on every other path it is leaked (an owner, or a closure owning the memory,
        // dropped here would free it under running work).
        let release = ManuallyDrop::new(std::mem::replace(&mut self.release, Release::Driver));
        if self.ptr == 0 {
            drop(ManuallyDrop::into_inner(release));
            return;
        }
        // Releases that had to wait may be able to finish now.
        queued::retry();
        let generation = queued::generation();
        let mut used = self.uses.take();
        let uses_alone = used.len();
        if let Some(home) = &self.home {
            used.push(home.held());
        }
        // Releases on a home stream enqueue on the streams involved: hold their order
        // locks, without blocking (the caller may hold one already). One locked for a
        // capture beginning, ending or being joined: the release waits in the queue, whole,
        // and finishes when that lock is let go.
        let Some(locks) = self.lock_streams(&used) else {
            used.truncate(uses_alone);
            let moved = self.moved(used, ManuallyDrop::into_inner(release));
            queued::queue(Box::new(moved), generation);
            return;
        };
        // A wait, an event or the free itself enqueued now on a stream being captured would
        // land in the user's graph (a free node frees again at every launch): the capture's
        // graph owns the memory instead, and frees it when it goes.
        // So does a host wait that a strict capture forbids this thread: that capture's
        // graph owns the memory then.
        let recording = used
            .iter()
            .find_map(Stream::capture_log)
            .or_else(|| Stream::strict_capture_here(self.ctx.cuda()));
        if let Some(log) = recording {
            let uses = used[..uses_alone].iter().map(Stream::held).collect();
            let moved = self.moved(uses, ManuallyDrop::into_inner(release));
            drop(locks);
            return give_to_capture(&log, moved);
        }
        let _g = match self.ctx.bind() {
            Ok(g) => g,
            Err(e) => {
                drop(locks);
                return self.leak(
                    used,
                    &format_args!("making its context current failed: {e}"),
                );
            }
        };
        // Any failure below leaks the memory: never free what work may still touch. But a
        // wait refused because a strict capture began meanwhile (a global one, on another
        // thread; refused by this crate, or by the driver, which then spoils it) is no
        // failure of the work: that capture's graph owns the memory, as if it had been
        // found above, or, once the capture is over, the wait is asked again.
        let mut tries = 0;
        while let Err(e) = self.quiesce(&used) {
            tries += 1;
            if !refused_for_a_capture(&e) || tries > 3 {
                drop(locks);
                return self.leak(
                    used,
                    &format_args!("waiting for the work of the streams that used it failed: {e}"),
                );
            }
            let late = used
                .iter()
                .find_map(Stream::capture_log)
                .or_else(|| Stream::strict_capture_here(self.ctx.cuda()));
            if let Some(log) = late {
                drop(_g);
                let uses = used[..uses_alone].iter().map(Stream::held).collect();
                let moved = self.moved(uses, ManuallyDrop::into_inner(release));
                drop(locks);
                return give_to_capture(&log, moved);
            }
        }
        let cuda = self.ctx.cuda();
        match (ManuallyDrop::into_inner(release), &self.home) {
            (Release::Driver, Some(home)) => {
                // SAFETY: allocated by cuMemAllocAsync on `home` and freed once, after the
                // work of every stream that used it (ordered just above); no capture
                // records `home` or those streams (checked above, under their order locks).
                let _ = unsafe { (cuda.fns().cuMemFreeAsync)(self.ptr, home.as_raw()) };
            }
            (Release::Driver, None) => {
                // SAFETY: allocated by cuMemAlloc (or handed over as such) and freed once,
                // after the work of every stream that used it is done.
                let _ = unsafe { (cuda.fns().cuMemFree)(self.ptr) };
            }
            // The releaser's contract (`from_raw_with`): called once, with the context
            // current, after the work of every stream that used it.
            (Release::With(release), _) => release(self.ptr),
            // The owner's contract (`from_owner`, `from_owner_on`): dropping it frees the
            // memory, in order on the home stream (ordered after every use above) or at
            // once (every use is done).
            (Release::Owner(owner), _) => drop(owner),
        }
        drop(locks);
    }
}

/// `len` elements of `T` in device memory of one context.
///
/// Synchronous copies and fills are complete, for every stream, when they return (they
/// wait for the context's legacy default stream). A download sees the work of other
/// streams only once those are synchronised. The `*_on` copies are ordered on a stream and wait
/// for that stream before returning, so the host memory they read or write is never used
/// after the borrow ends; the `unsafe` `*_async` copies do not wait.
///
/// Work enqueued on a stream through this crate and the crates built on it (collectives,
/// async copies, graph launches) is noted with [`used_on`](Self::used_on): dropping the
/// buffer then frees the memory only after that work, and captured or grouped work keeps
/// the memory itself alive (see the crate's Safety section).
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, DeviceBuffer};
///
/// let (cuda, world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let (c0, c1) = (cuda.device(0)?.primary_context()?, cuda.device(1)?.primary_context()?);
/// let mut a = DeviceBuffer::from_slice(&c0, &[1u32, 2, 3, 4])?;
/// assert_eq!((a.len(), a.size_bytes(), a.device().ordinal()), (4, 16, 0));
/// a.copy_from_host(&[5, 6, 7, 8])?;
/// let mut b = DeviceBuffer::<u32>::alloc(&c1, 4)?;
/// b.copy_from(&a)?; // across devices: a peer copy
/// let mut back = [0; 4];
/// b.copy_to_host(&mut back)?;
/// assert_eq!(back, [5, 6, 7, 8]);
/// b.memset_bytes(0x01)?;
/// assert_eq!(b.to_vec()?, [0x0101_0101; 4]);
/// drop((a, b));
/// assert_eq!((world.used_memory(0), world.used_memory(1)), (0, 0));
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct DeviceBuffer<T: DeviceRepr> {
    alloc: Arc<Allocation>,
    /// A copy of `alloc.ptr`, read on every call.
    ptr: CUdeviceptr,
    len: usize,
    _t: PhantomData<T>,
}

static_assertions::assert_impl_all!(DeviceBuffer<f32>: Send, Sync, std::fmt::Debug);

impl<T: DeviceRepr> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.alloc.ctx.device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

fn bytes_of<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or(Error::SizeOverflow {
        count: len,
        size: size_of::<T>(),
    })
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Allocates `len` elements; the contents are whatever the memory held.
    #[doc(alias = "cuMemAlloc")]
    pub fn alloc(ctx: &Context, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            let _g = ctx.bind()?;
            // SAFETY: valid out-pointer; a context is current.
            unsafe { call!(ctx.cuda(), cuMemAlloc(&mut ptr, bytes)) }?;
        }
        Ok(Self::owning(ctx, ptr, len, None))
    }

    /// Allocates `len` elements in stream order on `stream` (freed on it too).
    ///
    /// Memory for work on that stream without a device-wide synchronisation; its use
    /// elsewhere is ordered after the allocation by the crate.
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::non_blocking(&ctx)?;
    /// let mut scratch = DeviceBuffer::<f32>::alloc_on(&stream, 256)?;
    /// scratch.fill_async(1.5, &stream)?;
    /// assert_eq!(scratch.to_vec()?[255], 1.5);
    /// drop(scratch); // cuMemFreeAsync on `stream`
    /// stream.synchronize()?;
    /// assert_eq!(world.used_memory(0), 0);
    /// assert!(world.violations().is_empty());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuMemAllocAsync")]
    pub fn alloc_on(stream: &Stream, len: usize) -> Result<Self> {
        let ctx = stream.context();
        let bytes = bytes_of::<T>(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            // A capture would make this a graph's allocation, valid only inside the graph.
            let _order = stream.enqueue_lock();
            stream.refuse_capture("alloc_on")?;
            let _g = ctx.bind()?;
            // SAFETY: valid out-pointer and stream, which no capture records.
            unsafe {
                call!(
                    ctx.cuda(),
                    cuMemAllocAsync(&mut ptr, bytes, stream.as_raw())
                )
            }?;
        }
        Ok(Self::owning(ctx, ptr, len, Some(stream.held())))
    }

    fn owning(ctx: &Context, ptr: CUdeviceptr, len: usize, home: Option<Stream>) -> Self {
        Self::owning_with(ctx, ptr, len, home, Release::Driver)
    }

    fn owning_with(
        ctx: &Context,
        ptr: CUdeviceptr,
        len: usize,
        home: Option<Stream>,
        release: Release,
    ) -> Self {
        // A new buffer is a chance to finish releases that had to wait.
        queued::retry();
        DeviceBuffer {
            alloc: Arc::new(Allocation {
                ctx: ctx.clone(),
                ptr,
                bytes: len.saturating_mul(size_of::<T>()),
                home,
                ready: AtomicBool::new(false),
                uses: UseLog::default(),
                release,
            }),
            ptr,
            len,
            _t: PhantomData,
        }
    }

    /// Takes `len` elements of device memory that `owner` keeps allocated (another
    /// crate's buffer, moved in whole): no copy, and no address to free by hand. The
    /// buffer drops `owner` once the work of every stream that used the memory is done
    /// and no graph or open group can launch work on it again (if that cannot be proven,
    /// the memory and `owner` are leaked, and stderr says so).
    /// [`into_owner`](Self::into_owner) gives `owner` back; nothing hands out the address
    /// alone, so no freed address can leak out.
    ///
    /// Owners that free in stream order on a stream of their own (cudarc's slices) are
    /// better adopted with [`from_owner_on`](Self::from_owner_on): their release is then
    /// ordered on the device instead of waited for on the host.
    ///
    /// # Safety
    /// `ptr` must be device memory of `ctx`, readable and writable from it, of at least
    /// `len * size_of::<T>()` bytes (anything with `len == 0`), that stays allocated while
    /// `owner` lives and that nothing but this buffer uses until `owner` is dropped or
    /// given back; work already enqueued on it must be complete (or be ordered before the
    /// buffer's first use by the caller).
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// /// Another crate's allocation: freed when it is dropped.
    /// struct Theirs(DeviceBuffer<u8>);
    /// let theirs = Theirs(DeviceBuffer::zeroed(&ctx, 16)?);
    /// let ptr = theirs.0.as_raw();
    /// // SAFETY: 16 bytes of `ctx`'s memory, allocated while `theirs` lives, used by
    /// // nothing else meanwhile.
    /// let mut buf = unsafe { DeviceBuffer::<u8>::from_owner(&ctx, ptr, 16, theirs) };
    /// buf.fill_async(7, &Stream::non_blocking(&ctx)?)?;
    /// let Ok(back) = buf.into_owner::<Theirs>() else { panic!("nothing else holds it") };
    /// assert_eq!(back.0.to_vec()?, [7; 16], "given back after the fill");
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub unsafe fn from_owner<O: Send + Sync + 'static>(
        ctx: &Context,
        ptr: CUdeviceptr,
        len: usize,
        owner: O,
    ) -> Self {
        Self::owning_with(ctx, ptr, len, None, Release::Owner(Box::new(owner)))
    }

    /// As [`from_owner`](Self::from_owner), for an owner whose work and release happen
    /// in order on `home` (a cudarc slice frees on its stream): the buffer's first use on
    /// another stream waits for `home`'s work so far, synchronous calls wait for `home`
    /// once, and the release (or [`into_owner`](Self::into_owner)) makes `home` wait, on
    /// the device, for the work of every other stream that used the memory. When `home`
    /// is another library's stream ([`Stream::from_owner`], [`Stream::from_raw`]), which
    /// that library may capture at any moment, the host waits for those streams instead.
    ///
    /// # Safety
    /// As for [`from_owner`](Self::from_owner), except that work already enqueued on the
    /// memory may be pending, if only on `home`; and dropping `owner` releases the memory
    /// in order on `home` (after the work enqueued there), or synchronously.
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let home = Stream::non_blocking(&ctx)?;
    /// // Another crate's stream-ordered allocation, with work pending on its stream.
    /// let mut theirs = DeviceBuffer::<u32>::alloc_on(&home, 4)?;
    /// theirs.fill_async(5, &home)?;
    /// let ptr = theirs.as_raw();
    /// // SAFETY: 4 `u32`s of `ctx`, allocated while `theirs` lives, which frees in order
    /// // on `home`; its pending work is on `home` only.
    /// let mut buf = unsafe { DeviceBuffer::<u32>::from_owner_on(&home, ptr, 4, theirs) };
    /// let other = Stream::non_blocking(&ctx)?;
    /// buf.slice_mut(..2)?.fill_async(6, &other)?; // waits for `home`'s fill first
    /// drop(buf); // `home` waits for `other`, then the owner frees on `home`
    /// home.synchronize()?;
    /// assert_eq!(world.used_memory(0), 0);
    /// assert!(world.violations().is_empty());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub unsafe fn from_owner_on<O: Send + Sync + 'static>(
        home: &Stream,
        ptr: CUdeviceptr,
        len: usize,
        owner: O,
    ) -> Self {
        let ctx = home.context();
        Self::owning_with(
            ctx,
            ptr,
            len,
            Some(home.held()),
            Release::Owner(Box::new(owner)),
        )
    }

    /// Gives back the owner that [`from_owner`](Self::from_owner) or
    /// [`from_owner_on`](Self::from_owner_on) took, once the memory is idle for it: the
    /// home stream ordered after every other stream's work (on the device), or, without
    /// one or with another library's home stream, that work waited for on the host. Returns the buffer unchanged when it has no owner of
    /// type `O`, while a graph or open group still uses the memory, while a stream that
    /// used it is being captured, or when the wait fails.
    #[allow(clippy::result_large_err)]
    pub fn into_owner<O: Send + Sync + 'static>(self) -> std::result::Result<O, Self> {
        let owns = matches!(&self.alloc.release, Release::Owner(o) if o.is::<O>());
        if !owns || Arc::strong_count(&self.alloc) != 1 {
            return Err(self);
        }
        let mut used = self.alloc.uses.streams();
        if let Some(home) = &self.alloc.home {
            used.push(home.held());
        }
        let idle = self.alloc.lock_streams(&used).is_some_and(|locks| {
            let ok = !used.iter().any(|s| s.capture_log().is_some())
                && self
                    .alloc
                    .ctx
                    .bind()
                    .is_ok_and(|_g| self.alloc.quiesce(&used).is_ok());
            drop(locks);
            ok
        });
        if !idle {
            return Err(self);
        }
        let (ptr, len) = (self.ptr, self.len);
        let mut alloc = match Arc::try_unwrap(self.alloc) {
            Ok(a) => a,
            Err(alloc) => {
                return Err(DeviceBuffer {
                    alloc,
                    ptr,
                    len,
                    _t: PhantomData,
                });
            }
        };
        // Defused: the allocation's drop releases nothing when its address is 0.
        alloc.ptr = 0;
        match std::mem::replace(&mut alloc.release, Release::Driver) {
            Release::Owner(o) => match o.downcast::<O>() {
                Ok(o) => Ok(*o),
                Err(_) => unreachable!("checked to be an `O` above"),
            },
            _ => unreachable!("checked to be an owner above"),
        }
    }

    /// Takes ownership of `len` elements of foreign device memory at `ptr` (another
    /// allocator's: `ncclMemAlloc`, a framework's pool), released by `release(ptr)` under
    /// the same rules as this crate's own memory: once, with `ctx` current, only after the
    /// work of every stream that used it is done and no graph or open group can launch
    /// work on it again. Views, copies, kernels and collectives then use it like any
    /// buffer. `release` is never called for an empty buffer, nor after
    /// [`into_raw`](Self::into_raw); if the memory cannot be proven idle it is leaked
    /// rather than released.
    ///
    /// # Safety
    /// `ptr` must be device memory of `ctx`, readable and writable from it, of at least
    /// `len * size_of::<T>()` bytes (or anything with `len == 0`), owned by nobody else
    /// until `release` is called; `release` must free exactly that memory and nothing else.
    ///
    /// Memory of another allocator (here the simulated driver's stand-in for
    /// `ncclMemAlloc`), released by it once the work using it is done:
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let ptr = {
    ///     let _current = ctx.bind()?;
    ///     world.alloc_foreign(64, "myAlloc").expect("a context is current")
    /// };
    /// let released = Arc::new(Mutex::new(Vec::new()));
    /// let log = released.clone();
    /// let allocator = world.clone();
    /// // SAFETY: 64 bytes of device memory of `ctx`, for 16 `u32`s, owned by nothing else
    /// // until the release frees exactly it.
    /// let mut buf = unsafe {
    ///     DeviceBuffer::<u32>::from_raw_with(&ctx, ptr, 16, move |p| {
    ///         log.lock().unwrap().push(p);
    ///         allocator.free_foreign(p, "myFree", "myAlloc").expect("its own memory");
    ///     })
    /// };
    /// let stream = Stream::non_blocking(&ctx)?;
    /// buf.fill_async(3, &stream)?;
    /// assert_eq!(buf.to_vec()?, [3; 16]);
    /// drop(buf); // waits for `stream`, then releases
    /// assert_eq!(*released.lock().unwrap(), [ptr]);
    /// assert!(world.violations().is_empty());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub unsafe fn from_raw_with(
        ctx: &Context,
        ptr: CUdeviceptr,
        len: usize,
        release: impl FnOnce(CUdeviceptr) + Send + Sync + 'static,
    ) -> Self {
        if len == 0 || ptr == 0 {
            // Any address will do for no element: there is nothing to release.
            return Self::owning(ctx, 0, 0, None);
        }
        Self::owning_with(ctx, ptr, len, None, Release::With(Box::new(release)))
    }

    /// Allocates and zeroes `len` elements.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<Self> {
        let mut b = Self::alloc(ctx, len)?;
        b.memset_bytes(0)?;
        Ok(b)
    }

    /// Allocates and uploads `data`.
    pub fn from_slice(ctx: &Context, data: &[T]) -> Result<Self> {
        let mut b = Self::alloc(ctx, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// Takes ownership of `len` elements at `ptr`, allocated with `cuMemAlloc` in `ctx`
    /// (freed with `cuMemFree` on drop), to use memory from other CUDA code.
    ///
    /// # Safety
    /// `ptr` must be a live `cuMemAlloc` allocation of `ctx` of at least `len * size_of::<T>()`
    /// bytes (or 0 with `len == 0`), owned by nobody else.
    ///
    /// [`into_raw`](Self::into_raw) is the way back:
    ///
    /// ```
    /// use cuda_hal::DeviceBuffer;
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let buf = DeviceBuffer::from_slice(&ctx, &[1u16, 2, 3])?;
    /// let Ok((ptr, len)) = buf.into_raw() else { panic!("nothing else holds it") };
    /// assert_eq!(world.live().device_allocations, 1, "given away, not freed");
    /// // SAFETY: the `cuMemAlloc` allocation of `ctx` just given up, 3 `u16`s long.
    /// let again = unsafe { DeviceBuffer::<u16>::from_raw(&ctx, ptr, len) };
    /// assert_eq!(again.to_vec()?, [1, 2, 3]);
    /// drop(again);
    /// assert_eq!(world.live().device_allocations, 0);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[must_use = "dropping the buffer frees the memory"]
    pub unsafe fn from_raw(ctx: &Context, ptr: CUdeviceptr, len: usize) -> Self {
        Self::owning(ctx, ptr, len, None)
    }

    /// Gives up ownership: returns the address and length; the memory is no longer freed
    /// by this value (free it with `cuMemFree`, or `cuMemFreeAsync` if it was allocated
    /// stream-ordered, once the work enqueued on it is done).
    ///
    /// Returns the buffer unchanged while a graph or an open group still uses the memory
    /// (then it is not this value's alone to give away), and for memory that something
    /// else releases ([`from_raw_with`](Self::from_raw_with)'s closure,
    /// [`from_owner`](Self::from_owner)'s owner): the address alone would outlive what
    /// keeps it allocated. [`into_owner`](Self::into_owner) gives an owner back.
    ///
    /// ```
    /// use cuda_hal::DeviceBuffer;
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let theirs = DeviceBuffer::<u8>::zeroed(&ctx, 8)?;
    /// let ptr = theirs.as_raw();
    /// // SAFETY: 8 bytes of `ctx`, allocated while the closure (which owns them) lives.
    /// let buf = unsafe { DeviceBuffer::<u8>::from_raw_with(&ctx, ptr, 8, move |_| drop(theirs)) };
    /// let buf = buf.into_raw().expect_err("the closure owns the memory: no bare address");
    /// drop(buf); // the closure runs, and frees it
    /// assert_eq!(world.used_memory(0), 0);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[allow(clippy::result_large_err)]
    pub fn into_raw(self) -> std::result::Result<(CUdeviceptr, usize), Self> {
        let (ptr, len) = (self.ptr, self.len);
        if !matches!(self.alloc.release, Release::Driver) {
            return Err(self);
        }
        match Arc::try_unwrap(self.alloc) {
            Ok(mut a) => {
                // Defused: the allocation's drop frees nothing when its address is 0.
                a.ptr = 0;
                Ok((ptr, len))
            }
            Err(alloc) => Err(DeviceBuffer {
                alloc,
                ptr,
                len,
                _t: PhantomData,
            }),
        }
    }

    /// Notes that work enqueued on `stream` uses this memory, so that its free waits for
    /// that work; and, while `stream` is being captured or a group is open on this thread,
    /// keeps the memory itself alive for the graph or the group ([`Stream::hold`]). Call
    /// it *before* enqueueing the work. Every enqueueing call of this crate and of
    /// nccl-channel does; code that enqueues work on the raw address itself calls it too.
    ///
    /// Hold [`Stream::enqueue_lock`] from before this call until the work is enqueued,
    /// so that no capture begins or ends in between. Stream-ordered memory first used on
    /// another stream than its own makes that stream wait for the allocation; that can
    /// fail (a driver error), and then nothing may be enqueued.
    ///
    /// Cheap when the stream is the one noted last and nothing is captured or deferred:
    /// two loads and a thread-local read.
    #[inline]
    pub fn used_on(&self, stream: &Stream) -> Result<()> {
        self.alloc.note(stream)?;
        stream.hold(|| self.keep_alive());
        Ok(())
    }

    /// A shared owner of the memory: it is not freed while the returned value lives.
    ///
    /// ```
    /// use cuda_hal::DeviceBuffer;
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let buf = DeviceBuffer::<u8>::zeroed(&ctx, 32)?;
    /// let held = buf.keep_alive();
    /// assert_eq!(buf.owners(), 2);
    /// drop(buf);
    /// assert_eq!(world.used_memory(0), 32, "still held");
    /// drop(held);
    /// assert_eq!(world.used_memory(0), 0);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[must_use = "the memory is held only while the KeepAlive lives"]
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.alloc.clone())
    }

    /// How many owners the memory has: this buffer, plus each graph, open group or
    /// [`KeepAlive`] (e.g. an NCCL registration) that holds it. A pool may hand memory to
    /// a new user only when it is the sole owner: a graph could launch work on it again.
    #[must_use]
    pub fn owners(&self) -> usize {
        Arc::strong_count(&self.alloc)
    }

    /// Waits until the work enqueued so far on every stream that used the memory is done
    /// (refused while one of them is being captured: the wait would spoil the capture).
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let (s1, s2) = (Stream::non_blocking(&ctx)?, Stream::non_blocking(&ctx)?);
    /// let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, 8)?;
    /// buf.slice_mut(..4)?.fill_async(1, &s1)?;
    /// buf.slice_mut(4..)?.fill_async(2, &s2)?;
    /// buf.synchronize_uses()?; // both streams, and only those
    /// assert!(s1.is_idle()? && s2.is_idle()?);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn synchronize_uses(&self) -> Result<()> {
        self.alloc
            .uses
            .synchronize("DeviceBuffer::synchronize_uses")
    }

    /// Number of elements.
    #[inline]
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    #[inline]
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[inline]
    #[must_use]
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The raw device address (0 for an empty buffer).
    #[inline]
    #[must_use]
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The context the memory lives in.
    #[inline]
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.alloc.ctx
    }

    /// The device the memory lives on.
    #[inline]
    #[must_use]
    pub fn device(&self) -> &Device {
        self.alloc.ctx.device()
    }

    /// A shared view of all elements.
    #[inline]
    #[must_use]
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView::new(self)
    }

    /// An exclusive view of all elements.
    #[inline]
    pub fn as_view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut::new(self)
    }

    /// A shared view of elements `range` ([`Error::OutOfRange`] if it does not fit).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        self.as_view().slice(range)
    }

    /// An exclusive view of elements `range` ([`Error::OutOfRange`] if it does not fit).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        self.as_view_mut().slice_mut(range)
    }

    /// Shared views of `[0, mid)` and `[mid, len)`.
    pub fn split_at(&self, mid: usize) -> Result<(DeviceView<'_, T>, DeviceView<'_, T>)> {
        self.as_view().split_at(mid)
    }

    /// Exclusive views of `[0, mid)` and `[mid, len)`.
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceViewMut<'_, T>, DeviceViewMut<'_, T>)> {
        self.as_view_mut().split_at_mut(mid)
    }

    /// Shared views of `size` consecutive elements each (the last may be shorter).
    pub fn chunks(&self, size: usize) -> Result<Chunks<'_, T>> {
        self.as_view().chunks(size)
    }

    /// Exclusive views of `size` consecutive elements each (the last may be shorter):
    /// e.g. the buckets of a gradient all-reduce over one flat buffer.
    pub fn chunks_mut(&mut self, size: usize) -> Result<ChunksMut<'_, T>> {
        self.as_view_mut().chunks_mut(size)
    }

    /// Uploads `src` (same length).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.as_view_mut().copy_from_host(src)
    }

    /// Downloads into `dst` (same length).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.as_view().copy_to_host(dst)
    }

    /// Downloads into a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_view().to_vec()
    }

    /// Copies `src` (same length: a buffer, a view, any [`DeviceSlice`]) into this buffer;
    /// across devices through `cuMemcpyPeer`.
    #[doc(alias = "cuMemcpyDtoD")]
    pub fn copy_from<S: DeviceSlice<Elem = T> + ?Sized>(&mut self, src: &S) -> Result<()> {
        self.as_view_mut().copy_from(src)
    }

    /// Uploads `src` on `stream`, in stream order, and waits for the stream. Refused
    /// while the stream is captured; no capture can begin until the wait is over.
    ///
    /// ```
    /// use cuda_hal::{CaptureMode, DeviceBuffer, Error, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::non_blocking(&ctx)?;
    /// let mut buf = DeviceBuffer::<i64>::zeroed(&ctx, 2)?;
    /// buf.copy_from_host_on(&[-4, 4], &stream)?;
    /// let mut back = [0; 2];
    /// buf.copy_to_host_on(&mut back, &stream)?;
    /// assert_eq!(back, [-4, 4]);
    /// // A capture would keep the host slice for the graph's later launches: refused.
    /// stream.begin_capture(CaptureMode::ThreadLocal)?;
    /// let refused = buf.copy_from_host_on(&[1, 2], &stream);
    /// assert_eq!(refused, Err(Error::Capturing { what: "copy_from_host_on" }));
    /// drop(stream.end_capture()?);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn copy_from_host_on(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        self.as_view_mut().copy_from_host_on(src, stream)
    }

    /// Downloads into `dst` on `stream`, in stream order, and waits for the stream (as
    /// [`copy_from_host_on`](Self::copy_from_host_on)).
    pub fn copy_to_host_on(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        self.as_view().copy_to_host_on(dst, stream)
    }

    /// Enqueues an upload of `src` on `stream` and returns at once.
    ///
    /// # Safety
    /// `src` must stay alive and unchanged until the stream has done the copy (synchronise
    /// the stream or an event recorded after it); if the stream is being captured, for as
    /// long as the graph can be launched.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub unsafe fn copy_from_host_async(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.as_view_mut().copy_from_host_async(src, stream) }
    }

    /// Enqueues a download into `dst` on `stream` and returns at once.
    ///
    /// # Safety
    /// `dst` must stay alive and unread until the stream has done the copy; if the stream
    /// is being captured, for as long as the graph can be launched.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub unsafe fn copy_to_host_async(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.as_view().copy_to_host_async(dst, stream) }
    }

    /// Enqueues a device-to-device copy of `src` on `stream` (same context) and waits.
    pub fn copy_from_on<S: DeviceSlice<Elem = T> + ?Sized>(
        &mut self,
        src: &S,
        stream: &Stream,
    ) -> Result<()> {
        self.as_view_mut().copy_from_on(src, stream)
    }

    /// Enqueues a device-to-device copy of `src` on `stream` and returns at once (also
    /// inside a graph capture). Safe, unlike the host copies: both sides are noted as used
    /// on `stream`, so dropping either waits for the copy, and a capture keeps both alive
    /// for the graph.
    ///
    /// ```
    /// use cuda_hal::{DeviceBuffer, Stream};
    /// # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
    /// # let ctx = cuda.device(0)?.primary_context()?;
    /// let stream = Stream::non_blocking(&ctx)?;
    /// let src = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0])?;
    /// let mut dst = DeviceBuffer::<f32>::zeroed(&ctx, 3)?;
    /// dst.copy_from_async(&src, &stream)?;
    /// drop(src); // freed only after the copy
    /// stream.synchronize()?;
    /// assert_eq!(dst.to_vec()?, [1.0, 2.0, 3.0]);
    /// assert!(world.violations().is_empty());
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub fn copy_from_async<S: DeviceSlice<Elem = T> + ?Sized>(
        &mut self,
        src: &S,
        stream: &Stream,
    ) -> Result<()> {
        self.as_view_mut().copy_from_async(src, stream)
    }

    /// Sets every byte to `byte`.
    #[doc(alias = "cuMemsetD8")]
    pub fn memset_bytes(&mut self, byte: u8) -> Result<()> {
        self.as_view_mut().memset_bytes(byte)
    }

    /// Sets every element to `value` (a memset for 1-, 2- and 4-byte patterns, an upload
    /// otherwise).
    pub fn fill(&mut self, value: T) -> Result<()> {
        self.as_view_mut().fill(value)
    }

    /// Enqueues setting every element to `value` on `stream` (see
    /// [`DeviceViewMut::fill_async`]).
    #[doc(alias = "cuMemsetD32Async")]
    pub fn fill_async(&mut self, value: T, stream: &Stream) -> Result<()> {
        self.as_view_mut().fill_async(value, stream)
    }
}

// SAFETY: the allocation holds `len` elements in `ctx` for as long as the buffer lives;
// `used_on` notes the stream in the allocation's use log (its free waits for the work)
// and hands a shared owner to an open capture or group; `used_synchronously` makes
// stream-ordered memory complete first.
unsafe impl<T: DeviceRepr> DeviceSlice for DeviceBuffer<T> {
    type Elem = T;
    #[inline]
    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    #[inline]
    fn len(&self) -> usize {
        self.len
    }
    #[inline]
    fn context(&self) -> &Context {
        &self.alloc.ctx
    }
    #[inline]
    fn used_on(&self, stream: &Stream) -> Result<()> {
        DeviceBuffer::used_on(self, stream)
    }
    fn used_synchronously(&self) -> Result<()> {
        self.alloc.ready_for_host()
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(DeviceBuffer::keep_alive(self))
    }
}

// SAFETY: device memory from cuMemAlloc(Async) is writable, and `&mut` of the buffer is
// the only way to it from safe code.
unsafe impl<T: DeviceRepr> DeviceSliceMut for DeviceBuffer<T> {}
