#!/usr/bin/env bash
# The gate suite on a GPU machine (the device of this project's README): installs the carried wheels, freezes
# the CUDA bounds of the embedded tiny and small models from the provider variants, then qualifies h3_triton.
# Everything it writes that should be committed (bounds, lock) is packed into $OUT/thresholds.tar.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
python3 -c "import torch, triton, diffusers; print(torch.__version__, triton.__version__, diffusers.__version__, torch.cuda.get_device_name())"
GATES="tests/gates/test_model.py tests/gates/test_block.py"
# REFREEZE="reason" replaces the committed CUDA bounds (the reason is recorded in them); unset, freezing
# refuses to overwrite and only missing bounds are frozen.
FORCE=${REFREEZE:+--h3-freeze-force=$REFREEZE}
phase freeze-tiny 240 python3 -m pytest $GATES -m gate --h3-model=tiny --h3-device=cuda --h3-freeze ${FORCE:+"$FORCE"} -q
phase check-tiny 300 python3 -m pytest $GATES -m gate --h3-model=tiny --h3-device=cuda -q --h3-out="$OUT/tiny"
phase freeze-small 180 python3 -m pytest tests/gates/test_model.py -m gate --h3-model=small --h3-device=cuda --h3-freeze ${FORCE:+"$FORCE"} -q
phase check-small 180 python3 -m pytest tests/gates/test_model.py -m gate --h3-model=small --h3-device=cuda -q --h3-out="$OUT/small"
tar -cf "$OUT/thresholds.tar" thresholds
for f in "$OUT"/tiny/results.json "$OUT"/small/results.json; do
  [ -f "$f" ] && python3 -c "import json,sys; [print(k, v['summary'][:220]) for k, v in json.load(open('$f'))['results'].items()]"
done
