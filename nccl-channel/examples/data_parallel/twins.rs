//! The kernels' host twins, for simulated devices: each does on the host what its kernel
//! in `kernels.cu` does on a GPU (one call per launch, covering the whole grid).

use cuda_mock::{KernelCall, MockDriver};

fn f32s(call: &mut KernelCall<'_>, param: usize, len: usize) -> Vec<f32> {
    let p = call.param::<u64>(param);
    call.read::<f32>(p, len)
}

/// A mock driver whose kernels `residual`, `gradient`, `gradient_cols`, `sgd` and `mse` do
/// on the host what `kernels.cu` does on a GPU (one call per launch, covering the whole
/// grid).
pub(crate) fn with_kernels(driver: MockDriver) -> MockDriver {
    driver
        .kernel("residual", &[8, 8, 8, 8, 4, 4], |c| {
            let (n, d) = (c.param::<i32>(4) as usize, c.param::<i32>(5) as usize);
            let (x, w, y) = (f32s(c, 0, n * d), f32s(c, 1, d + 1), f32s(c, 2, n));
            let r: Vec<f32> = x
                .chunks(d.max(1))
                .zip(&y)
                .map(|(row, yi)| row.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() + w[d] - yi)
                .collect();
            let p = c.param::<u64>(3);
            c.write(p, &r);
        })
        .kernel("gradient", &[8, 8, 8, 4, 4, 4], |c| {
            let (n, d) = (c.param::<i32>(3) as usize, c.param::<i32>(4) as usize);
            let scale = c.param::<f32>(5);
            let (x, r, mut g) = (f32s(c, 0, n * d), f32s(c, 1, n), f32s(c, 2, d + 1));
            for (row, ri) in x.chunks(d.max(1)).zip(&r) {
                for (gj, xj) in g.iter_mut().zip(row) {
                    *gj += scale * ri * xj;
                }
                g[d] += scale * ri;
            }
            let p = c.param::<u64>(2);
            c.write(p, &g);
        })
        .kernel("gradient_cols", &[8, 8, 8, 4, 4, 4, 4, 4], |c| {
            let (n, d) = (c.param::<i32>(3) as usize, c.param::<i32>(4) as usize);
            let scale = c.param::<f32>(5);
            let j0 = c.param::<i32>(6).max(0) as usize;
            let j1 = (j0 + c.param::<i32>(7).max(0) as usize).min(d + 1);
            if j0 >= j1 {
                return;
            }
            // Only the bucket's columns of `g` are read and written: the other buckets'
            // may be in an all-reduce on another stream. Each element gets the same
            // additions in the same order as from `gradient`, so the values are equal.
            let (x, r) = (f32s(c, 0, n * d), f32s(c, 1, n));
            let p = c.param::<u64>(2) + 4 * j0 as u64;
            let mut g = c.read::<f32>(p, j1 - j0);
            for (row, ri) in x.chunks(d.max(1)).zip(&r) {
                for (gj, j) in g.iter_mut().zip(j0..j1) {
                    *gj += if j < d {
                        scale * ri * row[j]
                    } else {
                        scale * ri
                    };
                }
            }
            c.write(p, &g);
        })
        .kernel("sgd", &[8, 8, 4, 4], |c| {
            let (lr, m) = (c.param::<f32>(2), c.param::<i32>(3) as usize);
            let (mut w, g) = (f32s(c, 0, m), f32s(c, 1, m));
            for (wj, gj) in w.iter_mut().zip(&g) {
                *wj -= lr * gj;
            }
            let p = c.param::<u64>(0);
            c.write(p, &w);
        })
        .kernel("mse", &[8, 8, 4], |c| {
            let n = c.param::<i32>(2) as usize;
            let r = f32s(c, 0, n);
            let l = r.iter().map(|v| v * v).sum::<f32>() / n as f32;
            let p = c.param::<u64>(1);
            c.write(p, &[l]);
        })
}
