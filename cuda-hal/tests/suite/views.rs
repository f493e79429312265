//! Views and foreign memory on the simulated driver: ranges reach exactly their elements,
//! bad ranges are typed errors, and work on a view keeps the memory it belongs to alive
//! exactly as work on the whole buffer does (the sanitizer checks every address when
//! the work executes).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{assert_clean, rig};

use std::sync::Mutex;

use cuda_hal::cuda_sys::CUdeviceptr;
use cuda_hal::{
    CaptureMode, Context, DeviceBuffer, DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut,
    Error, Result, Stream,
};

#[test]
fn copies_and_fills_on_views_touch_only_their_range() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[0u16; 10]).unwrap();
    buf.slice_mut(2..4).unwrap().fill(7).unwrap();
    buf.slice_mut(4..=5)
        .unwrap()
        .copy_from_host(&[8, 9])
        .unwrap();
    buf.slice_mut(6..8).unwrap().fill_async(0x0102, &s).unwrap();
    s.synchronize().unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[5u16, 6]).unwrap();
    buf.slice_mut(8..)
        .unwrap()
        .copy_from_async(&src, &s)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        buf.to_vec().unwrap(),
        [0, 0, 7, 7, 8, 9, 0x0102, 0x0102, 5, 6]
    );
    assert_eq!(buf.slice(3..6).unwrap().to_vec().unwrap(), [7, 8, 9]);
    let mut host = [0u16; 2];
    buf.slice(8..)
        .unwrap()
        .copy_to_host_on(&mut host, &s)
        .unwrap();
    assert_eq!(host, [5, 6]);
    // A view of a view starts at the inner view's start.
    let inner = buf.slice(2..8).unwrap().slice(1..3).unwrap();
    assert_eq!(inner.as_raw(), buf.as_raw() + 3 * 2);
    assert_eq!(inner.to_vec().unwrap(), [7, 8]);
    drop((buf, src, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn splits_and_chunks_cover_the_buffer_without_overlap() {
    let (_cuda, world, ctx) = rig();
    let mut buf = DeviceBuffer::<i32>::zeroed(&ctx, 7).unwrap();
    let chunks = buf.chunks_mut(3).unwrap();
    assert_eq!(chunks.len(), 3);
    for (i, mut c) in chunks.enumerate() {
        c.fill(i as i32 + 1).unwrap();
    }
    assert_eq!(buf.to_vec().unwrap(), [1, 1, 1, 2, 2, 2, 3]);
    let lens: Vec<usize> = buf.chunks(3).unwrap().map(|c| c.len()).collect();
    assert_eq!(lens, [3, 3, 1]);
    let (a, b) = buf.split_at(7).unwrap();
    assert_eq!((a.len(), b.len()), (7, 0));
    assert_eq!(b.to_vec().unwrap(), Vec::<i32>::new());
    let (mut a, mut b) = buf.split_at_mut(2).unwrap();
    a.copy_from_host(&[-1, -2]).unwrap();
    b.reborrow().slice_mut(3..).unwrap().copy_from(&a).unwrap();
    assert_eq!(b.to_vec().unwrap(), [1, 2, 2, -1, -2]);
    assert_eq!(buf.to_vec().unwrap(), [-1, -2, 1, 2, 2, -1, -2]);
    let (a, b) = buf.split_at(2).unwrap();
    assert_eq!(a.to_vec().unwrap(), [-1, -2]);
    assert_eq!(b.to_vec().unwrap(), [1, 2, 2, -1, -2]);
    assert!(world.violations().is_empty());
}

#[test]
fn bad_ranges_and_chunk_sizes_are_typed_errors() {
    let (_cuda, _world, ctx) = rig();
    let mut buf = DeviceBuffer::<f32>::zeroed(&ctx, 4).unwrap();
    assert_eq!(
        buf.slice(2..5).unwrap_err(),
        Error::OutOfRange {
            what: "DeviceView::slice",
            start: 2,
            end: 5,
            len: 4
        }
    );
    assert_eq!(
        buf.split_at_mut(5).unwrap_err(),
        Error::OutOfRange {
            what: "DeviceViewMut::split_at_mut",
            start: 0,
            end: 5,
            len: 4
        }
    );
    assert_eq!(
        buf.chunks(0).unwrap_err(),
        Error::InvalidArgument {
            what: "DeviceView::chunks",
            problem: "the chunk size must be at least 1".into()
        }
    );
    assert_eq!(
        buf.chunks_mut(0).unwrap_err(),
        Error::InvalidArgument {
            what: "DeviceViewMut::chunks_mut",
            problem: "the chunk size must be at least 1".into()
        }
    );
    // A view keeps its own length: copies check it.
    assert_eq!(
        buf.slice_mut(1..3)
            .unwrap()
            .copy_from_host(&[1.0; 3])
            .unwrap_err(),
        Error::LengthMismatch {
            what: "copy_from_host",
            buffer: "host",
            expected: 2,
            got: 3
        }
    );
    let s = Stream::new(&ctx).unwrap();
    let mut wide = DeviceBuffer::<f64>::zeroed(&ctx, 2).unwrap();
    assert_eq!(
        wide.fill_async(1.5, &s).unwrap_err(),
        Error::InvalidArgument {
            what: "fill_async",
            problem: "a 8-byte value whose bytes are not a repeated 1-, 2- or 4-byte pattern \
                      cannot be set by a memset; use fill or copy_from_async"
                .into()
        }
    );
    wide.fill_async(0.0, &s).unwrap();
    let other = rig_other_device(&ctx);
    assert_eq!(
        wide.fill_async(0.0, &other).unwrap_err(),
        Error::WrongDevice {
            what: "fill_async",
            object: "stream",
            expected: 0,
            found: 1
        }
    );
}

fn rig_other_device(ctx: &Context) -> Stream {
    let other = ctx.cuda().device(1).unwrap().primary_context().unwrap();
    Stream::new(&other).unwrap()
}

/// A graph captured over views of two buffers is launched after both buffers were
/// dropped: the views noted the work on the allocations, so the graph owns them.
#[test]
fn a_graph_keeps_the_memory_behind_its_views() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[1u32, 2, 3, 4]).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 2).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    dst.slice_mut(1..3)
        .unwrap()
        .copy_from_async(&src.slice(2..).unwrap(), &s)
        .unwrap();
    out.copy_from_async(&dst.slice(1..3).unwrap(), &s).unwrap();
    let exec = s.end_capture().unwrap().instantiate().unwrap();
    drop((src, dst));
    assert_eq!(world.live().device_allocations, 3, "held by the graph");
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [3, 4]);
    drop((exec, out, s, ctx, cuda));
    assert_clean(&world);
}

