//! The crate's tests: one binary, a module per topic (linked once, not once per file).

mod arithmetic;
mod common;
mod config;
mod init;
mod newer_api;
mod processes;
mod processes_comm_id;
mod registry;
mod sanitizer;
