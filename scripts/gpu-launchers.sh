#!/usr/bin/env bash
# The launcher cases on a GPU machine (after ../shared/gpu/stage; the device tool runs it
# with carry [".gpu"]): the scenario's two command lines verbatim (by index and by UUID),
# torchrun --no-python on the demo (c10d and static rendezvous) and on the benchmark, two
# "nodes" on one host with NCCL kept on sockets, and the same with torch's own NCCL.
# Writes each case's output to $OUT (or ./launchers-out) and prints it.
set -u
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
B=${B:-.gpu/bin}
PY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
TORCHRUN="$PY -m torch.distributed.run"
OUT=${OUT:-launchers-out}
mkdir -p "$OUT"
nvidia-smi -L
"$PY" -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version())'

case_() { echo; echo "=== $1"; }

case_ "the scenario's two command lines, verbatim"
( IREE_CUDA_NCCL_NPROCS=2 NCCL_COMM_ID=127.0.0.1:8000 IREE_CUDA_NCCL_PROCID=0 $B/allgather --device=cuda://0 &
  IREE_CUDA_NCCL_NPROCS=2 NCCL_COMM_ID=127.0.0.1:8000 IREE_CUDA_NCCL_PROCID=1 $B/allgather --device=cuda://1
  wait ) 2>&1 | tee "$OUT/verbatim.txt"

case_ "the same by UUID (rank 0 on GPU 1, rank 1 on GPU 0)"
U0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
U1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1)
( IREE_CUDA_NCCL_NPROCS=2 NCCL_COMM_ID=127.0.0.1:8001 IREE_CUDA_NCCL_PROCID=0 $B/allgather --device=cuda://$U1 &
  IREE_CUDA_NCCL_NPROCS=2 NCCL_COMM_ID=127.0.0.1:8001 IREE_CUDA_NCCL_PROCID=1 $B/allgather --device=cuda://$U0
  wait ) 2>&1 | tee "$OUT/verbatim-uuid.txt"

case_ "torchrun --standalone --nproc-per-node 2 --no-python allgather (c10d rendezvous)"
$TORCHRUN --standalone --nproc-per-node 2 --no-python $B/allgather 2>&1 | tee "$OUT/torchrun-c10d.txt"

case_ "torchrun static rendezvous (--nnodes 1 --master-addr/--master-port)"
$TORCHRUN --nnodes 1 --master-addr 127.0.0.1 --master-port 29531 --nproc-per-node 2 --no-python \
  $B/allgather --collective all_reduce --count 4 --dtype f32 2>&1 | tee "$OUT/torchrun-static.txt"

case_ "torchrun --no-python bench"
$TORCHRUN --standalone --nproc-per-node 2 --no-python $B/bench -c all_reduce,all_gather -b 8 -e 1G -f 8 \
  2>&1 | tee "$OUT/torchrun-bench.txt"

case_ "two nodes on one host: one torchrun per node, one GPU each, NCCL over sockets"
for node in 0 1; do
  CUDA_VISIBLE_DEVICES=$node NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    NCCL_DEBUG_FILE="$OUT/nccl-node$node.%p.log" \
    $TORCHRUN --nnodes 2 --node-rank $node --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29532 \
    --no-python $B/allgather > "$OUT/node$node.log" 2>&1 &
done
wait
for node in 0 1; do
  echo "--- node $node"
  grep -v "^\s*$" "$OUT/node$node.log" | grep -v "^\*\|OMP_NUM_THREADS"
  cat "$OUT"/nccl-node$node.*.log | grep -E "via NET|Using network|NCCL_P2P_DISABLE|NCCL_SHM_DISABLE" | head -4
done

case_ "two nodes, the benchmark over sockets"
for node in 0 1; do
  CUDA_VISIBLE_DEVICES=$node NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    $TORCHRUN --nnodes 2 --node-rank $node --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29533 \
    --no-python $B/bench -c all_reduce -b 8 -e 256M -f 8 > "$OUT/bench-node$node.log" 2>&1 &
done
wait
cat "$OUT/bench-node0.log"; grep -v "^#\|^\s" "$OUT/bench-node1.log" | head -5

case_ "torch's NCCL under torchrun"
NCCL_SYS_LIBRARY=$(dirname "$PY")/../lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2 \
  $TORCHRUN --standalone --nproc-per-node 2 --no-python $B/allgather 2>&1 | tee "$OUT/torchrun-torch-nccl.txt"

case_ "--nprocs 2 (our one-machine launcher)"
$B/allgather --nprocs 2 2>&1 | tee "$OUT/nprocs.txt"
