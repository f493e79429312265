//! How a rank gets the unique id, and what it tells the user it waits for.

use std::time::Duration;

use nccl_channel::{ChannelBuilder, World};

nccl_channel::if_rendezvous!({
use nccl_channel::{IdSource, Rendezvous};

use crate::report;

/// Sets the launcher's rendezvous (if that is how the id comes: `NCCL_COMM_ID` unset),
/// waiting as long as the rank may unless `NCCL_CHANNEL_RENDEZVOUS_TIMEOUT` says; returns
/// the builder and what the rank waits for, one note for both phases (the id, then NCCL's
/// init) worded for the rank's role.
pub(crate) fn id_source(
    b: ChannelBuilder,
    world: &World,
    timeout: Option<Duration>,
) -> Result<(ChannelBuilder, String), String> {
    let comm_id_set = std::env::var("NCCL_COMM_ID").is_ok_and(|v| !v.trim().is_empty());
    let rendezvous = match comm_id_set {
        true => None,
        false => Rendezvous::from_env(world).map_err(|e| report(&e))?,
    };
    let rendezvous = rendezvous.map(|rdv| {
        match (std::env::var_os("NCCL_CHANNEL_RENDEZVOUS_TIMEOUT"), timeout) {
            (None, Some(t)) => rdv.timeout(t),
            _ => rdv,
        }
    });
    let waiting_for = match (&rendezvous, comm_id_set) {
        (Some(rdv), _) if world.rank == 0 => {
            format!("the other ranks (to take the unique id from {rdv}, then to join NCCL)")
        }
        (Some(rdv), _) => {
            format!("the unique id from {rdv}, or, once it came, for the other ranks to join NCCL")
        }
        (None, true) => "the other ranks to join NCCL (NCCL_COMM_ID)".to_string(),
        (None, false) => "the other ranks to join NCCL".to_string(),
    };
    let b = match rendezvous {
        Some(rdv) => b.unique_id(IdSource::Rendezvous(rdv)),
        None => b,
    };
    Ok((b, waiting_for))
}
} else {
/// Without nccl-channel's rendezvous the id comes from `NCCL_COMM_ID` (or the builder's
/// own source): what the rank waits for.
pub(crate) fn id_source(
    b: ChannelBuilder,
    _world: &World,
    _timeout: Option<Duration>,
) -> Result<(ChannelBuilder, String), String> {
    let comm_id_set = std::env::var("NCCL_COMM_ID").is_ok_and(|v| !v.trim().is_empty());
    let waiting_for = match comm_id_set {
        true => "the other ranks to join NCCL (NCCL_COMM_ID)",
        false => "the other ranks to join NCCL",
    };
    Ok((b, waiting_for.to_string()))
}
});
