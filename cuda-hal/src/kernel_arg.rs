//! Kernel arguments: [`KernelArg`] turns one Rust value into the bytes a kernel parameter
//! receives (noting device memory as used on the launch stream, so it outlives the
//! kernel), [`KernelArgs`] packs a tuple of them for `cuLaunchKernel`.

use std::ffi::c_void;
use std::mem::size_of;

use cuda_sys::CUdeviceptr;

use crate::{DeviceRepr, DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut, Result, Stream};

/// One kernel argument: what the kernel's parameter receives ([`Raw`](Self::Raw)), made
/// for a launch on a stream.
///
/// Implemented for the fixed-width numbers (`i8`..`u64`, `f32`, `f64`, and `f16`/`bf16`
/// with the `half` feature), for device memory (`&S` and `&mut S` where `S` is a
/// [`DeviceSlice`] / [`DeviceSliceMut`], and views by value: the kernel gets the device
/// address), and for [`ByValue`] (any [`DeviceRepr`] struct, passed by value). `usize`
/// and `isize` are left out on purpose: the kernel's parameter has an explicit width.
///
/// # Safety
/// If [`Raw`](Self::Raw) carries anything a kernel may dereference (a device address),
/// [`prepare`](Self::prepare) keeps that memory allocated until the kernel has run on
/// `stream`, including every replay of a graph that captures the launch and a launch
/// deferred by an open group: as [`DeviceSlice::used_on`] does, which is what the impls
/// here call. What the kernel does with the values is
/// [`Function::launch`](crate::Function::launch)'s caller's promise.
///
/// A type of one's own can be an argument, e.g. an enum the kernel takes as a `u32`:
///
/// ```
/// use cuda_hal::{DeviceBuffer, KernelArg, LaunchConfig, Module, Result, Stream};
///
/// #[derive(Clone, Copy)]
/// enum Op {
///     Double = 0,
///     Negate = 1,
/// }
/// // SAFETY: a number, not an address.
/// unsafe impl KernelArg for Op {
///     type Raw = u32;
///     fn prepare(&self, _stream: &Stream) -> Result<u32> {
///         Ok(*self as u32)
///     }
/// }
///
/// let ptx = ".version 8.0\n.target sm_90\n.visible .entry apply(.param .u64 x, .param .u32 n, .param .u32 op) { ret; }\n";
/// let driver = cuda_mock::MockDriver::with_devices(1).kernel("apply", &[8, 4, 4], |k| {
///     let (x, n, op) = (k.param::<u64>(0), k.param::<u32>(1), k.param::<u32>(2));
///     let v: Vec<i32> = k.read::<i32>(x, n as usize).iter().map(|v| if op == 0 { 2 * v } else { -v }).collect();
///     k.write(x, &v);
/// });
/// let (cuda, _world) = driver.build_with(cuda_hal::Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let module = Module::from_ptx(&ctx, ptx)?;
/// let apply = module.function("apply")?;
/// let stream = Stream::new(&ctx)?;
/// let mut x = DeviceBuffer::from_slice(&ctx, &[1i32, -2, 3])?;
/// let shape = LaunchConfig::for_elements(3, 128);
/// // SAFETY: `apply` reads and writes `n` i32s at `x`, and takes `op` as a u32.
/// unsafe {
///     apply.launch(&stream, shape, (&mut x, 3u32, Op::Double))?;
///     apply.launch(&stream, shape, (&mut x, 3u32, Op::Negate))?;
/// }
/// stream.synchronize()?;
/// assert_eq!(x.to_vec()?, [-2, 4, -6]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub unsafe trait KernelArg {
    /// The parameter's value, copied by the driver at launch.
    type Raw: DeviceRepr;

    /// The value for a launch on `stream`. Called with the stream's
    /// [`enqueue_lock`](Stream::enqueue_lock) held, just before the launch: device memory
    /// is noted as used on `stream` here (see [`DeviceSlice::used_on`]). An `Err` means
    /// nothing is launched.
    fn prepare(&self, stream: &Stream) -> Result<Self::Raw>;

    /// The launch that [`prepare`](Self::prepare) prepared for has been enqueued (or
    /// failed): device memory hears of it ([`DeviceSlice::enqueued_on`]). The default
    /// does nothing.
    #[inline]
    fn enqueued(&self, stream: &Stream) {
        let _ = stream;
    }
}

