//! Attacks on views, copies, fills, modules, globals and launches from an adversarial
//! review, run against the simulated driver: `attack_*` tests are attacks the design
//! withstands (each fails if the hold it relies on is removed); the others are the
//! review's findings, fixed (each failed, or panicked, before its fix).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_hal::cuda_sys::CUresult;
use cuda_hal::{
    CaptureMode, Context, Cuda, DeviceBuffer, DeviceRepr, DeviceView, LaunchConfig, Module, Stream,
};
use cuda_mock::{MockDriver, MockWorld};

const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry copy(.param .u64 src, .param .u64 dst, .param .u32 n) { ret; }
";

fn rig() -> (Cuda, MockWorld, Context) {
    let d = MockDriver::with_devices(2)
        .kernel("copy", &[8, 8, 4], |k| {
            let (src, dst, n) = (k.param::<u64>(0), k.param::<u64>(1), k.param::<u32>(2));
            let v = k.read::<u32>(src, n as usize);
            k.write(dst, &v);
        })
        .global("empty", 0)
        .global("table", 16);
    let (cuda, world) = d.build_with(Cuda::from_driver).unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    (cuda, world, ctx)
}

fn assert_clean(world: &MockWorld) {
    let v = world.violations();
    assert!(v.is_empty(), "sanitizer:\n{}", v.join("\n"));
    assert!(world.live().is_empty(), "leaked: {:?}", world.live());
    assert_eq!(world.order_violations(), 0);
}

/// A zero-sized element type meets every word of `DeviceRepr`'s Safety section (Copy, no
/// padding, no pointers, every bit pattern valid).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Unit;
// SAFETY: a ZST: no padding, no pointers, its only (empty) bit pattern is valid.
unsafe impl DeviceRepr for Unit {}

/// `fill` / `fill_async` of a buffer of a zero-sized type have no bytes to set (they
/// used to index an empty byte array and panic); a global cannot be viewed as zero-sized
/// elements (it used to divide by zero).
#[test]
fn zero_sized_elements_are_filled_and_refused_as_globals_without_panics() {
    let (_cuda, _world, ctx) = rig();
    let mut b = DeviceBuffer::<Unit>::alloc(&ctx, 4).unwrap();
    b.fill(Unit).unwrap();
    let s = Stream::new(&ctx).unwrap();
    b.fill_async(Unit, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(b.to_vec().unwrap(), [Unit; 4]);
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    assert!(matches!(
        module.global::<Unit>("empty").unwrap_err(),
        cuda_hal::Error::InvalidArgument { what: "global", .. }
    ));
}

/// `fill_async` recorded by a capture, then the buffer dropped: the graph holds it.
#[test]
fn attack_fill_async_in_capture_then_drop_holds() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut b = DeviceBuffer::<u32>::zeroed(&ctx, 8).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    b.slice_mut(2..6).unwrap().fill_async(7, &s).unwrap();
    let g = s.end_capture().unwrap();
    assert_eq!(g.dependencies(), 1);
    let exec = g.instantiate().unwrap();
    drop((g, b));
    exec.launch(&s).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop((exec, s, ctx, cuda));
    assert_clean(&world);
}

/// Copies between views on different devices, synchronous and stream-ordered, also with
/// stream-ordered memory on the other device, dropped right after.
#[test]
fn attack_copies_between_views_of_two_devices_hold() {
    let (cuda, world, ctx) = rig();
    let ctx1 = cuda.device(1).unwrap().primary_context().unwrap();
    let s0 = Stream::non_blocking(&ctx).unwrap();
    let s1 = Stream::non_blocking(&ctx1).unwrap();
    let src = DeviceBuffer::from_slice(&ctx1, &[1u32, 2, 3, 4]).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    dst.slice_mut(..2)
        .unwrap()
        .copy_from(&src.slice(2..).unwrap())
        .unwrap();
    assert_eq!(dst.to_vec().unwrap(), [3, 4, 0, 0]);
    let ordered = DeviceBuffer::<u32>::alloc_on(&s1, 4).unwrap();
    dst.slice_mut(2..)
        .unwrap()
        .copy_from_async(&ordered.slice(..2).unwrap(), &s0)
        .unwrap();
    drop(ordered); // freed on s1, which must wait for s0
    // A stream of the other device is refused for the destination.
    assert!(
        dst.as_view_mut()
            .copy_from_async(&src, &s1)
            .is_err_and(|e| matches!(e, cuda_hal::Error::WrongDevice { .. }))
    );
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    drop((src, dst, s0, s1, ctx1, ctx, cuda));
    assert_clean(&world);
}

/// A global of a module used by a captured copy: dropping the module does not unload it
/// while the graph lives (its memory is the module's).
#[test]
fn attack_global_in_capture_then_module_dropped_holds() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    {
        let mut table = module.global::<u32>("table").unwrap();
        table.copy_from_host(&[5, 6, 7, 8]).unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        out.copy_from_async(&table.as_view(), &s).unwrap();
        table.as_view_mut().fill_async(9, &s).unwrap();
    }
    let exec = s.end_capture().unwrap().instantiate().unwrap();
    drop(module);
    assert_eq!(world.live().modules, 1);
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [5, 6, 7, 8]);
    drop(exec);
    assert_eq!(world.live().modules, 0);
    drop((out, s, ctx, cuda));
    assert_clean(&world);
}

