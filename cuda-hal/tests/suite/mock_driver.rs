//! cuda-hal on the simulated driver: selectors, properties, contexts, streams, events,
//! memory, every error path, and no live handle left after each test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cuda_hal::{
    Cuda, DeviceBuffer, DeviceSelector, DeviceUuid, Error, Event, MemoryInfo, PinnedBuffer, Stream,
};
use cuda_mock::{MockDevice, MockDriver, MockWorld};
use cuda_sys::CUresult;

fn mock(builder: MockDriver) -> (Cuda, MockWorld) {
    let (driver, world) = builder.build().unwrap();
    (Cuda::from_driver(driver).unwrap(), world)
}

fn two() -> (Cuda, MockWorld) {
    mock(MockDriver::with_devices(2))
}

/// Runs `f` with a two-device mock and checks that nothing leaked afterwards.
fn leak_checked(f: impl FnOnce(&Cuda, &MockWorld)) {
    let (cuda, world) = two();
    f(&cuda, &world);
    drop(cuda);
    assert!(world.live().is_empty(), "leaked: {:?}", world.live());
    assert_eq!(
        world.order_violations(),
        0,
        "a context was released before its children"
    );
    let v = world.violations();
    assert!(
        v.is_empty(),
        "the simulated GPU saw invalid accesses:\n{}",
        v.join("\n")
    );
}

const UUID_A: [u8; 16] = [
    0x5f, 0xdb, 0x05, 0x6c, 0x53, 0x7e, 0x3b, 0xd5, 0x1c, 0x80, 0xb2, 0x03, 0x94, 0x99, 0xe8, 0xe9,
];

#[test]
fn uuid_display_matches_nvidia_smi_and_parsing_tolerates_case() {
    let u = DeviceUuid(UUID_A);
    assert_eq!(u.to_string(), "GPU-5fdb056c-537e-3bd5-1c80-b2039499e8e9");
    for text in [
        "GPU-5fdb056c-537e-3bd5-1c80-b2039499e8e9",
        "gpu-5FDB056C-537E-3BD5-1C80-B2039499E8E9",
        "5fdb056c-537e-3bd5-1c80-b2039499e8e9",
        "5fdb056c537e3bd51c80b2039499e8e9",
        "MIG-5fdb056c-537e-3bd5-1c80-b2039499e8e9",
    ] {
        assert_eq!(text.parse::<DeviceUuid>().unwrap(), u, "{text}");
    }
}

#[test]
fn malformed_uuids_say_what_is_wrong() {
    for (text, needle) in [
        ("GPU-5fdb056c", "hex digits"),
        ("GPU-5fdb056c-537e-3bd5-1c80-b2039499e8e", "8-4-4-4-12"),
        ("GPU-5fdb056c537e-3bd5-1c80-b2039499e8e9-", "8-4-4-4-12"),
        (
            "GPU-zzdb056c-537e-3bd5-1c80-b2039499e8e9",
            "not hexadecimal",
        ),
        ("", "0 hex digits"),
        ("GPU-5fdb056c-537e-3bd5-1c80-b2039499e8é", "not hexadecimal"),
        ("GPU-5fdb056c-537e-3bd5-1c80-b2039499e8éé", "8-4-4-4-12"),
    ] {
        let e = text.parse::<DeviceUuid>().unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUuid { input, .. } if input == text),
            "{text}: {e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(needle) && msg.contains("GPU-xxxxxxxx"),
            "{text}: {msg}"
        );
    }
}

#[test]
fn every_selector_form_parses() {
    use DeviceSelector::*;
    assert_eq!("cuda://".parse::<DeviceSelector>().unwrap(), Default);
    assert_eq!("cuda://0".parse::<DeviceSelector>().unwrap(), Ordinal(0));
    assert_eq!("CUDA://12".parse::<DeviceSelector>().unwrap(), Ordinal(12));
    let u = "cuda://GPU-5fdb056c-537e-3bd5-1c80-b2039499e8e9";
    assert_eq!(
        u.parse::<DeviceSelector>().unwrap(),
        Uuid(DeviceUuid(UUID_A))
    );
    let m = "cuda://MIG-5FDB056C-537E-3BD5-1C80-B2039499E8E9";
    assert_eq!(
        m.parse::<DeviceSelector>().unwrap(),
        Uuid(DeviceUuid(UUID_A))
    );
    for pci in [
        "cuda://0000:18:00.0",
        "cuda://00000000:18:00.0",
        "cuda://18:00.0",
    ] {
        match pci.parse::<DeviceSelector>().unwrap() {
            PciBusId(p) => assert_eq!((p.domain, p.bus, p.device, p.function), (0, 0x18, 0, 0)),
            other => panic!("{pci}: {other:?}"),
        }
    }
    // Display round-trips.
    for s in ["cuda://", "cuda://3", u, "cuda://00000000:18:00.0"] {
        let p: DeviceSelector = s.parse().unwrap();
        assert_eq!(p.to_string().parse::<DeviceSelector>().unwrap(), p);
    }
}

