//! Modules, libraries and kernel launches on the simulated driver, whose kernels are Rust
//! functions that touch device memory through the sanitizer: right numbers, typed errors
//! before anything is launched, and code and memory that outlive the work using them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::assert_clean;

use cuda_hal::{
    BlockSize, ByValue, CaptureMode, Context, Cuda, DeviceBuffer, DeviceRepr, Error, Global,
    LaunchConfig, Library, Module, ParamInfo, Stream,
};
use cuda_mock::{MockDriver, MockWorld};

/// The PTX the tests load: the simulated driver reads its `.entry` names.
const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y) { ret; }
.visible .entry axpb(.param .u64 x, .param .align 4 .b8 coef[12]) { ret; }
.visible .entry add_table(.param .u64 x, .param .u64 table, .param .u32 n) { ret; }
.visible .entry noop() { ret; }
";

/// `a * x + b` for `n` elements, the coefficients as one struct parameter.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Coef {
    a: f32,
    b: f32,
    n: u32,
}
// SAFETY: three 4-byte numbers, no padding; every bit pattern is a valid value.
unsafe impl DeviceRepr for Coef {}

fn kernels(d: MockDriver) -> MockDriver {
    d.kernel("saxpy", &[4, 4, 8, 8], |k| {
        let (n, a) = (k.param::<u32>(0) as usize, k.param::<f32>(1));
        let (x, y) = (k.param::<u64>(2), k.param::<u64>(3));
        let xs = k.read::<f32>(x, n);
        let ys = k.read::<f32>(y, n);
        let out: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| a * x + y).collect();
        k.write(y, &out);
    })
    .kernel("axpb", &[8, 12], |k| {
        let x = k.param::<u64>(0);
        let c = k.param_bytes(1);
        let word = |i: usize| [c[i], c[i + 1], c[i + 2], c[i + 3]];
        let (a, b) = (f32::from_ne_bytes(word(0)), f32::from_ne_bytes(word(4)));
        let n = u32::from_ne_bytes(word(8)) as usize;
        let v: Vec<f32> = k.read::<f32>(x, n).iter().map(|x| a * x + b).collect();
        k.write(x, &v);
    })
    .kernel("add_table", &[8, 8, 4], |k| {
        let (x, t, n) = (k.param::<u64>(0), k.param::<u64>(1), k.param::<u32>(2));
        let table = k.read::<f32>(t, n as usize);
        let v: Vec<f32> = k
            .read::<f32>(x, n as usize)
            .iter()
            .zip(&table)
            .map(|(x, t)| x + t)
            .collect();
        k.write(x, &v);
    })
    .kernel("noop", &[], |_| {})
    .global("table", 16)
}

fn rig() -> (Cuda, MockWorld, Context) {
    crate::common::rig_with(kernels(MockDriver::with_devices(2)))
}

