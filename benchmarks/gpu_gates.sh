#!/usr/bin/env bash
# The README's GPU command on a GPU machine, per model in MODELS (default: tiny edge small), each timed, against the
# committed CUDA bounds: `pytest -m gate tests/gates --h3-device=cuda -n auto --h3-workers-per-gpu=8` (edge ships the
# model and block gates' files only: its run keeps those gates and their power items). Logs and per-item durations in
# $OUT; each run's JUnit file under its --h3-out (RUNS/MODEL/junit.xml), where its evidence lists it. With
# PHASES="freeze check", first freezes what is missing of each model's CUDA bounds (and packs
# thresholds/ into $OUT/thresholds.tar to commit).
#   REFREEZE="reason"  replace the committed CUDA bounds (the reason is recorded in them).
#   H3_WORKERS_PER_GPU  xdist workers sharing the GPU (default 8).
#   RUNS=DIR            where the run folders and JUnit go (default $OUT).
# With "cudnn" in PHASES, also tiny's model and block gates of diffusers' cuDNN SDPA backend as the candidate
# (`attention-backend:name=_native_cudnn`), which has no deterministic kernel: each must fail on that one line
# ($OUT/cudnn-candidate.log; its verdict lines echoed).
# With "paths" in PHASES, also the path report of the release model on this GPU, planned shape-only against the
# kernel-gate examples of tiny's suite ($OUT/paths-release-cuda.log; exit 1 names a path no example reached).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
MODELS=${MODELS:-"tiny edge small"}
PHASES=${PHASES:-check}
FORCE=${REFREEZE:+--h3-freeze-force=$REFREEZE}
gates_of() {  # the gate tests of a model: the items it ships bounds for, as pytest arguments in GATES
  GATES=(tests/gates)
  if [[ $1 == edge ]]; then GATES=(tests/gates/test_model.py tests/gates/test_block.py tests/gates/test_power.py -k "model or block" --h3-profile=model-block); fi
  GATES+=(-m gate --h3-model="$1" --h3-device=cuda)
}
if [[ " $PHASES " == *" freeze "* ]]; then
  for model in $MODELS; do
    gates_of "$model"
    phase "freeze-$model" "${FREEZE_LIMIT:-280}" python3 -m pytest "${GATES[@]}" --h3-freeze ${FORCE:+"$FORCE"} -q -rfE \
      --h3-out="${RUNS:-$OUT}/freeze-$model"
  done
  tar -cf "$OUT/thresholds.tar" thresholds
fi
if [[ " $PHASES " == *" check "* ]]; then
  for model in $MODELS; do
    gates_of "$model"
    phase "check-$model" "${CHECK_LIMIT:-280}" python3 -m pytest "${GATES[@]}" -n auto \
      --h3-workers-per-gpu="${H3_WORKERS_PER_GPU:-8}" -q -rfE --durations=0 --h3-out="${RUNS:-$OUT}/$model" \
      --junitxml="${RUNS:-$OUT}/$model/junit.xml"
    grep -E "^(FAILED|ERROR)" "$OUT/check-$model.log" | cut -c1-300 | head -20
  done
fi
if [[ " $PHASES " == *" paths "* ]]; then
  phase paths-release-cuda "${PATHS_LIMIT:-200}" h3gate paths --model release --device cuda --suite tiny
fi
if [[ " $PHASES " == *" cudnn "* ]]; then
  phase cudnn-candidate "${CUDNN_LIMIT:-200}" python3 -m pytest -m gate tests/gates/test_model.py tests/gates/test_block.py \
    --h3-model=tiny --h3-device=cuda --h3-candidate=attention-backend:name=_native_cudnn -n auto --h3-workers-per-gpu=3 -q -rfE \
    --h3-out="${RUNS:-$OUT}/cudnn-candidate"
  grep -o "determinism: no deterministic kernel[^;]*" "$OUT/cudnn-candidate.log" | sort | uniq -c
fi
