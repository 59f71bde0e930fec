"""The attention backward at release shape: h3_triton's kernels, the provider's, and a variant that computes dQ
with dK and dV, summing it in fixed point.

Usage (GPU): python benchmarks/attention_bwd_variants.py [--configs 64x128w8s2t,...]
             ncu --profile-from-start off -k regex:_fused_bwd python benchmarks/attention_bwd_variants.py --profile
             TRITON_INTERPRET=1 python benchmarks/attention_bwd_variants.py --shape small --device cpu   (checks itself)

h3_triton's Triton backward (the path off Hopper; on Hopper the five-product Gluon kernel of
``h3_triton/attention_hopper.py`` runs, 1.07x the provider's backward) is deterministic without atomics: one kernel per
key block computes dK and dV (recomputing Q K^T and dP = dO V^T), one per query block computes dQ (recomputing both
again), seven S x S x D products where FlashAttention's backward has five; with its dK/dV kernel warp-specialised it
runs at 0.79x the provider's backward on an H200 (``results/h200-perf/h200-release-attention-block-ws.json``; 0.70x
before, at the time of the measurements below). Adding each key block's share of dQ to a float32
accumulator with atomics saves the two products but makes dQ depend on the order the adds land in, which the
kernel gate rejects (two runs must be bitwise equal). Ordering the adds, as FlashAttention-3's deterministic mode
does, ran at 0.59x of h3_triton's speed (``results/h200-perf/attention-bwd-variants.log``, this script at commit
635548a): Triton 3.6 does not software-pipeline a loop that waits on a counter.

The variant keeps the atomics and makes their order irrelevant: each share, dS^T K, is scaled by a power of two
per query row and truncated to int64, and integer addition is associative. The scale puts a bound of every
partial sum of the row at 2**62: |dS_ij| = P_ij |dP_ij - delta_i| <= 2 |dO_i| max_j |V_j| P_ij (O_i is a convex
combination of V's rows) and sum_j P_ij = 1, so |dQ_id| <= 2 |dO_i| max_j |V_j| max_j |K_jd|, with 5% for
rounding. Truncation costs at most one unit of 2**-62 of that bound per key block, far below float32's rounding
of the same sum. ``t`` tilings add a tile with one TMA reduction (``cp.reduce.async.bulk``), ``i`` the same in
int32 (the bound at 2**30, shares rounded to nearest: half the bytes of ``t``, the bytes of FlashAttention's float32
adds), the others with per-element atomics. Three more suffixes bracket the cost of the adds and are not valid
backwards: ``f`` adds float32 with the TMA reduction (FlashAttention's scheme, order-dependent), ``s`` sums each
share to one number (five products, no adds), ``n`` leaves the share out (the compiler then drops its product:
four products, the dK/dV kernel alone). After the adds, ``W`` reads every tile through tensor descriptors and
warp-specialises the query loop (as h3_triton's dK/dV kernel), ``h`` orders programs heads first (programs running
together add into different heads' dQ), ``T`` forms the share transposed, K^T dS^T, whose rows (head_dim) the
warp-specialised loop could split between its two consumer groups as it splits the keys of the other products.
Every variant's gradients are compared with h3_triton's (max abs difference) and run twice, so a fast wrong or
unrepeatable kernel shows; a tiling Triton cannot compile is reported and the others still run.

Measured on an H200 (``results/h200-perf/attention-bwd-fixed-point.log``): h3_triton 280.3 ms, the provider
199.9 ms (two of its runs differ bitwise), the variant 358.8 ms with TMA
reductions (gradients within 4.9e-4 of h3_triton's, bitwise repeatable) and 489-509 ms with per-element atomics
(``attention-bwd-fixed-point-atomics.log``); 299.0 ms with float32 TMA reductions. Nsight Compute
(``ncu/ncu-attention-bwd-fused.csv``, ``--profile``): 349 ms, L2 at 51% and SM at 31% of peak with int64
adds; 294 ms, 31% and 37% with float32: one 8-warp program per SM (12.5% occupancy, registers and 209 KB of shared
memory a program), which waits on its reductions. The brackets, later (``attention-bwd-ws-fused.log``, h3_triton
256.6-260.9 ms, the provider 197.1-201.5 ms): five products without adds (``64x128w8s2s``) take 283.7 ms, more than
h3_triton's seven, and the 196-205.6 ms once read as "without dQ" is the four-product kernel (``n``). Warp
specialisation, which takes h3_triton's four-product dK/dV kernel from 179 to 147-155 ms, does not compile in Triton
3.6 once the loop holds the share's product: its NVGPUWarpSpecialization pass stops ("Unexpected
asyncTaskIds.size()", WSDataPartition.cpp:762) with int32, float32 or no adds (``i``, ``f``, ``s``), in either
orientation (``T``) and either program order, and with 64-key blocks ("operation destroyed but still has uses").
So Triton 3.6 offers no five-product backward faster than the seven-product one; not adopted.
"""

