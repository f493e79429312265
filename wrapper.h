/*
 * The one header bindgen reads (`cargo xtask bindgen`).
 *
 * CUDA_SYS selects the CUDA driver API (cuda.h); NCCL_SYS selects nccl.h. nccl.h includes
 * <cuda_runtime.h> only for cudaStream_t and cudaEvent_t: xtask/shim provides a
 * cuda_runtime.h that declares them exactly as the runtime does (pointers to the driver's
 * CUstream_st / CUevent_st), so nccl-sys can reuse cuda-sys's CUstream and CUevent and
 * needs none of the runtime API.
 */
#if defined(CUDA_SYS)
#include <cuda.h>
#elif defined(NCCL_SYS)
#include <nccl.h>
#else
#error "define CUDA_SYS or NCCL_SYS"
#endif
