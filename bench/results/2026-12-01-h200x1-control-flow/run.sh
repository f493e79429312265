#!/usr/bin/env bash
# The control-flow soundness tests (control_flow_gpu) on one H200 (2026-12-01), after
# staging with ../shared/gpu/stage --all-features (a script beside the repository) and
#   cargo test --release -p nccl-channel --all-features --test control_flow_gpu --no-run
# copied to .gpu/bin/test-nccl-channel-control_flow_gpu (the device tool, carry [".gpu"]).
export NCCL_NVLS_ENABLE=0
B=.gpu/bin/test-nccl-channel-control_flow_gpu
$B --include-ignored --test-threads=1 --nocapture                      # plain.txt (NCCL 2.28.3)
compute-sanitizer --tool memcheck --leak-check full --report-api-errors no \
  $B --include-ignored --test-threads=1                                # memcheck.txt
NCCL_SYS_LIBRARY=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2 \
  $B --include-ignored --test-threads=1                                # torch.txt (NCCL 2.28.9)
# suite-under-memcheck-one-gpu.txt: every other staged GPU binary under the same memcheck,
# 50 s each; the tests that need two GPUs fail with "needs two GPUs" on this machine.
# cuda-hal-gpu.txt, cuda-hal-kernels_gpu.txt: cuda-hal's GPU tests under the same memcheck
# (release builds of this commit's code); the two-GPU tests fail with "needs two GPUs".
# Final run: 6 passed on NCCL 2.28.3 and 2.28.9; memcheck 0 errors, 0 bytes leaked; the
# capture another thread began during the group did not receive the group's all-reduce
# on either NCCL (it ran at the group's end).