import argparse
import math
import re

import torch
import triton
import triton.language as tl

from h3_triton import attention
from h3_triton.attention import _head_descriptor, _heads_base, _probabilities, _scores
from h3_triton.interpret import INTERPRET, mma, to_dtype
from h3_triton.tma import set_scratch_allocator
from h3gate.bench import SHAPES, cases, median_ms

_BOUND_BITS = 62
# 32-bit adds: the bound at 2**30 keeps every sum of a row inside int32 with the margin to spare.
_BOUND_BITS_INT32 = 30
_ROUNDING_MARGIN = 1.05
# How a tiling's suffix adds dQ's shares: int64 atomics, one int64 TMA reduction per tile, and the two brackets.
_ADDS = {"": "atomic", "t": "tma", "i": "tma-int32", "f": "tma-float", "s": "sum", "n": "none"}


@triton.jit
def _fused_bwd(Q, K, V, DO, ROW_MAX, ROW_LOG_SUM, DELTA, DQ_SCALE, DK, DV, DQ_ACC,
               stride_b, stride_s, stride_h, H, S, sm_scale, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ADD: tl.constexpr,
               SPECIALIZED: tl.constexpr, HEADS_FIRST: tl.constexpr, TRANSPOSED: tl.constexpr,
               UPCAST: tl.constexpr):
    """dK, dV of one key block and its share of dQ, added (``ADD``, see :data:`_ADDS`) to DQ_ACC of (B*H, S, D);
    every tensor of (B, S, H, D) shares one layout.

    ``SPECIALIZED``: tiles through tensor descriptors and the query loop warp-specialised, as
    :func:`h3_triton.attention._dkdv_described_kernel`. ``HEADS_FIRST``: consecutive programs take consecutive
    (batch, head) pairs of one key block, so programs running together add into different heads' dQ.
    ``TRANSPOSED``: the share is formed as dQ^T = K^T dS^T, whose rows (head_dim) the warp-specialised loop can
    split between its consumer groups as it splits the keys of the other products, and DQ_ACC is (B*H, D, S).
    """
    if HEADS_FIRST:
        num_bh = tl.num_programs(0) // tl.cdiv(S, BLOCK_N)
        pid_n = tl.program_id(0) // num_bh
        pid_bh = tl.program_id(0) % num_bh
    else:
        pid_n = tl.program_id(0)
        pid_bh = tl.program_id(1)
    base = _heads_base(pid_bh, H, stride_b, stride_h)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = (offs_n < S)[:, None]
    kv_off = base + offs_n[:, None] * stride_s + offs_d[None, :]
    if SPECIALIZED:
        q_src = _head_descriptor(Q + base, S, stride_s, BLOCK_M, HEAD_DIM)
        do_src = _head_descriptor(DO + base, S, stride_s, BLOCK_M, HEAD_DIM)
        k = _head_descriptor(K + base, S, stride_s, BLOCK_N, HEAD_DIM).load([pid_n * BLOCK_N, 0])
        v = _head_descriptor(V + base, S, stride_s, BLOCK_N, HEAD_DIM).load([pid_n * BLOCK_N, 0])
    else:
        k = tl.load(K + kv_off, mask=keys, other=0.0)
        v = tl.load(V + kv_off, mask=keys, other=0.0)
    rows_base = pid_bh.to(tl.int64) * S
    acc_base = DQ_ACC + rows_base * HEAD_DIM
    if TRANSPOSED:  # rows padded to 4 elements: a descriptor's strides are multiples of 16 bytes
        s_pad = (S + 3) // 4 * 4
        acc_desc = tl.make_tensor_descriptor(DQ_ACC + pid_bh.to(tl.int64) * HEAD_DIM * s_pad, shape=[HEAD_DIM, S],
                                             strides=[s_pad, 1], block_shape=[HEAD_DIM, BLOCK_M])
    elif ADD != "atomic":
        acc_desc = tl.make_tensor_descriptor(acc_base, shape=[S, HEAD_DIM], strides=[HEAD_DIM, 1],
                                             block_shape=[BLOCK_M, HEAD_DIM])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    shares = 0.0
    for start_m in tl.range(0, S, BLOCK_M, warp_specialize=SPECIALIZED):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < S
        if SPECIALIZED:
            q = q_src.load([start_m, 0])
            do = do_src.load([start_m, 0])
        else:
            q_off = base + offs_m[:, None] * stride_s + offs_d[None, :]
            q = tl.load(Q + q_off, mask=rows[:, None], other=0.0)
            do = tl.load(DO + q_off, mask=rows[:, None], other=0.0)
        row_max = tl.load(ROW_MAX + rows_base + offs_m, mask=rows, other=0.0)
        row_log_sum = tl.load(ROW_LOG_SUM + rows_base + offs_m, mask=rows, other=0.0)
        delta = tl.load(DELTA + rows_base + offs_m, mask=rows, other=0.0)
        scale = tl.load(DQ_SCALE + rows_base + offs_m, mask=rows, other=0.0)
        qk_t = _scores(k, tl.trans(q), BLOCK_N, BLOCK_M, UPCAST)
        p_t = _probabilities(qk_t * qk_scale, row_max, row_log_sum, 1, False)
        dv = mma(to_dtype(p_t, do.dtype, UPCAST), do, dv, UPCAST)
        dp_t = _scores(v, tl.trans(do), BLOCK_N, BLOCK_M, UPCAST)
        ds_t = to_dtype(p_t * (dp_t - delta[None, :]), q.dtype, UPCAST)
        dk = mma(ds_t, q, dk, UPCAST)
        if TRANSPOSED:
            part_t = mma(tl.trans(k), ds_t, tl.zeros([HEAD_DIM, BLOCK_M], dtype=tl.float32), UPCAST)
            if ADD == "tma-int32":
                acc_desc.atomic_add([0, start_m], tl.floor(part_t * scale[None, :] + 0.5).to(tl.int32))
            elif ADD == "tma-float":
                acc_desc.atomic_add([0, start_m], part_t)
        else:
            part = mma(tl.trans(ds_t), k, tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), UPCAST)
            if ADD == "tma":
                acc_desc.atomic_add([start_m, 0], (part * scale[:, None]).to(tl.int64).to(tl.uint64, bitcast=True))
            elif ADD == "tma-int32":
                acc_desc.atomic_add([start_m, 0], tl.floor(part * scale[:, None] + 0.5).to(tl.int32))
            elif ADD == "tma-float":
                acc_desc.atomic_add([start_m, 0], part)
            elif ADD == "sum":
                shares += tl.sum(tl.sum(part, 1), 0)
            elif ADD == "atomic":
                fixed = (part * scale[:, None]).to(tl.int64).to(tl.uint64, bitcast=True)
                tl.atomic_add(acc_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], fixed, mask=rows[:, None],
                              sem="relaxed")
    if ADD == "sum":
        tl.store(DQ_ACC + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), shares)
    if SPECIALIZED:
        _head_descriptor(DK + base, S, stride_s, BLOCK_N, HEAD_DIM).store(
            [pid_n * BLOCK_N, 0], to_dtype(dk * sm_scale, DK.dtype.element_ty, UPCAST))
        _head_descriptor(DV + base, S, stride_s, BLOCK_N, HEAD_DIM).store(
            [pid_n * BLOCK_N, 0], to_dtype(dv, DV.dtype.element_ty, UPCAST))
    else:
        tl.store(DK + kv_off, to_dtype(dk * sm_scale, DK.dtype.element_ty, UPCAST), mask=keys)
        tl.store(DV + kv_off, to_dtype(dv, DV.dtype.element_ty, UPCAST), mask=keys)


