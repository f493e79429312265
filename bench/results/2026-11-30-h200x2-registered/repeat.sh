#!/usr/bin/env bash
# The default pool's three largest ratios of the final run, measured again 5 times each.
export NCCL_NVLS_ENABLE=0
export NCCL_SYS_LIBRARY=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
cd "$(dirname "$0")/.."
B=.gpu/bin
for i in 1 2 3 4 5; do
  echo "\$ bench -c reduce_scatter -b 2M -e 2M -n 200 -w 20 --threads 2 -R 0,nccl,pool (repeat $i)"
  timeout 30 $B/bench -c reduce_scatter -b 2M -e 2M -n 200 -w 20 --threads 2 -R 0,nccl,pool 2>&1 | grep -E "^ +[0-9]"
  echo "\$ bench -c broadcast -b 2K -e 2K -n 1000 -w 100 --threads 2 -R 0,nccl,pool -G (repeat $i)"
  timeout 30 $B/bench -c broadcast -b 2K -e 2K -n 1000 -w 100 --threads 2 -R 0,nccl,pool -G 2>&1 | grep -E "^ +[0-9]"
  echo "\$ bench -c all_to_all -b 128 -e 128 -n 1000 -w 100 --threads 2 -R 0,nccl,pool -G (repeat $i)"
  timeout 30 $B/bench -c all_to_all -b 128 -e 128 -n 1000 -w 100 --threads 2 -R 0,nccl,pool -G 2>&1 | grep -E "^ +[0-9]"
done > $OUT/9-repeats.txt
tail -3 $OUT/9-repeats.txt
