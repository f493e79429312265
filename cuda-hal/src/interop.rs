//! # Other crates' memory, streams and contexts
//!
//! Projects keep their device memory in another crate (cudarc, and through it candle;
//! cubecl and burn; torch across an FFI boundary). This crate and nccl-channel use that
//! memory without a copy, under the same rule as their own: no work they enqueue, group or
//! capture outlives the memory it uses, and the other crate's next use and its free come
//! after that work.
//!
//! | what you have | how | `unsafe` in your code |
//! | --- | --- | --- |
//! | cudarc's `CudaSlice`, to keep for a while (groups, captures) | [`DeviceBuffer::from_cudarc`](crate::DeviceBuffer::from_cudarc), back with [`into_cudarc`](crate::DeviceBuffer::into_cudarc) | none |
//! | cudarc's slice or view, for one call | [`cudarc::Borrowed`](crate::cudarc::Borrowed), [`BorrowedMut`](crate::cudarc::BorrowedMut) | none |
//! | cudarc's `CudaContext` | [`Context::from_cudarc`](crate::Context::from_cudarc) | none |
//! | cudarc's `CudaStream`, to enqueue this crate's work on | [`Stream::from_cudarc`](crate::Stream::from_cudarc) | one: cudarc does not capture it on another thread meanwhile |
//! | any allocation kept alive by an owner value (a framework's tensor, a DLPack capsule) | [`DeviceBuffer::from_owner`](crate::DeviceBuffer::from_owner) / [`from_owner_on`](crate::DeviceBuffer::from_owner_on), back with [`into_owner`](crate::DeviceBuffer::into_owner) | one, for the address |
//! | a raw stream or context kept alive by an owner | [`Stream::from_owner`](crate::Stream::from_owner), [`Context::from_raw`](crate::Context::from_raw) | one |
//! | your own buffer type | implement [`DeviceSlice`](crate::DeviceSlice) (with [`Stream::hold`](crate::Stream::hold) and [`Stream::after_enqueue`](crate::Stream::after_enqueue)) | the `unsafe impl` |
//!
//! ## cudarc (feature `cudarc`)
//!
//! Both crates must drive the same driver library: cudarc opens `libcuda` itself, so an
//! in-process simulated driver cannot be shared ([`Error::ForeignDriver`](crate::Error::ForeignDriver));
//! without a GPU, run on the drop-in simulator (`LD_LIBRARY_PATH=$(cargo xtask dropin)`),
//! as the repository's tests and the `tensor_parallel` example do. This block is compiled
//! here; `dropin/tests/dropin/cudarc_interop.rs` runs the same steps on simulated GPUs:
//!
//! ```no_run
//! # #[cfg(feature = "cudarc")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use cuda_hal::cudarc::{Borrowed, BorrowedMut};
//! use cuda_hal::{Context, Cuda, DeviceBuffer, DeviceViewMut, Stream};
//! use cudarc::driver::CudaContext;
//!
//! let cuda = Cuda::load()?;
//! let theirs = CudaContext::new(0)?;
//! let ctx = Context::from_cudarc(&cuda, &theirs)?;
//! let their_stream = theirs.new_stream()?;
//! let src = their_stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
//! let mut dst = their_stream.alloc_zeros::<f32>(3)?;
//!
//! // Lent for one call, on a stream of ours: our copy waits for cudarc's upload, and
//! // cudarc's next use of `dst` (and its free of `src`) wait for our copy.
//! let ours = Stream::non_blocking(&ctx)?;
//! DeviceViewMut::new(&mut BorrowedMut::new(&ctx, &mut dst)?)
//!     .copy_from_async(&Borrowed::new(&ctx, &src)?, &ours)?;
//! drop(src);
//! assert_eq!(their_stream.clone_dtoh(&dst)?, [1.0, 2.0, 3.0]);
//!
//! // Moved in, for as long as we like (here: a fill on our stream), then given back.
//! let mut buf = DeviceBuffer::from_cudarc(&ctx, dst)?;
//! buf.fill_async(0.5, &ours)?;
//! let dst = buf.into_cudarc().expect("nothing else holds it");
//! assert_eq!(their_stream.clone_dtoh(&dst)?, [0.5; 3]);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "cudarc"))]
//! # fn main() {}
//! ```
//!
//! Borrowed memory is refused ([`Error::Deferred`](crate::Error::Deferred)) where the work
//! would run after the borrow ends: inside an NCCL group (including the groups
//! nccl-channel opens for `all_to_all`, `gather` and `scatter`) and in a capture. Move the
//! slice in for those.
//!
//! ## candle (through cudarc)
//!
//! candle's CUDA tensors are cudarc slices: `tensor.storage_and_layout()` gives
//! `Storage::Cuda(storage)`, and `storage.as_cuda_slice::<f32>()` the `&CudaSlice<f32>`
//! (the layout's `start_offset` and contiguity say which part is the tensor: take
//! `slice.slice(offset..offset + len)`). Lend it with
//! [`Borrowed::new`](crate::cudarc::Borrowed::new); its stream is the one candle's device
//! runs on. A sketch (not compiled here: candle is not a dependency):
//!
//! ```text
//! let (storage, layout) = tensor.storage_and_layout();
//! let candle_core::Storage::Cuda(s) = &*storage else { bail!("not on a GPU") };
//! let start = layout.start_offset();
//! let view = s.as_cuda_slice::<f32>()?.slice(start..start + tensor.elem_count());
//! comm.all_reduce(&Borrowed::new(&ctx, &view)?, &mut out, ReduceOp::Sum, &stream)?;
//! ```
//!
//! ## burn and cubecl
//!
//! cubecl's CUDA runtime allocates through cudarc but keeps its memory in pools and hands
//! out bindings, not `CudaSlice`s. Take the binding's device address and length from
//! cubecl, and adopt it with [`DeviceBuffer::from_owner_on`](crate::DeviceBuffer::from_owner_on):
//! a clone of the tensor as the owner (the pool keeps the memory while it lives) and the
//! stream cubecl runs that tensor's work on (adopted with
//! [`Stream::from_owner`](crate::Stream::from_owner)) as the home stream.
//!
//! ## torch tensors (DLPack, or raw pointers)
//!
//! A torch tensor crosses an FFI boundary as a DLPack capsule (`tensor.__dlpack__()`):
//! `data + byte_offset` is the address, `shape` the length (contiguous strides), and the
//! capsule's deleter gives the tensor back to torch. Own the capsule, call its deleter in
//! `Drop`, and adopt the memory with the capsule as the owner; torch's current stream
//! (`torch.cuda.current_stream().cuda_stream`, a raw handle) orders the handover. Here the
//! tensor's memory comes from the simulated driver:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use cuda_hal::{DeviceBuffer, Stream};
//! # let (cuda, world) = cuda_mock::MockDriver::with_devices(1).build_with(cuda_hal::Cuda::from_driver)?;
//! # let ctx = cuda.device(0)?.primary_context()?;
//!
//! /// A DLPack capsule's parts this needs (a real one: `*mut DLManagedTensor`).
//! struct Capsule {
//!     data: u64,
//!     len: usize,
//!     deleter: Box<dyn FnOnce() + Send + Sync>,
//! }
//! /// Owns the capsule: gives the tensor back to its framework when dropped.
//! struct Owned(Option<Capsule>);
//! impl Drop for Owned {
//!     fn drop(&mut self) {
//!         if let Some(c) = self.0.take() {
//!             (c.deleter)();
//!         }
//!     }
//! }
//!
//! // "torch": 8 floats and a deleter that frees them.
//! let data = { let _c = ctx.bind()?; world.alloc_foreign(32, "torch").expect("memory") };
//! let freed = Arc::new(Mutex::new(false));
//! let (w, f) = (world.clone(), freed.clone());
//! let deleter = Box::new(move || {
//!     w.free_foreign(data, "torch free", "torch").expect("its own memory");
//!     *f.lock().unwrap() = true;
//! });
//! let capsule = Capsule { data, len: 8, deleter };
//! let (ptr, len) = (capsule.data, capsule.len);
//! // SAFETY: `len` f32s at `ptr` of `ctx`, kept alive by the capsule until its deleter
//! // runs, which only the owner calls.
//! let mut t = unsafe { DeviceBuffer::<f32>::from_owner(&ctx, ptr, len, Owned(Some(capsule))) };
//! t.fill_async(1.0, &Stream::non_blocking(&ctx)?)?;
//! assert_eq!(t.to_vec()?, [1.0; 8]);
//! drop(t); // after the fill: the deleter gives the tensor back
//! assert!(*freed.lock().unwrap());
//! assert!(world.violations().is_empty());
//! # Ok::<(), cuda_hal::Error>(())
//! ```
