//! Modules, libraries and kernel launches on a real GPU (`#[ignore]`d; run with
//! `--include-ignored` on the GPU machine): the driver's answers to what the mock
//! simulates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_hal::{
    CaptureMode, Cuda, DeviceBuffer, Error, LaunchConfig, Library, Module, ParamInfo, Stream,
};

/// `y[i] = a * x[i] + y[i]` for `i < n`, written by hand for PTX ISA 7.8 (sm_80 and later).
const SAXPY: &str = r#"
.version 7.8
.target sm_80
.address_size 64

.visible .entry saxpy(
    .param .u64 saxpy_x,
    .param .u64 saxpy_y,
    .param .f32 saxpy_a,
    .param .u32 saxpy_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [saxpy_x];
    ld.param.u64 %rd2, [saxpy_y];
    ld.param.f32 %f1, [saxpy_a];
    ld.param.u32 %r2, [saxpy_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd3, %rd5;
    ld.global.f32 %f2, [%rd6];
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f3, [%rd7];
    fma.rn.f32 %f4, %f1, %f2, %f3;
    st.global.f32 [%rd7], %f4;
DONE:
    ret;
}
"#;

#[test]
#[ignore = "needs a GPU"]
fn saxpy_on_whole_buffers_and_views_with_checked_arguments() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, SAXPY).unwrap();
    let f = module.function("saxpy").unwrap();
    println!(
        "saxpy: {} registers, max {} threads/block, PTX {:?} binary {:?}",
        f.num_registers().unwrap(),
        f.max_threads_per_block().unwrap(),
        f.ptx_version().unwrap(),
        f.binary_version().unwrap()
    );
    let params = f.param_info().unwrap();
    assert_eq!(
        params,
        [
            ParamInfo { offset: 0, size: 8 },
            ParamInfo { offset: 8, size: 8 },
            ParamInfo {
                offset: 16,
                size: 4
            },
            ParamInfo {
                offset: 20,
                size: 4
            },
        ]
    );
    let n = 1 << 20;
    let hx: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = DeviceBuffer::from_slice(&ctx, &hx).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &vec![1.0f32; n]).unwrap();
    // SAFETY: saxpy reads n floats of x and reads and writes n floats of y.
    unsafe {
        f.launch(
            &s,
            LaunchConfig::for_elements(n, 256),
            (&x, &mut y, 2.0f32, n as u32),
        )
        .unwrap()
    };
    // The second half again, through views: elements n/2.. get 3 * x more.
    let (_, mut hi) = y.split_at_mut(n / 2).unwrap();
    let xs = x.slice(n / 2..).unwrap();
    // SAFETY: as above, over the n/2 elements of both views.
    unsafe {
        f.launch(
            &s,
            LaunchConfig::for_elements(n / 2, 256),
            (xs, &mut hi, 3.0f32, (n / 2) as u32),
        )
        .unwrap()
    };
    s.synchronize().unwrap();
    let got = y.to_vec().unwrap();
    for i in [0, 1, n / 2 - 1, n / 2, n - 1] {
        let want = 1.0 + 2.0 * i as f32 + if i >= n / 2 { 3.0 * i as f32 } else { 0.0 };
        assert_eq!(got[i], want, "element {i}");
    }
    // Checked before the driver is called.
    // SAFETY: refused before any launch.
    let e = unsafe { f.launch(&s, LaunchConfig::linear(1, 32), (&x, &mut y, 2.0f32)) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::KernelArgumentCount {
                expected: 4,
                got: 3,
                ..
            }
        ),
        "{e}"
    );
    // SAFETY: refused before any launch.
    let e = unsafe { f.launch(&s, LaunchConfig::linear(1, 32), (&x, &mut y, 2.0f64, 1u32)) }
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::KernelArgumentSize {
                index: 2,
                expected: 4,
                got: 8,
                ..
            }
        ),
        "{e}"
    );
    // SAFETY: refused before any launch.
    let e = unsafe {
        f.launch(
            &s,
            LaunchConfig::linear(1, 2048),
            (&x, &mut y, 2.0f32, 1u32),
        )
    }
    .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidLaunchConfig { kernel, config, problem }
            if kernel == "saxpy"
                && *config == LaunchConfig::linear(1, 2048)
                && problem.starts_with("2048 threads per block; the kernel allows at most ")),
        "{e}"
    );
    let occ = f.max_active_blocks_per_multiprocessor(256, 0).unwrap();
    let best = f.max_potential_block_size(0, 0).unwrap();
    println!(
        "occupancy: {occ} blocks of 256 per SM; best block {} threads, min grid {}",
        best.block_size, best.min_grid_size
    );
    assert!(occ >= 1 && best.block_size >= 32);
}

/// A graph that launches a kernel, replayed after the module and buffers were dropped.
#[test]
#[ignore = "needs a GPU"]
fn a_graph_keeps_its_module_and_memory() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let module = Module::from_ptx(&ctx, SAXPY).unwrap();
    let x = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0]).unwrap();
    let mut y = DeviceBuffer::from_slice(&ctx, &[0.0f32; 3]).unwrap();
    let mut out = DeviceBuffer::<f32>::zeroed(&ctx, 3).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    {
        let f = module.function("saxpy").unwrap();
        // SAFETY: 3 floats each, a grid of 32 threads guarded by n.
        unsafe { f.launch(&s, LaunchConfig::linear(1, 32), (&x, &mut y, 1.0f32, 3u32)) }.unwrap();
    }
    out.copy_from_async(&y, &s).unwrap();
    let exec = s.end_capture().unwrap().instantiate().unwrap();
    drop((module, x, y));
    for _ in 0..3 {
        exec.launch(&s).unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [3.0, 6.0, 9.0]);
}

#[test]
#[ignore = "needs a GPU"]
fn a_library_gives_a_function_per_context() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let lib = Library::from_ptx(&cuda, SAXPY).unwrap();
    let kernel = lib.kernel("saxpy").unwrap();
    for d in 0..cuda.device_count().unwrap().min(2) {
        let ctx = cuda.device(d).unwrap().primary_context().unwrap();
        let s = Stream::new(&ctx).unwrap();
        let f = kernel.function(&ctx).unwrap();
        let x = DeviceBuffer::from_slice(&ctx, &[1.0f32; 4]).unwrap();
        let mut y = DeviceBuffer::from_slice(&ctx, &[d as f32; 4]).unwrap();
        // SAFETY: 4 floats each, guarded by n.
        unsafe { f.launch(&s, LaunchConfig::linear(1, 64), (&x, &mut y, 5.0f32, 4u32)) }.unwrap();
        s.synchronize().unwrap();
        assert_eq!(y.to_vec().unwrap(), [5.0 + d as f32; 4], "device {d}");
    }
    // The driver's documented status for a name the library does not have.
    let e = lib.kernel("nope").unwrap_err();
    assert!(
        matches!(&e, Error::Lookup { call: "cuLibraryGetKernel", code, symbol, .. }
            if *code == cuda_hal::cuda_sys::CUresult::CUDA_ERROR_NOT_FOUND && symbol == "nope"),
        "{e}"
    );
}
