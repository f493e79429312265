//! The simulated NCCL's world (NWorld) and its slot table: below every module that reaches a world, above the state it locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use cuda_mock::MockWorld;

use crate::state::State;

cuda_mock::__mock_slots!(NWorld);
static WORLD_IDS: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_world_id() -> u64 {
    WORLD_IDS.fetch_add(1, Ordering::Relaxed)
}

/// The world of slot `slot`, while it is claimed (for the functions of every module).
pub(super) fn world(slot: usize) -> Option<Arc<NWorld>> {
    slot_world(slot)
}

/// The world as an `Arc`, for work that outlives the call (non-blocking init, split).
pub(super) fn slot_of(w: &NWorld) -> Option<Arc<NWorld>> {
    (0..cuda_mock::MAX_WORLDS)
        .filter_map(slot_world)
        .find(|x| x.id == w.id)
}

pub(crate) struct NWorld {
    pub(crate) id: u64,
    pub(crate) version: i32,
    pub(crate) timeout: Duration,
    pub(crate) null_ops: bool,
    pub(crate) windows: bool,
    pub(crate) local_registration: bool,
    pub(crate) multi_process: bool,
    pub(crate) cuda: MockWorld,
    pub(crate) state: Mutex<State>,
    pub(crate) cond: Condvar,
}

impl NWorld {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
