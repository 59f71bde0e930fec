#!/usr/bin/env bash
# Third-party candidates on a GPU machine: the provider's self-check through the kernel gate (every op, both dtypes),
# then the worked example of examples/byo-kernel with Liger-Kernel's Triton RMSNorm (kernel=liger) through every gate
# of MODEL (default tiny) against the committed CUDA bounds. Carry the liger-kernel wheel in .whl/ with the others.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e examples/byo-kernel || exit 1
python3 -c "import torch, triton, liger_kernel; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
MODEL=${MODEL:-tiny}
phase provider-kernel-gate "${KERNEL_LIMIT:-200}" python3 -m pytest tests/gates/test_kernels.py -m gate --h3-device=cuda \
  --h3-candidate provider -n auto --h3-workers-per-gpu=6 -q -rfE --h3-out="$OUT/provider" --junitxml="$OUT/provider-junit.xml"
grep -E "^(FAILED|ERROR)" "$OUT/provider-kernel-gate.log" | cut -c1-300 | head -20
phase "example-liger-$MODEL" "${EXAMPLE_LIMIT:-300}" python3 -m pytest tests/gates -m gate --h3-model="$MODEL" --h3-device=cuda \
  --h3-candidate example-rmsnorm:kernel=liger -n auto --h3-workers-per-gpu=6 -q -rfEs --h3-out="$OUT/example" \
  --junitxml="$OUT/example-junit.xml"
grep -E "^(FAILED|ERROR)|not claimed" "$OUT/example-liger-$MODEL.log" | cut -c1-300 | head -20
