/* Stand-in: nccl.h includes it, but its API uses no half-precision type. */
