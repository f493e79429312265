//! Element types NCCL can reduce, and reduction ops.

use cuda_hal::DeviceRepr;
use nccl_sys::{NcclVersion, ncclDataType_t};

/// An element type NCCL knows.
///
/// Implemented for the integers and floats NCCL has, the [`Fp8E4M3`] and [`Fp8E5M2`]
/// bytes, and with the `half` feature `half::f16` and `half::bf16`. A type of your own
/// with one of these layouts can be one too:
///
/// ```
/// # use cuda_hal::DeviceBuffer;
/// use nccl_channel::{Communicator, NcclType, ReduceOp};
/// use nccl_sys::ncclDataType_t;
///
/// /// Counts of something, kept apart from other `u64`s by the type system.
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// #[repr(transparent)]
/// struct Count(u64);
///
/// // SAFETY: a `u64` underneath (repr(transparent)): plain data, no padding, every bit
/// // pattern valid.
/// unsafe impl cuda_hal::DeviceRepr for Count {}
/// // SAFETY: laid out exactly as `u64`, which is what ncclUint64 describes.
/// unsafe impl NcclType for Count {
///     const DTYPE: ncclDataType_t = ncclDataType_t::ncclUint64;
///     const NAME: &'static str = "count";
/// }
///
/// assert_eq!(<f32 as NcclType>::NAME, "float32");
/// # let doc_support::OneRank { ctx, comm, stream, .. } = doc_support::one_rank()?;
/// // `comm`: a communicator of one rank (see `Communicator`), `stream` on its device.
/// let mut counts = DeviceBuffer::from_slice(&ctx, &[Count(4), Count(7)])?;
/// comm.all_reduce_in_place(&mut counts, ReduceOp::Max, &stream)?;
/// stream.synchronize()?;
/// assert_eq!(counts.to_vec()?, [Count(4), Count(7)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The `half` types, with the feature:
///
/// ```
/// # #[cfg(feature = "half")] {
/// use half::{bf16, f16};
/// use nccl_channel::NcclType;
/// assert_eq!((<f16 as NcclType>::NAME, <bf16 as NcclType>::NAME), ("float16", "bfloat16"));
/// # }
/// ```
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
    ($($(#[$attr:meta])* $t:ty => $d:ident, $name:literal;)*) => { $(
        $(#[$attr])*
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

// The attributes go on each impl: a `cfg` on the macro call would be gone by the time
// rustdoc looks for it, and the impls would show no feature badge.
nccl_type! {
    #[cfg(feature = "half")]
    #[cfg_attr(docsrs, doc(cfg(feature = "half")))]
    half::f16 => ncclFloat16, "float16";
    #[cfg(feature = "half")]
    #[cfg_attr(docsrs, doc(cfg(feature = "half")))]
    half::bf16 => ncclBfloat16, "bfloat16";
}

/// An 8-bit float, E4M3 (finite, max 448), as raw bits. NCCL ≥ 2.24.
///
/// Reductions compute in a wider type and round back; results beyond 448 saturate to
/// 448, as NCCL's do. Before NCCL 2.24, collectives on it are [`Error::Unsupported`]
/// (checked before any NCCL call).
///
/// ```
/// use nccl_channel::{Fp8E4M3, ReduceOp};
/// # use cuda_hal::DeviceBuffer;
/// # use nccl_channel::{Communicator, group};
/// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
/// // Two ranks on this thread (`comms`, `ctxs`, `streams`, as in `Communicator`'s example).
/// let (one, two, x256, max) = (Fp8E4M3(0x38), Fp8E4M3(0x40), Fp8E4M3(0x78), Fp8E4M3(0x7e));
/// let mut bufs = [
///     DeviceBuffer::from_slice(&ctxs[0], &[one, x256])?,
///     DeviceBuffer::from_slice(&ctxs[1], &[one, x256])?,
/// ];
/// group(&nccl, || {
///     for r in 0..2 {
///         comms[r].all_reduce_in_place(&mut bufs[r], ReduceOp::Sum, &streams[r])?;
///     }
///     Ok(())
/// })?;
/// streams[0].synchronize()?;
/// assert_eq!(bufs[0].to_vec()?, [two, max]); // 1 + 1 = 2; 256 + 256 saturates to 448
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`Error::Unsupported`]: crate::Error::Unsupported
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Fp8E4M3(pub u8);

/// An 8-bit float, E5M2 (IEEE-like), as raw bits. NCCL ≥ 2.24.
///
/// A library older than 2.24 has no fp8: the collective is refused before any NCCL call.
///
/// ```
/// # use std::sync::Arc;
/// use cuda_hal::{Cuda, DeviceBuffer, Stream};
/// use cuda_mock::MockDriver;
/// use nccl_channel::{Communicator, Error, Fp8E5M2, ReduceOp};
/// use nccl_sys::NcclVersion;
/// use nccl_mock::MockNccl;
///
/// let (cuda, gpus) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// // A simulated NCCL 2.23.4.
/// let (nccl, _world) = MockNccl::new(&gpus).version(NcclVersion::new(2, 23, 4)).build()?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let comm = Communicator::init_all(&Arc::new(nccl), std::slice::from_ref(&ctx))?.remove(0);
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::from_slice(&ctx, &[Fp8E5M2(0x3c)])?; // 1.0
/// let e = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream).unwrap_err();
/// assert!(matches!(e, Error::Unsupported { .. }), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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

/// A reduction.
///
/// Non-exhaustive: NCCL may add reductions.
///
/// [`Avg`](Self::Avg) divides the sum by the number of ranks; [`PreMulSum`](Self::PreMulSum)
/// scales each rank's input by that rank's own scalar before summing (a weighted sum, e.g.
/// gradients weighted by each rank's share of the batch):
///
/// ```
/// use nccl_channel::ReduceOp;
/// # use cuda_hal::DeviceBuffer;
/// # use nccl_channel::{Communicator, group};
/// # let doc_support::Ranks { nccl, ctxs, comms, streams, .. } = doc_support::ranks(2)?;
/// // Two ranks on this thread (`comms`, `ctxs`, `streams`, as in `Communicator`'s example).
/// let send = [
///     DeviceBuffer::from_slice(&ctxs[0], &[1.0f32, 4.0])?,
///     DeviceBuffer::from_slice(&ctxs[1], &[3.0f32, 8.0])?,
/// ];
/// let mut avg = [DeviceBuffer::zeroed(&ctxs[0], 2)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
/// let mut weighted = [DeviceBuffer::zeroed(&ctxs[0], 2)?, DeviceBuffer::zeroed(&ctxs[1], 2)?];
/// let weights = [0.25f32, 0.75];
/// group(&nccl, || {
///     for r in 0..2 {
///         comms[r].all_reduce(&send[r], &mut avg[r], ReduceOp::Avg, &streams[r])?;
///         let w = ReduceOp::PreMulSum(weights[r]);
///         comms[r].all_reduce(&send[r], &mut weighted[r], w, &streams[r])?;
///     }
///     Ok(())
/// })?;
/// streams[0].synchronize()?;
/// assert_eq!(avg[0].to_vec()?, [2.0, 6.0]);
/// assert_eq!(weighted[0].to_vec()?, [2.5, 7.0]); // 0.25 * [1, 4] + 0.75 * [3, 8]
/// assert_eq!(ReduceOp::<f32>::Avg.name(), "avg");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
