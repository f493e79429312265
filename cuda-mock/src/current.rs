//! Each thread's current-context stack, and the current context of a call: below every module that acts in the current context.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::state::State;
use crate::world::World;
use cuda_sys::CUresult;

thread_local! {
    /// Per world: this thread's context stack (top = current).
    static CURRENT: RefCell<HashMap<u64, Vec<usize>>> = RefCell::new(HashMap::new());
}

/// The calling thread's current context in world `world_id`.
pub(super) fn current_context(world_id: u64) -> Option<usize> {
    CURRENT.with(|c| c.borrow().get(&world_id).and_then(|s| s.last().copied()))
}

/// Runs `f` on the calling thread's context stack of world `world_id`.
pub(super) fn with_stack<R>(world_id: u64, f: impl FnOnce(&mut Vec<usize>) -> R) -> R {
    CURRENT.with(|c| f(c.borrow_mut().entry(world_id).or_default()))
}

/// The current context of this thread in `w`, if it is alive.
pub(super) fn current(w: &World, s: &State) -> Result<usize, CUresult> {
    let ctx = current_context(w.id).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if s.contexts.contains_key(&ctx) {
        Ok(ctx)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }
}
