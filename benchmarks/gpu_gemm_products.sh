#!/usr/bin/env bash
# linear's three products (forward, dX, dW) apart at the release shapes, h3_triton's TMA kernel against cuBLAS
# (benchmarks/gemm_products.py), under each tiling of TILINGS, the SM clock and board power sampled beside them
# ($OUT/smi.csv); then Nsight Compute on each product of the projections in PROFILE_CASES, the kernel and cuBLAS's.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 >"$OUT/smi.csv" &
phase products "${PRODUCTS_LIMIT:-300}" python3 benchmarks/gemm_products.py \
  --tilings "${TILINGS:-256x128x8x3,128x256x8x3g16,128x256x8x3g4,128x128x8x4}"
cat "$OUT/products.log"
kill %1
IFS=, read -ra profile_cases <<<"${PROFILE_CASES:-to_out}"
for case in "${profile_cases[@]}"; do
  for product in ${PROFILE_PRODUCTS:-dX dW}; do
    name="ncu-${case// /-}-$product"
    phase "$name" "${NCU_LIMIT:-120}" ncu --clock-control none --profile-from-start off --csv --page details \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      python3 benchmarks/gemm_products.py --cases "$case" --profile "$product"
    mv "$OUT/$name.log" "$OUT/$name.csv"
    python3 benchmarks/ncu_summary.py "$OUT/$name.csv" --metrics "Duration,SM Frequency,Compute (SM) Throughput,Memory Throughput,L2 Cache Throughput,DRAM Throughput,Registers Per Thread"
  done
done
