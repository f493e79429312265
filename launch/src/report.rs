//! Errors as the programs print them: nccl-channel's [`report`](nccl_channel::report), one
//! line with every source.

pub use nccl_channel::report;
