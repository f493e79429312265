/* Stand-in for the CUDA runtime header, read by bindgen for nccl.h only (see wrapper.h). */
#ifndef NCCL_SYS_SHIM_CUDA_RUNTIME_H
#define NCCL_SYS_SHIM_CUDA_RUNTIME_H
#include <stddef.h> /* size_t, which the real runtime header brings */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif
