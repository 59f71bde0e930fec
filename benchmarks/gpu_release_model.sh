#!/usr/bin/env bash
# The streamed model gate on the release transformer's first LAYERS blocks (default 4) at the release contract, on
# one H200: the check (golden against the provider and h3_triton) with the saved block inputs in host memory, one
# freeze step (golden against sdpa-flash), then the check with the inputs on the GPU; a JSON log per run in $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
LAYERS=${LAYERS:-4}
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
phase release-host "${HOST_LIMIT:-330}" python3 benchmarks/release_model_gate.py --layers "$LAYERS" --saved-on host \
  --freeze sdpa-flash --out "$OUT/release-model-gate-$LAYERS-host.json"
grep -E "^(check|freeze)|Error" "$OUT/release-host.log"
phase release-device "${DEVICE_LIMIT:-200}" python3 benchmarks/release_model_gate.py --layers "$LAYERS" --saved-on device \
  --out "$OUT/release-model-gate-$LAYERS-device.json"
grep -E "^(check|freeze)|Error" "$OUT/release-device.log"