#[test]
fn every_malformed_selector_is_an_error_naming_the_expected_forms() {
    for bad in [
        "",
        "cuda:",
        "cuda:/0",
        "gpu://0",
        "cuda://-1",
        "cuda://abc",
        "cuda://0 ",
        " cuda://0",
        "cuda://1.5",
        "cuda://99999999999999999999999999",
        "cuda://GPU-",
        "cuda://GPU-1234",
        "cuda://GPU-5fdb056c-537e-3bd5-1c80-b2039499e8e9x",
        "cuda://0000:18:00",
        "cuda://0000:18:00.9",
        "cuda://0000:18:zz.0",
        "cuda://0000:118:00.0",
        "cuda://:18:00.0",
        "cuda://0:0:0:0.0",
    ] {
        let e = bad.parse::<DeviceSelector>().unwrap_err();
        assert!(
            matches!(&e, Error::InvalidSelector { input, .. } if input == bad),
            "{bad:?}: {e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("cuda://<ordinal>") && msg.contains("cuda://GPU-<uuid>"),
            "{bad:?}: {msg}"
        );
    }
}

#[test]
fn selection_by_index_uuid_pci_and_default() {
    leak_checked(|cuda, _| {
        assert_eq!(cuda.device_count().unwrap(), 2);
        let d1 = cuda.select("cuda://1").unwrap();
        assert_eq!(d1.ordinal(), 1);
        let by_uuid = cuda
            .select(&format!("cuda://{}", d1.uuid().unwrap()))
            .unwrap();
        assert_eq!(by_uuid, d1);
        let upper = format!("cuda://{}", d1.uuid().unwrap()).to_uppercase();
        assert_eq!(
            cuda.select(&upper.replace("CUDA://", "cuda://")).unwrap(),
            d1
        );
        let by_pci = cuda
            .select(&format!("cuda://{}", d1.pci_bus_id().unwrap()))
            .unwrap();
        assert_eq!(by_pci, d1);
        assert_eq!(cuda.select("cuda://").unwrap().ordinal(), 0);
    });
}

#[test]
fn a_selector_matching_nothing_lists_the_devices() {
    leak_checked(|cuda, _| {
        for sel in [
            "cuda://2",
            "cuda://GPU-00000000-0000-0000-0000-000000000000",
            "cuda://MIG-00000000-0000-0000-0000-000000000000",
            "cuda://gpu-00000000000000000000000000000000",
            "cuda://0000:99:00.0",
        ] {
            let e = cuda.select(sel).unwrap_err();
            let Error::NoSuchDevice {
                available,
                selector,
            } = &e
            else {
                panic!("{sel}: {e}")
            };
            // The selector as the user wrote it (a MIG UUID was once shown as GPU-...).
            assert_eq!(selector, sel);
            assert_eq!(available.len(), 2);
            let msg = e.to_string();
            assert!(
                msg.contains("GPU 0: Mock GPU 0 (UUID: GPU-") && msg.contains("GPU 1:"),
                "{msg}"
            );
        }
    });
}

#[test]
fn uuids_sharing_a_long_prefix_are_told_apart() {
    // 15 equal bytes; only the last differs.
    let mut a = UUID_A;
    let mut b = UUID_A;
    a[15] = 0x01;
    b[15] = 0x02;
    let (cuda, world) = mock(
        MockDriver::new()
            .device(MockDevice::new("A").uuid(a))
            .device(MockDevice::new("B").uuid(b)),
    );
    assert_eq!(
        cuda.select(&format!("cuda://{}", DeviceUuid(b)))
            .unwrap()
            .ordinal(),
        1
    );
    assert_eq!(
        cuda.select(&format!("cuda://{}", DeviceUuid(a)))
            .unwrap()
            .ordinal(),
        0
    );
    let mut c = UUID_A;
    c[15] = 0x03;
    assert!(matches!(
        cuda.select(&format!("cuda://{}", DeviceUuid(c))),
        Err(Error::NoSuchDevice { .. })
    ));
    // A prefix of a UUID is not a UUID.
    assert!(matches!(
        cuda.select("cuda://GPU-5fdb056c-537e-3bd5-1c80-b2039499e8"),
        Err(Error::InvalidSelector { .. })
    ));
    drop(cuda);
    assert!(world.live().is_empty());
}

