//! Stream work as data (Op, OpKind) and the ranges it touches: below the state, which keeps captured ops in streams and graphs, and the queue that runs them.

use std::ffi::c_void;
use std::sync::Arc;

use crate::kernel::Launch;
use crate::sanitizer::{Access, Side, Touch};
use cuda_sys::CUresult;

/// A unit of stream work, with the call that enqueued it (named in reports).
#[derive(Clone)]
pub(crate) struct Op {
    pub(crate) call: &'static str,
    pub(crate) kind: OpKind,
}

/// What an op does.
#[derive(Clone)]
pub(crate) enum OpKind {
    /// `len` bytes from `src` to `dst`; `sides` say where (dst, src) must lie; `peer`
    /// ops may touch any device's memory.
    Copy {
        dst: usize,
        src: usize,
        len: usize,
        sides: (Side, Side),
        peer: bool,
    },
    /// `n` elements of `size` bytes set to `value`.
    Memset {
        dst: usize,
        value: u32,
        size: usize,
        n: usize,
    },
    /// A host function (cuLaunchHostFunc).
    HostFn {
        f: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    /// Records an event.
    Record { event: usize },
    /// A stream-ordered free recorded by a capture: it frees at every replay (so a graph
    /// launched twice frees twice, as a free node would).
    Free { ptr: usize },
    /// Work of another simulation (such as a collective), touching `touches`.
    Custom {
        touches: Vec<Touch>,
        f: Arc<dyn Fn() -> CUresult + Send + Sync>,
    },
    /// A kernel launch: its host function, whose touches are checked as it makes them.
    Kernel(Arc<Launch>),
}

impl Op {
    pub(crate) fn new(call: &'static str, kind: OpKind) -> Self {
        Op { call, kind }
    }

    /// The ranges this op touches, checked when it executes.
    pub(crate) fn accesses(&self) -> Vec<Access> {
        match &self.kind {
            OpKind::Copy {
                dst,
                src,
                len,
                sides,
                ..
            } => vec![
                Access {
                    ptr: *src,
                    len: *len,
                    what: "reads",
                    side: sides.1,
                },
                Access {
                    ptr: *dst,
                    len: *len,
                    what: "writes",
                    side: sides.0,
                },
            ],
            OpKind::Memset { dst, size, n, .. } => vec![Access {
                ptr: *dst,
                len: size.saturating_mul(*n),
                what: "writes",
                side: Side::Device,
            }],
            OpKind::Custom { touches, .. } => touches.iter().map(device_access).collect(),
            OpKind::HostFn { .. }
            | OpKind::Record { .. }
            | OpKind::Free { .. }
            | OpKind::Kernel(_) => Vec::new(),
        }
    }

    pub(crate) fn peer(&self) -> bool {
        matches!(self.kind, OpKind::Copy { peer: true, .. })
    }
}

pub(crate) fn device_access(t: &Touch) -> Access {
    Access {
        ptr: t.ptr as usize,
        len: t.len,
        what: t.what,
        side: Side::Device,
    }
}
