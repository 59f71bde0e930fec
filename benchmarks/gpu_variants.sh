#!/usr/bin/env bash
# One GPU call that decides which kernel variants h3_triton should adopt next: every variant benchmark at release
# shapes (each checks its outputs against h3_triton's). Logs go to $OUT/<name>.log.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
phase norm-variants 90 python3 benchmarks/norm_variants.py
phase attention-bwd-variants 240 python3 benchmarks/attention_bwd_variants.py
for name in norm-variants attention-bwd-variants; do cat "$OUT/$name.log"; done
