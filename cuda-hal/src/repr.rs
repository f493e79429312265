//! [`DeviceRepr`]: element types that may live in device memory.

/// Plain data that can be copied to and from a device byte for byte.
///
/// Implemented for the primitive numbers (and `half::f16` / `half::bf16` with the `half`
/// feature); a `#[repr(C)]` struct of them without padding can implement it too:
///
/// ```
/// use cuda_hal::{DeviceBuffer, DeviceRepr};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// struct Point {
///     x: f32,
///     y: f32,
/// }
/// // SAFETY: two `f32`s, no padding, no pointers; every bit pattern is a valid `Point`.
/// unsafe impl DeviceRepr for Point {}
///
/// # let (cuda, _world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
/// # let ctx = cuda.device(0)?.primary_context()?;
/// let points = DeviceBuffer::from_slice(&ctx, &[Point { x: 1.0, y: 2.0 }])?;
/// assert_eq!(points.size_bytes(), 8);
/// assert_eq!(points.to_vec()?, [Point { x: 1.0, y: 2.0 }]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
///
/// # Safety
/// Implementors must be `Copy`, have no padding and no pointers, and every bit pattern
/// must be a valid value (device memory may hold anything, e.g. after an allocation).
pub unsafe trait DeviceRepr: Copy + Send + Sync + 'static {}

macro_rules! device_repr {
    ($attrs:tt => $($t:ty),*) => { $(
        device_repr!(@one $attrs $t);
    )* };
    (@one [$(#[$attr:meta])*] $t:ty) => {
        $(#[$attr])*
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl DeviceRepr for $t {}
    };
}
device_repr!([] => i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, isize, usize);

// The badge on docs.rs: the expanded impls do not carry the invocation's `cfg`.
#[cfg(feature = "half")]
device_repr!([#[cfg_attr(docsrs, doc(cfg(feature = "half")))]] => half::f16, half::bf16);
