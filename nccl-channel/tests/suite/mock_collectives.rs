//! Every collective × data type × op on the simulated NCCL, for world sizes 1 to 4 and 8,
//! against host-computed results; then leak checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common::{Rig, matrix};

fn world_of(n: usize) {
    let rig = Rig::new(n);
    let results = rig.run(n, |comm, s| matrix::check_every_type(comm, s).unwrap());
    let bad: Vec<String> = results.into_iter().flatten().collect();
    assert!(
        bad.is_empty(),
        "{} wrong results, e.g.:\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
    rig.assert_clean();
}

#[test]
fn world_size_1() {
    world_of(1);
}

#[test]
fn world_size_2() {
    world_of(2);
}

#[test]
fn world_size_3() {
    world_of(3);
}

#[test]
fn world_size_4() {
    world_of(4);
}

#[test]
fn world_size_8() {
    world_of(8);
}

/// Rank `r`'s input and the max and sum NCCL computes, per type: values that only the right
/// `ncclDataType_t` reduces this way (a signed type read as unsigned, or a float's bits
/// read as another type of the same size, gives another answer).
fn reduces_as_its_own_type<T>(rig: &Rig, inputs: [T; 2], max: T, sum: T)
where
    T: nccl_channel::NcclType + PartialEq + std::fmt::Debug + Send + Sync,
{
    use cuda_hal::DeviceBuffer;
    use nccl_channel::ReduceOp;
    let got = rig.run(2, |comm, s| {
        let send = DeviceBuffer::from_slice(comm.context(), &[inputs[comm.rank()]]).unwrap();
        let mut out = Vec::new();
        for op in [ReduceOp::Max, ReduceOp::Sum] {
            let mut recv = DeviceBuffer::from_slice(comm.context(), &[inputs[0]]).unwrap();
            comm.all_reduce(&send, &mut recv, op, s).unwrap();
            s.synchronize().unwrap();
            out.push(recv.to_vec().unwrap()[0]);
        }
        out
    });
    for per_rank in got {
        assert_eq!(per_rank, [max, sum], "{}", T::NAME);
    }
}

#[test]
fn each_rust_type_is_reduced_as_its_own_nccl_type() {
    use half::{bf16, f16};
    use nccl_channel::{Fp8E4M3, Fp8E5M2};
    Rig::new(2).check(|rig| {
        reduces_as_its_own_type::<i8>(rig, [-1, 1], 1, 0);
        reduces_as_its_own_type::<u8>(rig, [255, 1], 255, 0);
        reduces_as_its_own_type::<i32>(rig, [-1, 1], 1, 0);
        reduces_as_its_own_type::<u32>(rig, [u32::MAX, 1], u32::MAX, 0);
        reduces_as_its_own_type::<i64>(rig, [-1, 1], 1, 0);
        reduces_as_its_own_type::<u64>(rig, [u64::MAX, 1], u64::MAX, 0);
        reduces_as_its_own_type::<f32>(rig, [1.5, -0.25], 1.5, 1.25);
        reduces_as_its_own_type::<f64>(rig, [1.5, -0.25], 1.5, 1.25);
        let h = f16::from_f32;
        reduces_as_its_own_type::<f16>(rig, [h(1.5), h(-0.25)], h(1.5), h(1.25));
        let b = bf16::from_f32;
        reduces_as_its_own_type::<bf16>(rig, [b(1.5), b(-0.25)], b(1.5), b(1.25));
        // e4m3: 0x3c = 1.5, 0xa8 = -0.25, 0x3a = 1.25; e5m2: 0x3e = 1.5, 0xb4 = -0.25, 0x3d = 1.25.
        reduces_as_its_own_type::<Fp8E4M3>(
            rig,
            [Fp8E4M3(0x3c), Fp8E4M3(0xa8)],
            Fp8E4M3(0x3c),
            Fp8E4M3(0x3a),
        );
        reduces_as_its_own_type::<Fp8E5M2>(
            rig,
            [Fp8E5M2(0x3e), Fp8E5M2(0xb4)],
            Fp8E5M2(0x3e),
            Fp8E5M2(0x3d),
        );
    });
}

/// Each reduction's short name (used in messages and by the benchmark's tables).
#[test]
fn reduce_op_names() {
    use nccl_channel::ReduceOp;
    let names: Vec<&str> = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(0.5f32),
    ]
    .iter()
    .map(ReduceOp::name)
    .collect();
    assert_eq!(names, ["sum", "prod", "max", "min", "avg", "premulsum"]);
}