/// A stream-ordered buffer dropped right after async work on a view of it: the free is
/// ordered after that work (the mock checks the free against the streams' clocks).
#[test]
fn dropping_a_buffer_after_work_on_its_view_waits_for_the_work() {
    let (cuda, world, ctx) = rig();
    let own = Stream::non_blocking(&ctx).unwrap();
    let other = Stream::non_blocking(&ctx).unwrap();
    let src = DeviceBuffer::<u8>::alloc_on(&own, 64).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeroed(&ctx, 32).unwrap();
    dst.copy_from_async(&src.slice(16..48).unwrap(), &other)
        .unwrap();
    drop(src); // freed on `own`, which must first wait for `other`
    own.synchronize().unwrap();
    other.synchronize().unwrap();
    drop((dst, own, other, ctx, cuda));
    assert_clean(&world);
}

/// Another crate's memory: its own allocation and its own record of the streams that used
/// it, borrowed (never freed) by this crate.
struct Foreign {
    ctx: Context,
    ptr: CUdeviceptr,
    len: usize,
    used: Mutex<Vec<Stream>>,
}

impl Foreign {
    fn new(ctx: &Context, len: usize) -> Foreign {
        let mut ptr = 0;
        let _g = ctx.bind().unwrap();
        // SAFETY: valid out-pointer, a context is current.
        let rc = unsafe { (ctx.cuda().fns().cuMemAlloc)(&mut ptr, len * 4) };
        assert_eq!(rc.0, 0);
        Foreign {
            ctx: ctx.clone(),
            ptr,
            len,
            used: Mutex::new(Vec::new()),
        }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        for s in self.used.lock().unwrap().drain(..) {
            s.synchronize().unwrap();
        }
        let _g = self.ctx.bind().unwrap();
        // SAFETY: our allocation, freed once after the streams that used it.
        unsafe { (self.ctx.cuda().fns().cuMemFree)(self.ptr) };
    }
}

