"""The attention forward at release shape: h3_triton's kernel, a variant loading K and V through TMA, SDPA.

Usage (GPU): python benchmarks/attention_variants.py [--configs 128x128w8s3,...]
             TRITON_INTERPRET=1 python benchmarks/attention_variants.py --shape small --device cpu   (checks itself)

h3_triton's forward runs at 0.90x cuDNN SDPA at release shape on an H200 (``results/h200-perf``). Its key and
value tiles are pointer loads; the variant here builds a tensor descriptor per (batch, head) and loads K and V
tiles through TMA (asynchronous bulk copies into shared memory, no address arithmetic per element), the Hopper
recipe of Triton's own fused-attention tutorial. Same online softmax, same base-2 scale folded into one FMA
per score. Every variant's output is compared with cuDNN's (max abs difference) so a fast wrong kernel shows.
"""

import math
import re

import torch
import triton
import triton.language as tl
import torch.nn.functional as F

from h3_triton.attention import _scores, _softmax_step, attention
from h3_triton.interpret import INTERPRET, to_dtype
from h3gate.bench import SDPA_VARIANTS, SHAPES, _sdpa, cases, median_ms

import variant_cli


@triton.jit
def _tma_fwd_inner(acc, m_i, l_i, q, k_desc, v_desc, start, stop, S, qk_scale,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KEYS: tl.constexpr, UPCAST: tl.constexpr):
    for start_n in range(start, stop, BLOCK_N):
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        qk = _scores(q, tl.trans(k), BLOCK_M, BLOCK_N, UPCAST)
        if MASK_KEYS:
            qk = tl.where((start_n + tl.arange(0, BLOCK_N) < S)[None, :], qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, qk_scale, UPCAST)
    return acc, m_i, l_i


@triton.jit
def _tma_fwd(Q, K, V, O, stride_b, stride_s, stride_h, H, S, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """One (query block, batch x head); q, k, v, o share strides (B, S, H, D) with D contiguous."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    base = (pid_bh // H).to(tl.int64) * stride_b + (pid_bh % H).to(tl.int64) * stride_h
    q_desc = tl.make_tensor_descriptor(Q + base, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + base, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + base, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(O + base, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    q = q_desc.load([pid_m * BLOCK_M, 0])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    full_stop = (S // BLOCK_N) * BLOCK_N
    acc, m_i, l_i = _tma_fwd_inner(acc, m_i, l_i, q, k_desc, v_desc, 0, full_stop, S, qk_scale,
                                   BLOCK_M, BLOCK_N, False, UPCAST)
    acc, m_i, l_i = _tma_fwd_inner(acc, m_i, l_i, q, k_desc, v_desc, full_stop, S, S, qk_scale,
                                   BLOCK_M, BLOCK_N, True, UPCAST)
    o_desc.store([pid_m * BLOCK_M, 0], to_dtype(acc / l_i[:, None], O.dtype.element_ty, UPCAST))


def tma_attention(q, k, v, config: dict) -> torch.Tensor:
    """Forward only, for (B, S, H, D) tensors of one layout (the bench's inputs are contiguous)."""
    B, S, H, D = q.shape
    o = torch.empty_like(q)
    _tma_fwd[(triton.cdiv(S, config["BLOCK_M"]), B * H)](
        q, k, v, o, q.stride(0), q.stride(1), q.stride(2), H, S, math.log2(math.e) / math.sqrt(D),
        HEAD_DIM=D, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], UPCAST=INTERPRET,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return o


def parse_config(text: str) -> dict:
    """``128x128w8s3`` -> BLOCK_M 128, BLOCK_N 128, 8 warps, 3 stages."""
    found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    if not found:
        raise ValueError(f"config {text!r}: write BLOCK_MxBLOCK_N, warps, stages as 128x128w8s3")
    m, n, warps, stages = map(int, found.groups())
    return dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages)


def main():
    args, configs = variant_cli.parse(__doc__, "128x128w8s3,128x128w8s2,128x64w4s3,128x64w8s4", "128x128w8s3",
                                      parse_config)
    on_gpu = args.device.startswith("cuda")
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "attention")
    inputs = case.make()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]

    def sdpa():
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    runs = {}
    if on_gpu:
        runs.update({f"SDPA {variant}": (lambda variant=variant: _run_sdpa(sdpa, variant))
                     for variant in SDPA_VARIANTS})
    runs["h3_triton"] = lambda: attention(q, k, v)
    runs.update({f"tma {name}": (lambda config=config: tma_attention(q, k, v, config))
                 for name, config in configs.items()})
    with torch.no_grad():
        reference = _run_sdpa(sdpa, "cudnn") if on_gpu else sdpa()
        base_ms = None
        for name, run in runs.items():
            error = (run().float() - reference.float()).abs().max().item()
            ms = median_ms(run, args.device)
            base_ms = base_ms or ms
            print(f"{case.label:28s} {name:22s} {ms:9.3f} ms {case.work[0] / ms / 1e9:7.1f} TFLOP/s "
                  f"x{base_ms / ms:5.2f} of the first, max diff {error:.1e}")


def _run_sdpa(sdpa, variant):
    with _sdpa(variant):
        return sdpa()


if __name__ == "__main__":
    main()
