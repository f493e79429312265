#!/usr/bin/env bash
# Issue 28's GPU check (after ../shared/gpu/stage --all-features; the device tool runs it
# with carry [".gpu"]): cudarc on a real driver (cuda-hal's cudarc_gpu tests, also under
# compute-sanitizer), the tensor_parallel example on cudarc memory (also under
# compute-sanitizer; API errors are not reported: NCCL's init probes kernels of other
# architectures, and cuda-hal counts a kernel's parameters until the driver says no),
# then every other staged GPU test against the system NCCL.
# Writes $OUT/gpu-28.txt and prints its summary lines.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
B=${B:-.gpu/bin}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
fail=0
run() { echo "=== $*"; timeout 300 "$@" 2>&1 || { echo "FAILED ($?): $*"; fail=1; }; }
{
  nvidia-smi -L
  run "$B/test-cuda-hal-suite" --ignored --test-threads=1 --nocapture
  run compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$B/test-cuda-hal-suite" --ignored cudarc_gpu --test-threads=1
  run "$B/tensor_parallel" --nprocs 1
  run "$B/tensor_parallel" --nprocs 1 --batch 512 --features 8192 --hidden 4096 --out 4096
  run env NCCL_CHANNEL_NPROCS=1 NCCL_CHANNEL_PROCID=0 NCCL_COMM_ID=127.0.0.1:29517 \
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/tensor_parallel"
  for t in "$B"/test-*; do
    case "$t" in *cuda-hal-suite) continue;; esac
    run "$t" --ignored --test-threads=1 --skip torch_store_real ${SKIP:-}
  done
} > "$OUT/gpu-28.txt" 2>&1
grep -E "^=== |^test .*(ok|FAILED)$|test result|skipped: needs|panicked|ERROR SUMMARY|matches the host|FAILED \(|cudarc:" "$OUT/gpu-28.txt"
echo "gpu-issue28: $([ $fail = 0 ] && echo all passed || echo SOME FAILED)"
exit $fail
