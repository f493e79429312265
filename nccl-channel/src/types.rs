//! Element types NCCL can reduce, and reduction ops.

use cuda_hal::DeviceRepr;
use nccl_sys::{NcclVersion, ncclDataType_t};

/// An element type NCCL knows.
///
/// # Safety
/// `DTYPE` must describe `Self` exactly (size and representation).
pub unsafe trait NcclType: DeviceRepr {
    /// The NCCL data type.
    const DTYPE: ncclDataType_t;
    /// The first NCCL release with this type (`None`: every supported release).
    const SINCE: Option<NcclVersion> = None;
    /// A short name for messages and tables (`"int32"`).
    const NAME: &'static str;
}

macro_rules! nccl_type {
    ($($t:ty => $d:ident, $name:literal;)*) => { $(
        // SAFETY: the NCCL type of the same size and representation.
        unsafe impl NcclType for $t {
            const DTYPE: ncclDataType_t = ncclDataType_t::$d;
            const NAME: &'static str = $name;
        }
    )* };
}

nccl_type! {
    i8 => ncclInt8, "int8";
    u8 => ncclUint8, "uint8";
    i32 => ncclInt32, "int32";
    u32 => ncclUint32, "uint32";
    i64 => ncclInt64, "int64";
    u64 => ncclUint64, "uint64";
    f32 => ncclFloat32, "float32";
    f64 => ncclFloat64, "float64";
}

#[cfg(feature = "half")]
nccl_type! {
    half::f16 => ncclFloat16, "float16";
    half::bf16 => ncclBfloat16, "bfloat16";
}

/// An 8-bit float, E4M3 (finite, max 448), as raw bits. NCCL ≥ 2.24.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Fp8E4M3(pub u8);

/// An 8-bit float, E5M2 (IEEE-like), as raw bits. NCCL ≥ 2.24.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Fp8E5M2(pub u8);

// SAFETY: one byte, every bit pattern is a valid value.
unsafe impl DeviceRepr for Fp8E4M3 {}
// SAFETY: one byte, every bit pattern is a valid value.
unsafe impl DeviceRepr for Fp8E5M2 {}

// SAFETY: one byte in NCCL's fp8 layouts.
unsafe impl NcclType for Fp8E4M3 {
    const DTYPE: ncclDataType_t = ncclDataType_t::ncclFloat8e4m3;
    const SINCE: Option<NcclVersion> = Some(NcclVersion::new(2, 24, 0));
    const NAME: &'static str = "fp8e4m3";
}

// SAFETY: one byte in NCCL's fp8 layouts.
unsafe impl NcclType for Fp8E5M2 {
    const DTYPE: ncclDataType_t = ncclDataType_t::ncclFloat8e5m2;
    const SINCE: Option<NcclVersion> = Some(NcclVersion::new(2, 24, 0));
    const NAME: &'static str = "fp8e5m2";
}

/// A reduction. Non-exhaustive: NCCL may add reductions.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ReduceOp<T> {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average over the ranks.
    Avg,
    /// Sum of each rank's input multiplied by this rank's scalar
    /// (`ncclRedOpCreatePreMulSum`).
    PreMulSum(T),
}

impl<T> ReduceOp<T> {
    /// A short name (`"sum"`).
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }
}
