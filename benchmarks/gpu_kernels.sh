#!/usr/bin/env bash
# The kernel gate of h3_triton on a GPU machine, every kernel on its first tiling (H3_TRITON_AUTOTUNE=0: tuning
# each drawn shape afresh costs minutes per op), then every tiling the autotuner may pick, each forced in turn.
# ONLY="linear or attention" restricts both to the items pytest's -k selects.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
# Compiling a kernel per drawn shape class is CPU work: several workers share the GPU.
PER_GPU=${PER_GPU:-8}
H3_TRITON_AUTOTUNE=0 phase kernel-gate ${KERNEL_LIMIT:-240} python3 -m pytest tests/gates/test_kernels.py -m gate \
  --h3-device=cuda -n auto --h3-workers-per-gpu=$PER_GPU -q --durations=0 --h3-out="$OUT/kernels" \
  --junitxml="$OUT/kernels/junit.xml" ${ONLY:+-k "$ONLY"}
grep -E "^(FAILED|E  )|s call" "$OUT/kernel-gate.log" | head -30
phase tilings ${TILINGS_LIMIT:-150} python3 -m pytest tests/kernels/test_tilings.py -n auto --h3-workers-per-gpu=$PER_GPU \
  -q --durations=5 ${ONLY:+-k "$ONLY"}
grep -E "^(FAILED|E  )|passed|failed" "$OUT/tilings.log" | head -20
