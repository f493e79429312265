//! Loaded device code (a module or a library), shared by its owner and by the graphs and
//! launches that use it, and unloaded only once no enqueued or captured work can still
//! run its kernels: the memory model of the crate docs' "Safety" section, applied to code.

use std::sync::Arc;

use cuda_sys::{CUlibrary, CUmodule};

use crate::hold::core::{Dependency, KeepAlive};
use crate::hold::use_log::UseLog;
use crate::{Context, Cuda, Result, Stream};

/// The driver handle of loaded code.
#[derive(Clone, Copy)]
pub(crate) enum Handle {
    /// A module of one context (`cuModuleLoadData`), unloaded with `cuModuleUnload`.
    Module(CUmodule),
    /// A context-independent library (`cuLibraryLoadData`), unloaded with
    /// `cuLibraryUnload`.
    Library(CUlibrary),
    /// Given away, or moved into a capture's log: nothing to unload here.
    None,
}

/// One loaded module or library. The last owner unloads it, after every stream whose
/// work launched its kernels has finished (see [`Code::used_on`]).
pub(crate) struct CodeInner {
    cuda: Cuda,
    /// The module's context (`None` for a library).
    ctx: Option<Context>,
    handle: Handle,
    uses: UseLog,
}

// SAFETY: module and library handles are usable from any thread (the driver is
// thread-safe); the use log is behind its own locks.
unsafe impl Send for CodeInner {}
// SAFETY: as above; shared access only reads the handle or goes through the log's locks.
unsafe impl Sync for CodeInner {}

impl Dependency for CodeInner {
    fn used_on(&self, stream: &Stream) -> Result<()> {
        self.uses.note(stream, || Ok(()))
    }
}

impl Drop for CodeInner {
    fn drop(&mut self) {
        if let Handle::None = self.handle {
            return;
        }
        let used = self.uses.take();
        // Waiting for a stream being captured would spoil the capture (and its graph may
        // launch the kernels later): the capture's graph owns the code instead, and
        // unloads it when it goes. As for memory (`Allocation`'s plain drop).
        if let Some(log) = used.iter().find_map(Stream::capture_log) {
            let moved = CodeInner {
                cuda: self.cuda.clone(),
                ctx: self.ctx.clone(),
                handle: std::mem::replace(&mut self.handle, Handle::None),
                uses: UseLog::with(used),
            };
            // Ended since it was found: unloaded as if no capture had recorded it, by the
            // moved value's own drop.
            drop(log.keep(KeepAlive::new(Arc::new(moved))));
            return;
        }
        // Any failure below leaks the code: never unload what work may still run.
        for s in &used {
            if s.synchronize().is_err() {
                return;
            }
        }
        match self.handle {
            Handle::Module(m) => {
                let Some(ctx) = &self.ctx else { return };
                let Ok(_g) = ctx.bind() else { return };
                // SAFETY: loaded by cuModuleLoadData in `ctx` (current now) and unloaded
                // once, after the work of every stream that launched its kernels is done.
                let _ = unsafe { (self.cuda.fns().cuModuleUnload)(m) };
            }
            Handle::Library(l) => {
                // SAFETY: loaded by cuLibraryLoadData and unloaded once, after the work of
                // every stream that launched its kernels is done.
                let _ = unsafe { (self.cuda.fns().cuLibraryUnload)(l) };
            }
            Handle::None => {}
        }
    }
}

/// A shared owner of loaded code.
#[derive(Clone)]
pub(crate) struct Code(Arc<CodeInner>);

impl Code {
    pub(crate) fn new(cuda: &Cuda, ctx: Option<&Context>, handle: Handle) -> Code {
        Code(Arc::new(CodeInner {
            cuda: cuda.clone(),
            ctx: ctx.cloned(),
            handle,
            uses: UseLog::default(),
        }))
    }

    pub(crate) fn cuda(&self) -> &Cuda {
        &self.0.cuda
    }

    pub(crate) fn handle(&self) -> Handle {
        self.0.handle
    }

    /// Work about to be enqueued on `stream` runs this code: its unload waits for that
    /// work, and an open capture or group keeps it loaded ([`Stream::hold`]). Call with
    /// the stream's order lock held, before the work is enqueued.
    #[inline]
    pub(crate) fn used_on(&self, stream: &Stream) -> Result<()> {
        self.0.used_on(stream)?;
        stream.hold(|| self.keep_alive());
        Ok(())
    }

    /// A shared owner: the code stays loaded while it lives.
    pub(crate) fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.0.clone())
    }
}
