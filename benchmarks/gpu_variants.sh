#!/usr/bin/env bash
# One GPU call that decides which kernel variants h3_triton should adopt: every variant benchmark at release
# shapes (each checks its output against the provider's or h3_triton's), then the release bench of the ops
# as the baseline of the same machine. Logs go to $OUT/<name>.log.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
phase gemm-variants 150 python3 benchmarks/gemm_variants.py
phase attention-variants 150 python3 benchmarks/attention_variants.py
phase rope-variants 60 python3 benchmarks/rope_variants.py
for name in gemm-variants attention-variants rope-variants; do cat "$OUT/$name.log"; done
phase bench 200 h3gate bench --shape release --device cuda --no-block -o "$OUT/h200-release-ops.json"
tail -n 20 "$OUT/bench.log"
