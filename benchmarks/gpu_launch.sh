#!/usr/bin/env bash
# Triton's launches against h3_triton.launch's direct ones (H3_TRITON_DIRECT_LAUNCH) on a GPU machine: the launch
# and few-rows tests with direct launches, the host's cost of each piece of a call (launch_costs.py), where the
# AdaLN's forward+backward spends the host's time (host_profile.py) and the release bench's silu_linear and linear
# rows, under each setting in one machine's run. Before direct launches become the default, the README's GPU command
# and `benchmarks/gpu_kernels.sh` (the kernel gate and every tiling) run with H3_TRITON_DIRECT_LAUNCH=1 exported.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
phase launch-tests "${TESTS_LIMIT:-120}" env H3_TRITON_DIRECT_LAUNCH=1 python3 -m pytest tests/kernels/test_launch.py \
  tests/kernels/test_gemm.py -k "launch or few_rows" -q -n 8 --h3-workers-per-gpu=8
grep -E "^(FAILED|E  )|passed|failed" "$OUT/launch-tests.log" | head -20
phase launch-costs "${COSTS_LIMIT:-60}" python3 benchmarks/launch_costs.py
cat "$OUT/launch-costs.log"
for direct in 0 1; do
  phase "host-profile-direct-$direct" "${HOST_LIMIT:-60}" env H3_TRITON_DIRECT_LAUNCH=$direct \
    python3 benchmarks/host_profile.py silu_linear --backward --top 25
  head -2 "$OUT/host-profile-direct-$direct.log"
  phase "bench-direct-$direct" "${BENCH_LIMIT:-120}" env H3_TRITON_DIRECT_LAUNCH=$direct h3gate bench --shape release \
    --device cuda --ops silu_linear,linear --no-block -o "$OUT/bench-direct-$direct.json"
done
