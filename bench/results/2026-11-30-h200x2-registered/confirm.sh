#!/usr/bin/env bash
# Final code: GPU tests on both NCCLs, the pool and registered modes checked and timed.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TORCH_NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
cd "$(dirname "$0")/.."
B=.gpu/bin
{
for lib in "" "$TORCH_NCCL"; do
  echo "=== NCCL_SYS_LIBRARY=$lib"
  for t in .gpu/bin/test-*; do
    echo "--- $t"; NCCL_SYS_LIBRARY=$lib timeout 120 $t --include-ignored --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked|NCCL 2"
  done
done
} > $OUT/confirm-tests.txt 2>&1
{
echo "\$ bench -c all -b 1M -e 256M -f 16 -n 5 -w 1 --threads 2 -R 0,1,pool --check 1 (torch NCCL)"
NCCL_SYS_LIBRARY=$TORCH_NCCL timeout 120 $B/bench -c all -b 1M -e 256M -f 16 -n 5 -w 1 --threads 2 -R 0,1,pool --check 1
echo "\$ bench -c all_gather,broadcast -b 128M -e 1G -f 2 -n 20 -w 5 --threads 2 -R 0,1,pool --check 0 (torch NCCL)"
NCCL_SYS_LIBRARY=$TORCH_NCCL timeout 120 $B/bench -c all_gather,broadcast -b 128M -e 1G -f 2 -n 20 -w 5 --threads 2 -R 0,1,pool --check 0
} > $OUT/confirm-bench.txt 2>&1
grep -c "test result: ok" $OUT/confirm-tests.txt; grep -E "FAILED|panicked" $OUT/confirm-tests.txt | head
