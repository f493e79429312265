//! cuda-hal on real GPUs (`#[ignore]`d; run with `--include-ignored` on the GPU machine).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use cuda_hal::{Cuda, DeviceBuffer, Event, PinnedBuffer, Stream};

use test_support::env;

const GIB: usize = 1 << 30;

#[test]
#[ignore = "needs GPUs"]
fn devices_match_nvidia_smi() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let ours: Vec<String> = cuda
        .devices()
        .unwrap()
        .iter()
        .map(|d| d.describe().unwrap())
        .collect();
    let smi = env::scrubbed_for_gpu("nvidia-smi")
        .arg("-L")
        .output()
        .expect("nvidia-smi runs");
    let theirs: Vec<String> = String::from_utf8_lossy(&smi.stdout)
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .map(str::to_string)
        .collect();
    for l in &ours {
        println!("{l}");
    }
    // The order and the UUIDs of several devices are the point.
    if !test_support::enough_gpus(ours.len(), 2) {
        return;
    }
    assert_eq!(ours, theirs);
}

#[test]
#[ignore = "needs GPUs"]
fn select_by_index_and_uuid() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    for d in cuda.devices().unwrap() {
        let by_index = cuda.select(&format!("cuda://{}", d.ordinal())).unwrap();
        let by_uuid = cuda
            .select(&format!("cuda://{}", d.uuid().unwrap()))
            .unwrap();
        let by_pci = cuda
            .select(&format!("cuda://{}", d.pci_bus_id().unwrap()))
            .unwrap();
        assert_eq!(by_index, d);
        assert_eq!(by_uuid, d);
        assert_eq!(by_pci, d);
        let (major, minor) = d.compute_capability().unwrap();
        println!(
            "cuda://{} = {} = {}: {} GiB, sm_{major}{minor}",
            d.ordinal(),
            d.uuid().unwrap(),
            d.pci_bus_id().unwrap(),
            d.total_memory().unwrap() / GIB
        );
    }
}

fn pattern(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

#[test]
#[ignore = "needs GPUs"]
fn one_gib_round_trip_sync_and_stream_ordered_with_event_timing() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let n = GIB / 4;
    let host = pattern(n, 0xdead_beef);

    // Synchronous.
    let t = Instant::now();
    let d = DeviceBuffer::from_slice(&ctx, &host).unwrap();
    let back = d.to_vec().unwrap();
    println!("sync 1 GiB up+down: {:?}", t.elapsed());
    assert!(back == host, "sync round trip differs");
    drop(back);

    // Stream-ordered, pinned, timed with events.
    let s = Stream::non_blocking(&ctx).unwrap();
    let mut pinned = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    pinned.copy_from_slice(&pattern(n, 0x1234_5678));
    let mut e = DeviceBuffer::<u32>::alloc_on(&s, n).unwrap();
    let (a, b) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    s.record(&a).unwrap();
    e.copy_from_host_on(&pinned, &s).unwrap();
    s.record(&b).unwrap();
    b.synchronize().unwrap();
    let t = a.elapsed(&b).unwrap();
    println!(
        "pinned 1 GiB host->device: {t:.3?} = {:.1} GB/s (event timing)",
        GIB as f64 / (t.as_secs_f64() * 1e9)
    );
    assert!(t > std::time::Duration::ZERO);
    let mut out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    e.copy_to_host_on(&mut out, &s).unwrap();
    assert!(out[..] == pinned[..], "stream-ordered round trip differs");
    // Device-to-device and fill.
    let mut f = DeviceBuffer::<u32>::alloc(&ctx, n).unwrap();
    f.copy_from_on(&e, &s).unwrap();
    assert!(f.to_vec().unwrap()[..] == pinned[..]);
    f.fill(0xabcd_0123).unwrap();
    assert!(f.to_vec().unwrap().iter().all(|&x| x == 0xabcd_0123));
}

