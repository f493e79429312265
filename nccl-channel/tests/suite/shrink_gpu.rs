//! Shrink and revoke on real NCCL (`#[ignore]`d; GPU machine). Revoke needs NCCL >= 2.28.7
//! (e.g. torch's 2.28.9 through NCCL_SYS_LIBRARY); older ones check that it is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Barrier;

use crate::common::backend::Machine;
use cuda_hal::{DeviceBuffer, Stream};
use nccl_channel::{Communicator, Error, ReduceOp, UniqueId};

#[test]
#[ignore = "needs 2 GPUs"]
fn shrink_away_a_rank_then_revoke() {
    let Some(Machine { cuda, nccl, .. }) = Machine::gpus(2) else {
        return;
    };
    let id = UniqueId::generate(&nccl).unwrap();
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        for r in 0..2 {
            let (cuda, nccl, barrier) = (&cuda, &nccl, &barrier);
            s.spawn(move || {
                let ctx = cuda.device(r).unwrap().primary_context().unwrap();
                let comm = Communicator::init_rank(nccl, &ctx, &id, 2, r).unwrap();
                let st = Stream::non_blocking(&ctx).unwrap();
                comm.barrier(&st).unwrap();
                barrier.wait();
                if r == 0 {
                    // Rank 1 is "lost": rank 0 continues alone.
                    let small = comm.shrink(&[1]).unwrap();
                    assert_eq!((small.size(), small.rank()), (1, 0));
                    let mut b = DeviceBuffer::from_slice(&ctx, &[5i32; 8]).unwrap();
                    small
                        .all_reduce_in_place(&mut b, ReduceOp::Sum, &st)
                        .unwrap();
                    st.synchronize().unwrap();
                    assert_eq!(b.to_vec().unwrap(), [5; 8]);
                    println!(
                        "rank 0: shrunk to a communicator of {} rank, all_reduce ok",
                        small.size()
                    );
                }
                barrier.wait();
                // Revoke came in NCCL 2.28.7; the system NCCL of the GPU machine is 2.28.3.
                let has_revoke = nccl.version() >= nccl_sys::NcclVersion::new(2, 28, 7);
                match comm.revoke() {
                    Ok(()) if has_revoke => println!("rank {r}: revoked"),
                    Err(Error::Unsupported {
                        feature,
                        needed,
                        found,
                    }) if !has_revoke => {
                        assert_eq!((feature, needed.as_str()), ("ncclCommRevoke", "2.28.7"));
                        assert_eq!(found, nccl.version().to_string());
                        println!("rank {r}: revoke needs NCCL {needed}, this is {found}: skipped");
                    }
                    other => panic!("revoke on NCCL {}: {other:?}", nccl.version()),
                }
                comm.abort().unwrap();
            });
        }
    });
}