#[test]
fn saxpy_on_whole_buffers_and_on_views() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let x = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[10.0f32; 4]).unwrap();
    let cfg = LaunchConfig::for_elements(4, 128);
    // SAFETY: saxpy reads n floats at x and writes n floats at y.
    unsafe { saxpy.launch(&s, cfg, (4u32, 2.0f32, &x, &mut y)) }.unwrap();
    s.synchronize().unwrap();
    assert_eq!(y.to_vec().unwrap(), [12.0, 14.0, 16.0, 18.0]);
    // Views: only elements 1 and 2 of y, from elements 2 and 3 of x.
    let xs = x.slice(2..).unwrap();
    let ys = y.slice_mut(1..3).unwrap();
    // SAFETY: as above, with n = 2, the views' length.
    unsafe { saxpy.launch(&s, LaunchConfig::linear(1, 2), (2u32, 1.0f32, xs, ys)) }.unwrap();
    s.synchronize().unwrap();
    assert_eq!(y.to_vec().unwrap(), [12.0, 17.0, 20.0, 18.0]);
    // On the legacy default stream too.
    let legacy = Stream::legacy_default(&ctx);
    // SAFETY: as above.
    unsafe { saxpy.launch(&legacy, cfg, (4u32, 0.0f32, &x, &mut y)) }.unwrap();
    legacy.synchronize().unwrap();
    assert_eq!(y.to_vec().unwrap(), [12.0, 17.0, 20.0, 18.0]);
    assert_eq!(world.calls("cuLaunchKernel"), 3);
    drop(saxpy);
    drop((module, x, y, s, legacy, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn a_struct_passes_by_value() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let axpb = module.function("axpb").unwrap();
    assert_eq!(
        axpb.param_info().unwrap(),
        [
            ParamInfo { offset: 0, size: 8 },
            ParamInfo {
                offset: 8,
                size: 12
            }
        ]
    );
    let s = Stream::new(&ctx).unwrap();
    let mut x = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0]).unwrap();
    let coef = ByValue(Coef {
        a: 3.0,
        b: 0.5,
        n: 2,
    });
    // SAFETY: axpb reads and writes `coef.n` floats at x (2 of 3).
    unsafe { axpb.launch(&s, LaunchConfig::linear(1, 32), (&mut x, coef)) }.unwrap();
    s.synchronize().unwrap();
    assert_eq!(x.to_vec().unwrap(), [3.5, 6.5, 3.0]);
    drop(axpb);
    drop((module, x, s, ctx, cuda));
    assert_clean(&world);
}

/// A buffer dropped right after the launch that uses it: its free waits for the kernel.
#[test]
fn a_buffer_dropped_right_after_a_launch_waits_for_the_kernel() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let x = DeviceBuffer::from_slice(&ctx, &[1.0f32; 64]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[0.0f32; 64]).unwrap();
    // SAFETY: saxpy reads and writes 64 floats.
    unsafe {
        saxpy.launch(
            &s,
            LaunchConfig::for_elements(64, 64),
            (64u32, 1.0f32, &x, &mut y),
        )
    }
    .unwrap();
    let syncs = world.calls("cuStreamSynchronize");
    drop(x);
    assert_eq!(
        world.calls("cuStreamSynchronize") - syncs,
        1,
        "the free waited for the launch stream"
    );
    assert_eq!(y.to_vec().unwrap(), [1.0; 64]);
    drop(saxpy);
    drop((module, y, s, ctx, cuda));
    assert_clean(&world);
}

/// A module dropped right after a launch: the unload waits for the kernel's stream (the
/// simulated driver reports an unload not ordered after the module's launches).
#[test]
fn a_module_dropped_right_after_a_launch_waits_for_the_kernel() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    // SAFETY: noop touches nothing.
    unsafe {
        module
            .function("noop")
            .unwrap()
            .launch(&s, LaunchConfig::linear(1, 1), ())
    }
    .unwrap();
    let syncs = world.calls("cuStreamSynchronize");
    assert_eq!(world.live().modules, 1);
    drop(module);
    assert_eq!(world.live().modules, 0);
    assert_eq!(world.calls("cuStreamSynchronize") - syncs, 1);
    drop((s, ctx, cuda));
    assert_clean(&world);
}

/// A graph that launches a kernel keeps its module: dropping the `Module` while the graph
/// lives unloads nothing, and the graph still launches the kernel. (Without the hold, the
/// drop would unload the module and the replay would launch a function of an unloaded
/// module, which the simulated driver reports and fails.)
#[test]
fn a_captured_launch_keeps_the_module_for_the_graph() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let x = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[0.0f32; 2]).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    // SAFETY: saxpy reads and writes 2 floats.
    unsafe { saxpy.launch(&s, LaunchConfig::linear(1, 2), (2u32, 1.0f32, &x, &mut y)) }.unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 3, "the module and both buffers");
    let exec = graph.instantiate().unwrap();
    drop(graph);
    assert_eq!(y.to_vec().unwrap(), [0.0, 0.0], "captured, not run");
    drop(saxpy);
    drop((module, x));
    assert_eq!(world.live().modules, 1, "held by the graph");
    exec.launch(&s).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(y.to_vec().unwrap(), [2.0, 4.0]);
    drop(exec);
    assert_eq!(world.live().modules, 0, "unloaded with the graph");
    drop((y, s, ctx, cuda));
    assert_clean(&world);
}

