//! The sanitizer's checks, as methods of the state (stamps, clock joins, range checks, free order, quarantining): above `state`, whose fields they read.

use crate::sanitizer::{Access, Clock, Side, Use};
use crate::state::State;
use cuda_sys::CUresult;

/// Whether reports are also printed at once (`CUDA_SYS_MOCK_PANIC_ON_VIOLATION=1`).
fn print_violations() -> bool {
    std::env::var_os("CUDA_SYS_MOCK_PANIC_ON_VIOLATION").is_some_and(|v| v == "1")
}

impl State {
    /// Records a sanitizer report (never panics: callers are `extern "C"`).
    pub(crate) fn violation(&mut self, message: String) {
        if print_violations() {
            eprintln!("cuda-sys mock: violation: {message}");
        }
        self.violations.push(message);
    }

    /// The clock of stream `key` (legacy stream when `key` is not a stream handle).
    fn clock_mut(&mut self, key: usize) -> &mut Clock {
        match self.streams.get_mut(&key) {
            Some(st) => &mut st.clock,
            None => self.legacy.entry(key).or_default(),
        }
    }

    /// What work on stream `key` of `ctx` is ordered after, with the legacy stream's
    /// implicit synchronisation against blocking streams of its context.
    fn ordered_clock(&self, key: usize, ctx: usize) -> Clock {
        let mut c = match self.streams.get(&key) {
            Some(st) => {
                let mut c = st.clock.clone();
                if !st.non_blocking
                    && let Some(l) = self.legacy.get(&ctx)
                {
                    c.join(l);
                }
                c
            }
            None => {
                let mut c = self.legacy.get(&key).cloned().unwrap_or_default();
                for st in self.streams.values() {
                    if st.ctx == ctx && !st.non_blocking {
                        c.join(&st.clock);
                    }
                }
                c
            }
        };
        c.join(&self.host_clock);
        c
    }

    /// Stamps one op on stream `key` of context `ctx`; returns the stamp.
    pub(crate) fn stamp(&mut self, key: usize, ctx: usize) -> u64 {
        let mut c = self.ordered_clock(key, ctx);
        let n = c.tick(key);
        *self.clock_mut(key) = c;
        self.latest.0.insert(key, n);
        n
    }

    /// The current clock of stream `key`.
    pub(crate) fn clock_of(&mut self, key: usize) -> Clock {
        self.clock_mut(key).clone()
    }

    /// Stream `key` waits for `clock` (cuStreamWaitEvent).
    pub(crate) fn stream_join(&mut self, key: usize, clock: &Clock) {
        self.clock_mut(key).join(clock);
    }

    /// The host waited for stream `key` of `ctx` (for the legacy stream: the blocking
    /// streams of its context too, an over-approximation that avoids false reports).
    pub(crate) fn host_sync_stream(&mut self, key: usize, ctx: usize) {
        let c = self.ordered_clock(key, ctx);
        self.host_clock.join(&c);
    }

    /// The host waited for `clock` (an event).
    pub(crate) fn host_join(&mut self, clock: &Clock) {
        self.host_clock.join(clock);
    }

    /// The host waited for all work of the world (device-wide syncs, over-approximated).
    pub(crate) fn host_sync_all(&mut self) {
        let all = self.latest.clone();
        self.host_clock.join(&all);
    }

    /// Everything enqueued so far (for context-wide event records).
    pub(crate) fn all_work(&self) -> Clock {
        self.latest.clone()
    }

    /// Checks one access; returns the start of the live allocation it lies in, if any,
    /// or why it is illegal. `device`: the stream's device (`None`: any, for peer ops).
    fn check_access(&self, a: &Access, device: Option<i32>) -> Result<Option<usize>, String> {
        if a.len == 0 {
            return Ok(None);
        }
        if let Some((start, al)) = self.allocs.range(..=a.ptr).next_back()
            && a.ptr < start + al.len
        {
            let in_bounds = a
                .ptr
                .checked_add(a.len)
                .is_some_and(|e| e <= start + al.len);
            if !in_bounds {
                return Err(format!(
                    "out of bounds of the allocation at {start:#x} ({} bytes)",
                    al.len
                ));
            }
            if a.side != Side::Host
                && let Some(d) = device
                && al.device != d
            {
                return Err(format!(
                    "belongs to device {}, the stream is on device {d}",
                    al.device
                ));
            }
            return Ok(Some(*start));
        }
        if let Some(by) = self.freed.overlapping(a.ptr, a.len) {
            return Err(format!("freed by {by}"));
        }
        if a.side == Side::Device {
            return Err("is not in any live device allocation".to_string());
        }
        Ok(None)
    }

    /// Checks every access of an op (reporting each illegal one as `{prefix}{call} {what}
    /// 0x..+len: reason`); on success returns the allocations touched.
    pub(crate) fn check_accesses(
        &mut self,
        prefix: &str,
        call: &str,
        accesses: &[Access],
        device: Option<i32>,
    ) -> Result<Vec<usize>, ()> {
        let mut touched = Vec::new();
        let mut bad = Vec::new();
        for a in accesses {
            match self.check_access(a, device) {
                Ok(Some(start)) => touched.push(start),
                Ok(None) => {}
                Err(why) => bad.push(format!(
                    "{prefix}{call} {} {:#x}+{}: {why}",
                    a.what, a.ptr, a.len
                )),
            }
        }
        if bad.is_empty() {
            Ok(touched)
        } else {
            for m in bad {
                self.violation(m);
            }
            Err(())
        }
    }