/// A function launched on a stream, then the module dropped while that stream is captured
/// by two different captures chained through an event: the module goes to one of them.
#[test]
fn attack_module_dropped_while_two_captures_run_holds() {
    let (cuda, world, ctx) = rig();
    let a = Stream::non_blocking(&ctx).unwrap();
    let b = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let src = DeviceBuffer::from_slice(&ctx, &[1u32]).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    let f = module.function("copy").unwrap();
    // SAFETY: copy reads and writes one u32.
    unsafe { f.launch(&a, LaunchConfig::linear(1, 1), (&src, &mut dst, 1u32)) }.unwrap();
    // SAFETY: as above.
    unsafe { f.launch(&b, LaunchConfig::linear(1, 1), (&src, &mut dst, 1u32)) }.unwrap();
    a.begin_capture(CaptureMode::ThreadLocal).unwrap();
    b.begin_capture(CaptureMode::ThreadLocal).unwrap();
    drop(f);
    drop(module);
    let ga = a.end_capture().unwrap();
    drop(ga); // the module moved to a's graph; unloading it now must not sync `b`
    assert!(b.is_capturing().unwrap(), "b's capture survived");
    let gb = b.end_capture().unwrap();
    drop(gb);
    drop((src, dst, a, b, ctx, cuda));
    assert_clean(&world);
}

/// Views of raw addresses: `from_raw_parts` is the only way, and it is unsafe; a view
/// cannot outlive its buffer (see the compile-fail candidates in the report).
#[test]
fn attack_view_chunks_cover_exactly() {
    let (cuda, world, ctx) = rig();
    let b = DeviceBuffer::from_slice(&ctx, &(0u32..10).collect::<Vec<_>>()).unwrap();
    let c: Vec<Vec<u32>> = b
        .chunks(usize::MAX)
        .unwrap()
        .map(|v| v.to_vec().unwrap())
        .collect();
    assert_eq!(c, vec![(0u32..10).collect::<Vec<_>>()]);
    let v: DeviceView<'_, u32> = b.slice(10..).unwrap();
    assert_eq!(v.chunks(3).unwrap().len(), 0);
    assert_eq!(
        b.slice(usize::MAX..).unwrap_err(),
        cuda_hal::Error::OutOfRange {
            what: "DeviceView::slice",
            start: usize::MAX,
            end: 10,
            len: 10
        }
    );
    assert_eq!(
        b.split_at(11).unwrap_err(),
        cuda_hal::Error::OutOfRange {
            what: "DeviceView::split_at",
            start: 0,
            end: 11,
            len: 10
        }
    );
    drop((b, ctx, cuda));
    assert_clean(&world);
}

/// `LaunchConfig::threads_per_block` saturates (three `u32`s multiplied in `u64` used to
/// overflow: a panic in debug builds, also inside `Function::launch`'s shape check), and
/// such a block is a typed error before the driver is called.
#[test]
fn an_overflowing_block_is_a_typed_error() {
    let c = LaunchConfig::new([1, 1, 1], [u32::MAX, u32::MAX, 2]);
    assert_eq!(c.threads_per_block(), u64::MAX);
    let (_cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let f = module.function("copy").unwrap();
    let s = Stream::new(&ctx).unwrap();
    // SAFETY: refused before the driver is called.
    let e = unsafe { f.launch(&s, c, (0u64, 0u64, 0u32)) }.unwrap_err();
    assert_eq!(
        e,
        cuda_hal::Error::InvalidLaunchConfig {
            kernel: "copy".into(),
            config: c,
            problem: format!(
                "{} threads per block; the kernel allows at most 1024",
                u64::MAX
            )
        }
    );
    assert_eq!(world.calls("cuLaunchKernel"), 0);
}

/// A library of one simulated driver asked for its kernel in a context of another: the
/// handle is refused by the other driver (typed), never used as its own.
#[test]
fn attack_library_kernel_in_a_context_of_another_driver_is_refused() {
    let (cuda_a, world_a, _ctx_a) = rig();
    let (_cuda_b, world_b, ctx_b) = rig();
    let lib = cuda_hal::Library::from_ptx(&cuda_a, PTX).unwrap();
    let k = lib.kernel("copy").unwrap();
    // World b does not know world a's handles: the driver's answer for any unknown one.
    let e = k.function(&ctx_b).unwrap_err();
    assert!(
        matches!(&e, cuda_hal::Error::Driver { call: "cuKernelGetFunction", code, name, .. }
            if *code == CUresult::CUDA_ERROR_INVALID_HANDLE && name == "CUDA_ERROR_INVALID_HANDLE"),
        "{e}"
    );
    let e = lib.global::<u32>(&ctx_b, "table").unwrap_err();
    assert!(
        matches!(&e, cuda_hal::Error::Lookup { call: "cuLibraryGetGlobal", code, name, symbol, .. }
            if *code == CUresult::CUDA_ERROR_INVALID_HANDLE && name == "CUDA_ERROR_INVALID_HANDLE"
                && symbol == "table"),
        "{e}"
    );
    drop(k);
    drop(lib);
    assert!(
        world_a.violations().is_empty(),
        "{:?}",
        world_a.violations()
    );
    println!("world b: {:?}", world_b.violations());
}
