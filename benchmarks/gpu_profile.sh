#!/usr/bin/env bash
# Profiler evidence for the performance targets h3_triton misses: Nsight Compute on one run of each op at
# release shapes (benchmarks/profile_op.py), candidate and provider, clocks left alone (--clock-control none).
# Each profile's details page goes to $OUT/ncu-<name>.csv; summary lines (duration, throughput) are echoed.
#   NCU_SECTIONS  the sections taken (default: speed of light, the compute and memory workloads, the warps' stall
#                 reasons, occupancy and launch statistics: what says whether the tensor cores, L2 or the issue
#                 of a kernel's instructions bound it)
# Last, the gate's own cost: the small model gate's and a release-size block gate's phases, each split into GPU
# kernel time and the gate's own time (gate_phases.py --profile).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
profile() {
  local name=$1; shift
  phase "ncu-$name" "${NCU_LIMIT:-120}" ncu --clock-control none --profile-from-start off --csv --page details \
    $(printf -- "--section %s " ${NCU_SECTIONS:-$SECTIONS}) python3 benchmarks/profile_op.py "$@"
  mv "$OUT/ncu-$name.log" "$OUT/ncu-$name.csv"
  python3 benchmarks/ncu_summary.py "$OUT/ncu-$name.csv" | head -40
}
SECTIONS="SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats Occupancy LaunchStats"
# The first tiling of every kernel (the fastest measured at release shapes): no tuning runs inside the profile.
export H3_TRITON_AUTOTUNE=0
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) is not on PATH"; exit 1; }
profile attention-fwd attention
profile attention-fwd-cudnn attention --provider --sdpa cudnn
profile attention-bwd attention --backward
profile attention-bwd-cudnn attention --backward --provider --sdpa cudnn
profile silu-linear-bwd silu_linear --backward
profile silu-linear-bwd-provider silu_linear --backward --provider
profile norm rms_norm_modulate
phase gate-cost-small 150 python3 benchmarks/gate_phases.py --model small --device cuda --profile
phase gate-cost-release-block 240 python3 benchmarks/gate_phases.py --gate block --model release --device cuda --profile
cat "$OUT/gate-cost-small.log" "$OUT/gate-cost-release-block.log"
