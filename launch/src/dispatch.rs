//! The `main` of an example that is either one rank (its launcher's environment says so)
//! or the launcher of `--nprocs N` ranks: which one, and the exit status.

use std::process::ExitCode;

use nccl_channel::World;

/// Runs `rank` when the environment describes a world, `start(n)` for `--nprocs n`
/// without one; refuses both at once, and neither. An error is printed as `name: error`
/// and exits 1.
pub fn dispatch(
    name: &str,
    nprocs: Option<usize>,
    rank: impl FnOnce(World) -> Result<(), String>,
    start: impl FnOnce(usize) -> Result<(), String>,
) -> ExitCode {
    let result = match (World::from_env(), nprocs) {
        (Err(e), _) => Err(e.to_string()),
        (Ok(Some(world)), Some(_)) => Err(crate::nprocs_in_a_world(&world)),
        (Ok(Some(world)), None) => rank(world),
        (Ok(None), Some(n)) if n >= 1 => start(n),
        (Ok(None), _) => Err(
            "no world configured: pass --nprocs N (N >= 1), or set NCCL_CHANNEL_NPROCS/\
             NCCL_CHANNEL_PROCID and NCCL_COMM_ID=host:port"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