macro_rules! scalar_arg {
    ($attrs:tt => $($t:ty),*) => { $(
        scalar_arg!(@one $attrs $t);
    )* };
    (@one [$(#[$attr:meta])*] $t:ty) => {
        $(#[$attr])*
        // SAFETY: a number, not an address.
        unsafe impl KernelArg for $t {
            type Raw = $t;
            #[inline]
            fn prepare(&self, _: &Stream) -> Result<$t> {
                Ok(*self)
            }
        }
    };
}
scalar_arg!([] => i8, u8, i16, u16, i32, u32, i64, u64, f32, f64);

// The badge on docs.rs: the expanded impls do not carry the invocation's `cfg`.
#[cfg(feature = "half")]
scalar_arg!([#[cfg_attr(docsrs, doc(cfg(feature = "half")))]] => half::f16, half::bf16);

/// A value of a plain-data type passed by value (a struct the kernel takes as one
/// parameter). Its layout must match the kernel's: `#[repr(C)]` with the same fields.
///
/// ```
/// use cuda_hal::{ByValue, DeviceBuffer, DeviceRepr, LaunchConfig, Module, Stream};
///
/// /// `struct Affine { float a, b; }` on the device.
/// #[repr(C)]
/// #[derive(Clone, Copy)]
/// struct Affine {
///     a: f32,
///     b: f32,
/// }
/// // SAFETY: two `f32`s, no padding; every bit pattern is a valid value.
/// unsafe impl DeviceRepr for Affine {}
///
/// let ptx = ".version 8.0\n.target sm_90\n.visible .entry affine(.param .u64 x, .param .u32 n, .param .align 4 .b8 f[8]) { ret; }\n";
/// let driver = cuda_mock::MockDriver::with_devices(1).kernel("affine", &[8, 4, 8], |k| {
///     let (x, n) = (k.param::<u64>(0), k.param::<u32>(1) as usize);
///     let f = k.param_bytes(2).to_vec();
///     let (a, b) = (f32::from_ne_bytes([f[0], f[1], f[2], f[3]]), f32::from_ne_bytes([f[4], f[5], f[6], f[7]]));
///     let v: Vec<f32> = k.read::<f32>(x, n).iter().map(|x| a * x + b).collect();
///     k.write(x, &v);
/// });
/// let (cuda, _world) = driver.build_with(cuda_hal::Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let module = Module::from_ptx(&ctx, ptx)?;
/// let affine = module.function("affine")?;
/// let stream = Stream::new(&ctx)?;
/// let mut x = DeviceBuffer::from_slice(&ctx, &[0.0f32, 1.0, 2.0])?;
/// let f = ByValue(Affine { a: 2.0, b: 0.5 });
/// // SAFETY: `affine` reads and writes `n` floats at `x`, and takes an `Affine` by value.
/// unsafe { affine.launch(&stream, LaunchConfig::linear(1, 32), (&mut x, 3u32, f)) }?;
/// stream.synchronize()?;
/// assert_eq!(x.to_vec()?, [0.5, 2.5, 4.5]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ByValue<T: DeviceRepr>(pub T);

// SAFETY: the value is passed as it is; memory its fields may point to is the launch's
// caller's to keep alive (see `Function::launch`).
unsafe impl<T: DeviceRepr> KernelArg for ByValue<T> {
    type Raw = T;
    #[inline]
    fn prepare(&self, _: &Stream) -> Result<T> {
        Ok(self.0)
    }
}

/// Device memory as an argument: checks it belongs to the launch stream's context, notes
/// it used there, and gives its address.
#[inline]
fn memory<S: DeviceSlice + ?Sized>(s: &S, stream: &Stream) -> Result<CUdeviceptr> {
    stream
        .context()
        .expect_same(s.context(), "Function::launch", "kernel argument")?;
    Ok(crate::Enqueuing::begin(s, stream)?.reported_by_caller())
}

// SAFETY: `memory` notes the memory used on the stream (DeviceSlice::used_on).
unsafe impl<S: DeviceSlice + ?Sized> KernelArg for &S {
    type Raw = CUdeviceptr;
    #[inline]
    fn prepare(&self, stream: &Stream) -> Result<CUdeviceptr> {
        memory(*self, stream)
    }
    #[inline]
    fn enqueued(&self, stream: &Stream) {
        (**self).enqueued_on(stream);
    }
}

// SAFETY: as above.
unsafe impl<S: DeviceSliceMut + ?Sized> KernelArg for &mut S {
    type Raw = CUdeviceptr;
    #[inline]
    fn prepare(&self, stream: &Stream) -> Result<CUdeviceptr> {
        memory(&**self, stream)
    }
    #[inline]
    fn enqueued(&self, stream: &Stream) {
        (**self).enqueued_on(stream);
    }
}

// SAFETY: as above.
unsafe impl<T: DeviceRepr> KernelArg for DeviceView<'_, T> {
    type Raw = CUdeviceptr;
    #[inline]
    fn prepare(&self, stream: &Stream) -> Result<CUdeviceptr> {
        memory(self, stream)
    }
    #[inline]
    fn enqueued(&self, stream: &Stream) {
        DeviceSlice::enqueued_on(self, stream);
    }
}

// SAFETY: as above.
unsafe impl<T: DeviceRepr> KernelArg for DeviceViewMut<'_, T> {
    type Raw = CUdeviceptr;
    #[inline]
    fn prepare(&self, stream: &Stream) -> Result<CUdeviceptr> {
        memory(self, stream)
    }
    #[inline]
    fn enqueued(&self, stream: &Stream) {
        DeviceSlice::enqueued_on(self, stream);
    }
}

mod sealed {
    pub trait Sealed {}
}

/// All the arguments of one launch: `()` and tuples of up to 12 [`KernelArg`]s. Sealed:
/// the packing it does is what makes the launch's parameter pointers valid.
///
/// What a launch checks against the kernel's parameters:
///
/// ```
/// use cuda_hal::{ByValue, DeviceBuffer, DeviceView, KernelArgs};
/// // Numbers are their own width; device memory is an 8-byte address.
/// assert_eq!(<(u32, f32, &DeviceBuffer<f64>) as KernelArgs>::SIZES, [4, 4, 8]);
/// assert_eq!(<(DeviceView<'_, u8>, ByValue<u16>) as KernelArgs>::SIZES, [8, 2]);
/// assert!(<() as KernelArgs>::SIZES.is_empty());
/// ```
pub trait KernelArgs: sealed::Sealed {
    /// Each argument's size in bytes, in order.
    const SIZES: &'static [usize];

    /// The prepared values, kept alive across the launch.
    #[doc(hidden)]
    type Raw;

    /// One pointer per value, as `cuLaunchKernel` wants them.
    #[doc(hidden)]
    type Pointers: AsMut<[*mut c_void]>;

    /// Prepares every argument for a launch on `stream` (see [`KernelArg::prepare`]).
    #[doc(hidden)]
    fn prepare(&self, stream: &Stream) -> Result<Self::Raw>;

    /// Pointers to each value of `raw`, valid while `raw` is neither moved nor dropped.
    #[doc(hidden)]
    fn pointers(raw: &mut Self::Raw) -> Self::Pointers;

    /// The launch has been enqueued (or failed): every argument hears of it
    /// ([`KernelArg::enqueued`]).
    #[doc(hidden)]
    fn enqueued(&self, stream: &Stream);
}

impl sealed::Sealed for () {}
impl KernelArgs for () {
    const SIZES: &'static [usize] = &[];
    type Raw = ();
    type Pointers = [*mut c_void; 0];
    fn prepare(&self, _: &Stream) -> Result<()> {
        Ok(())
    }
    fn pointers(_: &mut ()) -> [*mut c_void; 0] {
        []
    }
    fn enqueued(&self, _: &Stream) {}
}

macro_rules! tuple_args {
    ($n:literal: $($a:ident $i:tt),+) => {
        impl<$($a: KernelArg),+> sealed::Sealed for ($($a,)+) {}
        impl<$($a: KernelArg),+> KernelArgs for ($($a,)+) {
            const SIZES: &'static [usize] = &[$(size_of::<$a::Raw>()),+];
            type Raw = ($($a::Raw,)+);
            type Pointers = [*mut c_void; $n];
            #[inline]
            fn prepare(&self, stream: &Stream) -> Result<Self::Raw> {
                Ok(($(self.$i.prepare(stream)?,)+))
            }
            #[inline]
            fn pointers(raw: &mut Self::Raw) -> Self::Pointers {
                [$((&raw mut raw.$i).cast::<c_void>()),+]
            }
            #[inline]
            fn enqueued(&self, stream: &Stream) {
                $(self.$i.enqueued(stream);)+
            }
        }
    };
}
tuple_args!(1: A 0);
tuple_args!(2: A 0, B 1);
tuple_args!(3: A 0, B 1, C 2);
tuple_args!(4: A 0, B 1, C 2, D 3);
tuple_args!(5: A 0, B 1, C 2, D 3, E 4);
tuple_args!(6: A 0, B 1, C 2, D 3, E 4, F 5);
tuple_args!(7: A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_args!(8: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
tuple_args!(9: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
tuple_args!(10: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
tuple_args!(11: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
tuple_args!(12: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);

static_assertions::assert_impl_all!(ByValue<f64>: Send, Sync, Copy, std::fmt::Debug);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_raw_values() {
        assert_eq!(<() as KernelArgs>::SIZES, &[] as &[usize]);
        assert_eq!(<(u8, f64, ByValue<u16>) as KernelArgs>::SIZES, &[1, 8, 2]);
        assert_eq!(
            <(&crate::DeviceBuffer<f32>, DeviceView<'static, i8>) as KernelArgs>::SIZES,
            &[8, 8]
        );
    }

    #[test]
    fn pointers_point_at_each_value() {
        let mut raw = (1u8, 2.5f64, 7u32);
        let p = <(u8, f64, u32) as KernelArgs>::pointers(&mut raw);
        // SAFETY: the pointers point at `raw`'s fields, which are alive and of these types.
        unsafe {
            assert_eq!(*p[0].cast::<u8>(), 1);
            assert_eq!(*p[1].cast::<f64>(), 2.5);
            assert_eq!(*p[2].cast::<u32>(), 7);
        }
    }
}
