#!/usr/bin/env bash
# On a machine of two (or more) GPUs: the tiny gate suite with one xdist worker per GPU (-n auto), each
# worker's GPU recorded in the evidence; then the small preset's generation time per step at 64x64.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
phase gates-n-auto 200 python3 -m pytest tests/gates/test_model.py tests/gates/test_block.py -m gate --h3-device=cuda -n auto -q --h3-out="$OUT/xdist"
python3 -c "
import json
for k, v in json.load(open('$OUT/xdist/results.json'))['results'].items():
    print(k, v['passed'], v['context']['device'])
    print('   ', v['summary'][:200])"
phase generation-small 120 python3 benchmarks/generation_steps.py --model small --contract thresholds/small/generation-contract.json
tail -n 4 "$OUT/generation-small.log"
phase kernels-n-auto 230 python3 -m pytest tests/gates/test_kernels.py -m gate --h3-device=cuda -n auto -q --h3-kernel-examples=3 --h3-out="$OUT/kernels"
grep -E "^(FAILED|E  )" "$OUT/kernels-n-auto.log" | head -20