#[test]
fn properties_come_from_the_driver() {
    let (cuda, _w) = mock(
        MockDriver::new().device(
            MockDevice::new("NVIDIA H200")
                .memory(141 << 30)
                .compute_capability(9, 0)
                .pci(0, 0x3b, 0),
        ),
    );
    let d = cuda.device(0).unwrap();
    assert_eq!(d.name().unwrap(), "NVIDIA H200");
    assert_eq!(d.total_memory().unwrap(), 141 << 30);
    assert_eq!(d.compute_capability().unwrap(), (9, 0));
    assert_eq!(d.pci_bus_id().unwrap().to_string(), "00000000:3B:00.0");
    assert!(
        d.describe()
            .unwrap()
            .starts_with("GPU 0: NVIDIA H200 (UUID: GPU-")
    );
    assert_eq!(cuda.version().to_string(), "13.0");
}

#[test]
fn bind_makes_current_and_restores() {
    leak_checked(|cuda, world| {
        let c0 = cuda.device(0).unwrap().primary_context().unwrap();
        let c1 = cuda.device(1).unwrap().primary_context().unwrap();
        assert_eq!(world.current_device(), None);
        {
            let _g0 = c0.bind().unwrap();
            assert_eq!(world.current_device(), Some(0));
            {
                let _g1 = c1.bind().unwrap();
                assert_eq!(world.current_device(), Some(1));
            }
            assert_eq!(world.current_device(), Some(0));
        }
        assert_eq!(world.current_device(), None);
        assert_eq!(world.live().context_retains, 2);
    });
}

#[test]
fn two_devices_from_one_thread() {
    leak_checked(|cuda, world| {
        let c0 = cuda.device(0).unwrap().primary_context().unwrap();
        let c1 = cuda.device(1).unwrap().primary_context().unwrap();
        let data: Vec<u32> = (0..1000).collect();
        let a = DeviceBuffer::from_slice(&c0, &data).unwrap();
        let mut b = DeviceBuffer::<u32>::alloc(&c1, 1000).unwrap();
        assert_eq!(a.device().ordinal(), 0);
        assert_eq!(b.device().ordinal(), 1);
        assert_eq!(world.device_range(b.as_raw(), 4000), Some(1));
        b.copy_from(&a).unwrap();
        assert_eq!(b.to_vec().unwrap(), data);
        assert_eq!(world.used_memory(0), 4000);
        assert_eq!(world.used_memory(1), 4000);
    });
}

#[test]
fn round_trips_sync_and_stream_ordered() {
    leak_checked(|cuda, _| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let host: Vec<f64> = (0..4096).map(|i| i as f64 * 0.5).collect();
        let mut d = DeviceBuffer::<f64>::alloc_on(&s, host.len()).unwrap();
        d.copy_from_host_on(&host, &s).unwrap();
        let mut back = vec![0.0; host.len()];
        d.copy_to_host_on(&mut back, &s).unwrap();
        assert_eq!(back, host);
        let mut e = DeviceBuffer::<f64>::alloc(&ctx, host.len()).unwrap();
        e.copy_from_on(&d, &s).unwrap();
        assert_eq!(e.to_vec().unwrap(), host);
        let mut pinned = PinnedBuffer::<f64>::zeroed(&ctx, host.len()).unwrap();
        assert!(pinned.iter().all(|&x| x == 0.0));
        e.copy_to_host_on(&mut pinned, &s).unwrap();
        assert_eq!(&pinned[..], &host[..]);
        assert!(s.is_idle().unwrap());
    });
}

