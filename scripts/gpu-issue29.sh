#!/usr/bin/env bash
# Issue 29's one-GPU check (after ../shared/gpu/stage --all-features; run with carry
# [".gpu"]): builds NCCL 2.30.7 from source in the background (.gpu/build-nccl), runs the
# newer-API GPU tests and issue 28's cudarc tests on the system NCCL (2.28.x: the newer
# calls must say Unsupported) meanwhile, then the newer-API tests, the whole nccl-channel
# GPU suite and the demo against 2.30.7, the newer-API tests also under compute-sanitizer.
# Writes $OUT/gpu-29.txt and prints its summary lines.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
B=${B:-.gpu/bin}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
fail=0
run() { echo "=== $*"; timeout 300 "$@" 2>&1 || { echo "FAILED ($?): $*"; fail=1; }; }
san() { run compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$@"; }
{
  nvidia-smi -L
  bash .gpu/build-nccl > /tmp/nccl.env 2> /tmp/nccl.build.err &
  builder=$!
  echo "--- system NCCL"
  run "$B/test-nccl-channel-suite" --ignored newer_api_gpu --test-threads=1 --nocapture
  run "$B/test-cuda-hal-suite" --ignored cudarc_gpu --test-threads=1 --nocapture
  san "$B/test-cuda-hal-suite" --ignored cudarc_gpu --test-threads=1
  run "$B/tensor_parallel" --nprocs 1
  wait "$builder" || { echo "FAILED: building NCCL"; cat /tmp/nccl.build.err; fail=1; }
  cat /tmp/nccl.build.err
  eval "$(cat /tmp/nccl.env)"
  echo "--- NCCL_SYS_LIBRARY=${NCCL_SYS_LIBRARY:-unset}"
  run "$B/test-nccl-channel-suite" --ignored newer_api_gpu --test-threads=1 --nocapture
  san "$B/test-nccl-channel-suite" --ignored newer_api_gpu --test-threads=1
  run "$B/test-nccl-channel-suite" --ignored --test-threads=1 --skip torch_store_real ${SKIP:-}
  [ -x "$B/allgather" ] && run "$B/allgather" --nprocs 1
} > "$OUT/gpu-29.txt" 2>&1
grep -E "^=== |^--- |^test .*(ok|FAILED)$|test result|skipped: needs|panicked|ERROR SUMMARY|FAILED|NCCL 2\.|built NCCL|mem stats|suspended|resumed|parameter keys|scalable|simulated group|put_signal|window user|cudarc:|matches the host|2x2xi32|1x1xi32" "$OUT/gpu-29.txt"
echo "gpu-issue29: $([ $fail = 0 ] && echo all passed || echo SOME FAILED)"
exit $fail
