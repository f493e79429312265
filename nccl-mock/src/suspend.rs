//! `ncclCommSuspend`, `ncclCommResume` and `ncclCommMemStats` (2.29.7): a communicator's
//! dynamic memory released and restored, and what it holds; above the state, the
//! communicator checks and the thread's groups.
//!
//! As NCCL's memory manager (`src/mem_manager.cc`): suspend with `NCCL_SUSPEND_MEM` marks
//! the communicator suspended (again: `ncclInvalidUsage`, "Already suspended"); other
//! flags alone do nothing; resume of one not suspended is `ncclInvalidUsage` ("Not in
//! suspended state"); a communicator still completing a non-blocking operation is
//! `ncclInvalidArgument` (NCCL's `ncclCommEnsureReady`). The byte counts do not change
//! while suspended (NCCL counts what it manages, released or not); `ncclStatGpuMemSuspended`
//! says 1. Stricter than NCCL, as a sanitizer: a suspend inside an open group (NCCL would
//! run it at the group's end) is `ncclInvalidUsage`, and so is one while the communicator
//! has a non-blocking operation in progress; work on a suspended communicator (a
//! collective, send/recv, or a captured one replayed) is reported and refused with
//! `ncclInvalidUsage`: NCCL's kernels would touch the released memory.

use std::ffi::c_int;

use crate::macros::mock_fns;
use crate::state::{State, fail};
use crate::thread_groups::in_group;
use crate::world::NWorld;
use nccl_sys::{ncclComm_t, ncclCommMemStat_t, ncclResult_t};

/// Bytes NCCL keeps for the communicator's life (simulated: 1 MiB and 64 KiB a rank).
fn persist(size: usize) -> u64 {
    (1 << 20) + (size as u64) * (64 << 10)
}

/// Bytes a suspend releases (simulated: 2 MiB of buffers a rank).
fn suspendable(size: usize) -> u64 {
    (size as u64) * (2 << 20)
}

impl State {
    /// Refuses work of a suspended communicator `h` (reported: NCCL would use released
    /// memory).
    pub(crate) fn refuse_suspended(
        &mut self,
        w: &NWorld,
        call: &str,
        h: usize,
    ) -> Result<(), ncclResult_t> {
        if !self.suspended.contains(&h) {
            return Ok(());
        }
        let msg = format!(
            "{call}: communicator {h:#x} is suspended (ncclCommSuspend): its memory is \
             released until ncclCommResume"
        );
        w.cuda.report(msg.clone());
        Err(fail(self, ncclResult_t::ncclInvalidUsage, msg))
    }

    /// NCCL's `ncclCommEnsureReady`: a communicator whose last non-blocking operation is
    /// still in progress is `ncclInvalidArgument`.
    fn ensure_ready(&mut self, call: &str, h: usize) -> Result<(), ncclResult_t> {
        let busy = self.comms.get(&h).is_none_or(|c| {
            c.clique.is_none()
                || c.pending
                    .iter()
                    .any(|d| d.lock().unwrap_or_else(|e| e.into_inner()).is_none())
        });
        if busy {
            return Err(fail(
                self,
                ncclResult_t::ncclInvalidArgument,
                format!(
                    "{call}: Attempt to use communicator before the previous operation returned ncclSuccess"
                ),
            ));
        }
        Ok(())
    }
}

mock_fns! {
    fn ncclCommSuspend = comm_suspend(w, s, comm: ncclComm_t, flags: c_int) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if let Err(rc) = s.ensure_ready(CALL, h) {
            return rc;
        }
        if in_group(w.id) {
            return fail(&mut s, ncclResult_t::ncclInvalidUsage,
                "ncclCommSuspend inside an open group (NCCL runs it at the group's end): not simulated".into());
        }
        if flags & nccl_sys::NCCL_SUSPEND_MEM as c_int == 0 {
            return ncclResult_t::ncclSuccess;
        }
        if s.suspended.contains(&h) {
            return fail(&mut s, ncclResult_t::ncclInvalidUsage, "MemManager: Already suspended".into());
        }
        // NCCL releases the memory its work uses now: work of this communicator that the
        // host did not wait for may still run on it (the sanitizer's check; NCCL does not).
        let mut uses: Vec<(usize, (u64, String))> = s
            .comm_uses
            .get(&h)
            .map(|u| u.iter().map(|(k, v)| (*k, v.clone())).collect())
            .unwrap_or_default();
        uses.sort_by_key(|(k, _)| *k);
        for (key, (stamp, call)) in uses {
            if !w.cuda.host_waited_for(key, stamp) {
                w.cuda.report(format!(
                    "{CALL} of communicator {h:#x}: its work enqueued on stream {key:#x} ({call}) may still use the memory NCCL releases: the host did not wait for it"
                ));
            }
        }
        s.suspended.insert(h);
        ncclResult_t::ncclSuccess
    }
    fn ncclCommResume = comm_resume(w, s, comm: ncclComm_t) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if let Err(rc) = s.ensure_ready(CALL, h) {
            return rc;
        }
        if !s.suspended.remove(&h) {
            return fail(&mut s, ncclResult_t::ncclInvalidUsage, "MemManager: Not in suspended state".into());
        }
        ncclResult_t::ncclSuccess
    }
    fn ncclCommMemStats = comm_mem_stats(w, s, comm: ncclComm_t, stat: ncclCommMemStat_t, value: *mut u64) {
        let h = match s.check_comm(w, CALL, comm) {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        if let Err(rc) = s.ensure_ready(CALL, h) {
            return rc;
        }
        if value.is_null() {
            return ncclResult_t::ncclInvalidArgument;
        }
        let size = s.comms.get(&h).map_or(0, |c| c.size);
        let v = match stat {
            ncclCommMemStat_t::ncclStatGpuMemSuspend => suspendable(size),
            ncclCommMemStat_t::ncclStatGpuMemSuspended => u64::from(s.suspended.contains(&h)),
            ncclCommMemStat_t::ncclStatGpuMemPersist => persist(size),
            ncclCommMemStat_t::ncclStatGpuMemTotal => persist(size) + suspendable(size),
            _ => return ncclResult_t::ncclInvalidArgument,
        };
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { *value = v };
        ncclResult_t::ncclSuccess
    }
}
