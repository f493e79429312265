//! The host reference: the same training on every shard at once, in f64.

use crate::data::{host_vec, shard};
use crate::{Losses, Opts};

/// The losses of the training on all `ranks` shards at once in f64 (each of `n` samples of
/// `d` features): every `--log-every` steps and after the last.
pub(crate) fn host_losses(
    ranks: usize,
    n: usize,
    d: usize,
    o: &Opts,
) -> Result<Vec<(usize, f64)>, Box<dyn std::error::Error>> {
    // Every rank's shard, on this host: sized by --samples and --features times the ranks.
    let mut shards = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        shards.push(
            shard(rank, n, d)
                .map_err(|e| format!("the host reference (--no-reference skips it): {e}"))?,
        );
    }
    let total = (ranks * n) as f64;
    let mut w = vec![0.0f64; d + 1];
    let mut r = host_vec::<f64>(ranks as u128 * n as u128, "the host reference's residuals")?;
    r.resize(ranks * n, 0.0);
    let residuals = |w: &[f64], r: &mut [f64]| {
        let mut i = 0;
        for (x, y) in &shards {
            for (row, yi) in x.chunks(d).zip(y) {
                let dot: f64 = row.iter().zip(w).map(|(a, b)| f64::from(*a) * b).sum();
                r[i] = dot + w[d] - f64::from(*yi);
                i += 1;
            }
        }
        r.iter().map(|v| v * v).sum::<f64>() / total
    };
    let mut host = Vec::new();
    for step in 0..o.steps {
        let l = residuals(&w, &mut r);
        if step % o.log_every as usize == 0 {
            host.push((step, l));
        }
        let mut g = vec![0.0f64; d + 1];
        let mut i = 0;
        for (x, _) in &shards {
            for row in x.chunks(d) {
                for (gj, xj) in g.iter_mut().zip(row) {
                    *gj += r[i] * f64::from(*xj);
                }
                g[d] += r[i];
                i += 1;
            }
        }
        for (wj, gj) in w.iter_mut().zip(&g) {
            *wj -= f64::from(o.lr) * 2.0 * gj / total;
        }
    }
    host.push((o.steps, residuals(&w, &mut r)));
    Ok(host)
}

/// Trains on all shards at once in f64 and compares the logged losses.
pub(crate) fn check_reference(
    dev: &Losses,
    ranks: usize,
    n: usize,
    d: usize,
    o: &Opts,
) -> Result<(), Box<dyn std::error::Error>> {
    let host = host_losses(ranks, n, d, o)?;
    let mut worst = 0.0f64;
    for ((step, dl), (hstep, hl)) in dev.logged.iter().zip(&host) {
        if step != hstep {
            return Err(format!("reference steps differ: {step} vs {hstep}").into());
        }
        worst = worst.max((f64::from(*dl) - hl).abs() / hl.abs().max(1e-30));
    }
    let (last_dev, last_host) = (
        dev.logged.last().map_or(0.0, |l| l.1),
        host[host.len() - 1].1,
    );
    println!(
        "host reference (f64): final loss {last_host:.6e}, device {last_dev:.6e}; largest relative \
         difference over {} logged losses {worst:.2e}",
        host.len()
    );
    if worst > 2e-2 {
        return Err(
            format!("the device losses differ from the host reference by {worst:.2e}").into(),
        );
    }
    Ok(())
}