#[test]
fn fresh_memory_is_not_zero_and_fill_sets_every_element() {
    leak_checked(|cuda, _| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let raw = DeviceBuffer::<u8>::alloc(&ctx, 8).unwrap();
        assert_eq!(
            raw.to_vec().unwrap(),
            [0xA5; 8],
            "mock marks uninitialised memory"
        );
        assert_eq!(
            DeviceBuffer::<i32>::zeroed(&ctx, 5)
                .unwrap()
                .to_vec()
                .unwrap(),
            [0; 5]
        );
        let mut b8 = DeviceBuffer::<i8>::alloc(&ctx, 7).unwrap();
        b8.fill(-3).unwrap();
        assert_eq!(b8.to_vec().unwrap(), [-3; 7]);
        let mut b16 = DeviceBuffer::<u16>::alloc(&ctx, 7).unwrap();
        b16.fill(0x1234).unwrap();
        assert_eq!(b16.to_vec().unwrap(), [0x1234; 7]);
        let mut b32 = DeviceBuffer::<f32>::alloc(&ctx, 7).unwrap();
        b32.fill(2.5).unwrap();
        assert_eq!(b32.to_vec().unwrap(), [2.5; 7]);
        let mut b64 = DeviceBuffer::<f64>::alloc(&ctx, 7).unwrap();
        b64.fill(-1.25).unwrap();
        assert_eq!(b64.to_vec().unwrap(), [-1.25; 7]);
        let mut r64 = DeviceBuffer::<u64>::alloc(&ctx, 3).unwrap();
        r64.fill(0x0101_0101_0101_0101).unwrap();
        assert_eq!(r64.to_vec().unwrap(), [0x0101_0101_0101_0101; 3]);
    });
}

#[test]
fn empty_buffers_work_without_allocating() {
    leak_checked(|cuda, world| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let mut b = DeviceBuffer::<u32>::alloc(&ctx, 0).unwrap();
        b.copy_from_host(&[]).unwrap();
        assert!(b.to_vec().unwrap().is_empty());
        b.fill(1).unwrap();
        assert_eq!(world.calls("cuMemAlloc"), 0);
    });
}

#[test]
fn length_and_device_mismatches_are_typed_errors() {
    leak_checked(|cuda, _| {
        let c0 = cuda.device(0).unwrap().primary_context().unwrap();
        let c1 = cuda.device(1).unwrap().primary_context().unwrap();
        let mut b = DeviceBuffer::<u32>::alloc(&c0, 4).unwrap();
        let e = b.copy_from_host(&[1, 2, 3]).unwrap_err();
        assert_eq!(
            e,
            Error::LengthMismatch {
                what: "copy_from_host",
                buffer: "host",
                expected: 4,
                got: 3
            }
        );
        assert_eq!(
            e.to_string(),
            "copy_from_host: the host buffer must hold 4 elements, it holds 3"
        );
        assert!(matches!(
            b.copy_to_host(&mut [0; 5]),
            Err(Error::LengthMismatch { .. })
        ));
        let other = DeviceBuffer::<u32>::alloc(&c0, 5).unwrap();
        assert!(matches!(
            b.copy_from(&other),
            Err(Error::LengthMismatch { .. })
        ));
        let s1 = Stream::new(&c1).unwrap();
        let e = b.copy_from_host_on(&[1, 2, 3, 4], &s1).unwrap_err();
        assert_eq!(
            e,
            Error::WrongDevice {
                what: "copy_from_host_async",
                object: "stream",
                expected: 0,
                found: 1
            }
        );
        assert_eq!(
            e.to_string(),
            "copy_from_host_async: the stream is on device 1, expected device 0"
        );
        let ev = Event::new(&c0).unwrap();
        assert!(matches!(s1.record(&ev), Err(Error::WrongDevice { .. })));
        assert!(matches!(
            DeviceBuffer::<u64>::alloc(&c0, usize::MAX / 4),
            Err(Error::SizeOverflow { .. })
        ));
    });
}

