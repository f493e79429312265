#!/usr/bin/env bash
# Issue 26's GPU part (after ../shared/gpu/stage --all-features; the device tool runs it
# with carry [".gpu"]): every staged GPU test binary against the system NCCL, then each
# under compute-sanitizer (memcheck with leak checking), whose summary lines are kept.
# Writes $OUT/run-tests.txt and $OUT/sanitizer.txt (or ./gpu-out) and prints both.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
B=${B:-.gpu/bin}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
nvidia-smi -L
bash .gpu/run-tests 2>&1 | tee "$OUT/run-tests.txt" | grep -E "^=== |test result|run-tests:|skipped|FAILED|panicked"
for t in "$B"/test-*; do
  echo "=== compute-sanitizer $(basename "$t")"
  timeout 400 compute-sanitizer --tool memcheck --leak-check full --report-api-errors no \
    "$t" --include-ignored --test-threads=1 2>&1 | tail -n 40
done 2>&1 | tee "$OUT/sanitizer.txt" | grep -E "^=== |ERROR SUMMARY|LEAK SUMMARY|test result|leaked|FAILED"