def dq_scale(k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, bits: int) -> torch.Tensor:
    """Per query row of (B*H, S): the power of two that maps the row's bound on |dQ| to 2**bits."""
    B, S, H, _ = do.shape
    value_norm = v.float().norm(dim=-1).amax(dim=1)
    key_max = k.float().abs().amax(dim=(1, 3))
    bound = 2 * _ROUNDING_MARGIN * do.float().norm(dim=-1) * (value_norm * key_max)[:, None, :]
    exponent = (bits - torch.ceil(torch.log2(bound))).clamp(-126, 126)
    return torch.exp2(exponent).permute(0, 2, 1).reshape(B * H, S).contiguous()


def fused_backward(out: torch.Tensor, do: torch.Tensor, config: dict):
    """dq, dk, dv of h3_triton's attention output ``out`` (its forward's saved tensors reused), bfloat16 only."""
    q, k, v, o, row_max, row_log_sum = out.grad_fn.saved_tensors
    B, S, H, D = q.shape
    if not all(t.stride() == q.stride() for t in (k, v, do)):
        raise ValueError("the variant takes q, k, v and dout of one layout (the bench's are contiguous)")
    if config["ADD"].startswith("tma") and INTERPRET:
        raise ValueError("Triton's interpreter has no TMA reduction; drop the suffix of the tiling")
    sm_scale = 1.0 / math.sqrt(D)
    delta = torch.empty_like(row_max)
    attention._delta(attention._grid(B, H, S, "BLOCK_M"), o, do, delta, *q.stride()[:3], *do.stride()[:3], H, S,
                     HEAD_DIM=D, UPCAST=INTERPRET)
    int32 = config["ADD"] == "tma-int32"
    if config["TRANSPOSED"] and config["ADD"] not in ("tma-int32", "tma-float", "none"):
        raise ValueError("the transposed share is added by 32-bit TMA reductions only (suffix i or f)")
    scale = dq_scale(k, v, do, _BOUND_BITS_INT32 if int32 else _BOUND_BITS)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    floats = config["ADD"] in ("tma-float", "sum", "none")
    shape = (B * H, D, triton.cdiv(S, 4) * 4) if config["TRANSPOSED"] else (B * H, S, D)
    accumulator = torch.zeros(shape, dtype=torch.float32 if floats else torch.int32 if int32 else torch.uint64,
                              device=q.device)
    if config["ADD"] != "atomic" or config["SPECIALIZED"]:
        set_scratch_allocator()
    blocks = triton.cdiv(S, config["BLOCK_N"])
    _fused_bwd[(blocks * B * H,) if config["HEADS_FIRST"] else (blocks, B * H)](
        q, k, v, do, row_max, row_log_sum, delta, scale, dk, dv, accumulator,
        *q.stride()[:3], H, S, sm_scale, sm_scale * math.log2(math.e),
        HEAD_DIM=D, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], ADD=config["ADD"],
        SPECIALIZED=config["SPECIALIZED"], HEADS_FIRST=config["HEADS_FIRST"], TRANSPOSED=config["TRANSPOSED"],
        UPCAST=INTERPRET,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    if config["TRANSPOSED"]:
        accumulator = accumulator[..., :S].transpose(1, 2)
    if floats:
        summed = accumulator
    elif int32:
        summed = accumulator.float() / scale[..., None]
    else:
        summed = accumulator.view(torch.int64).double() / scale.double()[..., None]
    dq = (summed * sm_scale).to(q.dtype).view(B, H, S, D).transpose(1, 2)
    return dq, dk, dv


