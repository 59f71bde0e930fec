#!/usr/bin/env bash
# The release gates through pytest on one H200, as a user runs them (`--h3-model=release --h3-device=cuda`), random
# weights; a log per phase in $OUT with the GPU's and the host's used memory sampled every 5 s (max printed).
#   PHASES  any of: golden-attention model block gen-freeze gen-check (default: all, in that order), and folder: the
#           model gate on a release-width checkpoint folder that `h3gate checkpoint make --preset release --components
#           transformer --layers $LAYERS` writes under $RUNS (about 4 GB: a whole release folder, 194.5 GB, does not fit
#           the machine's disk), loaded through diffusers' from_pretrained as a user's checkpoint is
#           seed-freeze, seed-check: the release contract's seed 42 and workflow t2va (49 steps, 124 x 1344x768), the
#           generation gate's bounds from the provider and SEED_VARIANTS (default sdpa-flash: of the variants that change
#           the provider's numerics at release, the fastest), then h3_triton against them with --h3-verify-last-step.
#           Its thresholds folder is benchmarks/release-seed/thresholds (the release generation contract narrowed to
#           that seed and workflow, locked), copied to $SEED_TH (default /tmp/h3-th-seed), where the freeze writes its
#           bounds ($OUT/seed-thresholds.tar; a folder that holds them skips the freeze). Both phases together stop
#           SEED_LIMIT s (default 560) after the script starts, and the same command resumes them from the run store in
#           $RUNS.
#   LAYERS  blocks of the partial model the model gate runs (release-layers<N>, default 2)
#   BLOCKS  block gate items at the full release model (default: "block24 block49")
#   VARIANTS  provider variants the freezes calibrate from (default: sdpa-flash,sdpa-efficient)
# Bounds go to $TH (a copy of thresholds/, default /tmp/h3-th), runs to $RUNS (default /tmp/h3-runs): both stay on the
# machine between calls while it is held; the bounds files (not the 0.8 GB block captures) are copied to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
PHASES=${PHASES:-"golden-attention model block gen-freeze gen-check"}
LAYERS=${LAYERS:-2}
BLOCKS=${BLOCKS:-"block24 block49"}
VARIANTS=${VARIANTS:-sdpa-flash,sdpa-efficient}
TH=${TH:-/tmp/h3-th}
SEED_END=$(( $(date +%s) + ${SEED_LIMIT:-560} ))
RUNS=${RUNS:-/tmp/h3-runs}
[[ -d $TH ]] || cp -r thresholds "$TH"
GATE=(python3 -m pytest -m gate --h3-model=release --h3-device=cuda --h3-thresholds="$TH" --h3-out="$RUNS" -q -rfE -p no:cacheprovider)
SKIP="random-weight release generation: the model gate at release runs on leading blocks (release-layers$LAYERS)"

sampled() {  # sampled NAME LIMIT COMMAND...: phase with memory sampling
  local name=$1
  ( while true; do
      echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1) $(free -m | awk '/Mem:/{print $3}')"
      sleep 5
    done ) >"$OUT/$name-memory.log" &
  local sampler=$!
  rm -f "$RUNS/results.json" "$RUNS/evidence.json"
  phase "$@"
  kill $sampler
  for file in results evidence; do [[ -f $RUNS/$file.json ]] && cp "$RUNS/$file.json" "$OUT/$name-$file.json"; done
  awk '{if ($2>g) g=$2; if ($3>h) h=$3} END {printf "   peak GPU %.1f GiB, host %.1f GiB (used, sampled every 5 s)\n", g/1024, h/1024}' \
    "$OUT/$name-memory.log"
}
has() { [[ " $PHASES " == *" $1 "* ]]; }

python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
if has golden-attention; then
  sampled golden-attention 240 python3 benchmarks/golden_attention.py --out "$OUT/golden-attention.json"
  grep -vE "^\s*$" "$OUT/golden-attention.log" | tail -8
