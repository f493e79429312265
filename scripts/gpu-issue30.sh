#!/usr/bin/env bash
# Issue 30 on the GPU machine: two GPUs (nvidia-h200-x2), NCCL 2.30.7 built from source
# and the system's 2.28.3 / torch's 2.28.9. Stage first (here, on the CPU machine):
#
#   bash scripts/gpu-stage          # .gpu/: binaries, NCCL and nccl-tests sources
#
# then, with the device tool's `run` and carry [".gpu"], one part or several per call
# (each part says how long it took; a call may take at most 10 minutes):
#
#   bash scripts/gpu-issue30.sh suite      # 1: GPU suites on 2.28.3 and 2.30.7, grow,
#                                          #    one-sided, elastic run vs uninterrupted
#   bash scripts/gpu-issue30.sh cudarc     # 2: cudarc collectives, group, graph, sanitizer
#   bash scripts/gpu-issue30.sh perf-2.30  # 3: ours vs nccl-tests vs torch on 2.30.7
#   bash scripts/gpu-issue30.sh perf-2.28  #    the same on torch's 2.28.9
#   bash scripts/gpu-issue30.sh ddp        # 3: data_parallel (plain, --overlap) vs torch DDP
#   bash scripts/gpu-issue30.sh pool       # 4: the pool's table from a sweep of its own
#                                          #    (2.30.7), and the pool again with it
#
# QUICK=1 shrinks the perf sweeps to a dry run of their steps (as on one GPU).
#
# Outputs go to $OUT/issue30/ (commit them under bench/results/). On one GPU every part
# runs what one GPU can (one rank; the two-rank steps say "skipped: needs 2 GPUs"), as a
# dry run of the script: figures of one rank are not comparisons.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
B=${B:-.gpu/bin}
[ -d "$B" ] || { mkdir -p "$B" && xz -dc .gpu/bins.tar.xz | tar xf - -C "$B"; }
OUT=${OUT:-gpu-out}
O=$OUT/issue30
mkdir -p "$O"
exec > >(tee -a "$O/log.txt") 2>&1
PY=$([ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || echo python3)
# torch's NCCL wheel (a namespace package: its folder is its __path__).
TORCH_NCCL=$($PY -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
[ -f "$TORCH_NCCL/lib/libnccl.so.2" ] || TORCH_NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
[ -f "$TORCH_NCCL/lib/libnccl.so.2" ] || echo "FAILED: torch's NCCL not found (TORCH_NCCL=$TORCH_NCCL)"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fail=0
run() { echo "=== $*"; timeout "${T:-300}" "$@" 2>&1 || { echo "FAILED ($?): $*"; fail=1; }; }
san() { run compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$@"; }
two() { [ "$NGPU" -ge 2 ] || { echo "skipped: needs 2 GPUs, this machine has $NGPU: $*"; return 1; }; }
# Builds NCCL 2.30.7 (about 220 s on 16 cores; build-nccl skips a build it finds in /tmp,
# on a machine still warm from an earlier call); prints its env line.
nccl230() {
  bash .gpu/build-nccl 2> /tmp/nccl.build.err || { cat /tmp/nccl.build.err; return 1; }
  cat /tmp/nccl.build.err
}
# nccl-tests, built against the NCCL in $1 (a directory with include/ and lib/), into $2.
nccl_tests() {
  local home=$1 dst=$2
  [ -f .gpu/nccltests.tar.gz ] || { echo "no .gpu/nccltests.tar.gz (scripts/gpu-stage stages it)"; return 1; }
  [ -x "$dst/build/all_reduce_perf" ] && return 0
  mkdir -p "$dst" && tar xzf .gpu/nccltests.tar.gz -C "$dst" --strip-components=1
  local s; s=$(date +%s)
  make -C "$dst" -j"$(nproc)" MPI=0 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NCCL_HOME="$home" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$dst/build.log" 2>&1 \
    || { tail -n 30 "$dst/build.log"; return 1; }
  echo "built nccl-tests against $home in $(( $(date +%s) - s )) s"
}
# A directory shaped as NCCL_HOME for torch's wheel (its lib has only libnccl.so.2).
torch_home() {
  local h=/tmp/nccl-torch
  mkdir -p $h/lib && ln -sfn "$TORCH_NCCL/include" $h/include
  ln -sf "$TORCH_NCCL/lib/libnccl.so.2" $h/lib/libnccl.so.2; ln -sf libnccl.so.2 $h/lib/libnccl.so
  echo $h
}
# NCCL 2.30.7 builds in the background from the start (parts that need it wait for it);
# LIB230 is its library once built.
LIB230=
nccl_wait() {
  [ -n "${BUILDER:-}" ] && { wait "$BUILDER"; BUILDER=; cat /tmp/nccl230.out; }
  LIB230=$(grep -o '/tmp/nccl[^ ]*libnccl.so.2' /tmp/nccl230.out 2>/dev/null)
  [ -n "$LIB230" ] || { echo "FAILED: no NCCL 2.30.7"; fail=1; return 1; }
}
part() { echo; echo "##### part $1 ($(date -u +%H:%M:%S), $NGPU GPU(s))"; }
took() { echo "##### part $1 took $(( $(date +%s) - $2 )) s"; }

suite() {
  local s; s=$(date +%s); part suite
  nvidia-smi -L
  echo "--- system NCCL (2.28.3): every staged GPU test"
  for t in "$B"/test-*; do T=300 run "$t" --ignored --test-threads=1 --skip torch_store_real; done
  nccl_wait || return
  export NCCL_SYS_LIBRARY=$LIB230
  echo "--- NCCL_SYS_LIBRARY=$NCCL_SYS_LIBRARY: every staged GPU test (the two-GPU module next)"
  for t in "$B"/test-*; do T=300 run "$t" --ignored --test-threads=1 --skip torch_store_real --skip two_gpu::; done
  echo "--- two GPUs on 2.30.7: grow 1 -> 2, one-sided put/signal/wait, cudarc, with their output"
  run "$B/test-nccl-channel-suite" --ignored two_gpu:: --test-threads=1 --nocapture
  echo "--- the elastic run: rank 1 killed at step 10, replaced through grow; and uninterrupted"
  if two elastic; then
    run "$B/data_parallel" --nprocs 2 --steps 60 --log-every 10 > "$O/elastic-uninterrupted.txt"
    cat "$O/elastic-uninterrupted.txt"
    run "$B/data_parallel" --nprocs 2 --steps 60 --log-every 10 --elastic --kill-rank 1 --kill-at 10 > "$O/elastic-killed.txt"
    cat "$O/elastic-killed.txt"
    echo "final losses: uninterrupted $(grep -ho 'final .*loss [^ ]*' "$O/elastic-uninterrupted.txt" | tail -1), elastic $(grep -ho 'final .*loss [^ ]*' "$O/elastic-killed.txt" | tail -1)"
  fi
  unset NCCL_SYS_LIBRARY
  took suite "$s"
}

cudarc() {
  local s; s=$(date +%s); part cudarc
  cudarc_on() {
    echo "--- NCCL_SYS_LIBRARY=${NCCL_SYS_LIBRARY:-(system 2.28.3)}"
    run "$B/test-nccl-channel-suite" --ignored cudarc --test-threads=1 --nocapture
    san "$B/test-nccl-channel-suite" --ignored cudarc --test-threads=1
    san "$B/test-cuda-hal-suite" --ignored cudarc --test-threads=1
  }
  cudarc_on
  if two tensor_parallel; then run "$B/tensor_parallel" --nprocs 2; else run "$B/tensor_parallel" --nprocs 1; fi
  nccl_wait && NCCL_SYS_LIBRARY=$LIB230 cudarc_on
  took cudarc "$s"
}

# Ours, nccl-tests and torch on one NCCL: $1 label, $2 NCCL_HOME (include/, lib/), $3 the
# libnccl.so.2 ours and torch load (torch: LD_PRELOAD, which its wheel's loader takes).
perf_on() {
  local label=$1 home=$2 lib=$3 d=$O/perf-$1 s; s=$(date +%s); part "perf-$label"
  mkdir -p "$d"
  # Nothing builds while anything is timed: NCCL's build (started for another part) and
  # nccl-tests' finish first.
  [ -z "${BUILDER:-}" ] || nccl_wait > /dev/null
  nccl_tests "$home" "/tmp/nccl-tests-$label" > "$d/nccl-tests-build.txt" 2>&1
  cat "$d/nccl-tests-build.txt"
  local n=$(( NGPU >= 2 ? 2 : 1 ))
  local bw="-b 128M -e 4G -f 2 -n 10 -w 3" lat="-b 8 -e 1M -f 4 -n 200 -w 20"
  # QUICK=1: a dry run of the script's steps (one GPU), not figures.
  [ -n "${QUICK:-}" ] && bw="-b 128M -e 256M -f 2 -n 3 -w 1" lat="-b 8 -e 64K -f 16 -n 20 -w 2"
  local launch="--nprocs $n"
  export NCCL_SYS_LIBRARY=$lib
  # torch loads its own NCCL; another one it is given through LD_PRELOAD.
  local preload=; [ "$lib" -ef "$TORCH_NCCL/lib/libnccl.so.2" ] || preload=$lib
  { T=400 run "$B/bench" -c all $bw $launch -R 0,1,2,pool --check 0; } > "$d/ours-bw.txt" 2>&1
  { T=200 run "$B/bench" -c all $lat $launch -R 0,1,2,pool -G; } > "$d/ours-lat.txt" 2>&1
  { T=400 LD_PRELOAD=$preload run $PY -m torch.distributed.run --nproc_per_node $n bench/torch_bench.py -c all $bw -R 0,1,2; } > "$d/torch-bw.raw" 2>&1
  { T=200 LD_PRELOAD=$preload run $PY -m torch.distributed.run --nproc_per_node $n bench/torch_bench.py -c all $lat -R 0,1,2; } > "$d/torch-lat.raw" 2>&1
  for f in bw lat; do grep -v "^W[0-9]\|OMP_NUM\|^\*\*\*" "$d/torch-$f.raw" > "$d/torch-$f.txt"; rm "$d/torch-$f.raw"; done
  local nt=/tmp/nccl-tests-$label/build
  if [ -x $nt/all_reduce_perf ]; then
    local modes="0"; $nt/all_reduce_perf -h 2>&1 | grep -q -- "-R," && modes="0 1 2"
    for c in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
      for r in $modes; do
        local rf=""; [ "$modes" = 0 ] || rf="-R $r"
        { T=120 LD_LIBRARY_PATH=$(dirname "$lib") run $nt/${c}_perf $bw -g $n -c 0 $rf
          T=60 LD_LIBRARY_PATH=$(dirname "$lib") run $nt/${c}_perf $lat -g $n -c 0 -G 1 $rf; } > "$d/nt-$c-R$r.txt" 2>&1
      done
    done
  fi
  unset NCCL_SYS_LIBRARY
  $PY bench/compare.py "$d" --label "NCCL $label, $n GPU(s)" > "$d/compare.md" 2>&1
  cat "$d/compare.md"
  grep -h "FAILED\|skipped" "$d"/*.txt | head -40
  grep -l "^FAILED" "$d"/*.txt && fail=1
  took "perf-$label" "$s"
}

ddp() {
  local s; s=$(date +%s); part ddp
  local n=$(( NGPU >= 2 ? 2 : 1 )) d=$O/ddp
  mkdir -p "$d"
  # Both sides on torch's NCCL (2.28.9).
  export NCCL_SYS_LIBRARY=$TORCH_NCCL/lib/libnccl.so.2
  local big="--features 8192 --samples 16384 --steps 60"
  for size in "" "$big" "$big --bucket 8193"; do
    run "$B/data_parallel" --nprocs $n $size --no-reference
    run "$B/data_parallel" --nprocs $n $size --no-reference --overlap
    run $PY -m torch.distributed.run --nproc_per_node $n bench/ddp_bench.py $size
    run $PY -m torch.distributed.run --nproc_per_node $n bench/ddp_bench.py $size --layout buckets
  done 2>&1 | grep -v "^W[0-9]\|OMP_NUM\|^\*\*\*" | tee "$d/ddp.txt" | grep -E "^=== |step time|FAILED"
  grep -q "^FAILED" "$d/ddp.txt" && fail=1
  unset NCCL_SYS_LIBRARY
  took ddp "$s"
}

pool() {
  local s; s=$(date +%s); part pool
  local d=$O/pool
  mkdir -p "$d"
  local n=$(( NGPU >= 2 ? 2 : 1 ))
  # The table needs base and registered rows of every collective: a sweep with -R nccl,1.
  nccl_wait && export NCCL_SYS_LIBRARY=$LIB230
  local sweep="-b 1M -e 4G -f 4 -n 10 -w 3" check="-b 128M -e 4G -f 2 -n 10 -w 3"
  [ -n "${QUICK:-}" ] && sweep="-b 1M -e 16M -f 4 -n 3 -w 1" check="-b 128M -e 256M -f 2 -n 3 -w 1"
  T=300 run "$B/bench" -c all $sweep --nprocs $n -R 0,nccl,1 --check 0 > "$d/sweep.txt" 2>&1
  echo "=== pool-policy $d/sweep.txt"
  if "$B/pool-policy" "$d/sweep.txt" > "$d/policy.tsv" 2> "$d/policy.err"; then
    grep -v "^#  " "$d/policy.tsv"
    NCCL_CHANNEL_POOL_POLICY=$d/policy.tsv T=300 run "$B/bench" -c all_gather,all_reduce $check --nprocs $n -R 0,1,pool --check 1 > "$d/pool-with-table.txt" 2>&1
    grep -h "^# Avg\|FAILED" "$d/pool-with-table.txt" | head
  elif two "a table from measurements of one rank"; then
    cat "$d/policy.err"; echo "FAILED: pool-policy"; fail=1
  else
    head -3 "$d/policy.err"
  fi
  unset NCCL_SYS_LIBRARY
  took pool "$s"
}

[ $# -gt 0 ] || set -- suite cudarc perf-2.28 ddp perf-2.30 pool
case " $* " in *" suite "*|*" cudarc "*|*" perf-2.30 "*|*" pool "*)
  ( nccl230 > /tmp/nccl230.out 2>&1 ) & BUILDER=$! ;;
esac
for p in "$@"; do
  case $p in
    suite) suite ;;
    cudarc) cudarc ;;
    perf-2.30) nccl_wait && perf_on 2.30.7 "$(dirname "$(dirname "$LIB230")")" "$LIB230" ;;
    perf-2.28) perf_on 2.28.9 "$(torch_home)" "$TORCH_NCCL/lib/libnccl.so.2" ;;
    ddp) ddp ;;
    pool) pool ;;
    *) echo "unknown part $p"; fail=1 ;;
  esac
done
echo "gpu-issue30: $([ $fail = 0 ] && echo all passed || echo SOME FAILED) (parts: $*)"
sleep 1  # tee's last lines
# The device tool brings back a few files: everything else packed in one.
tar czf "$OUT/issue30-$(date -u +%H%M%S).tgz" -C "$OUT" --exclude '*.tgz' issue30 && find "$O" -mindepth 1 -type d -exec rm -rf {} +
exit $fail
