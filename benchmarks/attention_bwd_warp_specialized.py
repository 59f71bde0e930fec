"""The attention backward at release shape with Triton's automatic warp specialisation (Hopper), against
h3_triton's kernels and the provider's.

Usage (GPU): python benchmarks/attention_bwd_warp_specialized.py [--dkdv 64x128w4s2,...] [--dq 128x64w4s2,...]

h3_triton's backward keeps its seven S x S x D products and its determinism (dK/dV per key block, dQ per query
block, each output element written by one program) and runs at 0.70x the provider's backward on an H200; one
program of 8 warps per SM issues the loads, the products and the softmax arithmetic in turn. On Hopper, Triton
3.6 splits a loop marked ``tl.range(..., warp_specialize=True)`` into a producer warp group issuing the TMA loads
and two consumer warp groups, each owning half of the program's tile (FlashAttention-3's layout), when every
tile the loop reads comes through a tensor descriptor. Both kernels here are h3_triton's arithmetic in that
form, bfloat16 only: q, k, v, dO through descriptors; the per-row terms (log-sum-exp, delta) of the dQ kernel
through descriptors as well, which needs rows padded to 16 bytes (:func:`row_terms`), since pointer loads of a
split tile stop the compiler's pass. Every variant's gradients are compared with h3_triton's (max abs
difference) and run twice, so a fast wrong or unrepeatable kernel shows; each kernel is also timed alone.
"""

import argparse
import math
import re

import torch
import triton
import triton.language as tl

from h3_triton import attention
from h3_triton.attention import _heads_base
from h3_triton.tma import set_scratch_allocator
from h3gate.bench import SHAPES, cases, median_ms

# Rows of the per-row terms are padded to this many float32s, so every row starts on 16 bytes (TMA).
_ROW_PAD = 4


