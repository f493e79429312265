//! Inputs once taken silently and checks the rest of the suite did not pin: a sign in a
//! selector, UUID or PCI bus id; a device index equal to the count; an object of another
//! `Cuda` instance on the same device; a copy length loosened to "at least"; a context
//! guard whose drop no longer restores the previous context.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::str::FromStr;

use cuda_hal::{Cuda, DeviceBuffer, DeviceSelector, DeviceUuid, Error, Event, PciBusId, Stream};
use cuda_mock::MockDriver;

#[test]
fn signs_are_not_digits_in_selectors_uuids_and_bus_ids() {
    let uuid = "GPU-+f345678-1234-1234-1234-123456789abc";
    let e = DeviceUuid::from_str(uuid).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidUuid {
            input: uuid.into(),
            problem: "\"+f\" is not hexadecimal".into()
        }
    );
    let selector = format!("cuda://{uuid}");
    assert_eq!(
        DeviceSelector::from_str(&selector).unwrap_err(),
        Error::InvalidSelector {
            input: selector.clone(),
            problem: e.to_string()
        }
    );
    for bus in ["+0:18:00.0", "0000:+8:00.0", "0000:18:+0.0", "0000:18:00.+"] {
        assert_eq!(
            PciBusId::from_str(bus).unwrap_err(),
            Error::InvalidPciBusId { input: bus.into() },
            "{bus}"
        );
    }
    assert_eq!(
        DeviceSelector::from_str("cuda://+1").unwrap_err(),
        Error::InvalidSelector {
            input: "cuda://+1".into(),
            problem: "\"+1\" is not an ordinal, a UUID or a PCI bus id".into()
        }
    );
    // The digits themselves are taken, any case.
    assert_eq!(
        DeviceSelector::from_str("cuda://1").unwrap(),
        DeviceSelector::Ordinal(1)
    );
    assert_eq!(
        PciBusId::from_str("0000:fF:1f.7").unwrap(),
        PciBusId {
            domain: 0,
            bus: 0xff,
            device: 0x1f,
            function: 7
        }
    );
    assert_eq!(
        DeviceUuid::from_str("GPU-Ff345678-1234-1234-1234-123456789abc")
            .unwrap()
            .0[0],
        0xff
    );
}

#[test]
fn a_device_index_equal_to_the_count_is_refused() {
    let (cuda, _gpus) = MockDriver::with_devices(2)
        .build_with(Cuda::from_driver)
        .unwrap();
    assert_eq!(cuda.device(1).unwrap().ordinal(), 1);
    assert_eq!(cuda.select("cuda://1").unwrap().ordinal(), 1);
    for e in [
        cuda.device(2).unwrap_err(),
        cuda.select("cuda://2").unwrap_err(),
    ] {
        match e {
            Error::NoSuchDevice {
                selector,
                available,
            } => {
                assert!(selector.ends_with('2'), "{selector}");
                assert_eq!(available.len(), 2, "{available:?}");
            }
            other => panic!("expected NoSuchDevice, got {other:?}"),
        }
    }
}

#[test]
fn an_object_of_another_cuda_instance_names_the_context() {
    let (cuda, _gpus) = MockDriver::with_devices(2)
        .build_with(Cuda::from_driver)
        .unwrap();
    let (other, _other_gpus) = MockDriver::with_devices(1)
        .build_with(Cuda::from_driver)
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let ctx1 = cuda.device(1).unwrap().primary_context().unwrap();
    let foreign_ctx = other.device(0).unwrap().primary_context().unwrap();
    let event = Event::new(&ctx).unwrap();
    let foreign = Stream::new(&foreign_ctx).unwrap();
    let e = event.record(&foreign).unwrap_err();
    assert_eq!(
        e,
        Error::WrongContext {
            what: "Event::record",
            object: "stream",
            device: 0
        }
    );
    assert_eq!(
        e.to_string(),
        "Event::record: the stream belongs to another CUDA context (both are on device 0; \
         another Cuda instance?): use objects of one context"
    );
    // Another device is still named as such.
    assert_eq!(
        event.record(&Stream::new(&ctx1).unwrap()).unwrap_err(),
        Error::WrongDevice {
            what: "Event::record",
            object: "stream",
            expected: 0,
            found: 1
        }
    );
    // A device copy between two instances' buffers on one stream.
    let src = DeviceBuffer::from_slice(&foreign_ctx, &[1u32; 4]).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 4).unwrap();
    assert_eq!(
        dst.copy_from_async(&src, &foreign).unwrap_err(),
        Error::WrongContext {
            what: "copy_from_async",
            object: "stream",
            device: 0
        }
    );
}

