//! Stream order: a stream's key and context, capture, and ops executed under the sanitizer; below every domain that enqueues work, above the state and the allocator.
//!
//! Work runs eagerly, at enqueue time, in order; while a stream is captured it is
//! recorded instead, to run when the graph is launched. Either way each op is stamped,
//! checked and recorded by the sanitizer when it executes.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use crate::alloc::free_device;
use crate::current::current;
use crate::handle::{h2p, p2h};
use crate::kernel::Launch;
use crate::op::{Op, OpKind, device_access};
use crate::sanitizer::{Access, Touch, Use};
use crate::state::State;
use crate::world::World;
use cuda_sys::{CUresult, CUstream, CUstreamCaptureMode};

/// Checks that function `f` is still loaded; a function of an unloaded module (or no
/// function at all) is reported, prefixed by `prefix`, as `CUDA_ERROR_INVALID_HANDLE`.
pub(super) fn check_live(s: &mut State, f: usize, prefix: &str) -> Result<(), CUresult> {
    if s.functions.contains_key(&f) {
        return Ok(());
    }
    let why = match s.dead_functions.get(&f) {
        Some(d) => format!(
            "{prefix}cuLaunchKernel of {} (function {f:#x}): its module was unloaded by {}",
            d.name, d.by
        ),
        None => format!("{prefix}cuLaunchKernel of {f:#x}: not a function handle"),
    };
    s.violation(why);
    Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// Records, on the module of a launch that is executing, that stream `key` used it (its
/// unload must be ordered after the launch).
pub(super) fn record_module_use(s: &mut State, launch: &Launch, key: usize, stamp: u64) {
    if let Some(m) = s.modules.get_mut(&launch.module) {
        m.last_use.insert(
            key,
            Use {
                stamp,
                call: format!("cuLaunchKernel {}", launch.name),
            },
        );
    }
}

/// A stream's sanitizer key and context: its handle, or for the legacy default stream
/// (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) the current context's handle.
pub(crate) fn stream_key(
    w: &World,
    s: &State,
    stream: CUstream,
) -> Result<(usize, usize), CUresult> {
    let h = p2h(stream);
    if h <= 2 {
        let c = current(w, s)?;
        return Ok((c, c));
    }
    s.streams
        .get(&h)
        .map(|st| (h, st.ctx))
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// The context a stream belongs to (0: the current context's default stream).
pub(super) fn stream_ctx(w: &World, s: &State, stream: CUstream) -> Result<usize, CUresult> {
    stream_key(w, s, stream).map(|(_, c)| c)
}

/// Whether stream `key` is being captured (by its own capture or one it joined).
pub(super) fn capturing(s: &State, key: usize) -> bool {
    capture_origin(s, key).is_some()
}

/// The stream whose capture records `key`'s work: itself, or the capture it joined while
/// that is still running.
pub(crate) fn capture_origin(s: &State, key: usize) -> Option<usize> {
    let st = s.streams.get(&key)?;
    if st.capture.is_some() {
        return Some(key);
    }
    let origin = st.joined?;
    s.streams
        .get(&origin)
        .is_some_and(|o| o.capture.is_some())
        .then_some(origin)
}

/// The running capture (its origin stream) that forbids the calling thread "potentially
/// unsafe" calls, host synchronisations among them: one this thread began in global or
/// thread-local mode, or any thread's in global mode (CUDA's `cudaStreamCaptureMode`).
pub(super) fn forbidding_capture(s: &State) -> Option<usize> {
    let me = std::thread::current().id();
    s.streams.iter().find_map(|(k, st)| match st.capture_mode {
        Some((CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL, _)) => Some(*k),
        Some((CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, t)) if t == me => Some(*k),
        _ => None,
    })
}

/// Checks what can be checked before an op runs (arguments, not addresses).
fn validate(s: &State, op: &Op) -> Result<(), CUresult> {
    match &op.kind {
        OpKind::Copy { dst, src, len, .. } => {
            if *len > 0 && (*dst == 0 || *src == 0) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            Ok(())
        }
        OpKind::Memset { dst, size, n, .. } => {
            let bytes = size
                .checked_mul(*n)
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            if bytes > 0 && (*dst == 0 || dst % size != 0) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            Ok(())
        }
        OpKind::Record { event } => {
            if s.events.contains_key(event) {
                Ok(())
            } else {
                Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
            }
        }
        OpKind::HostFn { .. } | OpKind::Custom { .. } | OpKind::Free { .. } | OpKind::Kernel(_) => {
            Ok(())
        }
    }
}

/// Executes `op` now on stream `key` of context `ctx`: stamps it, checks its ranges
/// (illegal ones are reported, prefixed by `prefix`, and the op is skipped), records its
/// uses and runs it. Ops that call out (host functions, other simulations) run with the
/// lock released, so they may block on other threads or call the driver.
fn execute(
    w: &World,
    mut s: MutexGuard<'_, State>,
    key: usize,
    ctx: usize,
    op: Op,
    prefix: &str,
) -> CUresult {
    if let Err(e) = validate(&s, &op) {
        return e;
    }
    // A captured launch of a function whose module was unloaded since is caught here.
    if let OpKind::Kernel(l) = &op.kind
        && let Err(e) = check_live(&mut s, l.function, prefix)
    {
        return e;
    }
    let stamp = s.stamp(key, ctx);
    let device = if op.peer() {
        None
    } else {
        s.contexts.get(&ctx).map(|c| c.device)
    };
    let touched = match s.check_accesses(prefix, op.call, &op.accesses(), device) {
        Ok(t) => t,
        Err(()) => return CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    };
    s.record_uses(&touched, key, stamp, op.call);
    match op.kind {
        OpKind::Copy { dst, src, len, .. } => {
            if len > 0 {
                // SAFETY: checked just above: device sides lie in live allocations (never in
                // quarantined memory); host sides are the caller's pointers, valid for `len`
                // bytes by the API's contract.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            }
            CUresult::CUDA_SUCCESS
        }
        OpKind::Memset {
            dst,
            value,
            size,
            n,
        } => {
            for i in 0..n {
                let p = dst + i * size;
                // SAFETY: the whole range was checked just above to lie in one live
                // allocation (a device side), and `validate` checked `dst` is aligned to `size`.
                unsafe {
                    match size {
                        1 => *(p as *mut u8) = value as u8,
                        2 => *(p as *mut u16) = value as u16,
                        _ => *(p as *mut u32) = value,
                    }
                }
            }
            CUresult::CUDA_SUCCESS
        }
        OpKind::Record { event } => {
            let clock = s.clock_of(key);
            if let Some(e) = s.events.get_mut(&event) {
                e.recorded = Some(Instant::now());
                e.clock = clock;
            }
            CUresult::CUDA_SUCCESS
        }
        OpKind::Free { ptr } => {
            if s.allocs.contains_key(&ptr) {
                s.check_free_order(op.call, key, ptr);
            }
            free_device(&mut s, op.call, ptr)
        }
        OpKind::HostFn { f, data } => {
            drop(s);
            // SAFETY: the caller of cuLaunchHostFunc passed this function and argument.
            unsafe { f(h2p(data)) };
            CUresult::CUDA_SUCCESS
        }
        OpKind::Custom { f, .. } => {
            drop(s);
            let outer = RUNNING.replace(Some((w.id, key, stamp)));
            let rc = f();
            RUNNING.set(outer);
            rc
        }
        OpKind::Kernel(launch) => {
            record_module_use(&mut s, &launch, key, stamp);
            let device = s.contexts.get(&ctx).map_or(0, |c| c.device);
            drop(s);
            crate::kernel::run(w, &launch, key, stamp, device, prefix)
        }
    }
}

thread_local! {
    /// The custom op this thread is executing: (world id, stream key, stamp).
    static RUNNING: std::cell::Cell<Option<(u64, usize, u64)>> = const { std::cell::Cell::new(None) };
}

/// [`crate::MockWorld::running_op`].
pub(super) fn running_op(w: &World) -> Option<(usize, u64)> {
    RUNNING
        .get()
        .and_then(|(id, key, stamp)| (id == w.id).then_some((key, stamp)))
}

/// Enqueues `op` on `stream`: recorded if the stream is capturing, else executed now.
pub(super) fn enqueue(w: &World, s: MutexGuard<'_, State>, stream: CUstream, op: Op) -> CUresult {
    enqueue_from(w, s, stream, op, "")
}

/// [`enqueue`], with reports prefixed by `prefix` (`"cuGraphLaunch: "` at replay).
pub(super) fn enqueue_from(
    w: &World,
    mut s: MutexGuard<'_, State>,
    stream: CUstream,
    op: Op,
    prefix: &str,
) -> CUresult {
    let (key, ctx) = match stream_key(w, &s, stream) {
        Ok(k) => k,
        Err(e) => return e,
    };
    if let Err(e) = validate(&s, &op) {
        return e;
    }
    if let Some(origin) = capture_origin(&s, key)
        && let Some(cap) = s.streams.get_mut(&origin).and_then(|o| o.capture.as_mut())
    {
        cap.push(op);
        return CUresult::CUDA_SUCCESS;
    }
    execute(w, s, key, ctx, op, prefix)
}

/// Synchronous work: needs a current context, like the real driver; runs on its legacy
/// stream, and the host then waits for the whole device (over-approximated to the world).
pub(super) fn sync_run(w: &World, s: MutexGuard<'_, State>, op: Op) -> CUresult {
    let ctx = match current(w, &s) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let rc = execute(w, s, ctx, ctx, op, "");
    w.lock().host_sync_all();
    rc
}

pub(super) fn stream_device(w: &World, stream: CUstream) -> Option<i32> {
    let s = w.lock();
    let ctx = stream_ctx(w, &s, stream).ok()?;
    s.contexts.get(&ctx).map(|c| c.device)
}

/// [`crate::MockWorld::enqueue_op`].
pub(super) fn enqueue_op(
    w: &World,
    stream: CUstream,
    call: &'static str,
    touches: Vec<Touch>,
    f: Arc<dyn Fn() -> CUresult + Send + Sync>,
) -> CUresult {
    let s = w.lock();
    enqueue(w, s, stream, Op::new(call, OpKind::Custom { touches, f }))
}

/// [`crate::MockWorld::access`].
pub(super) fn access(
    w: &World,
    stream: CUstream,
    call: &str,
    touches: &[Touch],
) -> Result<(), CUresult> {
    let mut s = w.lock();
    let (key, ctx) = stream_key(w, &s, stream)?;
    // Nothing is stamped while the stream is captured; the ranges are still checked.
    let stamp = (!capturing(&s, key)).then(|| s.stamp(key, ctx));
    let device = s.contexts.get(&ctx).map(|c| c.device);
    let accesses: Vec<Access> = touches.iter().map(device_access).collect();
    let touched = s
        .check_accesses("", call, &accesses, device)
        .map_err(|()| CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)?;
    if let Some(stamp) = stamp {
        s.record_uses(&touched, key, stamp, call);
    }
    Ok(())
}
