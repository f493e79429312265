//! The newer API's steps (NCCL 2.22 to 2.32): suspend and resume, memory statistics,
//! simulated group ends, parameters, grows, encryption, and the scalable init of the
//! world. Each checks its exact typed outcome: the release's `Unsupported`, the documented
//! refusals, or success.

use std::sync::Arc;
use std::time::Duration;

use cuda_hal::{Context, DeferScope, DeviceBuffer, Stream};
use nccl_channel::{
    CommConfig, Communicator, Encryption, Error, Group, Param, ReduceOp, SuspendFlags, UniqueId,
    set_encryption,
};
use nccl_sys::{Nccl, NcclVersion, since};

use super::super::program::Op;
use super::State;

/// Communicator `ctx`'s single-rank world: by `init_rank_scalable` (one id) when `scalable`
/// and the release has it (two ids for one rank are refused first; before 2.23.4 the call
/// is `Unsupported` and the plain init is used), else by one unique id.
pub(super) fn init(
    nccl: &Arc<Nccl>,
    ctx: &Context,
    config: &CommConfig,
    scalable: bool,
) -> nccl_channel::Result<Communicator> {
    let id = UniqueId::generate(nccl)?;
    if scalable {
        const WHAT: &str = "Communicator::init_rank_scalable";
        let two = [id, UniqueId::generate(nccl)?];
        let r = Communicator::init_rank_scalable(nccl, ctx, &two, 1, 0, config);
        match unsupported(nccl.version(), "ncclCommInitRankScalable") {
            Some(e) => {
                assert_eq!(r.err(), Some(e.clone()), "two ids on an old release");
                let r = Communicator::init_rank_scalable(nccl, ctx, &two[..1], 1, 0, config);
                assert_eq!(r.err(), Some(e), "one id on an old release");
            }
            None => {
                assert!(
                    matches!(r, Err(Error::InvalidArgument { what: WHAT, .. })),
                    "two ids for one rank: {r:?}"
                );
                return Communicator::init_rank_scalable(nccl, ctx, &two[..1], 1, 0, config);
            }
        }
    }
    Communicator::init_rank_with(nccl, ctx, &id, 1, 0, config)
}

/// `feature`'s `Unsupported` on release `found`, if it is older than the function.
fn unsupported(found: NcclVersion, feature: &'static str) -> Option<Error> {
    let (_, needed) = since::FUNCTIONS
        .iter()
        .find(|(f, _)| *f == feature)
        .copied()
        .expect("a function nccl-sys knows");
    (found < needed).then(|| Error::Unsupported {
        feature,
        needed: needed.to_string(),
        found: found.to_string(),
    })
}

/// The errors of a communicator that cannot be used at all (aborted, revoked, held by a
/// group on another thread): they come before any other check.
fn unusable(e: &Error) -> bool {
    matches!(e, Error::Aborted | Error::GroupedElsewhere { .. })
}

/// A collective on a suspended communicator is refused with exactly `Suspended` (or the
/// communicator cannot be used at all).
pub(super) fn refused_as_suspended(c: &Communicator, what: &str, r: &nccl_channel::Result<()>) {
    match r {
        Err(Error::Suspended { .. }) => {}
        Err(e) if unusable(e) => {}
        other => panic!(
            "{what} on suspended communicator {:p}: {other:?}, not Error::Suspended",
            std::ptr::from_ref(c)
        ),
    }
}

fn key(c: &Communicator) -> usize {
    std::ptr::from_ref(c).addr()
}