    /// Checks one range like [`check_accesses`](Self::check_accesses) (reported the same
    /// way) and returns the start of the live allocation it lies in with the host address
    /// of its first byte, derived from that allocation; `None` for an empty range.
    pub(crate) fn check_range(
        &mut self,
        prefix: &str,
        call: &str,
        access: Access,
        device: Option<i32>,
    ) -> Result<Option<(usize, *mut u8)>, ()> {
        let touched = self.check_accesses(prefix, call, &[access], device)?;
        Ok(touched.first().and_then(|&start| {
            let a = self.allocs.get(&start)?;
            Some((start, a.ptr.wrapping_add(access.ptr - start)))
        }))
    }

    /// [`MockWorld::read_device`](crate::MockWorld::read_device): `len` bytes at `ptr`,
    /// checked and copied while the caller holds the world's lock.
    pub(crate) fn read_device(
        &mut self,
        call: &str,
        ptr: u64,
        len: usize,
    ) -> Result<Vec<u8>, CUresult> {
        let access = device_access(ptr, len, "reads");
        let Some((_, src)) = self
            .check_range("", call, access, None)
            .map_err(|()| CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)?
        else {
            return Ok(Vec::new());
        };
        // Checked first: `len` is no more than the live allocation's length.
        let mut out = vec![0u8; len];
        // SAFETY: `src` points at `len` bytes of one live allocation (just checked, and
        // derived from that allocation's pointer); it cannot be freed before the copy ends,
        // since freeing needs the world's lock, which the caller holds. `out` is a distinct
        // host buffer of `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.cast_const(), out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// [`MockWorld::write_device`](crate::MockWorld::write_device): `data` to `ptr`,
    /// checked and copied while the caller holds the world's lock.
    pub(crate) fn write_device(
        &mut self,
        call: &str,
        ptr: u64,
        data: &[u8],
    ) -> Result<(), CUresult> {
        let access = device_access(ptr, data.len(), "writes");
        if let Some((_, dst)) = self
            .check_range("", call, access, None)
            .map_err(|()| CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)?
        {
            // SAFETY: `dst` points at `data.len()` bytes of one live allocation (just
            // checked, and derived from that allocation's pointer), which cannot be freed
            // before the copy ends: freeing needs the world's lock, which the caller holds.
            // `data` is readable for its length; `copy` tolerates overlap.
            unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        }
        Ok(())
    }

    /// Records that the op `stamp` of stream `key` (`call`) touched these allocations.
    pub(crate) fn record_uses(&mut self, touched: &[usize], key: usize, stamp: u64, call: &str) {
        for start in touched {
            if let Some(a) = self.allocs.get_mut(start) {
                a.last_use.insert(
                    key,
                    Use {
                        stamp,
                        call: call.to_string(),
                    },
                );
            }
        }
    }

    /// How a stream key is named in reports.
    pub(crate) fn stream_name(&self, key: usize) -> String {
        match self.contexts.get(&key) {
            Some(c) if !self.streams.contains_key(&key) => {
                format!("the legacy stream of device {}", c.device)
            }
            _ => format!("stream {key:#x}"),
        }
    }

    /// Reports uses of the allocation at `start` by other streams that stream `key` (just
    /// stamped with a free) is not ordered after.
    pub(crate) fn check_free_order(&mut self, call: &str, key: usize, start: usize) {
        let Some(a) = self.allocs.get(&start) else {
            return;
        };
        let clock = self.clock_ref(key);
        let mut late: Vec<(usize, String)> = a
            .last_use
            .iter()
            .filter(|(t, u)| **t != key && clock.is_none_or(|c| c.get(**t) < u.stamp))
            .map(|(t, u)| (*t, u.call.clone()))
            .collect();
        late.sort();
        let len = a.len;
        for (t, what) in late {
            let m = format!(
                "{call} on {} frees {start:#x}+{len} while work enqueued on {} ({what}) is not ordered before it",
                self.stream_name(key),
                self.stream_name(t)
            );
            self.violation(m);
        }
    }

    fn clock_ref(&self, key: usize) -> Option<&Clock> {
        match self.streams.get(&key) {
            Some(st) => Some(&st.clock),
            None => self.legacy.get(&key),
        }
    }

    /// Moves the live allocation at `start` to the quarantine (poisoned), freed by `by`.
    pub(crate) fn quarantine(&mut self, start: usize, by: &'static str) -> bool {
        let Some(a) = self.allocs.remove(&start) else {
            return false;
        };
        if let Some(u) = self.used.get_mut(a.device as usize) {
            *u = u.saturating_sub(a.len as u64);
        }
        self.freed.insert(a, by);
        true
    }

    /// Why freeing `ptr` is wrong, when it is not the start of a live allocation.
    pub(crate) fn bad_free(&self, call: &str, ptr: usize) -> String {
        if let Some(by) = self.freed.overlapping(ptr, 1) {
            return format!("{call} of {ptr:#x}: double free (already freed by {by})");
        }
        if let Some((start, a)) = self.allocs.range(..=ptr).next_back()
            && ptr < start + a.len
        {
            return format!(
                "{call} of {ptr:#x}: inside the allocation at {start:#x} ({} bytes), not its start",
                a.len
            );
        }
        format!("{call} of {ptr:#x}: not a live device allocation")
    }
}

/// A device-side access of `len` bytes at the device address `ptr` (an address beyond the
/// host's address space is in no allocation).
fn device_access(ptr: u64, len: usize, what: &'static str) -> Access {
    Access {
        ptr: usize::try_from(ptr).unwrap_or(usize::MAX),
        len,
        what,
        side: Side::Device,
    }
}