fi
if has model; then
  H3GATE_LAYERS=$LAYERS h3gate contracts --model release --thresholds "$TH" | head -3
  sampled model-freeze 300 env H3GATE_LAYERS="$LAYERS" "${GATE[@]}" tests/gates/test_model.py::test_model --h3-freeze --h3-variants="$VARIANTS"
  sampled model-check 300 env H3GATE_LAYERS="$LAYERS" "${GATE[@]}" tests/gates/test_model.py::test_model --junitxml="$OUT/model-junit.xml"
fi
if has block; then
  for block in $BLOCKS; do
    sampled "block-freeze-$block" 300 "${GATE[@]}" "tests/gates/test_block.py::test_block[$block]" --h3-freeze --h3-variants="$VARIANTS"
    sampled "block-check-$block" 300 "${GATE[@]}" "tests/gates/test_block.py::test_block[$block]" --junitxml="$OUT/$block-junit.xml"
  done
fi
if has gen-freeze; then
  sampled gen-freeze 560 "${GATE[@]}" tests/gates/test_generation.py::test_generation_preflight --h3-freeze \
    --h3-variants="${GEN_VARIANTS:-sdpa-efficient}"
fi
if has gen-check; then
  sampled gen-check 560 "${GATE[@]}" tests/gates/test_generation.py::test_generation_preflight --h3-skip-model-gate="$SKIP" \
    --junitxml="$OUT/gen-junit.xml"
  grep -E "(same_start|psnr|ssim|temporal|audio)" "$OUT/gen-check.log" | head -20
fi
if has folder; then
  FOLDER=$RUNS/minimax-h3-release-layers$LAYERS
  [[ -d $FOLDER ]] || phase folder-make 300 h3gate checkpoint make --preset release --components transformer \
    --layers "$LAYERS" "$FOLDER"
  h3gate contracts --model "$FOLDER" --thresholds "$TH" | head -3
  FOLDER_GATE=("${GATE[@]/--h3-model=release/--h3-model=$FOLDER}")
  sampled folder-model-freeze 300 "${FOLDER_GATE[@]}" tests/gates/test_model.py::test_model --h3-freeze \
    --h3-variants="$VARIANTS"
  sampled folder-model-check 300 "${FOLDER_GATE[@]}" tests/gates/test_model.py::test_model \
    --junitxml="$OUT/folder-model-junit.xml"
fi
if has seed-freeze || has seed-check; then
  SEED_TH=${SEED_TH:-/tmp/h3-th-seed}
  [[ -d $SEED_TH ]] || cp -r benchmarks/release-seed/thresholds "$SEED_TH"
  SEED_GATE=("${GATE[@]/--h3-thresholds=$TH/--h3-thresholds=$SEED_TH}" "tests/gates/test_generation.py::test_generation[seed42]")
  seed_left() { echo $(( SEED_END - $(date +%s) )); }
  SEED_BOUNDS=$SEED_TH/release/cuda-nvidia-h200/generation-bounds.json
  if has seed-freeze && [[ ! -f $SEED_BOUNDS ]]; then
    sampled seed-freeze "$(seed_left)" "${SEED_GATE[@]}" --h3-freeze --h3-variants="${SEED_VARIANTS:-sdpa-flash}"
  fi
  if has seed-check && [[ -f $SEED_BOUNDS ]] && (( $(seed_left) > 60 )); then
    sampled seed-check "$(seed_left)" "${SEED_GATE[@]}" --h3-verify-last-step --h3-skip-model-gate="$SKIP" --junitxml="$RUNS/seed-junit.xml"
    grep -E "(same_start|determinism|psnr|ssim|temporal|audio)" "$OUT/seed-check.log" | head -20
  fi
  ( cd "$SEED_TH" && tar -cf "$OUT/seed-thresholds.tar" . )
fi
if has golden-attention || has model || has block || has gen-freeze || has gen-check || has folder; then
  ( cd "$TH" && find . -name "*.json" | tar -cf "$OUT/thresholds.tar" -T - )
fi
ls "$OUT"
