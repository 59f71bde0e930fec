"""The norm + modulation forward at release shape: h3_triton's kernel and a variant that walks each row in chunks.

Usage (GPU): python benchmarks/norm_variants.py [--configs c512w4,c1024w8,...]
             TRITON_INTERPRET=1 python benchmarks/norm_variants.py --shape small --device cpu   (checks itself)

h3_triton's forward holds a whole row in one tile, padded to a power of two: a 5376-wide row of the release model
becomes 8192 lanes, a third of them masked, and on an H200 it needs 109 registers per thread, so register
pressure caps the occupancy at 25% and the kernel at 63% of the copy bandwidth (``results/h200-perf/ncu/
ncu-norm.csv``, ``h200-release-ops-block-tma.json``). The variant reads a row in chunks of CHUNK columns twice:
the first pass sums the squares, the second normalises, modulates and stores, its loads served from L1 or L2
(10.7 KB a row). 5376 is 11 chunks of 512 (5632 lanes) or 6 of 1024 (6144). Same float32 arithmetic per
element, the sum of squares in another order; every variant's output is compared with h3_triton's (max abs
difference) so a fast wrong kernel shows.
"""

import re

import torch
import triton
import triton.language as tl

from h3_triton.interpret import INTERPRET, to_dtype
from h3_triton.norm import rms_norm_modulate
from h3gate.bench import SHAPES, cases, ceilings, median_ms

import variant_cli


@triton.jit
def _chunked_forward(x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, y_ptr, seq_len, width, eps,
                     sx_b, sx_s, sx_c, s_w, s_scale_r, s_scale_c, s_shift_r, s_shift_c, s_idx,
                     CHUNK: tl.constexpr, UPCAST: tl.constexpr):
    """One modulated row (of batch x seq) per program, in chunks of CHUNK columns."""
    row = tl.program_id(0).to(tl.int64)
    batch = row // seq_len
    seq = row - batch * seq_len
    x_row = x_ptr + batch * sx_b + seq * sx_s
    cols = tl.arange(0, CHUNK)
    squares = tl.zeros([CHUNK], dtype=tl.float32)
    for start in range(0, width, CHUNK):
        mask = start + cols < width
        x = tl.load(x_row + (start + cols) * sx_c, mask=mask, other=0.0).to(tl.float32)
        squares += x * x
    rstd = tl.rsqrt(tl.sum(squares, axis=0) / width + eps)
    r = tl.load(idx_ptr + seq * s_idx)
    for start in range(0, width, CHUNK):
        c = start + cols
        mask = c < width
        x = tl.load(x_row + c * sx_c, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c * s_w, mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + r * s_scale_r + c * s_scale_c, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + r * s_shift_r + c * s_shift_c, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w * (1.0 + scale) + shift
        tl.store(y_ptr + row * width + c, to_dtype(y, y_ptr.dtype.element_ty, UPCAST), mask=mask)


def chunked(x, weight, eps, scale, shift, idx, config: dict) -> torch.Tensor:
    batch, seq_len, width = x.shape
    y = torch.empty((batch, seq_len, width), dtype=x.dtype, device=x.device)
    _chunked_forward[(batch * seq_len,)](
        x, weight, scale, shift, idx, y, seq_len, width, eps, *x.stride(), weight.stride(0), *scale.stride(),
        *shift.stride(), idx.stride(0), CHUNK=config["CHUNK"], UPCAST=INTERPRET, num_warps=config["num_warps"],
    )
    return y


def parse_config(text: str) -> dict:
    """``c1024w8`` -> chunks of 1024 columns, 8 warps."""
    found = re.fullmatch(r"c(\d+)w(\d+)", text)
    if not found or int(found.group(1)) & (int(found.group(1)) - 1):
        raise ValueError(f"config {text!r}: write a power-of-two chunk and the warps as c1024w8")
    return {"CHUNK": int(found.group(1)), "num_warps": int(found.group(2))}


def main():
    args, configs = variant_cli.parse(__doc__, "c512w2,c512w4,c1024w4,c1024w8,c2048w8", parse_config)
    on_gpu = args.device.startswith("cuda")
    copy = ceilings(args.device)["copy_gbps"] if on_gpu else None
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "rms_norm_modulate")
    inputs = case.make()
    with torch.no_grad():
        reference = rms_norm_modulate(**inputs)
        runs = {"h3_triton": lambda: rms_norm_modulate(**inputs)}
        runs.update({f"chunked {name}": (lambda config=config: chunked(**inputs, config=config))
                     for name, config in configs.items()})
        for name, run in runs.items():
            error = (run().float() - reference.float()).abs().max().item()
            ms = median_ms(run, args.device)
            rate = case.work[0] / ms / 1e6
            of_copy = f" {rate / copy:5.1%} of copy" if copy else ""
            print(f"{case.label:28s} {name:18s} {ms:8.3f} ms {rate:7.0f} GB/s{of_copy}, max diff {error:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