def parse_config(text: str) -> dict:
    """``64x128w8s2t`` -> BLOCK_M 64 (queries), BLOCK_N 128 (keys), 8 warps, 2 stages, adds of :data:`_ADDS`;
    then ``W`` for the warp-specialised descriptor loop, ``h`` for heads-first program order and ``T`` for the
    transposed share (``64x128w4s2iWhT``)."""
    found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)([tifsn]?)(W?)(h?)(T?)", text)
    if not found:
        raise ValueError(f"config {text!r}: write BLOCK_MxBLOCK_N, warps, stages, a suffix of {_ADDS} and then "
                         "optionally W, h and T, as 64x128w8s2t or 64x128w4s2iWh")
    m, n, warps, stages = map(int, found.groups()[:4])
    return dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages, ADD=_ADDS[found.group(5)],
                SPECIALIZED=bool(found.group(6)), HEADS_FIRST=bool(found.group(7)), TRANSPOSED=bool(found.group(8)))


def provider_backward(q, k, v, do):
    """The provider's attention (torch SDPA, default backends) and its backward, on the (B, H, S, D) transposes."""
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves)
    return lambda: torch.autograd.grad(out, leaves, do.transpose(1, 2), retain_graph=True)


def kernel_ms(run) -> float:
    """The duration of one ``run()``'s ``_fused_bwd`` kernel, from a torch.profiler trace of three calls."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    return sum(event.device_time_total for event in trace.events()
               if event.device_type.name == "CUDA" and "_fused_bwd" in event.name) / 1e3 / 3


def main():
    defaults = "64x128w8s2t,32x128w8s2t,64x128w8s2f,64x128w8s2s,64x128w8s2n"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=defaults,
                        help=f"comma-separated tilings of the variant (default: {defaults})")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--profile", action="store_true", help="run each tiling once, untimed, inside a CUDA "
                        "profiler range (for Nsight Compute with --profile-from-start off)")
    args = parser.parse_args()
    if args.profile and not args.device.startswith("cuda"):
        parser.error("--profile opens a CUDA profiler range: use it with --device cuda")
    try:
        configs = {name: parse_config(name) for name in args.configs.split(",")}
    except ValueError as error:
        parser.error(str(error))
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "attention")
    inputs = case.make()
    q, k, v = (inputs[name].detach().requires_grad_() for name in ("q", "k", "v"))
    out = attention.attention(q, k, v)
    do = torch.randn_like(out)
    if args.profile:
        with torch.cuda.profiler.profile():
            for config in configs.values():
                fused_backward(out, do, config)
                torch.cuda.synchronize()
        return
    reference = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    runs = {"h3_triton": lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)}
    if args.device.startswith("cuda"):
        provider = provider_backward(q, k, v, do)
        runs["provider"] = lambda: [g.transpose(1, 2) for g in provider()]
    runs.update({f"fused {name}": (lambda config=config: fused_backward(out, do, config))
                 for name, config in configs.items()})
    base_ms = None
    for name, run in runs.items():
        try:
            error = max((got.float() - want.float()).abs().max().item() for got, want in zip(run(), reference))
        except RuntimeError as failure:  # a tiling Triton cannot compile; the others still run
            print(f"{case.label} backward {name:22s} failed: {str(failure).splitlines()[-1]}", flush=True)
            continue
        if name.startswith("fused") and args.device.startswith("cuda"):
            print(f"{case.label} backward {name:22s} its kernel alone {kernel_ms(run):9.3f} ms", flush=True)
        again = all(torch.equal(a, b) for a, b in zip(run(), run()))
        ms = median_ms(run, args.device)
        base_ms = base_ms or ms
        print(f"{case.label} backward {name:22s} {ms:9.3f} ms x{base_ms / ms:5.2f} of h3_triton's, "
              f"max diff {error:.1e}, {'bitwise repeatable' if again else 'NOT REPEATABLE'}", flush=True)


if __name__ == "__main__":
    main()
