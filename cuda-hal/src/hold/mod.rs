//! The memory model (the crate docs' "Safety" section): what keeps device memory, code,
//! streams and communicators alive until the GPU can no longer touch them. Below the
//! handle types; each file holds one part of it:
//!
//! * `core`: the types, which name one another: [`Stream`](crate::Stream)'s handle and
//!   state, [`Dependency`](crate::Dependency) and [`KeepAlive`](crate::KeepAlive) (what
//!   work needs, shared), a capture's record.
//! * `use_log`: the streams whose work used an allocation; its free is ordered after them.
//! * `group`: [`DeferScope`](crate::DeferScope), what an open NCCL group holds until it ends.
//! * `host_waits`: the captures that forbid a thread host synchronisations.
//! * `after_enqueue`, `hooks`: which order locks a thread holds (each guard accounts for
//!   itself), and the code that waits for one to be let go.
//! * `queued`: releases that found a stream locked for a capture, finished when it is let
//!   go: a contended lock never decides between freeing and leaking.
//! * `foreign_capture`: work recorded by another library's capture, kept by a CUDA user
//!   object its graph owns.
//! * `lock`: locking the model's plain lists.
//!
//! The invariant they share: **a leak is whole**. A release that cannot be proven safe
//! releases nothing it needs (the memory, its context, the streams that used it, the
//! owner or closure that frees it), so no context goes under memory work may still use.

pub(crate) mod after_enqueue;
pub(crate) mod core;
pub(crate) mod foreign_capture;
pub(crate) mod group;
pub(crate) mod hooks;
pub(crate) mod host_waits;
pub(crate) mod lock;
pub(crate) mod queued;
pub(crate) mod use_log;
