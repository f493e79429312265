#!/usr/bin/env bash
# Window latency from 8 B to 512 KiB under other settings (CUDA graphs), NCCL 2.28.9.
export NCCL_NVLS_ENABLE=0
export NCCL_SYS_LIBRARY=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
cd "$(dirname "$0")/.."
B=.gpu/bin
run() { echo; echo "\$ $*"; timeout 60 "$@" 2>&1 | grep -E "^ +[0-9]|config:|rror"; }
{
run $B/bench -c all_reduce -b 8 -e 512K -f 4 -n 1000 -w 100 --nprocs 2 -R 0,2 -G
run $B/bench -c all_reduce -b 8 -e 512K -f 4 -n 1000 -w 100 --threads 2 -R 0,2 -G --cta-policy efficiency
run $B/bench -c all_reduce -b 8 -e 512K -f 4 -n 1000 -w 100 --threads 2 -R 0,2 -G --min-ctas 16 --max-ctas 16
run $B/bench -c all_reduce -b 8 -e 512K -f 4 -n 1000 -w 100 --threads 2 -R 0,2 -G --max-ctas 4
} > $OUT/10-window-latency.txt
grep -c "^ " $OUT/10-window-latency.txt
