//! The crate's tests: one binary, a module per topic (linked once, not once per file).

mod loader_env;
mod real_nccl;
mod resident;
mod stub_libraries;
mod wheel_script;
