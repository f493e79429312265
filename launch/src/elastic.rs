//! `--nprocs N` for elastic programs: as [`processes`](crate::processes), except that one
//! rank is expected to be killed (the program kills it itself, to show recovery), and a
//! replacement process is started in its place as soon as it is gone, as an elastic
//! agent (torchrun's) would: on the dead rank's device, with the launch's rendezvous, as
//! rank `as_rank` of the world the survivors grow back to.

use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::processes::{Launch, Place, key, kill_all};
use crate::relay::{Output, Who};
use crate::report;
use crate::secret::LaunchSecret;

/// The rank a launch expects to lose, and the process that replaces it.
#[derive(Clone, Debug)]
pub struct Replacement {
    /// The rank expected to die by a signal (any other end of it is a failure).
    pub rank: usize,
    /// The replacement's rank in the regrown world (its `NCCL_CHANNEL_PROCID`; the world
    /// size stays the launch's).
    pub as_rank: usize,
    /// The replacement's arguments.
    pub args: Vec<String>,
}

/// Starts this executable `n` times with `args` as [`processes`](crate::processes) does;
/// when rank `replacement.rank` is killed by a signal, starts the replacement (its
/// output prefixed `[replacement] `) on that rank's device. Every other process must
/// succeed, the replacement too; a failure stops them all, as does `timeout`.
pub fn processes_replacing(
    n: usize,
    args: &[String],
    timeout: Duration,
    output: Output,
    replacement: &Replacement,
) -> Result<(), String> {
    if replacement.rank >= n || replacement.as_rank >= n {
        return Err(format!(
            "the replaced rank {} and the replacement's rank {} must be below {n}",
            replacement.rank, replacement.as_rank
        ));
    }
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
    println!(
        "launching {n} ranks, rendezvous at 127.0.0.1:{port}; rank {} will be replaced",
        replacement.rank
    );
    let mut children: Vec<(Who, Child)> = Vec::new();
    let mut printers = Vec::new();
    for r in 0..n {
        match launch.start(&exe, n, r) {
            Ok((child, relays)) => {
                children.push((Who::Rank(r), child));
                printers.extend(relays);
            }
            Err(e) => {
                stop(&mut children);
                return Err(format!("starting rank {r}: {e}"));
            }
        }
    }
    let deadline = t + timeout;
    let mut failed: Vec<String> = Vec::new();
    let mut done = vec![false; n];
    let mut replaced = false;
    while done.iter().any(|d| !d) {
        let mut start_replacement = false;
        for (i, (who, c)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(st)) => {
                    done[i] = true;
                    let expected = matches!(who, Who::Rank(r) if *r == replacement.rank)
                        && st.signal().is_some()
                        && !replaced;
                    if expected {
                        println!(
                            "[launcher] rank {} is gone ({st}); starting its replacement, rank \
                             {} of {n} once it joins, on its device",
                            replacement.rank, replacement.as_rank
                        );
                        start_replacement = true;
                    } else if !st.success() {
                        failed.push(format!("{who} exited with {st}"));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[i] = true;
                    failed.push(format!("{who}: {e}"));
                }
            }
        }
        if start_replacement {
            replaced = true;
            let place = Place {
                size: n,
                rank: replacement.as_rank,
                local: replacement.rank,
                who: Who::Named("replacement"),
            };
            match launch.start_at(&exe, &replacement.args, &place) {
                Ok((child, relays)) => {
                    children.push((Who::Named("replacement"), child));
                    printers.extend(relays);
                    done.push(false);
                }
                Err(e) => failed.push(format!("starting the replacement: {e}")),
            }
        }
        if !failed.is_empty() && done.iter().any(|d| !d) {
            std::thread::sleep(Duration::from_millis(500));
            stop(&mut children);
            failed.push("the other processes were stopped".into());
            break;
        }
        if Instant::now() > deadline {
            stop(&mut children);
            failed.push(format!(
                "processes still running after {timeout:?}; stopped"
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in printers {
        let _ = p.join();
    }
    if !replaced && failed.is_empty() {
        failed.push(format!(
            "rank {} was never replaced: it was not killed",
            replacement.rank
        ));
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    println!(
        "all {n} ranks and the replacement succeeded in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn stop(children: &mut [(Who, Child)]) {
    for (_, c) in children.iter_mut() {
        kill_all(std::slice::from_mut(c));
    }
}
