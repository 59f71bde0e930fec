"""The attention backward at release shape: h3_triton's two kernels and a variant that computes dQ with dK and dV.

Usage (GPU): python benchmarks/attention_bwd_variants.py [--configs 64x128w8s3,...]
             TRITON_INTERPRET=1 python benchmarks/attention_bwd_variants.py --shape small --device cpu   (checks itself)

h3_triton's backward is deterministic without atomics: one kernel per key block computes dK and dV (recomputing
Q K^T and dP = dO V^T), one per query block computes dQ (recomputing both again), seven S x S x D products where
FlashAttention's backward has five; it runs at 0.70x the provider's backward on an H200
(``results/h200-perf/h200-release-ops-block-tma.json``). The variant is the deterministic scheme of
FlashAttention-3: the dK/dV program also forms its key block's share of dQ, dS^T K, and adds it to a float32
accumulator of the query tile in key-block order, waiting on a per-tile counter until the key blocks before it
have added theirs (acquire), then bumping it (release). The sum order is fixed, so results are bitwise
reproducible; the float32 sums are scaled and rounded to the inputs' dtype afterwards. Programs are dispatched in
key-block order within a head, so a program only ever waits for one that is already running. Every variant's
gradients are compared with h3_triton's (max abs difference) so a fast wrong kernel shows.

Measured on an H200 (``results/h200-perf/attention-bwd-variants.log``): 473.6 ms at 64x128 against h3_triton's
277.3 ms, so it is not adopted. Triton 3.6 does not software-pipeline a loop that waits on a counter (the
64x128 tiling needs the same shared memory at 2 and 3 stages), and the waits serialise the key blocks of each
query tile.
"""

import argparse
import math
import re

import torch
import triton
import triton.language as tl

from h3_triton import attention
from h3_triton.attention import _heads_base, _probabilities, _scores
from h3_triton.interpret import INTERPRET, mma, to_dtype
from h3gate.bench import SHAPES, cases, median_ms



@triton.jit
def _ordered_add(acc_ptrs, part, lock, pid_n, rows):
    """Adds ``part`` to what the key blocks before ``pid_n`` left at ``acc_ptrs``, in key-block order.

    One code path for every key block: Triton 3.6's software pipeliner fails on sm_90 when the loop holds this
    wait in two branches (the last key block writing dQ itself), so the last block stores its sum like the
    others and :func:`fused_backward` rounds the float32 sums afterwards, as FlashAttention-3 does.
    """
    seen = tl.atomic_add(lock, 0, sem="acquire")
    while seen != pid_n:
        seen = tl.atomic_add(lock, 0, sem="acquire")
    if pid_n > 0:
        part += tl.load(acc_ptrs, mask=rows[:, None], other=0.0, cache_modifier=".cg")
    tl.store(acc_ptrs, part, mask=rows[:, None])
    tl.debug_barrier()
    tl.atomic_xchg(lock, pid_n + 1, sem="release")