/// A module dropped while a stream it was launched on is being captured (for other work)
/// is not unloaded then (waiting for the stream would spoil the capture): the capture's
/// graph takes it and unloads it when it goes.
#[test]
fn a_module_dropped_during_a_capture_goes_to_the_graph() {
    let (cuda, world, ctx) = rig();
    let s = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    // SAFETY: noop touches nothing.
    unsafe {
        module
            .function("noop")
            .unwrap()
            .launch(&s, LaunchConfig::linear(1, 1), ())
    }
    .unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    drop(module);
    assert_eq!(world.live().modules, 1);
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 1, "the module");
    drop(graph);
    assert_eq!(world.live().modules, 0);
    drop((s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn wrong_arguments_are_typed_errors_and_nothing_is_launched() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let s = Stream::new(&ctx).unwrap();
    let x = DeviceBuffer::from_slice(&ctx, &[1.0f32]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[0.0f32]).unwrap();
    let cfg = LaunchConfig::linear(1, 1);
    // SAFETY: refused before the driver is called (what is tested).
    let e = unsafe { saxpy.launch(&s, cfg, (1u32, &x, &mut y)) }.unwrap_err();
    assert_eq!(
        e,
        Error::KernelArgumentCount {
            kernel: "saxpy".into(),
            expected: 4,
            got: 3
        }
    );
    // SAFETY: as above.
    let e = unsafe { saxpy.launch(&s, cfg, (1u64, 2.0f32, &x, &mut y)) }.unwrap_err();
    assert_eq!(
        e,
        Error::KernelArgumentSize {
            kernel: "saxpy".into(),
            index: 0,
            expected: 4,
            got: 8
        }
    );
    assert_eq!(
        e.to_string(),
        "kernel saxpy: parameter 0 is 4 bytes; the argument given is 8"
    );
    // SAFETY: as above.
    let e = unsafe { saxpy.launch(&s, cfg, (1u32, 2.0f64, &x, &mut y)) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::KernelArgumentSize {
                index: 1,
                expected: 4,
                got: 8,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(world.calls("cuLaunchKernel"), 0);
    assert_eq!(y.to_vec().unwrap(), [0.0]);
    drop(saxpy);
    drop((module, x, y, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn memory_of_another_device_is_a_typed_error() {
    let (cuda, world, ctx) = rig();
    let ctx1 = cuda.device(1).unwrap().primary_context().unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let s = Stream::new(&ctx).unwrap();
    let x = DeviceBuffer::from_slice(&ctx1, &[1.0f32]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[0.0f32]).unwrap();
    // SAFETY: refused before the driver is called.
    let e = unsafe { saxpy.launch(&s, LaunchConfig::linear(1, 1), (1u32, 1.0f32, &x, &mut y)) }
        .unwrap_err();
    assert_eq!(
        e,
        Error::WrongDevice {
            what: "Function::launch",
            object: "kernel argument",
            expected: 0,
            found: 1
        }
    );
    // And a stream of another device than the function's.
    let s1 = Stream::new(&ctx1).unwrap();
    // SAFETY: refused before the driver is called.
    let e = unsafe { saxpy.launch(&s1, LaunchConfig::linear(1, 1), (1u32, 1.0f32, &y, &y)) }
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                what: "Function::launch",
                object: "stream",
                expected: 0,
                found: 1
            }
        ),
        "{e}"
    );
    assert_eq!(world.calls("cuLaunchKernel"), 0);
    drop(saxpy);
    drop((module, x, y, s, s1, ctx1, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn launch_shapes_are_checked_before_the_driver() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let noop = module.function("noop").unwrap();
    let s = Stream::new(&ctx).unwrap();
    for (config, problem) in [
        (
            LaunchConfig::linear(0, 32),
            "the grid has a dimension of 0 blocks",
        ),
        (
            LaunchConfig::for_elements(0, 32),
            "the grid has a dimension of 0 blocks",
        ),
        (
            LaunchConfig::new([1, 1, 1], [32, 0, 1]),
            "the block has a dimension of 0 threads",
        ),
        (
            LaunchConfig::new([1, 1, 1], [32, 32, 2]),
            "2048 threads per block; the kernel allows at most 1024",
        ),
    ] {
        // SAFETY: noop touches nothing; the shape is refused (what is tested).
        let e = unsafe { noop.launch(&s, config, ()) }.unwrap_err();
        assert_eq!(
            e,
            Error::InvalidLaunchConfig {
                kernel: "noop".into(),
                config,
                problem: problem.into()
            }
        );
    }
    assert_eq!(world.calls("cuLaunchKernel"), 0);
    // Too much dynamic shared memory is the driver's to refuse.
    let big = LaunchConfig::linear(1, 1).with_shared_mem(64 << 10);
    // SAFETY: noop touches nothing.
    let e = unsafe { noop.launch(&s, big, ()) }.unwrap_err();
    assert!(
        matches!(e, Error::Driver { call: "cuLaunchKernel", code, .. } if code == cuda_hal::cuda_sys::CUresult::CUDA_ERROR_INVALID_VALUE),
        "{e}"
    );
    noop.set_max_dynamic_shared_mem(64 << 10).unwrap();
    assert_eq!(noop.max_dynamic_shared_mem().unwrap(), 64 << 10);
    // SAFETY: noop touches nothing.
    unsafe { noop.launch(&s, big, ()) }.unwrap();
    assert_eq!(world.calls("cuLaunchKernel"), 2);
    drop(noop);
    drop((module, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn attributes_and_occupancy() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let f = module.function("saxpy").unwrap();
    assert_eq!(f.name(), "saxpy");
    assert_eq!(f.max_threads_per_block().unwrap(), 1024);
    assert_eq!(f.num_registers().unwrap(), 32);
    assert_eq!(f.static_shared_mem_bytes().unwrap(), 0);
    assert_eq!(f.max_dynamic_shared_mem().unwrap(), 48 << 10);
    assert_eq!(f.ptx_version().unwrap(), (9, 0));
    assert_eq!(f.binary_version().unwrap(), (9, 0));
    assert_eq!(f.max_active_blocks_per_multiprocessor(256, 0).unwrap(), 8);
    assert_eq!(f.max_active_blocks_per_multiprocessor(1024, 0).unwrap(), 2);
    assert_eq!(
        f.max_active_blocks_per_multiprocessor(64, 40 << 10)
            .unwrap(),
        5
    );
    assert_eq!(
        f.max_potential_block_size(0, 0).unwrap(),
        BlockSize {
            min_grid_size: 2 * 132,
            block_size: 1024
        }
    );
    assert_eq!(
        f.max_potential_block_size(0, 256).unwrap(),
        BlockSize {
            min_grid_size: 8 * 132,
            block_size: 256
        }
    );
    let sizes: Vec<usize> = f.param_info().unwrap().iter().map(|p| p.size).collect();
    assert_eq!(sizes, [4, 4, 8, 8]);
    // The name asked for is in the error (a typo shows), and the simulated driver lists
    // the kernels the image has.
    let e = module.function("missing").unwrap_err();
    assert_eq!(
        e,
        Error::Lookup {
            call: "cuModuleGetFunction",
            symbol: "missing".into(),
            code: cuda_hal::cuda_sys::CUresult::CUDA_ERROR_NOT_FOUND,
            name: "CUDA_ERROR_NOT_FOUND".into(),
            message: "simulated driver: not found: the image declares no kernel \"missing\" \
                      (its .entry kernels: add_table, axpb, noop, saxpy)"
                .into(),
        }
    );
    assert_eq!(
        e.to_string(),
        "cuModuleGetFunction(\"missing\") failed: CUDA_ERROR_NOT_FOUND (500): simulated driver: \
         not found: the image declares no kernel \"missing\" (its .entry kernels: add_table, \
         axpb, noop, saxpy)"
    );
    assert!(matches!(
        module.function("a\0b"),
        Err(Error::InvalidArgument {
            what: "Module::function",
            ..
        })
    ));
    drop(f);
    drop((module, ctx, cuda));
    assert_clean(&world);
}

/// A 12.0 driver cannot tell a kernel's parameters: `param_info` is unsupported, naming
/// 12.4, and launches go without the argument check.
#[test]
fn without_param_info_launches_are_not_checked_against_parameters() {
    let (cuda, world) = kernels(MockDriver::with_devices(1))
        .version(12000)
        .build_with(Cuda::from_driver)
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    match saxpy.param_info() {
        Err(Error::Unsupported {
            feature, needed, ..
        }) => {
            assert_eq!((feature, needed.as_str()), ("cuFuncGetParamInfo", "12.4"))
        }
        other => panic!("{other:?}"),
    }
    let s = Stream::new(&ctx).unwrap();
    let x = DeviceBuffer::from_slice(&ctx, &[1.0f32]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[1.0f32]).unwrap();
    // SAFETY: the right arguments for saxpy over one float.
    unsafe { saxpy.launch(&s, LaunchConfig::linear(1, 1), (1u32, 5.0f32, &x, &mut y)) }.unwrap();
    s.synchronize().unwrap();
    assert_eq!(y.to_vec().unwrap(), [6.0]);
    drop(saxpy);
    drop((module, x, y, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn module_globals_are_device_memory_that_keeps_the_module() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let mut table: Global<'_, f32> = module.global("table").unwrap();
    assert_eq!(table.len(), 4);
    assert_eq!(table.to_vec().unwrap(), [0.0; 4], "zeroed at load");
    table.copy_from_host(&[1.0, 2.0, 3.0, 4.0]).unwrap();
    let add = module.function("add_table").unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut x = DeviceBuffer::from_slice(&ctx, &[10.0f32; 4]).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    // SAFETY: add_table reads n floats of the table and reads and writes n floats of x.
    unsafe { add.launch(&s, LaunchConfig::linear(1, 4), (&mut x, &table, 4u32)) }.unwrap();
    let graph = s.end_capture().unwrap();
    let exec = graph.instantiate().unwrap();
    drop((graph, add, table));
    drop(module);
    assert_eq!(
        world.live().modules,
        1,
        "the graph holds the module and its global"
    );
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(x.to_vec().unwrap(), [11.0, 12.0, 13.0, 14.0]);
    drop(exec);
    // The same 16 bytes as other element types: whole numbers of them, or an error.
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    assert_eq!(module.global::<f64>("table").unwrap().len(), 2);
    assert_eq!(
        module.global::<Coef>("table").unwrap_err(),
        Error::InvalidArgument {
            what: "global",
            problem: "the global table is 16 bytes, not a whole number of 12-byte elements".into()
        }
    );
    drop((module, x, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn libraries_give_a_function_per_context() {
    let (cuda, world, ctx0) = rig();
    let lib = Library::from_ptx(&cuda, PTX).unwrap();
    assert_eq!(world.live().libraries, 1);
    let saxpy = lib.kernel("saxpy").unwrap();
    assert_eq!(saxpy.name(), "saxpy");
    let e = lib.kernel("missing").unwrap_err();
    assert!(
        matches!(&e, Error::Lookup { call: "cuLibraryGetKernel", code, symbol, .. }
            if *code == cuda_hal::cuda_sys::CUresult::CUDA_ERROR_NOT_FOUND && symbol == "missing"),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "cuLibraryGetKernel(\"missing\") failed: CUDA_ERROR_NOT_FOUND (500): simulated driver: \
         not found: the image declares no kernel \"missing\" (its .entry kernels: add_table, \
         axpb, noop, saxpy)"
    );
    let mut results = Vec::new();
    for device in cuda.devices().unwrap() {
        let ctx = device.primary_context().unwrap();
        let f = saxpy.function(&ctx).unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let x = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0]).unwrap();
        let mut y = DeviceBuffer::from_slice(&ctx, &[device.ordinal() as f32; 2]).unwrap();
        // SAFETY: saxpy reads and writes 2 floats.
        unsafe { f.launch(&s, LaunchConfig::linear(1, 2), (2u32, 3.0f32, &x, &mut y)) }.unwrap();
        s.synchronize().unwrap();
        results.push(y.to_vec().unwrap());
        let table = lib.global::<u32>(&ctx, "table").unwrap();
        assert_eq!(table.to_vec().unwrap(), [0; 4]);
    }
    assert_eq!(results, [[3.0, 6.0], [4.0, 7.0]]);
    drop(saxpy);
    drop(lib);
    assert_eq!(world.live().libraries, 0);
    drop((ctx0, cuda));
    assert_clean(&world);
}

#[test]
fn an_injected_launch_failure_is_the_drivers_error() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let noop = module.function("noop").unwrap();
    let s = Stream::new(&ctx).unwrap();
    world.fail_next(
        "cuLaunchKernel",
        cuda_hal::cuda_sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    );
    // SAFETY: noop touches nothing.
    let e = unsafe { noop.launch(&s, LaunchConfig::linear(1, 1), ()) }.unwrap_err();
    assert!(
        matches!(e, Error::Driver { call: "cuLaunchKernel", ref name, .. } if name == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
        "{e}"
    );
    // SAFETY: as above.
    unsafe { noop.launch(&s, LaunchConfig::linear(1, 1), ()) }.unwrap();
    assert_eq!(world.calls("cuLaunchKernel"), 2);
    drop(noop);
    drop((module, s, ctx, cuda));
    assert_clean(&world);
}

#[test]
fn debug_output_names_what_matters() {
    let (cuda, _world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let f = module.function("noop").unwrap();
    assert_eq!(format!("{f:?}"), "Function { name: \"noop\", device: 0 }");
    assert_eq!(format!("{module:?}"), "Module { device: 0 }");
    let lib = Library::from_ptx(&cuda, PTX).unwrap();
    assert_eq!(
        format!("{:?}", lib.kernel("noop").unwrap()),
        "Kernel { name: \"noop\" }"
    );
    assert_eq!(format!("{lib:?}"), "Library { .. }");
    let g = module.global::<u32>("table").unwrap();
    assert!(format!("{g:?}").contains("len: 4"), "{g:?}");
}

/// The raw handles are the driver's own: direct driver calls with them find the same
/// functions, kernels and globals.
#[test]
fn raw_handles_work_in_driver_calls() {
    let (cuda, world, ctx) = rig();
    let fns = cuda.fns();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let table = module.global::<u32>("table").unwrap();
    let lib = Library::from_ptx(&cuda, PTX).unwrap();
    let kernel = lib.kernel("noop").unwrap();
    let noop = kernel.function(&ctx).unwrap();
    let _g = ctx.bind().unwrap();
    let (mut f, mut k, mut lf) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let (mut ptr, mut bytes) = (0, 0);
    // SAFETY: valid out-pointers and NUL-terminated names; the handles are alive (their
    // owners are borrowed) and the context is current.
    let rcs = unsafe {
        [
            (fns.cuModuleGetFunction)(&mut f, module.as_raw(), c"saxpy".as_ptr()),
            (fns.cuModuleGetGlobal)(&mut ptr, &mut bytes, module.as_raw(), c"table".as_ptr()),
            (fns.cuLibraryGetKernel)(&mut k, lib.as_raw(), c"noop".as_ptr()),
            (fns.cuKernelGetFunction)(&mut lf, kernel.as_raw()),
        ]
    };
    assert_eq!(rcs, [cuda_hal::cuda_sys::CUresult::CUDA_SUCCESS; 4]);
    assert!(!f.is_null() && !k.is_null() && !lf.is_null());
    // The driver hands out one handle per name.
    assert_eq!(f, saxpy.as_raw());
    assert_eq!((ptr, bytes), (table.as_raw(), 16));
    assert_ne!(ptr, 0);
    assert_eq!(k, kernel.as_raw());
    assert_eq!(lf, noop.as_raw());
    drop(_g);
    drop((saxpy, table, noop, kernel));
    drop((module, lib, ctx, cuda));
    assert_clean(&world);
}

/// Every attribute query reports the driver's failure, not a made-up value.
#[test]
fn attribute_queries_report_driver_failures() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let f = module.function("saxpy").unwrap();
    let failed = |e: Error| match e {
        Error::Driver { call, name, .. } => (call, name),
        other => panic!("{other:?}"),
    };
    let oom = cuda_hal::cuda_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    let expected = ("cuFuncGetAttribute", "CUDA_ERROR_OUT_OF_MEMORY".to_string());
    world.fail_next("cuFuncGetAttribute", oom);
    assert_eq!(failed(f.static_shared_mem_bytes().unwrap_err()), expected);
    world.fail_next("cuFuncGetAttribute", oom);
    assert_eq!(failed(f.num_registers().unwrap_err()), expected);
    world.fail_next("cuFuncGetAttribute", oom);
    assert_eq!(failed(f.max_dynamic_shared_mem().unwrap_err()), expected);
    world.fail_next("cuFuncGetAttribute", oom);
    assert_eq!(failed(f.ptx_version().unwrap_err()), expected);
    world.fail_next("cuFuncGetAttribute", oom);
    assert_eq!(failed(f.binary_version().unwrap_err()), expected);
    assert_eq!(f.static_shared_mem_bytes().unwrap(), 0);
    drop(f);
    drop((module, ctx, cuda));
    assert_clean(&world);
}

/// A block of exactly the kernel's most threads is allowed.
#[test]
fn a_block_of_the_most_threads_launches() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let noop = module.function("noop").unwrap();
    let s = Stream::new(&ctx).unwrap();
    let full = LaunchConfig::new([2, 1, 1], [32, 16, 2]);
    assert_eq!(full.threads_per_block(), 1024);
    // SAFETY: noop touches nothing.
    unsafe { noop.launch(&s, full, ()) }.unwrap();
    s.synchronize().unwrap();
    assert_eq!(world.calls("cuLaunchKernel"), 1);
    drop(noop);
    drop((module, s, ctx, cuda));
    assert_clean(&world);
}

/// A global used only by a copy (no launch of its module's kernels) keeps the module
/// loaded for a graph that captured the copy.
#[test]
fn a_captured_copy_of_a_global_keeps_the_module() {
    let (cuda, world, ctx) = rig();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let mut table: Global<'_, u32> = module.global("table").unwrap();
    assert!(!table.is_empty());
    table.copy_from_host(&[5, 6, 7, 8]).unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    out.copy_from_async(&table, &s).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.dependencies(), 2, "the module and the buffer");
    let exec = graph.instantiate().unwrap();
    drop((graph, table));
    drop(module);
    assert_eq!(world.live().modules, 1, "held by the graph");
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [5, 6, 7, 8]);
    drop(exec);
    assert_eq!(world.live().modules, 0);
    drop((out, s, ctx, cuda));
    assert_clean(&world);
}

/// A global of no bytes is an empty slice of any element type.
#[test]
fn an_empty_global() {
    let (cuda, world) = MockDriver::with_devices(1)
        .global("none", 0)
        .build_with(Cuda::from_driver)
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let none = module.global::<f64>("none").unwrap();
    assert_eq!(none.len(), 0);
    assert!(none.is_empty());
    assert_eq!(none.to_vec().unwrap(), Vec::<f64>::new());
    drop(none);
    drop((module, ctx, cuda));
    assert_clean(&world);
}

/// What an NCCL registration holds through `DeviceSlice::keep_alive`: the memory of a
/// buffer, of a view of one, and a module's global outlive their owners while it is held.
#[test]
fn keep_alive_holds_the_memory_past_its_owner() {
    use cuda_hal::DeviceSlice;
    let (cuda, world, ctx) = rig();
    let buf = DeviceBuffer::from_slice(&ctx, &[1u32, 2, 3]).unwrap();
    let held = DeviceSlice::keep_alive(&buf).expect("a buffer can be held");
    let view_held = DeviceSlice::keep_alive(&buf.slice(1..).unwrap()).expect("so can its views");
    drop(buf);
    assert_eq!(
        world.live().device_allocations,
        1,
        "held by the keep-alives"
    );
    drop(held);
    assert_eq!(
        world.live().device_allocations,
        1,
        "still held by the view's"
    );
    drop(view_held);
    assert_eq!(world.live().device_allocations, 0);

    let module = Module::from_ptx(&ctx, PTX).unwrap();
    let held = DeviceSlice::keep_alive(&module.global::<u32>("table").unwrap())
        .expect("a global can be held");
    drop(module);
    assert_eq!(world.live().modules, 1, "the global holds its module");
    drop(held);
    assert_eq!(world.live().modules, 0);
    drop((ctx, cuda));
    assert_clean(&world);
}

/// A kernel the image declares but no host twin is bound for: the simulated driver names
/// it, says that no twin is bound and how to bind one; the error keeps the raw status.
#[test]
fn a_kernel_without_a_host_twin_is_named_with_how_to_bind_one() {
    let (cuda, world, ctx) = rig();
    let ptx = format!("{PTX}.visible .entry unbound(.param .u64 x) {{ ret; }}\n");
    let twin = "simulated driver: not found: kernel \"unbound\" is in the image but no host \
                twin is bound for it; bind one with MockDriver::kernel(\"unbound\", &[parameter \
                sizes], |call| ...) before the build, or MockWorld::bind_kernel after it (a \
                program on the drop-in library: simgpu_bind_kernel)";
    let module = Module::from_ptx(&ctx, &ptx).unwrap();
    assert_eq!(
        module.function("unbound").unwrap_err(),
        Error::Lookup {
            call: "cuModuleGetFunction",
            symbol: "unbound".into(),
            code: cuda_hal::cuda_sys::CUresult::CUDA_ERROR_NOT_FOUND,
            name: "CUDA_ERROR_NOT_FOUND".into(),
            message: twin.into(),
        }
    );
    let lib = Library::from_ptx(&cuda, &ptx).unwrap();
    assert_eq!(
        lib.kernel("unbound").unwrap_err().to_string(),
        format!("cuLibraryGetKernel(\"unbound\") failed: CUDA_ERROR_NOT_FOUND (500): {twin}")
    );
    // A global that is not bound is named too.
    assert_eq!(
        module.global::<u32>("tabel").unwrap_err().to_string(),
        "cuModuleGetGlobal(\"tabel\") failed: CUDA_ERROR_NOT_FOUND (500): simulated driver: not \
         found: the module has no global \"tabel\"; bind one with MockDriver::global(\"tabel\", \
         bytes) before the build, or MockWorld::bind_global before the module is loaded"
    );
    // Bound afterwards, it is found; the detail does not outlive its failure.
    world.bind_kernel("unbound", &[8], |_| {});
    assert_eq!(module.function("unbound").unwrap().name(), "unbound");
    drop((lib, module, ctx, cuda));
    assert_clean(&world);
}
