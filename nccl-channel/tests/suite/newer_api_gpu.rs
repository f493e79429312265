//! NCCL 2.22–2.32's newer calls on a real GPU and a real NCCL (`#[ignore]`d; the GPU machine
//! runs them against the NCCL `NCCL_SYS_LIBRARY` names, e.g. 2.30.7 built from source): what
//! one GPU allows — suspend and resume with memory stats, parameters, the scalable init of
//! one rank, a simulated group end, a put and signal to this rank's own window. Each prints
//! what it saw. On an NCCL older than a call, the test checks the typed `Unsupported`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use cuda_hal::{Cuda, DeviceBuffer, Stream};
use nccl_channel::{
    CommConfig, Communicator, Error, Group, Param, ReduceOp, Signal, SignalWait, SuspendFlags,
    UniqueId, WindowFlags,
};
use nccl_sys::NcclVersion;

fn one_rank() -> (Arc<nccl_sys::Nccl>, Communicator, Stream) {
    let cuda = Cuda::load().expect("a GPU test (run with --include-ignored on the GPU machine)");
    let nccl = nccl_channel::nccl().expect("a GPU test: no NCCL");
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    let comm = Communicator::init_all(&nccl, std::slice::from_ref(&ctx))
        .unwrap()
        .remove(0);
    let stream = Stream::non_blocking(&ctx).unwrap();
    println!("NCCL {} ({})", nccl.version(), nccl.origin());
    (nccl, comm, stream)
}

fn at_least(nccl: &nccl_sys::Nccl, v: NcclVersion) -> bool {
    nccl.version() >= v
}

#[test]
#[ignore = "needs a GPU"]
fn suspend_resume_and_memory_stats_on_a_real_nccl() {
    let (nccl, comm, stream) = one_rank();
    let mut buf = DeviceBuffer::from_slice(comm.context(), &[1.5f32; 1024]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
        .unwrap();
    stream.synchronize().unwrap();
    if !at_least(&nccl, NcclVersion::new(2, 29, 7)) {
        assert!(matches!(
            comm.suspend(SuspendFlags::MEM),
            Err(Error::Unsupported { .. })
        ));
        println!("suspend: Unsupported on NCCL {}", nccl.version());
        return;
    }
    // Work in flight on a stream the communicator used: refused, NCCL's memory kept.
    let n = 1usize << 30; // 4 GiB of f32 each way: the copy takes about a millisecond
    let send = DeviceBuffer::<f32>::zeroed(comm.context(), n).unwrap();
    let mut recv = DeviceBuffer::<f32>::alloc(comm.context(), n).unwrap();
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)
        .unwrap();
    let busy = comm.suspend(SuspendFlags::MEM);
    println!("suspend right after a 4 GiB all-reduce was enqueued: {busy:?}");
    assert!(matches!(busy, Err(Error::InFlight { .. })), "{busy:?}");
    stream.synchronize().unwrap();
    drop((send, recv));
    let before = comm.mem_stats().unwrap();
    comm.suspend(SuspendFlags::MEM).unwrap();
    let during = comm.mem_stats().unwrap();
    assert!(comm.is_suspended() && during.suspended);
    assert!(matches!(
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream),
        Err(Error::Suspended { .. })
    ));
    comm.resume().unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(buf.to_vec().unwrap(), vec![1.5f32; 1024]);
    let after = comm.mem_stats().unwrap();
    println!(
        "mem stats before {before:?}\n          suspended {during:?}\n          resumed {after:?}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn parameters_scalable_init_and_a_simulated_group_on_a_real_nccl() {
    let (nccl, comm, stream) = one_rank();
    if at_least(&nccl, NcclVersion::new(2, 30, 4)) {
        let keys = Param::<String>::keys(&nccl).unwrap();
        println!(
            "{} parameter keys, first {:?}",
            keys.len(),
            &keys[..keys.len().min(5)]
        );
        assert!(!keys.is_empty());
        let key = &keys[0];
        println!(
            "{key} = {}",
            Param::<String>::value_string(&nccl, key).unwrap()
        );
    }
    if at_least(&nccl, NcclVersion::new(2, 23, 4)) {
        let ids = [UniqueId::generate(&nccl).unwrap()];
        let c =
            Communicator::init_rank_scalable(&nccl, comm.context(), &ids, 1, 0, &CommConfig::new())
                .unwrap();
        assert_eq!((c.rank(), c.size()), (0, 1));
        let mut b = DeviceBuffer::from_slice(comm.context(), &[3i32; 8]).unwrap();
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(b.to_vec().unwrap(), [3; 8]);
        println!("scalable init of 1 rank from 1 id: all-reduce checked");
    }
    if at_least(&nccl, NcclVersion::new(2, 22, 3)) {
        let mut big = DeviceBuffer::<f32>::zeroed(comm.context(), 64 << 20).unwrap();
        let g = Group::start(&nccl).unwrap();
        comm.all_reduce_in_place(&mut big, ReduceOp::Sum, &stream)
            .unwrap();
        let predicted = g.simulate_end().unwrap();
        println!("simulated group end: 256 MiB all-reduce on 1 rank predicted {predicted:?}");
        stream.synchronize().unwrap();
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_put_and_signal_to_this_ranks_own_window_on_a_real_nccl() {
    let (nccl, comm, stream) = one_rank();
    if !at_least(&nccl, NcclVersion::new(2, 29, 2)) {
        println!("one-sided: needs NCCL 2.29.2, this is {}", nccl.version());
        return;
    }
    let mut src = comm.alloc_nccl::<u32>(1024).unwrap();
    let mut dst = comm.alloc_nccl::<u32>(1024).unwrap();
    src.fill(7).unwrap();
    dst.fill(0).unwrap();
    let sym = WindowFlags::COLL_SYMMETRIC;
    let _src_win = comm.register_window(&src, sym).unwrap();
    let win = comm.register_window(&dst, sym).unwrap();
    println!("window user pointer: {:?}", win.user_ptr());
    let r = win.put_signal(&src.slice(0..4).unwrap(), 0, 16, Signal::DEFAULT, &stream);
    match r {
        Ok(()) => {
            comm.wait_signal(&[SignalWait::new(0, 1)], &stream).unwrap();
            stream.synchronize().unwrap();
            assert_eq!(dst.to_vec().unwrap()[..8], [0, 0, 0, 0, 7, 7, 7, 7]);
            println!("put_signal to self, then wait_signal: data checked");
        }
        // A real NCCL may refuse one-sided work on one rank: say what it said.
        Err(e) => println!("put_signal on one rank refused by NCCL: {e}"),
    }
}