@triton.jit
def _head_desc(ptr, S, stride_s, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    return tl.make_tensor_descriptor(ptr, shape=[S, HEAD_DIM], strides=[stride_s, 1], block_shape=[BLOCK, HEAD_DIM])


@triton.jit
def _row_desc(ptr, BH, S, stride_row, BLOCK: tl.constexpr):
    """A tensor descriptor of (B*H, S) per-row terms whose rows are ``stride_row`` apart, BLOCK of one row at a time."""
    return tl.make_tensor_descriptor(ptr, shape=[BH, S], strides=[stride_row, 1], block_shape=[1, BLOCK])


@triton.jit
def _row_terms_kernel(O, DO, ROW_MAX, ROW_LOG_SUM, LSE, DELTA, stride_b, stride_s, stride_h, H, S, stride_row,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """log2-sum-exp (row max + log2 of the row sum, as h3_triton adds them) and delta = rowsum(dO * O)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < S
    at = _heads_base(pid_bh, H, stride_b, stride_h) + offs_m[:, None] * stride_s + offs_d[None, :]
    o = tl.load(O + at, mask=rows[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=rows[:, None], other=0.0).to(tl.float32)
    stats = pid_bh.to(tl.int64) * S + offs_m
    out = pid_bh.to(tl.int64) * stride_row + offs_m
    lse = tl.load(ROW_MAX + stats, mask=rows, other=0.0) + tl.load(ROW_LOG_SUM + stats, mask=rows, other=0.0)
    tl.store(LSE + out, lse, mask=rows)
    tl.store(DELTA + out, tl.sum(o * do, 1), mask=rows)


@triton.jit
def _dkdv_ws(Q, K, V, DO, LSE, DELTA, DK, DV, stride_b, stride_s, stride_h, H, S, stride_row, sm_scale, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK, dV of one key block (BLOCK_N keys, split between the two consumer warp groups) over query tiles."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    base = _heads_base(pid_bh, H, stride_b, stride_h)
    q_desc = _head_desc(Q + base, S, stride_s, BLOCK_M, HEAD_DIM)
    do_desc = _head_desc(DO + base, S, stride_s, BLOCK_M, HEAD_DIM)
    k = _head_desc(K + base, S, stride_s, BLOCK_N, HEAD_DIM).load([pid_n * BLOCK_N, 0])
    v = _head_desc(V + base, S, stride_s, BLOCK_N, HEAD_DIM).load([pid_n * BLOCK_N, 0])
    rows_base = pid_bh.to(tl.int64) * stride_row
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in tl.range(0, S, BLOCK_M, warp_specialize=True):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < S
        q = q_desc.load([start_m, 0])
        do = do_desc.load([start_m, 0])
        lse = tl.load(LSE + rows_base + offs_m, mask=rows, other=0.0)
        delta = tl.load(DELTA + rows_base + offs_m, mask=rows, other=0.0)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        dk = tl.dot((p_t * (dp_t - delta[None, :])).to(q.dtype), q, dk)
    _head_desc(DK + base, S, stride_s, BLOCK_N, HEAD_DIM).store([pid_n * BLOCK_N, 0], (dk * sm_scale).to(tl.bfloat16))
    _head_desc(DV + base, S, stride_s, BLOCK_N, HEAD_DIM).store([pid_n * BLOCK_N, 0], dv.to(tl.bfloat16))


@triton.jit
def _dq_ws(Q, K, V, DO, LSE, DELTA, DQ, stride_b, stride_s, stride_h, BH, H, S, stride_row, sm_scale, qk_scale,
           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one query block (BLOCK_M queries, split between the two consumer warp groups) over key tiles; keys
    past S are masked out of P, as h3_triton's last tile is."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    base = _heads_base(pid_bh, H, stride_b, stride_h)
    q = _head_desc(Q + base, S, stride_s, BLOCK_M, HEAD_DIM).load([pid_m * BLOCK_M, 0])
    do = _head_desc(DO + base, S, stride_s, BLOCK_M, HEAD_DIM).load([pid_m * BLOCK_M, 0])
    lse = _row_desc(LSE, BH, S, stride_row, BLOCK_M).load([pid_bh, pid_m * BLOCK_M]).reshape(BLOCK_M)
    delta = _row_desc(DELTA, BH, S, stride_row, BLOCK_M).load([pid_bh, pid_m * BLOCK_M]).reshape(BLOCK_M)
    k_desc = _head_desc(K + base, S, stride_s, BLOCK_N, HEAD_DIM)
    v_desc = _head_desc(V + base, S, stride_s, BLOCK_N, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in tl.range(0, S, BLOCK_N, warp_specialize=True):
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        keys = (start_n + tl.arange(0, BLOCK_N)) < S
        p = tl.where(keys[None, :], tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        dq = tl.dot((p * (dp - delta[:, None])).to(k.dtype), k, dq)
    _head_desc(DQ + base, S, stride_s, BLOCK_M, HEAD_DIM).store([pid_m * BLOCK_M, 0], (dq * sm_scale).to(tl.bfloat16))


def row_terms(out: torch.Tensor, do: torch.Tensor):
    """(B*H, S padded to 16 bytes) log2-sum-exp and delta of h3_triton's forward ``out``, and the padded stride."""
    q, _, _, o, row_max, row_log_sum = out.grad_fn.saved_tensors
    B, S, H, D = q.shape
    stride_row = triton.cdiv(S, _ROW_PAD) * _ROW_PAD
    lse = torch.empty((B * H, stride_row), dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse)
    _row_terms_kernel[(triton.cdiv(S, 64), B * H)](o, do, row_max, row_log_sum, lse, delta, *o.stride()[:3], H, S,
                                                   stride_row, HEAD_DIM=D, BLOCK_M=64, num_warps=4)
    return lse, delta, stride_row


def launch_dkdv(out, do, lse, delta, stride_row, config):
    q, k, v, *_ = out.grad_fn.saved_tensors
    B, S, H, D = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale = 1.0 / math.sqrt(D)
    _dkdv_ws[(triton.cdiv(S, config["BLOCK_N"]), B * H)](
        q, k, v, do, lse, delta, dk, dv, *q.stride()[:3], H, S, stride_row, sm_scale, sm_scale * math.log2(math.e),
        HEAD_DIM=D, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return dk, dv


def launch_dq(out, do, lse, delta, stride_row, config):
    q, k, v, *_ = out.grad_fn.saved_tensors
    B, S, H, D = q.shape
    dq = torch.empty_like(q)
    sm_scale = 1.0 / math.sqrt(D)
    _dq_ws[(triton.cdiv(S, config["BLOCK_M"]), B * H)](
        q, k, v, do, lse, delta, dq, *q.stride()[:3], B * H, H, S, stride_row, sm_scale,
        sm_scale * math.log2(math.e), HEAD_DIM=D, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return dq


def warp_specialized_backward(out, do, dkdv_config, dq_config):
    set_scratch_allocator()
    lse, delta, stride_row = row_terms(out, do)
    dk, dv = launch_dkdv(out, do, lse, delta, stride_row, dkdv_config)
    return launch_dq(out, do, lse, delta, stride_row, dq_config), dk, dv


def parse_config(text: str) -> dict:
    """``64x128w4s2`` -> BLOCK_M 64 (queries), BLOCK_N 128 (keys), 4 warps a group, 2 stages."""
    found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    if not found:
        raise ValueError(f"config {text!r}: write BLOCK_MxBLOCK_N, warps and stages as 64x128w4s2")
    m, n, warps, stages = map(int, found.groups())
    return dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages)


def h3_triton_kernels(out, do):
    """h3_triton's dK/dV and dQ launches alone, with its first tilings (H3_TRITON_AUTOTUNE=0 runs those)."""
    q, k, v, o, row_max, row_log_sum = out.grad_fn.saved_tensors
    B, S, H, D = q.shape
    sm_scale = 1.0 / math.sqrt(D)
    delta = torch.empty_like(row_max)
    attention._delta(attention._grid(B, H, S, "BLOCK_M"), o, do, delta, *o.stride()[:3], *do.stride()[:3], H, S,
                     HEAD_DIM=D, UPCAST=False)
    grads = [torch.empty_like(q) for _ in range(3)]
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *q.stride()[:3], H, S, sm_scale,
              sm_scale * math.log2(math.e))
    dkdv = lambda: attention._dkdv(attention._grid(B, H, S, "BLOCK_N"), q, k, v, do, row_max, row_log_sum, delta,
                                   grads[1], grads[2], *common, HEAD_DIM=D, EXACT=False, UPCAST=False)
    dq = lambda: attention._dq(attention._grid(B, H, S, "BLOCK_M"), q, k, v, do, row_max, row_log_sum, delta,
                               grads[0], *common, HEAD_DIM=D, EXACT=False, UPCAST=False)
    return dkdv, dq


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dkdv", default="64x128w4s2,64x128w4s3", help="tilings of the dK/dV kernel (keys are "
                        "BLOCK_N, split between the two consumer groups)")
    parser.add_argument("--dq", default="128x64w4s2,128x64w4s3,128x128w4s2", help="tilings of the dQ kernel "
                        "(queries are BLOCK_M, split between the two consumer groups)")
    args = parser.parse_args()
    try:
        dkdv_configs = [parse_config(text) for text in args.dkdv.split(",")]
        dq_configs = [parse_config(text) for text in args.dq.split(",")]
    except ValueError as error:
        parser.error(str(error))
    case = next(c for c in cases(SHAPES["release"], "cuda") if c.op == "attention")
    inputs = case.make()
    q, k, v = (inputs[name].detach().requires_grad_() for name in ("q", "k", "v"))
    out = attention.attention(q, k, v)
    do = torch.randn_like(out)
    reference = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def report(name, ms, grads=None, again=None):
        diff = "" if grads is None else f", max diff {max((g.float() - r.float()).abs().max().item() for g, r in grads):.1e}"
        repeat = "" if again is None else (", bitwise repeatable" if again else ", NOT REPEATABLE")
        print(f"{case.label} {name:40s} {ms:9.3f} ms{diff}{repeat}", flush=True)

    report("backward h3_triton", median_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), "cuda"))
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    provider_out = torch.nn.functional.scaled_dot_product_attention(*leaves)
    report("backward provider", median_ms(lambda: torch.autograd.grad(provider_out, leaves, do.transpose(1, 2),
                                                                      retain_graph=True), "cuda"))
    dkdv, dq = h3_triton_kernels(out, do)
    report("h3_triton dK/dV kernel alone", median_ms(dkdv, "cuda"))
    report("h3_triton dQ kernel alone", median_ms(dq, "cuda"))
    set_scratch_allocator()
    lse, delta, stride_row = row_terms(out, do)
    report("row terms (lse, delta) alone", median_ms(lambda: row_terms(out, do), "cuda"))
    for text, config in zip(args.dkdv.split(","), dkdv_configs):
        run = lambda: launch_dkdv(out, do, lse, delta, stride_row, config)
        try:
            got = run()
        except Exception as error:  # a tiling the compiler refuses is reported, the sweep goes on
            print(f"dK/dV {text}: {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
            continue
        report(f"warp-specialized dK/dV {text}", median_ms(run, "cuda"), zip(got, reference[1:]),
               all(torch.equal(a, b) for a, b in zip(run(), run())))
    for text, config in zip(args.dq.split(","), dq_configs):
        run = lambda: launch_dq(out, do, lse, delta, stride_row, config)
        try:
            got = run()
        except Exception as error:
            print(f"dQ {text}: {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
            continue
        report(f"warp-specialized dQ {text}", median_ms(run, "cuda"), [(got, reference[0])],
               torch.equal(run(), run()))
    for d_text, d_config in zip(args.dkdv.split(","), dkdv_configs):
        for q_text, q_config in zip(args.dq.split(","), dq_configs):
            run = lambda: warp_specialized_backward(out, do, d_config, q_config)
            try:
                got = run()
            except Exception as error:
                print(f"backward {d_text} + {q_text}: {type(error).__name__}", flush=True)
                continue
            report(f"backward warp-specialized {d_text} + {q_text}", median_ms(run, "cuda"), zip(got, reference),
                   all(torch.equal(a, b) for a, b in zip(run(), run())))


if __name__ == "__main__":
    main()