impl State<'_> {
    pub(super) fn is_suspended(&self, c: &Communicator) -> bool {
        self.suspended.contains(&key(c))
    }

    pub(super) fn refused_if_suspended(
        &self,
        c: &Communicator,
        what: &str,
        r: &nccl_channel::Result<()>,
    ) {
        if self.is_suspended(c) {
            refused_as_suspended(c, what, r);
        }
    }

    /// Nothing but a stream's work may still use a communicator: no group open here or
    /// kept by the program, no graph (the crate's or another library's), no capture, no
    /// thread beside the program still running.
    fn nothing_holds(&self) -> bool {
        !DeferScope::is_open()
            && self.groups.is_empty()
            && self.graphs.iter().all(Option::is_none)
            && self.raw_graphs.is_empty()
            && self
                .streams
                .iter()
                .all(|s| !s.is_capturing().unwrap_or(true))
            && self
                .background
                .iter()
                .all(std::thread::JoinHandle::is_finished)
    }

    fn version_unsupported(&self, feature: &'static str) -> Option<Error> {
        unsupported(self.version, feature)
    }

    pub(super) fn newer_step(&mut self, op: &Op) {
        match *op {
            Op::Suspend { comm, mem, sync } => self.suspend(comm, mem, sync),
            Op::Resume { comm } => {
                let Some(c) = self.comm(comm) else { return };
                let r = c.resume();
                let was = self.is_suspended(c);
                match (&r, self.version_unsupported("ncclCommResume")) {
                    (Err(e), _) if unusable(e) => {}
                    (r, Some(e)) => assert_eq!(r, &Err(e), "resume on an old release"),
                    (Ok(()), None) => assert!(was, "resume of a communicator not suspended"),
                    (Err(Error::InvalidArgument { what, .. }), None) => {
                        assert_eq!(*what, "Communicator::resume");
                        assert!(!was, "resume of a suspended communicator refused: {r:?}");
                    }
                    (Err(e), None) => panic!("resume: {e:?}"),
                }
                if r.is_ok() {
                    self.suspended.remove(&key(c));
                }
                assert_eq!(c.is_suspended(), self.is_suspended(c), "is_suspended");
            }
            Op::MemStats { comm } => {
                let Some(c) = self.comm(comm) else { return };
                let r = c.mem_stats();
                match (r, self.version_unsupported("ncclCommMemStats")) {
                    (Err(e), _) if unusable(&e) => {}
                    (r, Some(e)) => assert_eq!(r, Err(e), "mem_stats on an old release"),
                    (Ok(m), None) => {
                        assert_eq!(m.suspended, self.is_suspended(c), "mem_stats: {m:?}");
                        assert_eq!(m.total, m.persistent + m.suspendable, "{m:?}");
                    }
                    // A panic injected into a group's settling left its non-blocking work
                    // unsettled (what it held is kept): NCCL refuses the next call, typed.
                    (Err(_), None) if self.injected_panic => {}
                    (Err(e), None) => panic!("mem_stats: {e:?}"),
                }
            }
            Op::SimulatedGroup {
                comm,
                stream,
                drop_inside,
            } => self.simulated_group(comm, stream, drop_inside),
            Op::SimulateEnd => {
                if let Some(g) = self.groups.pop() {
                    let r = g.simulate_end();
                    if let Some(e) = self.version_unsupported("ncclGroupSimulateEnd") {
                        assert_eq!(r, Err(e), "simulate_end on an old release");
                    }
                }
            }
            Op::Params { key } => self.params(key),
            Op::Grow { comm } => self.grow(comm),
            Op::SetEncryption { mode } => {
                let (mode, short) = match mode % 3 {
                    0 => (Encryption::None, false),
                    1 => (Encryption::Psk("k".repeat(32)), false),
                    _ => (Encryption::Psk("k".repeat(31)), true),
                };
                let r = set_encryption(self.nccl, &mode);
                match self.version_unsupported("ncclSetEncryption") {
                    Some(e) => assert_eq!(r, Err(e), "set_encryption on an old release"),
                    None if short => assert!(
                        matches!(
                            r,
                            Err(Error::InvalidArgument {
                                what: "set_encryption",
                                ..
                            })
                        ),
                        "a short key: {r:?}"
                    ),
                    None => assert_eq!(r, Ok(()), "set_encryption({mode:?})"),
                }
            }
            _ => unreachable!("not a step of the newer API"),
        }
    }

    fn suspend(&mut self, comm: u8, mem: bool, sync: bool) {
        let Some(c) = self.comm(comm) else { return };
        let synced = sync
            && self
                .streams
                .iter()
                .map(Stream::synchronize)
                .collect::<Vec<_>>()
                .iter()
                .all(Result::is_ok);
        // Must succeed: nothing but streams (all done) may use it, it is blocking (a
        // non-blocking one's grouped work is enqueued in the background), and no
        // leak-on-failure path was taken (an injected failure or panic, a capture behind
        // the crate's back: what the work held is kept for good, holds of it included).
        let free = synced
            && c.config().is_blocking()
            && self.nothing_holds()
            && self.faults.is_empty()
            && !self.injected_panic
            && !self.foreign_capture;
        let grouped = DeferScope::is_open();
        let was = self.is_suspended(c);
        let flags = if mem {
            SuspendFlags::MEM
        } else {
            SuspendFlags::NONE
        };
        let r = c.suspend(flags);
        match (&r, self.version_unsupported("ncclCommSuspend")) {
            (Err(e), _) if unusable(e) => {}
            (r, Some(e)) => assert_eq!(r, &Err(e), "suspend on an old release"),
            (Err(Error::Suspended { what }), None) => {
                assert_eq!(*what, "Communicator::suspend");
                assert!(was, "suspend refused as suspended, but it is not");
            }
            (_, None) if was => panic!("suspend of a suspended communicator: {r:?}"),
            (Err(Error::InFlight { what, problem }), None) => {
                assert_eq!(*what, "Communicator::suspend");
                assert!(!free, "suspend refused while nothing may use it: {problem}");
            }
            (_, None) if grouped => panic!("suspend inside an open group: {r:?}"),
            (Ok(()), None) => {}
            (Err(e), None) => assert!(!free, "suspend failed while nothing may use it: {e:?}"),
        }
        if r.is_ok() && mem {
            self.suspended.insert(key(c));
        }
        assert_eq!(c.is_suspended(), self.is_suspended(c), "is_suspended");
    }

    /// A group of its own ended with `simulate_end`: its pre-multiplied all-reduce (x3)
    /// must not run when NCCL simulates it (a blocking communicator); before 2.22.3 the
    /// call is `Unsupported` and the group ends as `end` does (its work runs).
    fn simulated_group(&mut self, comm: u8, stream: u8, drop_inside: bool) {
        let Some(c) = self.comm(comm) else { return };
        if DeferScope::is_open() {
            return;
        }
        let s = self.stream(stream).clone();
        let s = if s.context() == c.context() {
            s
        } else {
            let Ok(s) = Stream::new(c.context()) else {
                return;
            };
            s
        };
        let Ok(mut b) = DeviceBuffer::from_slice(c.context(), &[5i32, 7]) else {
            return;
        };
        let Ok(g) = Group::start(self.nccl) else {
            return;
        };
        let called = c.all_reduce_in_place(&mut b, ReduceOp::PreMulSum(3), &s);
        self.refused_if_suspended(c, "simulated all_reduce", &called);
        let kept = if drop_inside {
            drop(b);
            None
        } else {
            Some(b)
        };
        let r = g.simulate_end();
        let old = self.version_unsupported("ncclGroupSimulateEnd");
        let expect = match (&old, &called) {
            (Some(e), _) => {
                assert_eq!(r, Err(e.clone()), "simulate_end on an old release");
                None
            }
            (None, _) if !c.config().is_blocking() => {
                // NCCL launches a non-blocking communicator's group for real.
                if called.is_ok() {
                    assert!(
                        matches!(
                            r,
                            Err(Error::InvalidArgument {
                                what: "Group::simulate_end",
                                ..
                            })
                        ),
                        "simulate_end of a non-blocking group: {r:?}"
                    );
                }
                None
            }
            (None, Ok(())) => {
                let d = r.expect("simulate_end of a blocking group");
                assert!(d > Duration::ZERO, "a predicted all-reduce takes no time");
                Some([5, 7])
            }
            (None, Err(_)) => {
                assert_eq!(r, Ok(Duration::ZERO), "simulate_end of an empty group");
                Some([5, 7])
            }
        };
        // Before 2.22.3 the group ended for real: the work ran when it was enqueued.
        // (A non-blocking communicator's runs later, in the background.)
        let expect = match (&old, &called) {
            (Some(_), Ok(())) if c.config().is_blocking() && self.faults.is_empty() => {
                Some([15, 21])
            }
            (Some(_), _) => None,
            _ => expect,
        };
        if let (Some(b), Some(want)) = (kept, expect)
            && s.synchronize().is_ok()
            && let Ok(v) = b.to_vec()
        {
            assert_eq!(v, want, "the simulated group's work");
        }
    }

    fn params(&mut self, k: u8) {
        let nccl: &Nccl = self.nccl;
        let old = self.version_unsupported("ncclParamBind");
        match k % 5 {
            0 => {
                let r = Param::<u64>::bind(nccl, "NCCL_DEBUG_SUBSYS").and_then(|p| p.get());
                match old {
                    Some(e) => assert_eq!(r, Err(e)),
                    None => assert_eq!(
                        r,
                        Param::<u64>::get_value(nccl, "NCCL_DEBUG_SUBSYS"),
                        "get and get_value"
                    ),
                }
            }
            1 => {
                let r = Param::<u32>::bind(nccl, "NCCL_DEBUG_SUBSYS").map(|p| p.key().to_owned());
                let want = old.unwrap_or(Error::ParamType {
                    key: "NCCL_DEBUG_SUBSYS".into(),
                    asked: "u32",
                });
                assert_eq!(r, Err(want), "a u64 read as u32");
            }
            2 => {
                let r = Param::<String>::get_value(nccl, "NCCL_NO_SUCH_PARAMETER");
                let want = old.unwrap_or(Error::UnknownParam {
                    key: "NCCL_NO_SUCH_PARAMETER".into(),
                });
                assert_eq!(r, Err(want), "an unknown key");
            }
            3 => {
                let r = Param::keys(nccl);
                match self.version_unsupported("ncclParamGetAllParameterKeys") {
                    Some(e) => assert_eq!(r, Err(e)),
                    None => {
                        let keys = r.expect("the keys");
                        assert!(keys.iter().any(|k| k == "NCCL_DEBUG"), "{keys:?}");
                    }
                }
            }
            _ => {
                let r = Param::<String>::get_value(nccl, "NCCL_DEBUG_FILE");
                match old {
                    Some(e) => assert_eq!(r, Err(e)),
                    None => assert!(r.is_ok(), "NCCL_DEBUG_FILE as a string: {r:?}"),
                }
            }
        }
    }

    /// A grow by one rank on another thread (the other device), both grown ranks
    /// all-reducing once; inside an open group only the refusal is checked (no joiner).
    fn grow(&mut self, comm: u8) {
        let Some(c) = self.comm(comm) else { return };
        let old = self.version_unsupported("ncclCommGetUniqueId");
        if DeferScope::is_open() {
            let r = c.grow(2, None).map(|g| g.size());
            match (r, self.version_unsupported("ncclCommGrow")) {
                (Err(e), _) if unusable(&e) => {}
                (r, Some(e)) => assert_eq!(r, Err(e)),
                (r, None) => assert_eq!(
                    r,
                    Err(Error::SplitInGroup {
                        what: "grow",
                        instead: "Communicator::grow_all"
                    }),
                    "grow inside a group"
                ),
            }
            return;
        }
        if c.abort_handle().is_requested() {
            return;
        }
        let id = match (c.grow_id(), old) {
            (Ok(id), None) => id,
            (Err(e), _) if unusable(&e) => return,
            (r, Some(e)) => {
                assert_eq!(r.err(), Some(e), "grow_id on an old release");
                return;
            }
            (Err(e), None) => panic!("grow_id: {e:?}"),
        };
        let dev = c.context().device().ordinal() as u8 + 1;
        let ctx = self.ctx(dev);
        let nccl = self.nccl.clone();
        let config = c.config().clone();
        let joining = id;
        // Each side keeps its grown communicator until both sums are done (a rank that
        // closes early is a peer gone for the other's wait).
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let joiner = std::thread::spawn(move || {
            let g = Communicator::join_grown_with(&nccl, &ctx, &joining, 2, 1, &config)?;
            let r = ((g.rank(), g.size()), sum(&g, 2));
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
            Ok::<_, Error>(r)
        });
        let grown = c.grow(2, Some(&id));
        let mine = grown
            .as_ref()
            .map(|g| ((g.rank(), g.size()), sum(g, 1)))
            .map_err(Clone::clone);
        drop(done_tx);
        let theirs = joiner.join().expect("the joining rank");
        drop(grown);
        // A sum may fail only on a path that fails (a suspended parent is not one: the
        // grown communicator is a new one), or while a capture runs (a global one forbids
        // synchronizing).
        let clean = self.faults.is_empty()
            && !self.injected_panic
            && self
                .streams
                .iter()
                .all(|s| !s.is_capturing().unwrap_or(true));
        match (mine, theirs) {
            (Ok(a), Ok(b)) => {
                assert_eq!((a.0, b.0), ((0, 2), (1, 2)), "the grown ranks");
                if clean {
                    assert_eq!((a.1, b.1), (Ok(vec![3]), Ok(vec![3])), "grown sums");
                }
            }
            (Err(_), Err(_)) => {}
            (a, b) => assert!(
                !clean,
                "one side of a grow failed alone: {:?} / {:?}",
                a.map(|a| a.0),
                b.map(|b| b.0)
            ),
        }
    }
}

/// One all-reduce of `[v]` on grown communicator `g`, waited for.
fn sum(g: &Communicator, v: i32) -> nccl_channel::Result<Vec<i32>> {
    let s = Stream::new(g.context())?;
    let mut b = DeviceBuffer::from_slice(g.context(), &[v])?;
    g.all_reduce_in_place(&mut b, ReduceOp::Sum, &s)?;
    g.wait(&s)?;
    s.synchronize()?;
    Ok(b.to_vec()?)
}
