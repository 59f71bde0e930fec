#!/usr/bin/env bash
# The whole gate suite on a GPU machine (the device of this project's README): installs the carried wheels, freezes
# the CUDA bounds of the embedded models in MODELS (default: tiny small) from the provider variants, then runs
# `pytest -m gate tests/gates` on each with xdist (-n auto, H3_WORKERS_PER_GPU workers per GPU). Everything it writes
# that should be committed (bounds, captures, lock) is packed into $OUT/thresholds.tar; a log per phase in $OUT.
#   REFREEZE="reason"  replace the committed CUDA bounds (the reason is recorded in them); unset, only what is
#                      missing is frozen (freezing refuses to overwrite, and such items fail saying so).
#   PHASES="freeze check"  which phases to run.
#   TESTS="tests/gates"    the gate tests to run (the edge preset ships the model and block gates' files only:
#                          TESTS="tests/gates/test_model.py tests/gates/test_block.py").
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
MODELS=${MODELS:-"tiny small"}
PHASES=${PHASES:-"freeze check"}
read -r -a TESTS <<<"${TESTS:-tests/gates}"
FORCE=${REFREEZE:+--h3-freeze-force=$REFREEZE}
if [[ " $PHASES " == *" freeze "* ]]; then
  for model in $MODELS; do
    phase "freeze-$model" "${FREEZE_LIMIT:-280}" python3 -m pytest "${TESTS[@]}" -m gate --h3-model="$model" --h3-device=cuda \
      --h3-freeze ${FORCE:+"$FORCE"} -q -rfE --h3-out="$OUT/freeze-$model"
  done
  tar -cf "$OUT/thresholds.tar" thresholds
fi
if [[ " $PHASES " == *" check "* ]]; then
  for model in $MODELS; do
    phase "check-$model" "${CHECK_LIMIT:-280}" python3 -m pytest "${TESTS[@]}" -m gate --h3-model="$model" --h3-device=cuda \
      -n auto --h3-workers-per-gpu="${H3_WORKERS_PER_GPU:-8}" -q -rfE --h3-out="$OUT/$model" --junitxml="$OUT/$model-junit.xml"
    grep -E "^(FAILED|ERROR)" "$OUT/check-$model.log" | cut -c1-300 | head -20
  done
fi
