//! [`DeviceRepr`]: element types that may live in device memory.

/// Plain data that can be copied to and from a device byte for byte.
///
/// # Safety
/// Implementors must be `Copy`, have no padding and no pointers, and every bit pattern
/// must be a valid value (device memory may hold anything, e.g. after an allocation).
pub unsafe trait DeviceRepr: Copy + Send + Sync + 'static {}

macro_rules! device_repr {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl DeviceRepr for $t {}
    )* };
}
device_repr!(i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, isize, usize);

#[cfg(feature = "half")]
device_repr!(half::f16, half::bf16);
