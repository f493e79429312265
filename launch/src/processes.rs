//! `--nprocs N`: the one-machine launcher, a small torchrun: one process per rank,
//! configured by this crate's variables, all stopped when one fails.

use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nccl_channel::World;

use crate::relay::{Output, Who, relay};
use crate::report;
use crate::secret::LaunchSecret;

/// The refusal of `--nprocs` in a process its launcher already made a rank of a world
/// (starting ranks there would nest worlds).
pub fn nprocs_in_a_world(world: &World) -> String {
    format!(
        "--nprocs starts ranks itself, but this process is already rank {} of {} ({} \
         variables): leave --nprocs out, or unset the launcher's variables",
        world.rank, world.size, world.source
    )
}

/// The one-machine launcher: starts this executable `n` times with `args`, rank `r`
/// configured by `NCCL_CHANNEL_NPROCS/PROCID/LOCAL_PROCID`, a rendezvous address
/// (`NCCL_CHANNEL_RENDEZVOUS`, where rank 0 serves the unique id), a key of this launch
/// (`NCCL_CHANNEL_RENDEZVOUS_KEY`, so that ranks of another launch that find the same port
/// are told apart) and a secret file (`NCCL_CHANNEL_RENDEZVOUS_SECRET_FILE`: the caller's if
/// set, else one made for this launch, readable by its user alone and removed when the
/// launch ends, so that no other user's process can take the unique id from the port);
/// stops every rank when one fails or `timeout` passes. The ranks take
/// GPUs, or simulated devices without a driver, as [`rank_channel`](crate::rank_channel)
/// says.
pub fn processes(
    n: usize,
    args: &[String],
    timeout: Duration,
    output: Output,
) -> Result<(), String> {
    let t = Instant::now();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for the rendezvous: {e}"))?
        .port();
    let exe = std::env::current_exe().map_err(|e| report(&e))?;
    let secret = LaunchSecret::for_launch()?;
    let launch = Launch {
        args,
        port,
        key: key(),
        secret: secret.as_ref().map(LaunchSecret::path),
        output,
    };
    if output == Output::Prefixed {
        let ranks = if n == 1 { "rank" } else { "ranks" };
        println!("launching {n} {ranks}, rendezvous at 127.0.0.1:{port}");
    }
    let mut children: Vec<Child> = Vec::new();
    let mut printers = Vec::new();
    for r in 0..n {
        match launch.start(&exe, n, r) {
            Ok((child, relays)) => {
                children.push(child);
                printers.extend(relays);
            }
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("starting rank {r}: {e}"));
            }
        }
    }
    // No overflow: `seconds` caps every timeout at a year.
    let failed = wait_all(&mut children, t + timeout, timeout);
    for p in printers {
        let _ = p.join();
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    if output == Output::Prefixed {
        let ranks = match n {
            1 => "the rank".to_string(),
            _ => format!("all {n} ranks"),
        };
        println!("{ranks} succeeded in {:.2} s", t.elapsed().as_secs_f64());
    }
    Ok(())
}

