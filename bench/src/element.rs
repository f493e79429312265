//! The element types of `-d` and the reductions of `-o`.

use nccl_channel::half::{bf16, f16};
use nccl_channel::{NcclType, ReduceOp};

/// An element type the benchmark runs: an NCCL type made from the small whole numbers the
/// check writes (rank r holds r+1), compared exactly.
pub(crate) trait BenchVal: NcclType + PartialEq + std::fmt::Debug {
    /// `v` as this type (exact for the check's values).
    fn from_f(v: f64) -> Self;
}

macro_rules! bench_val {
    ($($t:ty),*) => { $( impl BenchVal for $t { fn from_f(v: f64) -> Self { v as $t } } )* };
}
bench_val!(i8, u8, i32, f32, f64);

impl BenchVal for f16 {
    fn from_f(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl BenchVal for bf16 {
    fn from_f(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// The reduction `-o` names (`sum` for anything else: clap lets only the five through).
pub(crate) fn op_of<T: BenchVal>(name: &str) -> ReduceOp<T> {
    match name {
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        _ => ReduceOp::Sum,
    }
}
