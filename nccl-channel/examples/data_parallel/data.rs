//! The data every rank and the host reference make alike: a deterministic generator, the
//! true weights and each shard's samples, and host vectors sized with a typed error.

/// SplitMix64: a tiny deterministic generator, so every rank and the host reference make
/// the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The weights the data is made from (bias last).
fn true_weights(d: usize) -> Vec<f32> {
    (0..=d)
        .map(|j| ((j * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect()
}

/// Rank `rank`'s shard: `n` rows of `d` features in [-1, 1), labels `x . w + b + noise`.
pub(crate) fn shard(rank: usize, n: usize, d: usize) -> nccl_channel::Result<(Vec<f32>, Vec<f32>)> {
    let w = true_weights(d);
    let mut rng = Rng(0x5EED_0000 + rank as u64);
    let mut x = host_vec(n as u128 * d as u128, "a rank's shard")?;
    x.extend((0..n * d).map(|_| rng.uniform()));
    let mut y = host_vec(n as u128, "a rank's shard")?;
    y.extend(x.chunks(d).map(|row| {
        let dot: f32 = row.iter().zip(&w).map(|(a, b)| a * b).sum();
        dot + w[d] + 0.01 * rng.uniform()
    }));
    Ok((x, y))
}

/// An empty host vector with room for `len` floats (sized by `--samples` and
/// `--features`), or an error that names those options, what was sized and the bytes the
/// host refused, instead of an abort.
pub(crate) fn host_vec<T>(len: u128, what: &str) -> nccl_channel::Result<Vec<T>> {
    let too_large = || nccl_channel::Error::InvalidArgument {
        what: "--samples and --features",
        problem: format!(
            "the host cannot hold {what}: {len} values ({} bytes)",
            len * size_of::<T>() as u128
        ),
    };
    let mut v = Vec::new();
    v.try_reserve_exact(usize::try_from(len).map_err(|_| too_large())?)
        .map_err(|_| too_large())?;
    Ok(v)
}

/// Prints a few values of rank `rank`'s shard of `n` rows of `d` features, as bits and
/// as numbers: rows 0, 1 and n - 1, features 0, 1, d - 2 and d - 1, and the labels of
/// those rows. `bench/ddp_data.py` ports this generator to Python (for the torch DDP
/// comparison, which must train on the same data); `bench/test_ddp_data.py` checks its
/// port against these values, and a test of this example checks they do not change.
pub(crate) fn print_shard(rank: usize, n: usize, d: usize) -> nccl_channel::Result<()> {
    let (x, y) = shard(rank, n, d)?;
    let pick = |last: usize| {
        let mut v = vec![0, 1, last.saturating_sub(1), last];
        v.retain(|&i| i <= last);
        v.sort_unstable();
        v.dedup();
        v
    };
    println!("shard of rank {rank}: {n} samples of {d} features");
    let rows = pick(n - 1);
    for &i in &rows {
        for j in pick(d - 1) {
            let v = x[i * d + j];
            println!("x[{i}][{j}] = {:#010x} {v:e}", v.to_bits());
        }
    }
    for &i in &rows {
        println!("y[{i}] = {:#010x} {:e}", y[i].to_bits(), y[i]);
    }
    Ok(())
}