@triton.jit
def _fused_bwd(Q, K, V, DO, ROW_MAX, ROW_LOG_SUM, DELTA, DK, DV, DQ_ACC, LOCKS,
               stride_b, stride_s, stride_h, H, S, M_BLOCKS, sm_scale, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """dK, dV of one key block and its share of dQ (unscaled, float32, in DQ_ACC of (B*H, S, D)); every tensor
    of (B, S, H, D) shares one layout."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    base = _heads_base(pid_bh, H, stride_b, stride_h)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = (offs_n < S)[:, None]
    kv_off = base + offs_n[:, None] * stride_s + offs_d[None, :]
    k = tl.load(K + kv_off, mask=keys, other=0.0)
    v = tl.load(V + kv_off, mask=keys, other=0.0)
    rows_base = pid_bh.to(tl.int64) * S
    acc_base = DQ_ACC + rows_base * HEAD_DIM
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for mb in range(0, M_BLOCKS):
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = offs_m < S
        q_off = base + offs_m[:, None] * stride_s + offs_d[None, :]
        q = tl.load(Q + q_off, mask=rows[:, None], other=0.0)
        do = tl.load(DO + q_off, mask=rows[:, None], other=0.0)
        row_max = tl.load(ROW_MAX + rows_base + offs_m, mask=rows, other=0.0)
        row_log_sum = tl.load(ROW_LOG_SUM + rows_base + offs_m, mask=rows, other=0.0)
        delta = tl.load(DELTA + rows_base + offs_m, mask=rows, other=0.0)
        qk_t = _scores(k, tl.trans(q), BLOCK_N, BLOCK_M, UPCAST)
        p_t = _probabilities(qk_t * qk_scale, row_max, row_log_sum, 1, False)
        dv = mma(to_dtype(p_t, do.dtype, UPCAST), do, dv, UPCAST)
        dp_t = _scores(v, tl.trans(do), BLOCK_N, BLOCK_M, UPCAST)
        ds_t = to_dtype(p_t * (dp_t - delta[None, :]), q.dtype, UPCAST)
        dk = mma(ds_t, q, dk, UPCAST)
        part = mma(tl.trans(ds_t), k, tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), UPCAST)
        acc_ptrs = acc_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        _ordered_add(acc_ptrs, part, LOCKS + pid_bh * M_BLOCKS + mb, pid_n, rows)
    tl.store(DK + kv_off, to_dtype(dk * sm_scale, DK.dtype.element_ty, UPCAST), mask=keys)
    tl.store(DV + kv_off, to_dtype(dv, DV.dtype.element_ty, UPCAST), mask=keys)


def fused_backward(out: torch.Tensor, do: torch.Tensor, config: dict):
    """dq, dk, dv of h3_triton's attention output ``out`` (its forward's saved tensors reused), bfloat16 only."""
    q, k, v, o, row_max, row_log_sum = out.grad_fn.saved_tensors
    B, S, H, D = q.shape
    if not all(t.stride() == q.stride() for t in (k, v, do)):
        raise ValueError("the variant takes q, k, v and dout of one layout (the bench's are contiguous)")
    sm_scale = 1.0 / math.sqrt(D)
    delta = torch.empty_like(row_max)
    attention._delta(attention._grid(B, H, S, "BLOCK_M"), o, do, delta, *q.stride()[:3], *do.stride()[:3], H, S,
                     HEAD_DIM=D, UPCAST=INTERPRET)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    m_blocks, n_blocks = triton.cdiv(S, config["BLOCK_M"]), triton.cdiv(S, config["BLOCK_N"])
    accumulator = torch.empty((B * H, S, D), dtype=torch.float32, device=q.device)
    locks = torch.zeros((B * H, m_blocks), dtype=torch.int32, device=q.device)
    _fused_bwd[(n_blocks, B * H)](
        q, k, v, do, row_max, row_log_sum, delta, dk, dv, accumulator, locks,
        *q.stride()[:3], H, S, m_blocks, sm_scale, sm_scale * math.log2(math.e),
        HEAD_DIM=D, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], UPCAST=INTERPRET,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    dq = (accumulator.view(B, H, S, D).transpose(1, 2) * sm_scale).to(q.dtype)
    return dq, dk, dv


def parse_config(text: str) -> dict:
    """``64x128w8s3`` -> BLOCK_M 64 (queries), BLOCK_N 128 (keys), 8 warps, 3 stages."""
    found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    if not found:
        raise ValueError(f"config {text!r}: write BLOCK_MxBLOCK_N, warps, stages as 64x128w8s3")
    m, n, warps, stages = map(int, found.groups())
    return dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages)


def main():
    defaults = "64x128w8s3,64x128w8s2,64x64w4s3,32x128w4s3"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=defaults, help=f"comma-separated tilings of the variant (default: {defaults})")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    try:
        configs = {name: parse_config(name) for name in args.configs.split(",")}
    except ValueError as error:
        parser.error(str(error))
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "attention")
    inputs = case.make()
    q, k, v = (inputs[name].detach().requires_grad_() for name in ("q", "k", "v"))
    out = attention.attention(q, k, v)
    do = torch.randn_like(out)
    reference = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    runs = {"h3_triton": lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)}
    runs.update({f"fused {name}": (lambda config=config: fused_backward(out, do, config))
                 for name, config in configs.items()})
    base_ms = None
    for name, run in runs.items():
        error = max((got.float() - want.float()).abs().max().item() for got, want in zip(run(), reference))
        again = all(torch.equal(a, b) for a, b in zip(run(), run()))
        ms = median_ms(run, args.device)
        base_ms = base_ms or ms
        print(f"{case.label} backward {name:22s} {ms:9.3f} ms x{base_ms / ms:5.2f} of h3_triton's, "
              f"max diff {error:.1e}, {'bitwise repeatable' if again else 'NOT REPEATABLE'}", flush=True)


if __name__ == "__main__":
    main()
