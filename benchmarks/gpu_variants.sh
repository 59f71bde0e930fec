#!/usr/bin/env bash
# One GPU call that decides which kernel variants h3_triton should adopt next, at release shapes: what the Hopper
# backward's ordered dQ adds cost (the kernel with the writers' turn wait taken out) and the norm forward's chunk
# widths. (`attention_bwd_variants.py`, the backward's rejected Triton variants, runs on its own: 240 s.)
# Logs go to $OUT/<name>.log.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export H3_TRITON_AUTOTUNE=0
phase attention-bwd-gluon-variants 240 python3 benchmarks/attention_bwd_gluon.py --unordered
phase row-tilings-chunks 60 python3 benchmarks/row_tilings.py --rows 1,2 --warps 4,8 --chunks 512,1024,2048
for name in attention-bwd-gluon-variants row-tilings-chunks; do cat "$OUT/$name.log"; done