#[test]
#[ignore = "needs GPUs"]
fn two_devices_from_one_thread() {
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    if !test_support::enough_gpus(cuda.device_count().unwrap(), 2) {
        return;
    }
    let c0 = cuda.device(0).unwrap().primary_context().unwrap();
    let c1 = cuda.device(1).unwrap().primary_context().unwrap();
    let n = 64 << 20;
    let host = pattern(n, 7);
    let a = DeviceBuffer::from_slice(&c0, &host).unwrap();
    let mut b = DeviceBuffer::<u32>::alloc(&c1, n).unwrap();
    let s1 = Stream::new(&c1).unwrap();
    let (e0, e1) = (Event::new(&c1).unwrap(), Event::new(&c1).unwrap());
    s1.record(&e0).unwrap();
    b.copy_from_on(&a, &s1).unwrap();
    s1.record(&e1).unwrap();
    e1.synchronize().unwrap();
    let t = e0.elapsed(&e1).unwrap();
    println!(
        "peer copy GPU0 -> GPU1, 256 MiB: {t:.3?} = {:.1} GB/s; peer access possible: {}",
        (n * 4) as f64 / (t.as_secs_f64() * 1e9),
        c0.device().can_access_peer(c1.device()).unwrap()
    );
    assert!(b.to_vec().unwrap() == host);
    assert_eq!(a.device().ordinal(), 0);
    assert_eq!(b.device().ordinal(), 1);
    assert_eq!(s1.device_ordinal().unwrap(), 1);
}

#[test]
#[ignore = "needs GPUs"]
fn synchronous_fills_and_uploads_are_done_for_other_streams() {
    // Regression: a memset runs on the legacy default stream and returned before it had
    // finished; work on a non-blocking stream then read stale memory (seen in the bench's
    // correctness check at >= 128 MiB).
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let s = Stream::non_blocking(&ctx).unwrap();
    let n = GIB / 4;
    for round in 0..3u32 {
        let mut a = DeviceBuffer::<u32>::alloc(&ctx, n).unwrap();
        a.fill(0x5a5a_0000 + round).unwrap();
        let mut b = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        b.copy_from_async(&a, &s).unwrap();
        s.synchronize().unwrap();
        let v = b.to_vec().unwrap();
        let wrong = v.iter().filter(|&&x| x != 0x5a5a_0000 + round).count();
        assert_eq!(wrong, 0, "round {round}: {wrong} stale elements");
    }
}

/// A capture whose stream's last handle goes before it ends, on the real driver: in each
/// mode the driver's capture is ended and its graph destroyed, the memory it held comes
/// back, and the thread's host waits work again.
#[test]
#[ignore = "needs GPUs"]
fn a_capture_whose_stream_goes_is_abandoned_and_its_memory_comes_back() {
    use cuda_hal::CaptureMode;
    let cuda = Cuda::load()
        .expect("a GPU test (run with --include-ignored on the GPU machine): no CUDA driver");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let len = 64 << 20;
    for mode in [
        CaptureMode::ThreadLocal,
        CaptureMode::Global,
        CaptureMode::Relaxed,
    ] {
        let free_before = ctx.memory_info().unwrap().free;
        {
            let s = Stream::non_blocking(&ctx).unwrap();
            let mut buf = DeviceBuffer::<u32>::zeroed(&ctx, len).unwrap();
            let mut homed = DeviceBuffer::<u32>::alloc_on(&s, len).unwrap();
            s.begin_capture(mode).unwrap();
            buf.fill_async(1, &s).unwrap();
            homed.fill_async(2, &s).unwrap();
            drop((buf, homed, s));
        }
        ctx.synchronize().unwrap();
        let free_after = ctx.memory_info().unwrap().free;
        println!(
            "{mode:?}: abandoned; {} MiB free before, {} MiB after",
            free_before >> 20,
            free_after >> 20
        );
        // Both 256 MiB are back (the stream-ordered pool keeps nothing past a
        // synchronisation by default): less than half of one missing.
        assert!(free_after + len * 2 > free_before, "{mode:?}");
    }
}