// SAFETY: `len` u32 in `ctx` for the value's life; every stream it was used on is waited
// for before the free; this test never captures or groups with it.
unsafe impl DeviceSlice for Foreign {
    type Elem = u32;
    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context(&self) -> &Context {
        &self.ctx
    }
    fn used_on(&self, stream: &Stream) -> Result<()> {
        self.used.lock().unwrap().push(stream.clone());
        Ok(())
    }
}
// SAFETY: cuMemAlloc memory is writable.
unsafe impl DeviceSliceMut for Foreign {}

#[test]
fn foreign_memory_is_borrowed_by_copies_and_views() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut f = Foreign::new(&ctx, 4);
    DeviceViewMut::new(&mut f)
        .copy_from_host(&[1, 2, 3, 4])
        .unwrap();
    let mut mine = DeviceBuffer::<u32>::zeroed(&ctx, 2).unwrap();
    mine.copy_from_async(&DeviceView::new(&f).slice(2..).unwrap(), &s)
        .unwrap();
    assert_eq!(f.used.lock().unwrap().len(), 1, "the view noted the use");
    let (_, mut hi) = DeviceViewMut::new(&mut f).split_at_mut(3).unwrap();
    hi.copy_from_async(&mine.slice(..1).unwrap(), &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(mine.to_vec().unwrap(), [3, 4]);
    assert_eq!(DeviceView::new(&f).to_vec().unwrap(), [1, 2, 3, 3]);
    // Borrowed, not owned: dropping the views freed nothing.
    assert_eq!(world.live().device_allocations, 2);
    drop(f);
    drop((mine, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn raw_views_read_memory_they_do_not_own() {
    let (cuda, world, ctx) = rig();
    let buf = DeviceBuffer::from_slice(&ctx, &[9i64, 8, 7]).unwrap();
    // SAFETY: `buf` holds 3 i64 in `ctx` and outlives the view; synchronous use only.
    let v = unsafe { DeviceView::<i64>::from_raw_parts(&ctx, buf.as_raw(), 3) };
    assert_eq!(v.slice(1..).unwrap().to_vec().unwrap(), [8, 7]);
    drop(buf);
    drop((ctx, cuda));
    assert_clean(&world);
}

/// A fill no memset can do (an 8-byte value that is not a repeated pattern) uploads a
/// host block of at most 1 MiB range by range, not a host copy of the whole buffer.
#[test]
fn a_fill_without_a_memset_uploads_one_mib_at_a_time() {
    let (_cuda, world, ctx) = rig();
    let n = 300_000; // 2.4 MB of f64: three 1 MiB blocks (131072 elements each)
    let mut b = DeviceBuffer::<f64>::zeroed(&ctx, n + 2).unwrap();
    let before = world.calls("cuMemcpyHtoD");
    b.slice_mut(1..=n).unwrap().fill(1.5).unwrap();
    assert_eq!(world.calls("cuMemcpyHtoD") - before, 3);
    let v = b.to_vec().unwrap();
    assert_eq!(
        (v[0], v[1], v[131_072], v[n], v[n + 1]),
        (0.0, 1.5, 1.5, 1.5, 0.0)
    );
    assert!(v[1..=n].iter().all(|x| *x == 1.5));
}

#[test]
fn views_report_their_range() {
    let (cuda, world, ctx) = rig();
    let mut buf = DeviceBuffer::from_slice(&ctx, &[1u32, 2, 3, 4, 5]).unwrap();
    let base = buf.as_raw();
    let v = buf.slice(1..3).unwrap();
    assert_eq!(
        format!("{v:?}"),
        format!("DeviceView {{ device: 0, ptr: {:#x}, len: 2 }}", base + 4)
    );
    assert!(!v.is_empty());
    assert!(buf.slice(2..2).unwrap().is_empty());
    let mut m = buf.slice_mut(3..).unwrap();
    assert_eq!(
        format!("{m:?}"),
        format!(
            "DeviceViewMut {{ device: 0, ptr: {:#x}, len: 2 }}",
            base + 12
        )
    );
    assert!(!m.is_empty());
    let mut host = [0u32; 2];
    m.copy_to_host(&mut host).unwrap();
    assert_eq!(host, [4, 5]);
    assert!(m.reborrow().slice_mut(1..1).unwrap().is_empty());
    // Chunks know how many are left.
    let mut chunks = buf.chunks(2).unwrap();
    assert_eq!(chunks.size_hint(), (3, Some(3)));
    assert_eq!(chunks.next().unwrap().to_vec().unwrap(), [1, 2]);
    assert_eq!(chunks.len(), 2);
    let lens: Vec<usize> = chunks.map(|c| c.len()).collect();
    assert_eq!(lens, [2, 1]);
    let mut chunks = buf.chunks_mut(4).unwrap();
    assert_eq!(chunks.size_hint(), (2, Some(2)));
    chunks.next().unwrap();
    assert_eq!(chunks.len(), 1);
    drop((buf, ctx, cuda));
    assert_clean(&world);
}

/// Synchronous calls on views of stream-ordered memory first make the allocation
/// complete, like calls on the buffer: while its stream is captured, that is refused.
#[test]
fn synchronous_calls_on_views_of_stream_ordered_memory_wait_for_the_allocation() {
    let (cuda, world, ctx) = rig();
    let own = Stream::non_blocking(&ctx).unwrap();
    let mut pooled = DeviceBuffer::<u32>::alloc_on(&own, 4).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 2).unwrap();
    own.begin_capture(CaptureMode::Relaxed).unwrap();
    let refused = Error::Capturing {
        what: "a synchronous call on stream-ordered memory",
    };
    assert_eq!(pooled.slice(..2).unwrap().to_vec(), Err(refused.clone()));
    assert_eq!(
        dst.copy_from(&pooled.slice(2..).unwrap()),
        Err(refused.clone())
    );
    assert_eq!(
        dst.copy_from(&pooled.slice_mut(2..).unwrap()),
        Err(refused.clone())
    );
    drop(own.end_capture().unwrap());
    let syncs = world.calls("cuStreamSynchronize");
    pooled.fill(6).unwrap();
    assert_eq!(
        world.calls("cuStreamSynchronize") - syncs,
        2,
        "waited for `own`, then for the memset"
    );
    dst.copy_from(&pooled.slice_mut(1..3).unwrap()).unwrap();
    assert_eq!(dst.to_vec().unwrap(), [6, 6]);
    drop((pooled, dst, own, ctx, cuda));
    assert_clean(&world);
}

/// Memory of no elements, described by another crate: the trait's provided methods.
struct Nothing {
    ctx: Context,
}

// SAFETY: no element, so no memory is promised (any address is valid for length 0).
unsafe impl DeviceSlice for Nothing {
    type Elem = u64;
    fn device_ptr(&self) -> CUdeviceptr {
        0
    }
    fn len(&self) -> usize {
        0
    }
    fn context(&self) -> &Context {
        &self.ctx
    }
    fn used_on(&self, _: &Stream) -> Result<()> {
        Ok(())
    }
}

#[test]
fn the_provided_methods_of_device_slice() {
    let (cuda, world, ctx) = rig();
    let f = Foreign::new(&ctx, 4);
    assert!(!DeviceSlice::is_empty(&f));
    assert_eq!(DeviceSlice::size_bytes(&f), 16);
    assert_eq!(DeviceSlice::device(&f).ordinal(), 0);
    assert_eq!(DeviceSlice::used_synchronously(&f), Ok(()));
    let none = Nothing { ctx: ctx.clone() };
    assert!(DeviceSlice::is_empty(&none));
    assert_eq!(DeviceSlice::size_bytes(&none), 0);
    assert_eq!(DeviceView::new(&none).to_vec().unwrap(), Vec::<u64>::new());
    drop((f, none, ctx, cuda));
    assert_clean(&world);
}
