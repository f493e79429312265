#!/usr/bin/env bash
# Issue 27's GPU check (after ../shared/gpu/stage --all-features; the device tool runs it
# with carry [".gpu"]): every GPU test of the one-binary-per-crate layout, i.e. each staged
# test binary's `#[ignore]`d tests, against the system NCCL. On a one-GPU machine the
# two-GPU tests must say "skipped: needs 2 GPUs" and pass; on_every_backend!'s `gpu` twins
# run their bodies on the GPUs they need. Tests that need torch (TORCH_PY) are skipped by
# name. Writes $OUT/gpu-tests.txt (or ./gpu-out) and prints the summary lines.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
B=${B:-.gpu/bin}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
nvidia-smi -L
fail=0
for t in "$B"/test-*; do
  echo "=== $(basename "$t")"
  timeout 300 "$t" --ignored --test-threads=1 --nocapture --skip torch_store_real 2>&1 || fail=1
done > "$OUT/gpu-tests.txt" 2>&1
grep -E "^=== |^test .*(ok|FAILED|ignored)$|test result|skipped: needs|panicked" "$OUT/gpu-tests.txt"
echo "gpu-layout: $([ $fail = 0 ] && echo all passed || echo SOME FAILED)"
exit $fail
