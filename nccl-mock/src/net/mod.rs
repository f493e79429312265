//! The multi-process mode ([`MockNccl::multi_process`](crate::MockNccl::multi_process)):
//! ranks in separate processes, each with its own simulated driver and NCCL, form one
//! communicator over loopback TCP.
//!
//! As NCCL's bootstrap root does, a *hub* coordinates one communicator: it is started by
//! `ncclGetUniqueId` (listening on `127.0.0.1:0`, its address in the id) or, with
//! `NCCL_COMM_ID=host:port`, by rank 0's init on that address. Every rank connects to it
//! ([`Link`]), ships the bytes its parts read of its send buffers, and writes what the
//! hub computed into its receive buffers; the hub runs each collective with the same
//! code as one process does (`clique::move_data`), so both modes give the same results.
//!
//! - [`wire`]: the messages and their framing.
//! - [`hub`]: rank 0's coordinator.
//! - [`link`]: a rank's connection to it.
//! - [`thread`]: the count of the mode's threads.

mod hub;
pub(crate) mod link;
mod thread;
mod wire;

use std::sync::Arc;
use std::time::Instant;

use link::{ConnectError, GatherError, Link};
pub use thread::network_threads;

use crate::clique::Clique;
use crate::state::fail;
use crate::world::NWorld;
use nccl_sys::ncclResult_t;

/// Id prefix of a hub started by `ncclGetUniqueId`; its address follows.
const HUB_ID: &[u8; 8] = b"MOCKNET1";
/// Id prefix of an `NCCL_COMM_ID` address, where rank 0's init starts the hub.
const ADDR_ID: &[u8; 8] = b"MOCKADDR";

/// The unique id of a new hub: `MOCKNET1` and its address (NUL-padded).
pub(crate) fn new_hub_id(w: &NWorld) -> Result<[u8; 128], String> {
    let addr = hub::start(("127.0.0.1", 0), w.timeout, None)
        .map_err(|e| format!("cannot start a hub on 127.0.0.1: {e}"))?;
    let mut id = [0u8; 128];
    id[..8].copy_from_slice(HUB_ID);
    let a = addr.to_string();
    let n = a.len().min(120);
    id[8..8 + n].copy_from_slice(&a.as_bytes()[..n]);
    Ok(id)
}

/// The hub address an id names, and whether rank 0 must start the hub there
/// (`NCCL_COMM_ID`); `None` for an id of the in-process mode.
fn address(id: &[u8]) -> Option<(String, bool)> {
    let fixed = match id.get(..8)? {
        p if p == HUB_ID => false,
        p if p == ADDR_ID => true,
        _ => return None,
    };
    let rest = id.get(8..)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let addr = std::str::from_utf8(&rest[..end]).ok()?;
    (!addr.is_empty()).then(|| (addr.to_string(), fixed))
}

/// Joins the communicator of a network id through its hub (starting it first for rank 0
/// of an `NCCL_COMM_ID` id); `None` when `id` is not a network id. `handle`: the
/// communicator of a deferred or non-blocking init, whose abort cancels the join.
pub(crate) fn join(
    w: &NWorld,
    id: &[u8],
    nranks: usize,
    rank: usize,
    device: i32,
    handle: Option<usize>,
) -> Option<Result<Arc<Clique>, ncclResult_t>> {
    let (addr, fixed) = address(id)?;
    let deadline = Instant::now() + w.timeout;
    // An address in use may be a closing listener (see `hub::start`): retried briefly.
    let retry_until = deadline.min(Instant::now() + hub::BIND_RETRY);
    if fixed
        && rank == 0
        && let Err(e) = hub::start(addr.as_str(), w.timeout, Some(retry_until))
    {
        let msg = format!("rank 0 cannot start the hub at {addr} (NCCL_COMM_ID): {e}");
        return Some(Err(fail(&mut w.lock(), ncclResult_t::ncclSystemError, msg)));
    }
    let cancelled = || handle.is_some_and(|h| w.lock().dead.contains_key(&h));
    w.lock().net_inits += 1;
    let res = connect(
        w,
        &addr,
        fixed,
        (nranks, rank, device),
        deadline,
        &cancelled,
    );
    let mut s = w.lock();
    s.net_inits -= 1;
    Some(match res {
        Ok(clique) => {
            s.cliques.push(Arc::downgrade(&clique));
            Ok(clique)
        }
        Err((rc, msg)) => Err(fail(&mut s, rc, msg)),
    })
}

/// Connects, says hello and waits for every rank; the clique, or the error and message.
fn connect(
    w: &NWorld,
    addr: &str,
    fixed: bool,
    (nranks, rank, device): (usize, usize, i32),
    deadline: Instant,
    cancelled: &dyn Fn() -> bool,
) -> Result<Arc<Clique>, (ncclResult_t, String)> {
    let (system, timeout) = (ncclResult_t::ncclSystemError, w.timeout);
    let aborted = || {
        let msg = format!("rank {rank}: init aborted");
        (ncclResult_t::ncclInvalidUsage, msg)
    };
    let unreachable = |e: String| {
        let starter = if fixed {
            "rank 0's init starts it (NCCL_COMM_ID)"
        } else {
            "the process that called ncclGetUniqueId runs it"
        };
        let msg = format!(
            "rank {rank}: no hub at {addr} within {timeout:?} ({e}); {starter}, so rank 0 and \
             maybe others are missing"
        );
        (system, msg)
    };
    loop {
        let link = match Link::connect(addr, rank, (deadline, timeout), cancelled) {
            Ok(l) => l,
            Err(ConnectError::Cancelled) => return Err(aborted()),
            Err(ConnectError::Unreachable(e)) => return Err(unreachable(e)),
        };
        let res = link.gather(nranks, device, deadline, cancelled);
        if let Err(GatherError::Unheard) = res {
            if Instant::now() >= deadline {
                return Err(unreachable("the connection closed unanswered".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        return formed(res, link, addr, (nranks, rank), timeout);
    }
}

/// The clique of a finished gather, or the error and message.
fn formed(
    res: Result<Vec<i32>, GatherError>,
    link: Link,
    addr: &str,
    (nranks, rank): (usize, usize),
    timeout: std::time::Duration,
) -> Result<Arc<Clique>, (ncclResult_t, String)> {
    let system = ncclResult_t::ncclSystemError;
    let aborted = || {
        let msg = format!("rank {rank}: init aborted");
        (ncclResult_t::ncclInvalidUsage, msg)
    };
    match res {
        Ok(devices) if devices.len() == nranks => Ok(Clique::networked(devices, link)),
        Ok(devices) => {
            let msg = format!(
                "rank {rank}: the hub at {addr} formed {} ranks, not {nranks}",
                devices.len()
            );
            Err((ncclResult_t::ncclInternalError, msg))
        }
        Err(GatherError::Refused(rc, msg)) => Err((rc, format!("{msg} (hub at {addr})"))),
        Err(GatherError::Lost(e)) => Err((system, format!("rank {rank}: hub at {addr}: {e}"))),
        Err(GatherError::Cancelled) => Err(aborted()),
        Err(GatherError::Unheard) => Err((system, format!("rank {rank}: hub at {addr} unheard"))),
        Err(GatherError::Timeout(missing)) => {
            let missing = match missing {
                Some(m) => format!("missing ranks {m:?}"),
                None => "the hub did not say which ranks are missing".into(),
            };
            let msg = format!(
                "rank {rank}: not every rank of {nranks} joined within {timeout:?} (hub at \
                 {addr}; {missing})"
            );
            Err((system, msg))
        }
    }
}