/// A key of this launch: the process and the time.
pub(crate) fn key() -> String {
    format!(
        "launch-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}

/// What every rank of one launch gets.
pub(crate) struct Launch<'a> {
    pub(crate) args: &'a [String],
    pub(crate) port: u16,
    pub(crate) key: String,
    /// The secret file made for this launch (`None`: the caller's passes through).
    pub(crate) secret: Option<&'a std::path::Path>,
    pub(crate) output: Output,
}

/// Where a started process sits: rank `rank` of `size`, on the device of local rank
/// `local`, its output relayed as `who`'s.
pub(crate) struct Place {
    pub(crate) size: usize,
    pub(crate) rank: usize,
    pub(crate) local: usize,
    pub(crate) who: Who,
}

impl Launch<'_> {
    /// Starts rank `r` of `n` and the threads that relay its output.
    pub(crate) fn start(
        &self,
        exe: &std::path::Path,
        n: usize,
        r: usize,
    ) -> std::io::Result<(Child, Vec<JoinHandle<()>>)> {
        let place = Place {
            size: n,
            rank: r,
            local: r,
            who: Who::Rank(r),
        };
        self.start_at(exe, self.args, &place)
    }

    /// Starts this executable with `args` at `place` (with this launch's rendezvous) and
    /// the threads that relay its output.
    pub(crate) fn start_at(
        &self,
        exe: &std::path::Path,
        args: &[String],
        place: &Place,
    ) -> std::io::Result<(Child, Vec<JoinHandle<()>>)> {
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env("NCCL_CHANNEL_NPROCS", place.size.to_string())
            .env("NCCL_CHANNEL_PROCID", place.rank.to_string())
            .env("NCCL_CHANNEL_LOCAL_PROCID", place.local.to_string())
            .env(
                "NCCL_CHANNEL_RENDEZVOUS",
                format!("127.0.0.1:{}", self.port),
            )
            .env("NCCL_CHANNEL_RENDEZVOUS_KEY", &self.key)
            .env_remove("NCCL_COMM_ID")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(path) = self.secret {
            cmd.env(crate::secret::SECRET_FILE_ENV, path);
        }
        // NCCL's NVLink SHARP stays off unless the caller's environment turns it on.
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        let mut child = cmd.spawn()?;
        let who = place.who;
        let show = match who {
            Who::Rank(r) => self.output.shows_stdout(r),
            Who::Named(_) => self.output == Output::Prefixed,
        };
        let output = self.output;
        let mut relays = Vec::new();
        if let Some(out) = child.stdout.take() {
            relays.push(std::thread::spawn(move || {
                relay(who, out, false, show, output)
            }));
        }
        if let Some(err) = child.stderr.take() {
            relays.push(std::thread::spawn(move || {
                relay(who, err, true, true, output)
            }));
        }
        Ok((child, relays))
    }
}

/// How long the other ranks get, once one failed, to end on their own (and print why)
/// before they are stopped.
const GRACE: Duration = Duration::from_millis(500);

/// Waits for every rank; a failed rank leaves its peers waiting in NCCL, so the others are
/// stopped [`GRACE`] later (each that ended by then is reported as it ended), as they are
/// at `deadline`. Returns what failed, in the order seen (empty: all succeeded).
fn wait_all(children: &mut [Child], deadline: Instant, timeout: Duration) -> Vec<String> {
    let mut failed: Vec<String> = Vec::new();
    let mut done = vec![false; children.len()];
    let mut stop_at: Option<Instant> = None;
    while done.iter().any(|d| !d) {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(st)) => {
                    done[r] = true;
                    if !st.success() {
                        failed.push(format!("rank {r} exited with {st}"));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[r] = true;
                    failed.push(format!("rank {r}: {e}"));
                }
            }
        }
        if !failed.is_empty() {
            stop_at.get_or_insert_with(|| Instant::now() + GRACE);
        }
        let now = Instant::now();
        let why = match stop_at {
            _ if now > deadline => Some(format!("still running after {timeout:?}")),
            Some(t) if now > t => Some("another rank failed".to_string()),
            _ => None,
        };
        if let Some(why) = why {
            for (r, c) in children.iter_mut().enumerate() {
                if !done[r] {
                    kill_all(std::slice::from_mut(c));
                    failed.push(format!("rank {r} was stopped: {why}"));
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    failed
}

pub(crate) fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sh(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).spawn().unwrap()
    }

    #[test]
    fn a_failed_rank_is_named_and_a_waiting_peer_stopped_after_the_grace() {
        let mut children = [sh("exit 3"), sh("sleep 60")];
        let t = Instant::now();
        let failed = wait_all(
            &mut children,
            t + Duration::from_secs(60),
            Duration::from_secs(60),
        );
        assert_eq!(
            failed,
            [
                "rank 0 exited with exit status: 3",
                "rank 1 was stopped: another rank failed"
            ]
        );
        assert!(
            t.elapsed() >= GRACE,
            "stopped before the grace: {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn ranks_past_the_deadline_are_stopped_and_named() {
        let mut children = [sh("exit 0"), sh("sleep 60")];
        let timeout = Duration::from_millis(50);
        let failed = wait_all(&mut children, Instant::now() + timeout, timeout);
        assert_eq!(failed, ["rank 1 was stopped: still running after 50ms"]);
    }

    #[test]
    fn ranks_that_all_succeed_report_nothing() {
        let mut children = [sh("exit 0"), sh("exit 0")];
        let far = Duration::from_secs(60);
        assert!(wait_all(&mut children, Instant::now() + far, far).is_empty());
    }
}