fn mismatch(what: &'static str, expected: usize, got: usize) -> Error {
    Error::LengthMismatch {
        what,
        buffer: if what.contains("host") {
            "host"
        } else {
            "source"
        },
        expected,
        got,
    }
}

/// Every copy's contract is an exact length: one short and one too many are refused,
/// the exact length copies.
#[test]
fn copy_lengths_are_exact_on_both_sides() {
    const N: usize = 4;
    let (cuda, _gpus) = MockDriver::with_devices(1)
        .build_with(Cuda::from_driver)
        .unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let s = Stream::new(&ctx).unwrap();
    let mut dev = DeviceBuffer::from_slice(&ctx, &[7u32; N]).unwrap();
    for len in [N - 1, N + 1] {
        let mut host = vec![0u32; len];
        assert_eq!(
            dev.copy_to_host(&mut host).unwrap_err(),
            mismatch("copy_to_host", N, len)
        );
        assert_eq!(
            dev.copy_from_host(&host).unwrap_err(),
            mismatch("copy_from_host", N, len)
        );
        let e = dev.copy_to_host_on(&mut host, &s).unwrap_err();
        assert!(
            matches!(e, Error::LengthMismatch { expected: N, got, .. } if got == len),
            "{e:?}"
        );
        let e = dev.copy_from_host_on(&host, &s).unwrap_err();
        assert!(
            matches!(e, Error::LengthMismatch { expected: N, got, .. } if got == len),
            "{e:?}"
        );
        let other = DeviceBuffer::<u32>::zeroed(&ctx, len).unwrap();
        assert_eq!(
            dev.copy_from(&other).unwrap_err(),
            mismatch("copy_from", N, len)
        );
        assert_eq!(
            dev.copy_from_on(&other, &s).unwrap_err(),
            mismatch("copy_from_async", N, len)
        );
        assert_eq!(
            dev.as_view().copy_to_host(&mut host).unwrap_err(),
            mismatch("copy_to_host", N, len)
        );
    }
    assert_eq!(dev.to_vec().unwrap(), [7; N], "nothing was copied");
    let mut host = [1u32, 2, 3, 4];
    dev.copy_from_host(&host).unwrap();
    dev.copy_to_host_on(&mut host, &s).unwrap();
    assert_eq!(host, [1, 2, 3, 4]);
    let mut other = DeviceBuffer::<u32>::zeroed(&ctx, N).unwrap();
    other.copy_from(&dev).unwrap();
    other.copy_from_on(&dev, &s).unwrap();
    assert_eq!(other.to_vec().unwrap(), [1, 2, 3, 4]);
}

fn current(cuda: &Cuda) -> cuda_hal::cuda_sys::CUcontext {
    let mut c = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; cuCtxGetCurrent only reads this thread's state.
    let rc = unsafe { (cuda.fns().cuCtxGetCurrent)(&mut c) };
    assert_eq!(rc, cuda_hal::cuda_sys::CUresult::CUDA_SUCCESS);
    c
}

fn bound_then_fails(ctx: &cuda_hal::Context) -> Result<(), Error> {
    let _g = ctx.bind()?;
    // Fails: the guard's drop must restore the previous context on this early return.
    let mut host = [0u32; 1];
    DeviceBuffer::<u32>::zeroed(ctx, 2)?.copy_to_host(&mut host)?;
    unreachable!("the lengths differ")
}

#[test]
fn dropping_a_context_guard_restores_the_previous_context() {
    let (cuda, _gpus) = MockDriver::with_devices(2)
        .build_with(Cuda::from_driver)
        .unwrap();
    let ctx0 = cuda.device(0).unwrap().primary_context().unwrap();
    let ctx1 = cuda.device(1).unwrap().primary_context().unwrap();
    let before = current(&cuda);
    assert_ne!(before, ctx0.as_raw());
    {
        let _g = ctx0.bind().unwrap();
        assert_eq!(current(&cuda), ctx0.as_raw());
        {
            let _h = ctx1.bind().unwrap();
            assert_eq!(current(&cuda), ctx1.as_raw());
        }
        assert_eq!(
            current(&cuda),
            ctx0.as_raw(),
            "the inner drop restores ctx0"
        );
    }
    assert_eq!(
        current(&cuda),
        before,
        "the outer drop restores the thread's own"
    );
    assert_eq!(
        bound_then_fails(&ctx1).unwrap_err(),
        mismatch("copy_to_host", 2, 1)
    );
    assert_eq!(current(&cuda), before, "early return: restored");
}
