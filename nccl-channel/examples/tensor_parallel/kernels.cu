// Kernel of the tensor_parallel example. `kernels.ptx` is this file compiled by NVRTC 12.8
// (the `nvidia-cuda-nvrtc-cu12` wheel; `nvcc -ptx -arch=compute_80 -O3` gives the same
// kernel), then `.version` lowered to 7.8, which it needs, so older drivers load it:
//   python3 scripts/nvrtc-ptx nccl-channel/examples/tensor_parallel/kernels.cu
// The simulated devices run the Rust twin in main.rs instead.

// c = a . b with a of n rows and k columns, b of k rows and m columns, all row-major:
// one thread per element of c.
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int n, int k,
                                  int m) {
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || j >= m) return;
    float s = 0.0f;
    for (int t = 0; t < k; ++t) s += a[(size_t)i * k + t] * b[(size_t)t * m + j];
    c[(size_t)i * m + j] = s;
}
