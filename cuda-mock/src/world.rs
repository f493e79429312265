//! The simulated machine (World), its slot table and its test-side handles (MockWorld): below every module that reaches a world, above the state it locks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::kernel::Machine;
use crate::sanitizer::Access;
use crate::state::{MockDevice, State};

__mock_slots!(World);
static WORLD_IDS: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_world_id() -> u64 {
    WORLD_IDS.fetch_add(1, Ordering::Relaxed)
}

/// The world of a slot, while it is claimed (for the functions `mock_fns!` declares).
pub(super) fn slot_world_of(slot: usize) -> Option<Arc<World>> {
    slot_world(slot)
}

/// The simulated machine behind a mock driver.
pub(crate) struct World {
    pub(crate) id: u64,
    pub(crate) version: i32,
    pub(crate) devices: Vec<MockDevice>,
    pub(crate) state: Mutex<State>,
    /// Code a test runs just before a chosen call ([`MockWorld::before_call`]).
    pub(crate) before: BeforeCalls,
}

/// Code to run just before the `skip + 1`-th next call of a function, outside the world's
/// lock (so it may call the driver itself, from this thread or another).
#[derive(Default)]
pub(crate) struct BeforeCalls {
    /// Whether any is pending: every call reads this one flag, and only then the list.
    any: AtomicBool,
    due: Mutex<Vec<BeforeCall>>,
}

struct BeforeCall {
    function: String,
    skip: u64,
    run: Box<dyn FnOnce() + Send>,
}

impl BeforeCalls {
    pub(crate) fn add(&self, function: &str, skip: u64, run: Box<dyn FnOnce() + Send>) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        due.push(BeforeCall {
            function: function.to_string(),
            skip,
            run,
        });
        self.any.store(true, Ordering::Release);
    }

    /// Runs what is due before this call of `function` (with no lock held).
    pub(crate) fn run(&self, function: &str) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let run = {
            let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
            let Some(i) = due.iter().position(|b| b.function == function) else {
                return;
            };
            if due[i].skip > 0 {
                due[i].skip -= 1;
                return;
            }
            let b = due.remove(i);
            self.any.store(!due.is_empty(), Ordering::Release);
            b.run
        };
        run();
    }
}

impl World {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters for a simulation; keep going rather than poison every later call.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Machine for World {
    fn violation(&self, message: String) {
        self.lock().violation(message);
    }

    fn touch(
        &self,
        (prefix, call): (&str, &str),
        access: Access,
        device: i32,
        (key, stamp): (usize, u64),
        copy: &mut dyn FnMut(*mut u8),
    ) -> bool {
        let mut s = self.lock();
        match s.check_range(prefix, call, access, Some(device)) {
            Ok(Some((start, host))) => {
                s.record_uses(&[start], key, stamp, call);
                copy(host);
                true
            }
            Ok(None) => true,
            Err(()) => false,
        }
    }
}

/// Test-side handle of a simulated machine: faults, call counts, live handles, and the
/// sanitizer's reports.
///
/// A failure injected into one call, then a use after free, which the sanitizer refuses
/// and reports instead of touching the memory:
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_sys::{CUdeviceptr, CUresult};
///
/// let (driver, world) = MockDriver::with_devices(1).build()?;
/// let f = driver.fns();
/// let (mut ctx, mut p): (_, CUdeviceptr) = (std::ptr::null_mut(), 0);
/// let mut out = [0u8; 64];
/// world.fail_next("cuMemAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
/// // SAFETY: valid out-pointers, a current context, and host memory of 64 bytes; the
/// // simulated driver checks every device address, so the copy from freed memory is
/// // refused without touching anything.
/// unsafe {
///     (f.cuInit)(0);
///     (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
///     (f.cuCtxSetCurrent)(ctx);
///     assert_eq!((f.cuMemAlloc)(&mut p, 64), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
///     assert_eq!((f.cuMemAlloc)(&mut p, 64), CUresult::CUDA_SUCCESS);
///     assert_eq!(world.live().device_allocations, 1);
///     assert_eq!((f.cuMemFree)(p), CUresult::CUDA_SUCCESS);
///     let rc = (f.cuMemcpyDtoH)(out.as_mut_ptr().cast(), p, 64);
///     assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
///     (f.cuDevicePrimaryCtxRelease)(0);
/// }
/// assert_eq!(world.calls("cuMemAlloc"), 2);
/// assert_eq!(world.take_violations(), [format!("cuMemcpyDtoH reads {p:#x}+64: freed by cuMemFree")]);
/// assert!(world.live().is_empty());
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Clone)]
pub struct MockWorld {
    pub(crate) world: Arc<World>,
}

/// A [`MockWorld`] that does not keep the simulated machine alive
/// ([`MockWorld::downgrade`]).
///
/// ```
/// use cuda_mock::MockDriver;
/// let (driver, world) = MockDriver::with_devices(1).build()?;
/// let weak = world.downgrade();
/// assert_eq!(weak.upgrade().map(|w| w.devices().len()), Some(1));
/// drop((driver, world));
/// assert!(weak.upgrade().is_none(), "the machine went with its last owner");
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Clone, Debug)]
pub struct WeakMockWorld {
    pub(crate) world: Weak<World>,
}

impl WeakMockWorld {
    /// The machine, while anything else still keeps it alive.
    pub fn upgrade(&self) -> Option<MockWorld> {
        self.world.upgrade().map(|world| MockWorld { world })
    }
}
