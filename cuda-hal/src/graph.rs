//! CUDA graphs: capture a stream's work once, replay it with one launch.

use cuda_sys::{CUgraph, CUgraphExec, CUstreamCaptureMode, CUstreamCaptureStatus};

use crate::{Context, Result, Stream};

/// How a capture treats unsafe calls from other threads (`CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unsafe calls from any thread fail while any capture is running.
    Global,
    /// Only this thread's unsafe calls fail (use this when several threads capture).
    ThreadLocal,
    /// Nothing is checked.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> CUstreamCaptureMode {
        match self {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

impl Stream {
    /// Starts recording the work enqueued on this stream instead of running it.
    #[doc(alias = "cuStreamBeginCapture")]
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let cuda = self.context().cuda();
        // SAFETY: a valid stream; the mode is a documented value.
        let rc = unsafe { (cuda.fns().cuStreamBeginCapture)(self.as_raw(), mode.raw()) };
        cuda.check(rc, "cuStreamBeginCapture")
    }

    /// Stops recording and returns the captured work as a graph.
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end_capture(&self) -> Result<Graph> {
        let cuda = self.context().cuda();
        let mut raw: CUgraph = std::ptr::null_mut();
        // SAFETY: a valid stream and out-pointer.
        let rc = unsafe { (cuda.fns().cuStreamEndCapture)(self.as_raw(), &mut raw) };
        cuda.check(rc, "cuStreamEndCapture")?;
        Ok(Graph {
            ctx: self.context().clone(),
            raw,
        })
    }

    /// Whether the stream is being captured.
    #[doc(alias = "cuStreamIsCapturing")]
    pub fn is_capturing(&self) -> Result<bool> {
        let cuda = self.context().cuda();
        let mut st = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a valid stream and out-pointer.
        let rc = unsafe { (cuda.fns().cuStreamIsCapturing)(self.as_raw(), &mut st) };
        cuda.check(rc, "cuStreamIsCapturing")?;
        Ok(st == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
    }
}

/// A captured graph.
pub struct Graph {
    ctx: Context,
    raw: CUgraph,
}

// SAFETY: graph handles are usable from any thread, one call at a time (`&mut`-free API;
// instantiation only reads the graph).
unsafe impl Send for Graph {}

impl Graph {
    /// Makes an executable graph of it.
    #[doc(alias = "cuGraphInstantiateWithFlags")]
    pub fn instantiate(&self) -> Result<GraphExec> {
        let cuda = self.ctx.cuda();
        let mut raw: CUgraphExec = std::ptr::null_mut();
        let _g = self.ctx.bind()?;
        // SAFETY: a valid graph and out-pointer; flags 0.
        let rc = unsafe { (cuda.fns().cuGraphInstantiateWithFlags)(&mut raw, self.raw, 0) };
        cuda.check(rc, "cuGraphInstantiateWithFlags")?;
        Ok(GraphExec {
            ctx: self.ctx.clone(),
            raw,
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamEndCapture and destroyed once.
        let _ = unsafe { (self.ctx.cuda().fns().cuGraphDestroy)(self.raw) };
    }
}

/// An executable graph: replays the captured work.
pub struct GraphExec {
    ctx: Context,
    raw: CUgraphExec,
}

// SAFETY: as for `Graph`.
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Enqueues one replay on `stream`.
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let cuda = self.ctx.cuda();
        // SAFETY: a valid executable graph and stream.
        let rc = unsafe { (cuda.fns().cuGraphLaunch)(self.raw, stream.as_raw()) };
        cuda.check(rc, "cuGraphLaunch")
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: created by instantiate and destroyed once.
        let _ = unsafe { (self.ctx.cuda().fns().cuGraphExecDestroy)(self.raw) };
    }
}