#[test]
fn out_of_memory_keeps_the_code_name_and_message() {
    let (cuda, world) = mock(MockDriver::new().device(MockDevice::new("small").memory(1 << 20)));
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let e = DeviceBuffer::<u8>::alloc(&ctx, 2 << 20).unwrap_err();
    let Error::Driver {
        call,
        code,
        name,
        message,
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(*call, "cuMemAlloc");
    assert_eq!(*code, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(name, "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(message.contains("out of memory"), "{message}");
    assert!(
        e.to_string()
            .contains("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)"),
        "{e}"
    );
    drop((ctx, cuda));
    assert!(world.live().is_empty());
}

/// Every driver call the safe layer makes, failing once, surfaces as that call's error and
/// leaks nothing.
#[test]
fn every_injected_fault_surfaces_typed_and_leaks_nothing() {
    type Step = fn(&Cuda) -> Result<(), Error>;
    let ctx = |c: &Cuda| c.device(0)?.primary_context();
    let cases: Vec<(&str, Step)> = vec![
        ("cuDeviceGetCount", |c| c.device_count().map(drop)),
        ("cuDeviceGet", |c| c.device(0).map(drop)),
        ("cuDeviceGetName", |c| c.device(0)?.name().map(drop)),
        ("cuDeviceGetUuid", |c| c.device(0)?.uuid().map(drop)),
        ("cuDeviceGetPCIBusId", |c| {
            c.device(0)?.pci_bus_id().map(drop)
        }),
        ("cuDeviceTotalMem", |c| {
            c.device(0)?.total_memory().map(drop)
        }),
        ("cuDeviceGetAttribute", |c| {
            c.device(0)?.compute_capability().map(drop)
        }),
        ("cuDeviceCanAccessPeer", |c| {
            c.device(0)?.can_access_peer(&c.device(1)?).map(drop)
        }),
        ("cuDevicePrimaryCtxRetain", |c| {
            c.device(0)?.primary_context().map(drop)
        }),
        ("cuCtxGetCurrent", |c| {
            c.device(0)?.primary_context()?.bind().map(drop)
        }),
        ("cuCtxPushCurrent", |c| {
            c.device(0)?.primary_context()?.bind().map(drop)
        }),
        ("cuCtxSynchronize", |c| {
            c.device(0)?.primary_context()?.synchronize()
        }),
        ("cuStreamCreate", |c| {
            Stream::new(&c.device(0)?.primary_context()?).map(drop)
        }),
        ("cuStreamSynchronize", |c| {
            Stream::new(&c.device(0)?.primary_context()?)?.synchronize()
        }),
        ("cuStreamQuery", |c| {
            Stream::new(&c.device(0)?.primary_context()?)?
                .is_idle()
                .map(drop)
        }),
        ("cuStreamWaitEvent", |c| {
            let x = c.device(0)?.primary_context()?;
            Stream::new(&x)?.wait_event(&Event::new(&x)?)
        }),
        ("cuEventCreate", |c| {
            Event::new(&c.device(0)?.primary_context()?).map(drop)
        }),
        ("cuEventRecord", |c| {
            let x = c.device(0)?.primary_context()?;
            Event::new(&x)?.record(&Stream::new(&x)?)
        }),
        ("cuEventSynchronize", |c| {
            Event::new(&c.device(0)?.primary_context()?)?.synchronize()
        }),
        ("cuEventQuery", |c| {
            Event::new(&c.device(0)?.primary_context()?)?
                .is_complete()
                .map(drop)
        }),
        ("cuEventElapsedTime", |c| {
            let x = c.device(0)?.primary_context()?;
            let (a, b, s) = (Event::new(&x)?, Event::new(&x)?, Stream::new(&x)?);
            a.record(&s)?;
            b.record(&s)?;
            a.elapsed(&b).map(drop)
        }),
        ("cuMemAlloc", |c| {
            DeviceBuffer::<u8>::alloc(&c.device(0)?.primary_context()?, 8).map(drop)
        }),
        ("cuMemAllocAsync", |c| {
            DeviceBuffer::<u8>::alloc_on(&Stream::new(&c.device(0)?.primary_context()?)?, 8)
                .map(drop)
        }),
        ("cuMemAllocHost", |c| {
            PinnedBuffer::<u8>::zeroed(&c.device(0)?.primary_context()?, 8).map(drop)
        }),
        ("cuMemcpyHtoD", |c| {
            DeviceBuffer::from_slice(&c.device(0)?.primary_context()?, &[1u8]).map(drop)
        }),
        ("cuMemcpyDtoH", |c| {
            DeviceBuffer::from_slice(&c.device(0)?.primary_context()?, &[1u8])?
                .to_vec()
                .map(drop)
        }),
        ("cuMemcpyDtoD", |c| {
            let x = c.device(0)?.primary_context()?;
            DeviceBuffer::from_slice(&x, &[1u8])?.copy_from(&DeviceBuffer::from_slice(&x, &[2u8])?)
        }),
        ("cuMemcpyPeer", |c| {
            let a = DeviceBuffer::from_slice(&c.device(0)?.primary_context()?, &[1u8])?;
            DeviceBuffer::from_slice(&c.device(1)?.primary_context()?, &[2u8])?.copy_from(&a)
        }),
        ("cuMemcpyHtoDAsync", |c| {
            let x = c.device(0)?.primary_context()?;
            DeviceBuffer::<u8>::alloc(&x, 1)?.copy_from_host_on(&[1], &Stream::new(&x)?)
        }),
        ("cuMemcpyDtoHAsync", |c| {
            let x = c.device(0)?.primary_context()?;
            DeviceBuffer::<u8>::zeroed(&x, 1)?.copy_to_host_on(&mut [0], &Stream::new(&x)?)
        }),
        ("cuMemcpyDtoDAsync", |c| {
            let x = c.device(0)?.primary_context()?;
            let a = DeviceBuffer::<u8>::zeroed(&x, 1)?;
            DeviceBuffer::<u8>::alloc(&x, 1)?.copy_from_on(&a, &Stream::new(&x)?)
        }),
        ("cuMemsetD8", |c| {
            DeviceBuffer::<u8>::zeroed(&c.device(0)?.primary_context()?, 4).map(drop)
        }),
        ("cuMemsetD16", |c| {
            DeviceBuffer::<u16>::alloc(&c.device(0)?.primary_context()?, 4)?.fill(0x102)
        }),
        ("cuMemsetD32", |c| {
            DeviceBuffer::<u32>::alloc(&c.device(0)?.primary_context()?, 4)?.fill(7)
        }),
    ];
    for (function, step) in cases {
        let (cuda, world) = two();
        let _ = ctx(&cuda);
        world.fail_next(function, CUresult::CUDA_ERROR_LAUNCH_FAILED);
        let e = step(&cuda).unwrap_err();
        match &e {
            Error::Driver {
                call, code, name, ..
            } => {
                assert_eq!(*call, function, "{e}");
                assert_eq!(*code, CUresult::CUDA_ERROR_LAUNCH_FAILED);
                assert_eq!(name, "CUDA_ERROR_LAUNCH_FAILED");
            }
            other => panic!("{function}: {other}"),
        }
        assert!(world.calls(function) >= 1);
        drop(cuda);
        assert!(
            world.live().is_empty(),
            "{function}: leaked {:?}",
            world.live()
        );
        assert_eq!(world.order_violations(), 0, "{function}");
    }
}

#[test]
fn init_failures_are_errors() {
    let (driver, _w) = MockDriver::new().build().unwrap();
    let e = Cuda::from_driver(driver).unwrap_err();
    assert!(
        matches!(&e, Error::Driver { call: "cuInit", code, .. } if *code == CUresult::CUDA_ERROR_NO_DEVICE),
        "{e}"
    );
    let (driver, w) = MockDriver::with_devices(1).build().unwrap();
    w.fail_next("cuInit", CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
    let e = Cuda::from_driver(driver).unwrap_err();
    assert!(
        matches!(&e, Error::Driver { call: "cuInit", code, name, .. }
            if *code == CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
                && name == "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
        "{e}"
    );
}

#[test]
fn functions_newer_than_the_driver_are_unsupported_with_the_version() {
    let (cuda, _w) = mock(MockDriver::with_devices(1).version(12040));
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let s = Stream::new(&ctx).unwrap();
    let e = s.device_ordinal().unwrap_err();
    assert_eq!(
        e,
        Error::Unsupported {
            feature: "cuStreamGetDevice",
            needed: "12.8".into(),
            found: "12.4".into()
        }
    );
    assert!(e.to_string().contains("needs a CUDA 12.8 driver"), "{e}");
    let (cuda, _w) = mock(MockDriver::with_devices(2).version(12080));
    let ctx = cuda.device(1).unwrap().primary_context().unwrap();
    assert_eq!(Stream::new(&ctx).unwrap().device_ordinal().unwrap(), 1);
}

#[test]
fn events_time_stream_work() {
    leak_checked(|cuda, _| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let s = Stream::new(&ctx).unwrap();
        let (a, b) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
        s.record(&a).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
        let mut d = DeviceBuffer::<u8>::alloc(&ctx, 1 << 20).unwrap();
        d.copy_from_host_on(&vec![1u8; 1 << 20], &s).unwrap();
        s.record(&b).unwrap();
        b.synchronize().unwrap();
        assert!(b.is_complete().unwrap());
        // The simulated events carry the host's clock when recorded: `b` was recorded at
        // least 10 ms after `a`, the same span measured backwards is its exact negative,
        // and an event measured against itself spans exactly 0.
        let d = a.elapsed(&b).unwrap();
        assert!(d >= std::time::Duration::from_millis(10), "{d:?}");
        assert_eq!(a.elapsed(&a).unwrap(), std::time::Duration::ZERO);
        // Backwards the driver gives a negative time: an error with that value, no panic.
        match b.elapsed(&a).unwrap_err() {
            Error::InvalidElapsed { ms } => {
                assert!(ms <= -10.0, "{ms}");
                let ns = (f64::from(-ms) * 1e6).round() as u64;
                assert_eq!(a.elapsed(&b).unwrap().as_nanos(), u128::from(ns));
            }
            e => panic!("{e}"),
        }
        let nt = Event::without_timing(&ctx).unwrap();
        s.record(&nt).unwrap();
        let e = a.elapsed(&nt).unwrap_err();
        assert!(
            matches!(&e, Error::Driver { call: "cuEventElapsedTime", code, .. }
                if *code == CUresult::CUDA_ERROR_INVALID_HANDLE),
            "{e}"
        );
        let other = Stream::new(&ctx).unwrap();
        other.wait_event(&b).unwrap();
        other.synchronize().unwrap();
        ctx.synchronize().unwrap();
    });
}

#[test]
fn dropping_the_context_handle_first_still_frees_memory_first() {
    let (cuda, world) = two();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let s = Stream::new(&ctx).unwrap();
    let buf = DeviceBuffer::<u32>::alloc_on(&s, 16).unwrap();
    let ev = Event::new(&ctx).unwrap();
    drop(ctx);
    drop(s);
    assert_eq!(world.live().context_retains, 1, "children keep the context");
    drop(buf);
    drop(ev);
    drop(cuda);
    assert!(world.live().is_empty(), "{:?}", world.live());
    assert_eq!(world.order_violations(), 0);
}

#[test]
fn the_mock_detects_release_in_the_wrong_order() {
    // Guards the leak check itself: a raw sequence that releases the context first.
    let (driver, world) = MockDriver::with_devices(1).build().unwrap();
    let f = driver.fns();
    // SAFETY: plain calls with valid out-pointers on the mock.
    unsafe {
        (f.cuInit)(0);
        let mut ctx = std::ptr::null_mut();
        (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
        (f.cuCtxSetCurrent)(ctx);
        let mut p = 0;
        (f.cuMemAlloc)(&mut p, 64);
        (f.cuDevicePrimaryCtxRelease)(0);
    }
    assert_eq!(world.order_violations(), 1);
}

#[test]
fn raw_handles_mix_with_other_code() {
    leak_checked(|cuda, _| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let legacy = Stream::legacy_default(&ctx);
        assert!(legacy.as_raw().is_null());
        legacy.synchronize().unwrap();
        let s = Stream::new(&ctx).unwrap();
        // SAFETY: a stream of `ctx`, kept alive by `s`; not owned.
        let borrowed = unsafe { Stream::from_raw(&ctx, s.as_raw(), false) };
        borrowed.synchronize().unwrap();
        drop(borrowed);
        s.synchronize().unwrap();
    });
}

#[test]
fn many_simulated_machines_coexist() {
    let worlds: Vec<_> = (1..=8).map(|n| mock(MockDriver::with_devices(n))).collect();
    for (i, (cuda, _)) in worlds.iter().enumerate() {
        assert_eq!(cuda.device_count().unwrap(), i + 1);
    }
}

#[test]
fn graphs_capture_and_replay_stream_work() {
    leak_checked(|cuda, _| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let s = Stream::non_blocking(&ctx).unwrap();
        let src = DeviceBuffer::from_slice(&ctx, &[1u32, 2, 3]).unwrap();
        let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 3).unwrap();
        s.begin_capture(cuda_hal::CaptureMode::ThreadLocal).unwrap();
        assert!(s.is_capturing().unwrap());
        // A call that waits for its stream is refused inside a capture before anything is
        // enqueued (on a device the wait would fail and spoil the capture).
        let e = dst.copy_from_on(&src, &s).unwrap_err();
        assert_eq!(
            e,
            Error::Capturing {
                what: "copy_from_on"
            }
        );
        let g = s.end_capture().unwrap();
        assert_eq!(g.dependencies(), 0, "nothing was recorded");
        drop(g);
        s.begin_capture(cuda_hal::CaptureMode::ThreadLocal).unwrap();
        dst.copy_from_async(&src, &s).unwrap();
        let g = s.end_capture().unwrap();
        assert!(!s.is_capturing().unwrap());
        assert_eq!(
            dst.to_vec().unwrap(),
            [0, 0, 0],
            "captured work did not run"
        );
        let exec = g.instantiate().unwrap();
        exec.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(dst.to_vec().unwrap(), [1, 2, 3]);
    });
}

#[test]
fn memory_info_follows_allocations() {
    leak_checked(|cuda, _| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let MemoryInfo { free: free0, total } = ctx.memory_info().unwrap();
        assert_eq!(free0, total);
        let b = DeviceBuffer::<u8>::alloc(&ctx, 1 << 20).unwrap();
        assert_eq!(
            ctx.memory_info().unwrap(),
            MemoryInfo {
                free: free0 - (1 << 20),
                total
            }
        );
        drop(b);
        assert_eq!(ctx.memory_info().unwrap().free, free0);
    });
}

#[test]
fn old_and_new_drivers_from_one_build() {
    // 12.0 and 12.4 lack the 12.5/12.8 functions: absent from the table, Unsupported in
    // the safe layer with the version needed; 13.0 has them; 11.8 is refused at load.
    for (version, has_125, has_128) in [
        (12000, false, false),
        (12040, false, false),
        (12050, true, false),
        (13000, true, true),
    ] {
        let (driver, _w) = MockDriver::with_devices(1)
            .version(version)
            .build()
            .unwrap();
        assert_eq!(
            driver.fns().cuFuncGetParamInfo.is_some(),
            version >= 12040,
            "{version}"
        );
        assert_eq!(
            driver.fns().cuCtxRecordEvent.is_some(),
            has_125,
            "{version}"
        );
        assert_eq!(
            driver.fns().cuStreamGetDevice.is_some(),
            has_128,
            "{version}"
        );
        let cuda = Cuda::from_driver(driver).unwrap();
        let s = Stream::new(&cuda.device(0).unwrap().primary_context().unwrap()).unwrap();
        match s.device_ordinal() {
            Ok(d) => assert!(has_128 && d == 0),
            Err(Error::Unsupported { needed, .. }) => assert!(!has_128 && needed == "12.8"),
            Err(e) => panic!("{e}"),
        }
    }
    let e = MockDriver::with_devices(1)
        .version(11080)
        .build()
        .unwrap_err();
    assert_eq!(
        e.reason(),
        Some(&cuda_sys::dylib::Reason::TooOld {
            found: "11.8".into(),
            minimum: "12.0".into()
        }),
        "{e}"
    );
    assert!(
        e.to_string().contains("11.8") && e.to_string().contains("12.0"),
        "{e}"
    );
}

#[test]
fn device_buffers_hand_their_memory_over_and_back() {
    leak_checked(|cuda, world| {
        let ctx = cuda.device(0).unwrap().primary_context().unwrap();
        let b = DeviceBuffer::from_slice(&ctx, &[4u16, 5, 6]).unwrap();
        let (ptr, len) = b.into_raw().unwrap();
        assert_eq!(world.live().device_allocations, 1, "into_raw does not free");
        // SAFETY: the allocation was just released by `into_raw`, of `len` u16 in `ctx`.
        let back = unsafe { DeviceBuffer::<u16>::from_raw(&ctx, ptr, len) };
        assert_eq!(back.to_vec().unwrap(), [4, 5, 6]);
        drop(back);
        assert_eq!(world.live().device_allocations, 0);
    });
}

#[test]
fn devices_are_equal_only_to_the_same_ordinal_of_the_same_driver() {
    let (cuda, _world) = two();
    let (other, _other_world) = two();
    let d0 = cuda.device(0).unwrap();
    assert_eq!(d0, cuda.device(0).unwrap());
    assert_ne!(d0, cuda.device(1).unwrap());
    assert_ne!(d0, other.device(0).unwrap(), "another driver's device 0");
    assert_eq!(
        format!("{:?}", cuda.device(1).unwrap()),
        "Device { ordinal: 1 }"
    );
    assert_eq!(
        format!("{cuda:?}"),
        format!(
            "Cuda {{ version: {:?}, origin: {:?} }}",
            cuda.version(),
            cuda.driver().origin()
        )
    );
}

#[test]
fn peer_access_is_between_two_devices() {
    let (cuda, _world) = two();
    let (d0, d1) = (cuda.device(0).unwrap(), cuda.device(1).unwrap());
    // The simulated driver lets every device reach every other one, never itself.
    assert!(d0.can_access_peer(&d1).unwrap());
    assert!(!d0.can_access_peer(&d0).unwrap());
}

#[test]
fn a_buffer_knows_its_size_in_bytes() {
    let (cuda, _world) = two();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let b = DeviceBuffer::<u32>::zeroed(&ctx, 3).unwrap();
    assert_eq!((b.len(), b.size_bytes()), (3, 12));
}

#[test]
fn debug_output_of_uuids_and_pinned_buffers() {
    let uuid = DeviceUuid(UUID_A);
    assert_eq!(format!("{uuid:?}"), format!("DeviceUuid({uuid})"));
    assert!(format!("{uuid}").starts_with("GPU-5fdb056c-"), "{uuid}");
    let (cuda, _world) = two();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let p = PinnedBuffer::<u16>::zeroed(&ctx, 3).unwrap();
    assert_eq!(format!("{p:?}"), "PinnedBuffer { len: 3 }");
}
