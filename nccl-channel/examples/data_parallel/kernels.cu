// Kernels of the data_parallel example: linear regression trained by full-batch gradient
// descent on each rank's shard. `kernels.ptx` is this file compiled by
//   nvcc -ptx -arch=compute_80 -O3 kernels.cu -o kernels.ptx
// (then `.version` lowered to 7.8, which these kernels need, so older drivers load it).
// `gradient_cols` was added later without nvcc: `python3 scripts/nvrtc-ptx` on this file
// (NVRTC 12.8; its `gradient` came out the same as nvcc's, line for line), and that
// kernel's entry appended to `kernels.ptx` with its labels renamed `$L__BB4_*`, so the
// other kernels' PTX is still nvcc's. Regenerating the whole file with the script is
// also fine.
// The simulated devices run the Rust twins in twins.rs instead.
//
// Layout: x is n rows of d features (row-major); w holds d weights and the bias (d + 1).

// r[i] = x[i] . w[0..d] + w[d] - y[i]: one block per row, a tree sum in shared memory.
extern "C" __global__ void residual(const float* x, const float* w, const float* y, float* r,
                                    int n, int d) {
    __shared__ float part[256];
    int i = blockIdx.x;
    if (i >= n) return;
    const float* row = x + (size_t)i * d;
    float s = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s += row[j] * w[j];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) r[i] = part[0] + w[d] - y[i];
}

// g[j] += scale * sum_i r[i] * x[i][j] (j < d), g[d] += scale * sum_i r[i]: one thread per
// weight, reading x a row at a time across threads (coalesced); the rows are split over
// gridDim.y blocks whose partial sums are added atomically (zero g first).
extern "C" __global__ void gradient(const float* x, const float* r, float* g, int n, int d,
                                    float scale) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j > d) return;
    int rows = (n + gridDim.y - 1) / gridDim.y;
    int i0 = blockIdx.y * rows;
    int i1 = min(n, i0 + rows);
    float s = 0.0f;
    if (j < d) {
        for (int i = i0; i < i1; ++i) s += r[i] * x[(size_t)i * d + j];
    } else {
        for (int i = i0; i < i1; ++i) s += r[i];
    }
    atomicAdd(&g[j], scale * s);
}

// `gradient` for the columns j0 .. j0 + cols - 1 only (column d is the bias), with the
// same row split: a bucket's share of the gradient, so that its all-reduce can start
// while the next bucket's columns are computed (`--overlap`). One thread per column.
extern "C" __global__ void gradient_cols(const float* x, const float* r, float* g, int n,
                                         int d, float scale, int j0, int cols) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= cols) return;
    int j = j0 + k;
    if (j > d) return;
    int rows = (n + gridDim.y - 1) / gridDim.y;
    int i0 = blockIdx.y * rows;
    int i1 = min(n, i0 + rows);
    float s = 0.0f;
    if (j < d) {
        for (int i = i0; i < i1; ++i) s += r[i] * x[(size_t)i * d + j];
    } else {
        for (int i = i0; i < i1; ++i) s += r[i];
    }
    atomicAdd(&g[j], scale * s);
}

// w[j] -= lr * g[j].
extern "C" __global__ void sgd(float* w, const float* g, float lr, int m) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < m) w[j] -= lr * g[j];
}

// out[0] = sum_i r[i]^2 / n: one block.
extern "C" __global__ void mse(const float* r, float* out, int n) {
    __shared__ float part[256];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += r[i] * r[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = part[0] / n;
}
