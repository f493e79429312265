//! The crate's tests: one binary, a module per topic (linked once, not once per file).

mod attacks;
mod common;
mod compile_fail;
#[cfg(feature = "cudarc")]
mod cudarc_gpu;
mod foreign;
mod gpu;
mod inputs;
mod kernels;
mod kernels_gpu;
mod mock_driver;
mod soundness;
mod views;
