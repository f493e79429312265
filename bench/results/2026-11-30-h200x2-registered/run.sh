#!/usr/bin/env bash
# BENCHMARKS.md's "Registered memory, windows and the default pool" tables: one device
# call, NCCL 2.28.9 (torch's) for ours and torch alike.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_SYS_LIBRARY=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
cd "$(dirname "$0")/.."
B=.gpu/bin
PY=$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || echo python3)
run() { echo; echo "\$ $*"; "$@" 2>&1; }
nvidia-smi -L > $OUT/1-tests.txt
{
run timeout 60 $B/test-nccl-channel-registration_gpu --include-ignored --test-threads=1 --nocapture
echo "# the same with the system NCCL 2.28.3:"
NCCL_SYS_LIBRARY= run timeout 60 $B/test-nccl-channel-registration_gpu --include-ignored --test-threads=1 --nocapture
echo "# under compute-sanitizer memcheck (system NCCL):"
NCCL_SYS_LIBRARY= run timeout 150 compute-sanitizer --tool memcheck --report-api-errors no $B/test-nccl-channel-registration_gpu --include-ignored --test-threads=1
for t in test-nccl-channel-gpu test-nccl-channel-soundness_gpu test-nccl-channel-split_gpu test-nccl-channel-demo_gpu test-nccl-channel-data_parallel test-cuda-hal-gpu test-cuda-hal-kernels_gpu test-nccl-sys-real_nccl test-cuda-sys-real_driver; do
  echo "--- $t"; timeout 120 $B/$t --include-ignored --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked"
done
} >> $OUT/1-tests.txt 2>&1
run timeout 90 $B/bench -c all_gather -b 128M -e 4G -f 2 -n 20 -w 5 --threads 2 -R 0,nccl,1,2,pool --check 0 > $OUT/2-allgather.txt
run timeout 90 $B/bench -c all_gather -b 128M -e 4G -f 2 -n 20 -w 5 --nprocs 2 -R 0,1,pool --check 0 >> $OUT/2-allgather.txt
{
run timeout 60 $B/bench -c all_reduce -b 8 -e 512K -f 2 -n 1000 -w 100 --threads 2 -R 0,1,2,pool -G
run timeout 60 $B/bench -c all_reduce -b 8 -e 512K -f 2 -n 1000 -w 100 --threads 2 -R 0,1,2,pool
} > $OUT/3-latency.txt
run timeout 200 $B/bench -c all -b 8 -e 4G -f 4 -n 50 -w 5 --threads 2 -R 0,nccl,1,2,pool --check 0 > $OUT/4-sweep.txt
run timeout 100 $B/bench -c all -b 8 -e 1M -f 4 -n 500 -w 50 --threads 2 -R 0,nccl,1,2,pool -G > $OUT/5-small-graphs.txt
{
run timeout 60 $B/bench -c all_reduce,all_gather -b 8 -e 1G -f 8 -n 20 -w 5 --threads 2 -R 0,1,2 --check 0
run timeout 60 $B/bench -c all_reduce,all_gather -b 8 -e 1G -f 8 -n 20 -w 5 --threads 2 -R 0,1,2 --cta-policy efficiency --check 0
run timeout 60 $B/bench -c all_reduce,all_gather -b 8 -e 1G -f 8 -n 20 -w 5 --threads 2 -R 0,1,2 --cta-policy zero --check 0
run timeout 60 $B/bench -c all_reduce,all_gather -b 8 -e 1G -f 8 -n 20 -w 5 --threads 2 -R 0,1,2 --max-ctas 4 --check 0
run timeout 60 $B/bench -c all_reduce,all_gather -b 8 -e 1G -f 8 -n 20 -w 5 --threads 2 -R 0,1,2 --min-ctas 32 --check 0
} > $OUT/6-cta.txt
run timeout 150 $PY -m torch.distributed.run --nproc_per_node 2 bench/torch_bench.py -c all_gather,all_reduce,reduce_scatter,all_to_all -b 8 -e 4G -f 4 -n 20 -w 5 -R 0,1,2 2>&1 | grep -v "^W1130\|OMP_NUM\|^\*\*\*" > $OUT/7-torch.txt
run timeout 120 $B/bench -c all -b 8 -e 256M -f 8 -n 3 -w 1 --threads 2 -R 0,nccl,1,2,pool --check 1 > $OUT/8-check.txt
grep -h "test result" $OUT/1-tests.txt | sort | uniq -c; grep -c "^ " $OUT/*.txt
