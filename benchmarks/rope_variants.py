"""The QK-norm + RoPE forward at release shape: h3_triton's kernel and a variant with one program per position.

Usage (GPU): python benchmarks/rope_variants.py [--configs w8,w16]
             TRITON_INTERPRET=1 python benchmarks/rope_variants.py --shape small --device cpu   (checks itself)

h3_triton's kernel tiles (batch, seq, head) rows, 32 per program at head_dim 128, and loads the float32 cos and
sin of every row it holds: 56 heads share one position's cos/sin, so the kernel reads three times as many bytes
of them (from cache) as of x. It runs at 63% of the copy bandwidth on an H200, its tiling already the best of
a sweep (``results/h200-perf/row-tilings.log``). The variant holds all heads of one position, (heads, head_dim)
padded to powers of two, and loads cos and sin once as a row. Same arithmetic per element; its output is
compared with h3_triton's (max abs difference) so a fast wrong kernel shows.
"""

import re

import torch
import triton
import triton.language as tl

from h3_triton.interpret import INTERPRET, to_dtype
from h3_triton.rope import _rope_args, qk_norm_rope
from h3gate.bench import SHAPES, cases, ceilings, median_ms

import variant_cli


@triton.jit
def _per_position(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, seq_len, heads, dim, rotary, eps,
                  sx_b, sx_s, sx_h, sx_d, s_w, s_cos_s, s_cos_d, s_sin_s, s_sin_d,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """All heads of position ``program_id`` (over batch x seq): RMSNorm per head, then rotate-half RoPE."""
    position = tl.program_id(0).to(tl.int64)
    batch = position // seq_len
    seq = position - batch * seq_len
    h = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    mask = (h < heads)[:, None] & col_mask[None, :]
    x_row = x_ptr + batch * sx_b + seq * sx_s + (h * sx_h)[:, None]
    x = tl.load(x_row + cols[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / dim + eps)
    w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    half = rotary // 2
    rot_cols = cols < rotary
    partner = tl.where(cols < half, cols + half, cols - half)
    x_p = tl.load(x_row + partner[None, :] * sx_d, mask=mask & rot_cols[None, :], other=0.0).to(tl.float32)
    w_p = tl.load(w_ptr + partner * s_w, mask=rot_cols, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + seq * s_cos_s + cols * s_cos_d, mask=rot_cols, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + seq * s_sin_s + cols * s_sin_d, mask=rot_cols, other=0.0).to(tl.float32)
    sign = tl.where(cols < half, -1.0, 1.0)
    rotated = x_p * rstd[:, None] * (sign * w_p)[None, :]
    y = y * cos[None, :] + rotated * sin[None, :]
    out = y_ptr + (position * heads + h)[:, None] * dim + cols[None, :]
    tl.store(out, to_dtype(y, y_ptr.dtype.element_ty, UPCAST), mask=mask)


def per_position(x, weight, eps, cos, sin, config: dict) -> torch.Tensor:
    batch, seq_len, heads, dim = x.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rotary, *rope_strides = _rope_args(cos, sin)
    _per_position[(batch * seq_len,)](
        x, weight, cos, sin, y, seq_len, heads, dim, rotary, eps, *x.stride(), weight.stride(0), *rope_strides,
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(dim), UPCAST=INTERPRET,
        num_warps=config["num_warps"],
    )
    return y


def parse_config(text: str) -> dict:
    """``w8`` -> 8 warps per program."""
    found = re.fullmatch(r"w(\d+)", text)
    if not found:
        raise ValueError(f"config {text!r}: write the warps per program as w8")
    return dict(num_warps=int(found.group(1)))


def main():
    args, configs = variant_cli.parse(__doc__, "w4,w8,w16", "w8", parse_config)
    on_gpu = args.device.startswith("cuda")
    copy = ceilings(args.device)["copy_gbps"] if on_gpu else None
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "qk_norm_rope")
    inputs = case.make()
    with torch.no_grad():
        reference = qk_norm_rope(**inputs)
        runs = {"h3_triton": lambda: qk_norm_rope(**inputs)}
        runs.update({f"per-position {name}": (lambda config=config: per_position(**inputs, config=config))
                     for name, config in configs.items()})
        for name, run in runs.items():
            error = (run().float() - reference.float()).abs().max().item()
            ms = median_ms(run, args.device)
            rate = case.work[0] / ms / 1e6
            of_copy = f" {rate / copy:5.1%} of copy" if copy else ""
            print(f"{case.label:28s} {name:20s} {ms:8.3f} ms {rate:7.0f} GB/s{of_copy}, max diff {error:.1e}")


if __name__ == "__main__":
    main()
