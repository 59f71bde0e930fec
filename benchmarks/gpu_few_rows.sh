#!/usr/bin/env bash
# The few-rows backward (silu_linear's AdaLN, h3_triton.gemm._few_rows_backward_kernel) on a GPU machine: its
# tilings timed at the release shape (wall, GPU and host time beside the provider's, gemm_tilings.py), Nsight
# Compute of one forward+backward of the candidate and the provider (the sections in NCU_SECTIONS, default
# SpeedOfLight; add WarpStateStats, MemoryWorkloadAnalysis, Occupancy and SourceCounters for where the warps stall),
# the GEMM unit tests (their sm_90 compile test compiles every tiling of the AdaLN's kernels too: UNITS_LIMIT 150 s),
# the kernel's variants (few_rows_variants.py: FEW_ROWS_VARIANTS at FEW_ROWS_VARIANT_TILINGS,
# each timed beside the provider and checked bitwise against the product kernel), and where the host's time to
# enqueue the op goes, the provider's beside (host_profile.py: the step is host-bound).
# Then run `ONLY=linear benchmarks/gpu_kernels.sh` for the kernel gate and tilings of linear and silu_linear.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
phase few-rows-tilings "${TILINGS_LIMIT:-100}" python3 benchmarks/gemm_tilings.py --op silu_linear \
  --launcher _FEW_ROWS_BACKWARD --tilings "${FEW_ROWS_TILINGS:-128x4x2,128x8x3,128x4x3,64x4x3,256x8x3,128x4x4}"
grep -v -i warn "$OUT/few-rows-tilings.log"
for who in ${NCU_WHO:-candidate provider}; do
  phase "ncu-silu-linear-bwd-$who" "${NCU_LIMIT:-50}" ncu --clock-control none --profile-from-start off --csv \
    --page details $(printf -- "--section %s " ${NCU_SECTIONS:-SpeedOfLight}) python3 benchmarks/profile_op.py silu_linear --backward \
    $([[ $who == provider ]] && echo --provider)
  mv "$OUT/ncu-silu-linear-bwd-$who.log" "$OUT/ncu-silu-linear-bwd-$who.csv"
  python3 benchmarks/ncu_summary.py "$OUT/ncu-silu-linear-bwd-$who.csv" --metrics "Duration,DRAM Throughput"
done
phase gemm-units "${UNITS_LIMIT:-150}" python3 -m pytest tests/kernels/test_gemm.py -n 8 --h3-workers-per-gpu=8 -q
grep -E "^(FAILED|E  )|passed|failed" "$OUT/gemm-units.log" | head -20
phase few-rows-variants "${VARIANTS_LIMIT:-240}" python3 benchmarks/few_rows_variants.py \
  --variants "${FEW_ROWS_VARIANTS:-product,none,TRANS+XT+SUMS_IF,TRANS+XT+EVICT,TRANS+XT+GT+SUMS_IF}" \
  --tilings "${FEW_ROWS_VARIANT_TILINGS:-128x4x2,128x8x3,128x4x3}"
grep -v -i warn "$OUT/few-rows-variants.log"
phase host-profile "${HOST_LIMIT:-90}" python3 benchmarks/host_profile.py silu_linear --backward
grep -v -i warn "$OUT/host-profile.log" | head -40
