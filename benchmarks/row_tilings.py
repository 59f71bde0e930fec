"""Forward time of the whole-row kernels (norm + modulation, QK-norm + RoPE) at release shapes, per row tiling.

Usage (GPU): python benchmarks/row_tilings.py [--rows 1,2,4,...] [--warps 4,8,16] [--chunks 512,1024,...]

These kernels take their tiling from ``h3_triton.rowreduce.full_row_tiling`` (a heuristic: ~4096 elements per tile
on a GPU, 8-16 elements per thread; the norm's forward adjusts it in ``_forward_tiling``); this sweep replaces the
forward's tiling only, times each with ``triton.testing.do_bench`` (median) and prints GB/s of activation traffic
and its fraction of the device copy bandwidth measured in the same run, the tiling in use marked, and the largest
difference from the output of the tiling in use, so a tiling that computes something else shows. A tile row is the
padded row of the norm, and all heads of one position (padded heads x head_dim) for QK-norm + RoPE, whose ``rows``
are positions. The norm's forward walks a row in chunks of the tiling's width, so it is also swept over
``--chunks`` narrower than the padded row. Tilings whose tile exceeds 32768 elements are skipped (they spill
registers).
"""

import argparse
from typing import Callable, NamedTuple

import torch
import triton

import h3_triton.norm
import h3_triton.rope
from h3_triton.rowreduce import RowTiling
from h3gate.bench import RELEASE, cases, ceilings, median_ms


class Op(NamedTuple):
    module: object  # where the forward looks its tiling up
    tiling_name: str  # the tiling function there, (width, name) -> RowTiling
    fn: Callable
    tile_row: Callable[[torch.Tensor], int]  # the width the forward asks a tiling for, from its input x
    chunked: bool  # whether the kernel walks a row in chunks of the tiling's width


OPS = {
    "rms_norm_modulate": Op(h3_triton.norm, "_forward_tiling", h3_triton.norm.rms_norm_modulate,
                            lambda x: x.shape[-1], True),
    "qk_norm_rope": Op(h3_triton.rope, "full_row_tiling", h3_triton.rope.qk_norm_rope,
                       lambda x: triton.next_power_of_2(x.shape[-2]) * x.shape[-1], False),
}


def sweep(rows_options, warps_options, chunk_options, progress=print):
    copy = ceilings("cuda")["copy_gbps"]
    progress(f"device copy: {copy:.0f} GB/s")
    for case in cases(RELEASE, "cuda"):
        if case.op not in OPS:
            continue
        op = OPS[case.op]
        in_use = getattr(op.module, op.tiling_name)
        inputs = case.make()
        with torch.no_grad():
            reference = op.fn(**inputs)
        padded = triton.next_power_of_2(op.tile_row(inputs["x"]))
        current = in_use(op.tile_row(inputs["x"]), "x")
        widths = [padded] + ([c for c in chunk_options if c < padded] if op.chunked else [])
        for tiling in (RowTiling(rows=rows, width=width, warps=warps)
                       for width in widths for rows in rows_options for warps in warps_options):
            if tiling.rows * tiling.width > 32768:
                continue
            setattr(op.module, op.tiling_name, lambda *_, tiling=tiling: tiling)
            try:
                with torch.no_grad():
                    error = (op.fn(**inputs).float() - reference.float()).abs().max().item()
                ms = median_ms(lambda: op.fn(**inputs), "cuda")
            finally:
                setattr(op.module, op.tiling_name, in_use)
            rate = case.work[0] / ms / 1e6
            mark = "  <- in use" if tiling == current else ""
            progress(f"{case.label:34s} rows {tiling.rows:3d} width {tiling.width:5d} warps {tiling.warps:2d}: "
                     f"{ms:7.3f} ms {rate:6.0f} GB/s {rate / copy:5.1%} of copy, max diff {error:.1e}{mark}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16,32,64", help="rows per tile to try (comma-separated)")
    parser.add_argument("--warps", default="4,8,16", help="warps per program to try (comma-separated)")
    parser.add_argument("--chunks", default="512,1024,2048",
                        help="chunk widths for the norm's forward, besides its whole padded row (comma-separated)")
    args = parser.parse_args()
    sweep(*([int(n) for n in option.split(",")] for option in (args.rows, args.warps, args.chunks)))


if __name__ == "__main__":
    main()
