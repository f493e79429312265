//! The crate's tests: one binary, a module per topic (linked once, not once per file).

mod foreign;
mod kernel_read_bounds;
mod kernels;
mod sanitizer;
mod user_objects;
