"""Flash attention (FlashAttention-2 style) for the H3 blocks: non-causal, unmasked, scale 1/sqrt(D).

Replaces the ``dispatch_attention_fn`` call of ``MiniMaxH3Transformer3DModel``, so it takes the layout diffusers
passes there, (batch, sequence, heads, head_dim) with arbitrary outer strides, and never materialises the
S x S score matrix (S is 38,222 at release: the matrix alone would be 5.8 GB per head).

Forward: one program per (query block, batch x head) sweeps the key blocks with the online softmax in base 2 (the
softmax scale is folded with log2(e) so each score costs one ``exp2``) and saves every row's base-2 max and log2
of its sum. bfloat16 tensors whose rows and heads start on 16-byte boundaries (any contiguous (B, S, H, D)) are
read through tensor descriptors (TMA): 0.94x cuDNN on an H200 at release shape against 0.89x for pointer loads
(``benchmarks/results/h200-perf/attention-variants.log``). Full key tiles run unmasked; only the last partial tile
pays for the mask, which keeps padded keys out of the softmax. Backward recomputes the probabilities from those two:
a preprocess kernel for delta = rowsum(dO * O), one kernel for dK and dV per key block looping over query blocks
(warp-specialised for tensors that descriptors can read: :func:`_dkdv_described_kernel`), one for dQ per query block
looping over key blocks. Each output element is written by exactly one program, so results are deterministic
without atomics. Every dot goes through :func:`h3_triton.interpret.mma`, except that float32 scores are summed in
float64 (:func:`_scores`).

On Hopper GPUs the bfloat16 forward and backward at head_dim 128 run :mod:`h3_triton.attention_hopper` instead,
Gluon kernels scheduled by hand with the same arithmetic (bitwise the same output, row statistics, dK and dV; dQ,
added in a fixed order outside the tensor cores, within a bfloat16 rounding): at release shape the forward 1.13x
cuDNN (67.4 against 76.2 ms), the backward 1.02x the provider's (206.8 against 210.4 ms;
``benchmarks/results/h200-release.json``).
"""

import math

import torch
import triton
import triton.language as tl

from h3_triton import attention_hopper, paths
from h3_triton.interpret import INTERPRET, device_function, mma, to_dtype
from h3_triton.launch import cdiv
from h3_triton.tma import aligned, set_scratch_allocator
from h3_triton.tuning import Launcher, configs

HEAD_DIMS = (32, 64, 128)
DTYPES = (torch.bfloat16, torch.float32)

# One fixed tiling under the interpreter, the GPU's own 128: the interpreter runs every program in numpy
# and its cost is per tile visited, not per element (32-wide tiles made a tiny-model forward 16x slower).
# Sequences that are not multiples of 128 (any odd length) still end in a partial tile.
_INTERPRET_TILE = 128


def _launcher(kernel, names: tuple[str, ...], rows: dict[int, tuple[tuple[int, ...], ...]]) -> Launcher:
    """Tuned on (S, D, and for the forward whether it reads through tensor descriptors) over ``rows``: per element
    size, tile sizes for ``names`` then num_warps, num_stages."""
    tilings = {size: configs(size_rows, names) for size, size_rows in rows.items()}
    key = ["S", "HEAD_DIM"] + [name for name in ("DESCRIBED",) if name in kernel.arg_names]
    return Launcher(kernel, tilings, key=key, interpreter=dict.fromkeys(names, _INTERPRET_TILE))


# (tiles..., num_warps, num_stages) per element size, the tiling of H3_TRITON_AUTOTUNE=0 first. The forward's
# best measured on an H200 at S=38,222, D=128 is BLOCK_M 128, BLOCK_N 128, 8 warps, 3 stages: 224 of the
# 227 KiB of shared memory at D=128, so 4 stages only run with BLOCK_N 64. The sets stay small because each
# new S is tuned afresh. The backward's first tilings are the fastest of ``benchmarks/attention_tilings.py`` on an
# H200 at that shape (``results/h200-perf/attention-tilings.log``): dK/dV at 64 x 128 takes the backward from
# 590 to 291 ms against 32 x 128, dQ at 128 x 64 another 18 ms. float32 dots run as IEEE FMAs (no tensor cores):
# one tiling each that fits (the bf16 ones do not) and compiles in under a minute, since float32 is a
# correctness path, not a speed path.
_FWD_ROWS = {
    2: ((128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 4, 3),
        (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 4), (128, 64, 8, 4)),
    4: ((64, 32, 4, 2),),
}
_DELTA_ROWS = {2: ((128, 4, 1), (64, 4, 1)), 4: ((64, 4, 1),)}
_DKDV_ROWS = {
    2: ((64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3)),
    4: ((32, 64, 4, 2),),
}
# Warp-specialised: 4 warps a group (Triton splits the loop only then), 2 stages (see the kernel).
_DKDV_DESCRIBED_ROWS = {2: ((64, 128, 4, 2), (32, 128, 4, 2))}
_DQ_ROWS = {
    2: ((128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 4, 3)),
    4: ((64, 32, 4, 2),),
}


@device_function
def _scores(a, b, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` for the score-like products (Q K^T, dO V^T, dO O^T), fp32 accumulation for bfloat16.

    float32 operands are multiplied and summed in float64 and rounded once: at peaky attention (|Q K^T| in the
    hundreds) a float32 chain of FMAs along head_dim errs by more than the softmax can absorb, and that error
    reaches every gradient through P.
    """
    if a.dtype == tl.float32:
        exact = tl.dot(a.to(tl.float64), b.to(tl.float64), tl.zeros([BLOCK_A, BLOCK_B], dtype=tl.float64),
                       out_dtype=tl.float64)
        return exact.to(tl.float32)
    else:
        return mma(a, b, tl.zeros([BLOCK_A, BLOCK_B], dtype=tl.float32), UPCAST)


@device_function
def _probabilities(scores, row_max, row_log_sum, QUERY_AXIS: tl.constexpr, EXACT: tl.constexpr):
    """P recomputed from base-2 ``scores`` and the forward's saved row max and log2 of the row sum.

    ``QUERY_AXIS`` is the axis of ``scores`` that runs over queries. ``EXACT`` (float32 inputs) subtracts the
    two apart: the exponents of the keys near the max are then small and nearly exact, where the rounding of
    their sum (up to ~100 at peaky attention) would put a relative error of 1e-6 on a whole row of P.
    bfloat16 adds them once per row.
    """
    if EXACT:
        if QUERY_AXIS == 0:
            return tl.math.exp2((scores - row_max[:, None]) - row_log_sum[:, None])
        else:
            return tl.math.exp2((scores - row_max[None, :]) - row_log_sum[None, :])
    else:
        if QUERY_AXIS == 0:
            return tl.math.exp2(scores - (row_max + row_log_sum)[:, None])
        else:
            return tl.math.exp2(scores - (row_max + row_log_sum)[None, :])


@device_function
def _heads_base(pid_bh, H, stride_b, stride_h):
    """Offset of (batch, head) ``pid_bh`` in a (B, S, H, D) tensor, in int64: B*S*H*D may pass 2**31."""
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    return off_b * stride_b + off_h * stride_h


@device_function
def _head_descriptor(ptr, S, stride_s, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A tensor descriptor of one head's (S, HEAD_DIM) matrix, read and written BLOCK rows at a time."""
    return tl.make_tensor_descriptor(ptr, shape=[S, HEAD_DIM], strides=[stride_s, 1], block_shape=[BLOCK, HEAD_DIM])


@device_function
def _key_value_tile(k_ptr, v_ptr, stride_k, stride_v, offs_n, offs_d, S, MASK_KEYS: tl.constexpr):
    """One key tile and its value tile; only the last partial tile is masked (padded keys load as 0)."""
    k_ptrs = k_ptr + offs_n[:, None] * stride_k + offs_d[None, :]
    v_ptrs = v_ptr + offs_n[:, None] * stride_v + offs_d[None, :]
    if MASK_KEYS:
        in_seq = (offs_n < S)[:, None]
        return tl.load(k_ptrs, mask=in_seq, other=0.0), tl.load(v_ptrs, mask=in_seq, other=0.0)
    else:
        return tl.load(k_ptrs), tl.load(v_ptrs)


@device_function
def _fwd_inner(acc, m_i, l_i, q, k_src, v_src, stride_kn, stride_vn, start, stop, S, qk_scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               MASK_KEYS: tl.constexpr, DESCRIBED: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax over key tiles [start, stop); only the last partial tile is called with MASK_KEYS.

    ``DESCRIBED``: ``k_src`` and ``v_src`` are tensor descriptors, whose loads fill keys past S with zeros as
    the masked pointer loads do; otherwise they are pointers.
    """
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + offs_n0
        if DESCRIBED:
            k = k_src.load([start_n, 0])
            v = v_src.load([start_n, 0])
        else:
            k, v = _key_value_tile(k_src, v_src, stride_kn, stride_vn, offs_n, offs_d, S, MASK_KEYS)
        qk = _scores(q, tl.trans(k), BLOCK_M, BLOCK_N, UPCAST)
        if MASK_KEYS:
            qk = tl.where((offs_n < S)[None, :], qk, float("-inf"))
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, qk_scale, UPCAST)
    return acc, m_i, l_i


@device_function
def _softmax_step(acc, m_i, l_i, qk, v, qk_scale, UPCAST: tl.constexpr):
    """One key tile of the online softmax (base 2): new row max, rescaled sum and accumulator, plus P V.

    The scaled max is the max of the scaled scores (a positive scale keeps the order and rounding is monotonic),
    so the scale folds into one FMA per score with the subtraction of the max.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = mma(to_dtype(p, v.dtype, UPCAST), v, acc * alpha[:, None], UPCAST)
    return acc, m_new, l_i


@triton.jit
def _fwd_kernel(Q, K, V, O, ROW_MAX, ROW_LOG_SUM,
                stride_qb, stride_qs, stride_qh,
                stride_kb, stride_ks, stride_kh,
                stride_vb, stride_vs, stride_vh,
                stride_ob, stride_os, stride_oh,
                H, S, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DESCRIBED: tl.constexpr,
                UPCAST: tl.constexpr):
    """One query block of one (batch, head). ``DESCRIBED``: q, k, v and o are read and written through tensor
    descriptors (TMA), which the caller has checked their layouts allow; same values, same arithmetic."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    q_ptr = Q + _heads_base(pid_bh, H, stride_qb, stride_qh)
    k_ptr = K + _heads_base(pid_bh, H, stride_kb, stride_kh)
    v_ptr = V + _heads_base(pid_bh, H, stride_vb, stride_vh)
    o_ptr = O + _heads_base(pid_bh, H, stride_ob, stride_oh)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in_seq = offs_m < S
    if DESCRIBED:
        q = _head_descriptor(q_ptr, S, stride_qs, BLOCK_M, HEAD_DIM).load([pid_m * BLOCK_M, 0])
        k_src = _head_descriptor(k_ptr, S, stride_ks, BLOCK_N, HEAD_DIM)
        v_src = _head_descriptor(v_ptr, S, stride_vs, BLOCK_N, HEAD_DIM)
    else:
        q = tl.load(q_ptr + offs_m[:, None] * stride_qs + offs_d[None, :], mask=row_in_seq[:, None], other=0.0)
        k_src = k_ptr
        v_src = v_ptr

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    full_stop = (S // BLOCK_N) * BLOCK_N
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_src, v_src, stride_ks, stride_vs, 0, full_stop, S, qk_scale,
                               BLOCK_M, BLOCK_N, HEAD_DIM, False, DESCRIBED, UPCAST)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_src, v_src, stride_ks, stride_vs, full_stop, S, S, qk_scale,
                               BLOCK_M, BLOCK_N, HEAD_DIM, True, DESCRIBED, UPCAST)

    out = to_dtype(acc / l_i[:, None], O.dtype.element_ty, UPCAST)
    if DESCRIBED:
        _head_descriptor(o_ptr, S, stride_os, BLOCK_M, HEAD_DIM).store([pid_m * BLOCK_M, 0], out)
    else:
        tl.store(o_ptr + offs_m[:, None] * stride_os + offs_d[None, :], out, mask=row_in_seq[:, None])
    rows_out = pid_bh.to(tl.int64) * S + offs_m
    tl.store(ROW_MAX + rows_out, m_i, mask=row_in_seq)
    tl.store(ROW_LOG_SUM + rows_out, tl.math.log2(l_i), mask=row_in_seq)


@triton.jit
def _delta_kernel(O, DO, DELTA,
                  stride_ob, stride_os, stride_oh,
                  stride_dob, stride_dos, stride_doh,
                  H, S,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, UPCAST: tl.constexpr):
    """delta = rowsum(dO * O) in float32, the row term of dS = P * (dP - delta).

    For float32, delta is the diagonal of dO @ O^T, computed by the same float64 dot (:func:`_scores`) as
    dP = dO @ V^T. Where a row's output equals a value row (one key, or attention peaked on one key) dP - delta
    then cancels to what it is in exact arithmetic, zero; a float32 sum in another order left the difference
    of two roundings (a few ULP of |dO||V|), which reached dQ and dK on an H200.
    bfloat16 outputs are rounded before delta sees them, so they keep the cheaper elementwise sum.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = (offs_m < S)[:, None]
    o = tl.load(O + _heads_base(pid_bh, H, stride_ob, stride_oh) + offs_m[:, None] * stride_os + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + _heads_base(pid_bh, H, stride_dob, stride_doh) + offs_m[:, None] * stride_dos
                 + offs_d[None, :], mask=rows, other=0.0)
    if O.dtype.element_ty == tl.float32:
        products = _scores(do, tl.trans(o), BLOCK_M, BLOCK_M, UPCAST)
        delta = tl.sum(tl.where(offs_m[:, None] == offs_m[None, :], products, 0.0), 1)
    else:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * S + offs_m, delta, mask=offs_m < S)


@device_function
def _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, max_ptr, log_sum_ptr, delta_ptr, stride_qs, stride_dos, start, stop, S,
                qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                MASK_QUERIES: tl.constexpr, EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """Accumulate dK (unscaled) and dV of one key block over query tiles [start, stop), transposed (keys x queries).

    Padded query rows load as zeros with zero dO and delta, so their terms vanish exactly; the mask only keeps
    the loads inside the tensors.
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + offs_m0
        if MASK_QUERIES:
            rows = offs_m < S
            q = tl.load(q_ptr + offs_m[:, None] * stride_qs + offs_d[None, :], mask=rows[:, None], other=0.0)
            do = tl.load(do_ptr + offs_m[:, None] * stride_dos + offs_d[None, :], mask=rows[:, None], other=0.0)
            row_max = tl.load(max_ptr + offs_m, mask=rows, other=0.0)
            row_log_sum = tl.load(log_sum_ptr + offs_m, mask=rows, other=0.0)
            delta = tl.load(delta_ptr + offs_m, mask=rows, other=0.0)
        else:
            q = tl.load(q_ptr + offs_m[:, None] * stride_qs + offs_d[None, :])
            do = tl.load(do_ptr + offs_m[:, None] * stride_dos + offs_d[None, :])
            row_max = tl.load(max_ptr + offs_m)
            row_log_sum = tl.load(log_sum_ptr + offs_m)
            delta = tl.load(delta_ptr + offs_m)
        dk, dv = _dkdv_step(dk, dv, k, v, q, do, row_max, row_log_sum, delta, qk_scale, BLOCK_M, BLOCK_N, EXACT,
                            UPCAST)
    return dk, dv


@device_function
def _dkdv_step(dk, dv, k, v, q, do, row_max, row_log_sum, delta, qk_scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """One query tile's share of dK (unscaled) and dV, transposed (keys x queries): P^T dO and dS^T Q."""
    qk_t = _scores(k, tl.trans(q), BLOCK_N, BLOCK_M, UPCAST)
    p_t = _probabilities(qk_t * qk_scale, row_max, row_log_sum, 1, EXACT)
    dv = mma(to_dtype(p_t, do.dtype, UPCAST), do, dv, UPCAST)
    dp_t = _scores(v, tl.trans(do), BLOCK_N, BLOCK_M, UPCAST)
    ds_t = p_t * (dp_t - delta[None, :])
    return mma(to_dtype(ds_t, q.dtype, UPCAST), q, dk, UPCAST), dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, ROW_MAX, ROW_LOG_SUM, DELTA, DK, DV,
                 stride_qb, stride_qs, stride_qh,
                 stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vs, stride_vh,
                 stride_dob, stride_dos, stride_doh,
                 stride_gb, stride_gs, stride_gh,
                 H, S, sm_scale, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
                 UPCAST: tl.constexpr):
    """dK, dV of one key block; DK and DV share the strides (gb, gs, gh) of their contiguous allocation."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_in_seq = (offs_n < S)[:, None]
    k = tl.load(K + _heads_base(pid_bh, H, stride_kb, stride_kh) + offs_n[:, None] * stride_ks + offs_d[None, :],
                mask=key_in_seq, other=0.0)
    v = tl.load(V + _heads_base(pid_bh, H, stride_vb, stride_vh) + offs_n[:, None] * stride_vs + offs_d[None, :],
                mask=key_in_seq, other=0.0)
    q_ptr = Q + _heads_base(pid_bh, H, stride_qb, stride_qh)
    do_ptr = DO + _heads_base(pid_bh, H, stride_dob, stride_doh)
    rows_base = pid_bh.to(tl.int64) * S
    max_ptr = ROW_MAX + rows_base
    log_sum_ptr = ROW_LOG_SUM + rows_base
    delta_ptr = DELTA + rows_base

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    full_stop = (S // BLOCK_M) * BLOCK_M
    dk, dv = _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, max_ptr, log_sum_ptr, delta_ptr, stride_qs, stride_dos,
                         0, full_stop, S, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, False, EXACT, UPCAST)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, max_ptr, log_sum_ptr, delta_ptr, stride_qs, stride_dos,
                         full_stop, S, S, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, True, EXACT, UPCAST)

    g_off = _heads_base(pid_bh, H, stride_gb, stride_gh) + offs_n[:, None] * stride_gs + offs_d[None, :]
    tl.store(DK + g_off, to_dtype(dk * sm_scale, DK.dtype.element_ty, UPCAST), mask=key_in_seq)
    tl.store(DV + g_off, to_dtype(dv, DV.dtype.element_ty, UPCAST), mask=key_in_seq)


@triton.jit
def _dkdv_described_kernel(Q, K, V, DO, ROW_MAX, ROW_LOG_SUM, DELTA, DK, DV,
                           stride_qb, stride_qs, stride_qh,
                           stride_kb, stride_ks, stride_kh,
                           stride_vb, stride_vs, stride_vh,
                           stride_dob, stride_dos, stride_doh,
                           stride_gb, stride_gs, stride_gh,
                           H, S, sm_scale, qk_scale,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           UPCAST: tl.constexpr):
    """:func:`_dkdv_kernel` for bfloat16 tensors that tensor descriptors can read, warp-specialised on Hopper.

    Every tile comes through a descriptor (keys and values before the loop, queries and dO in it; rows past S
    load as zeros, whose terms vanish as in :func:`_dkdv_inner`), so Triton's automatic warp specialisation
    gives the loop a producer warp group issuing the TMA loads and two consumer groups of 4 warps, each owning
    half of the key block. Same products in the same order as the pointer kernel: on an H200 at release shape
    its dK and dV are bitwise the pointer kernel's, in 147 ms against 179 (``results/h200-perf/``
    ``attention-bwd-warp-specialized.log``). Only 2-stage tilings: with 3 stages Triton 3.6's warp-specialised
    pipeline returned NaNs there. The dQ kernel stays on pointers: Triton 3.6 split its loop only with the
    per-row terms read through descriptors too, and that kernel stopped at an illegal instruction on the H200.
    """
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    q_src = _head_descriptor(Q + _heads_base(pid_bh, H, stride_qb, stride_qh), S, stride_qs, BLOCK_M, HEAD_DIM)
    do_src = _head_descriptor(DO + _heads_base(pid_bh, H, stride_dob, stride_doh), S, stride_dos, BLOCK_M, HEAD_DIM)
    k = _head_descriptor(K + _heads_base(pid_bh, H, stride_kb, stride_kh), S, stride_ks, BLOCK_N,
                         HEAD_DIM).load([pid_n * BLOCK_N, 0])
    v = _head_descriptor(V + _heads_base(pid_bh, H, stride_vb, stride_vh), S, stride_vs, BLOCK_N,
                         HEAD_DIM).load([pid_n * BLOCK_N, 0])
    rows_base = pid_bh.to(tl.int64) * S
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in tl.range(0, S, BLOCK_M, warp_specialize=True):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < S
        q = q_src.load([start_m, 0])
        do = do_src.load([start_m, 0])
        row_max = tl.load(ROW_MAX + rows_base + offs_m, mask=rows, other=0.0)
        row_log_sum = tl.load(ROW_LOG_SUM + rows_base + offs_m, mask=rows, other=0.0)
        delta = tl.load(DELTA + rows_base + offs_m, mask=rows, other=0.0)
        dk, dv = _dkdv_step(dk, dv, k, v, q, do, row_max, row_log_sum, delta, qk_scale, BLOCK_M, BLOCK_N, False,
                            UPCAST)
    grads = _heads_base(pid_bh, H, stride_gb, stride_gh)
    _head_descriptor(DK + grads, S, stride_gs, BLOCK_N, HEAD_DIM).store(
        [pid_n * BLOCK_N, 0], to_dtype(dk * sm_scale, DK.dtype.element_ty, UPCAST))
    _head_descriptor(DV + grads, S, stride_gs, BLOCK_N, HEAD_DIM).store(
        [pid_n * BLOCK_N, 0], to_dtype(dv, DV.dtype.element_ty, UPCAST))


@device_function
def _dq_inner(dq, q, do, row_max, row_log_sum, delta, k_ptr, v_ptr, stride_ks, stride_vs, start, stop, S, qk_scale,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
              MASK_KEYS: tl.constexpr, EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """Accumulate dQ (unscaled) of one query block over key tiles [start, stop)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + offs_n0
        k, v = _key_value_tile(k_ptr, v_ptr, stride_ks, stride_vs, offs_n, offs_d, S, MASK_KEYS)
        qk = _scores(q, tl.trans(k), BLOCK_M, BLOCK_N, UPCAST)
        p = _probabilities(qk * qk_scale, row_max, row_log_sum, 0, EXACT)
        if MASK_KEYS:
            p = tl.where((offs_n < S)[None, :], p, 0.0)
        dp = _scores(do, tl.trans(v), BLOCK_M, BLOCK_N, UPCAST)
        ds = p * (dp - delta[:, None])
        dq = mma(to_dtype(ds, k.dtype, UPCAST), k, dq, UPCAST)
    return dq


@triton.jit
def _dq_kernel(Q, K, V, DO, ROW_MAX, ROW_LOG_SUM, DELTA, DQ,
               stride_qb, stride_qs, stride_qh,
               stride_kb, stride_ks, stride_kh,
               stride_vb, stride_vs, stride_vh,
               stride_dob, stride_dos, stride_doh,
               stride_gb, stride_gs, stride_gh,
               H, S, sm_scale, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
               UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in_seq = offs_m < S
    rows = row_in_seq[:, None]
    q = tl.load(Q + _heads_base(pid_bh, H, stride_qb, stride_qh) + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + _heads_base(pid_bh, H, stride_dob, stride_doh) + offs_m[:, None] * stride_dos
                 + offs_d[None, :], mask=rows, other=0.0)
    rows_at = pid_bh.to(tl.int64) * S + offs_m
    row_max = tl.load(ROW_MAX + rows_at, mask=row_in_seq, other=0.0)
    row_log_sum = tl.load(ROW_LOG_SUM + rows_at, mask=row_in_seq, other=0.0)
    delta = tl.load(DELTA + rows_at, mask=row_in_seq, other=0.0)
    k_ptr = K + _heads_base(pid_bh, H, stride_kb, stride_kh)
    v_ptr = V + _heads_base(pid_bh, H, stride_vb, stride_vh)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    full_stop = (S // BLOCK_N) * BLOCK_N
    dq = _dq_inner(dq, q, do, row_max, row_log_sum, delta, k_ptr, v_ptr, stride_ks, stride_vs, 0, full_stop, S,
                   qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, False, EXACT, UPCAST)
    dq = _dq_inner(dq, q, do, row_max, row_log_sum, delta, k_ptr, v_ptr, stride_ks, stride_vs, full_stop, S, S,
                   qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, True, EXACT, UPCAST)
    tl.store(DQ + _heads_base(pid_bh, H, stride_gb, stride_gh) + offs_m[:, None] * stride_gs + offs_d[None, :],
             to_dtype(dq * sm_scale, DQ.dtype.element_ty, UPCAST), mask=rows)


_fwd = _launcher(_fwd_kernel, ("BLOCK_M", "BLOCK_N"), _FWD_ROWS)
_delta = _launcher(_delta_kernel, ("BLOCK_M",), _DELTA_ROWS)
_dkdv = _launcher(_dkdv_kernel, ("BLOCK_M", "BLOCK_N"), _DKDV_ROWS)
_dkdv_described = _launcher(_dkdv_described_kernel, ("BLOCK_M", "BLOCK_N"), _DKDV_DESCRIBED_ROWS)
_dq = _launcher(_dq_kernel, ("BLOCK_M", "BLOCK_N"), _DQ_ROWS)


def _outer_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, sequence, head) strides of a (B, S, H, D) tensor; the head_dim stride is 1 by contract."""
    return t.stride(0), t.stride(1), t.stride(2)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be (batch, seq, heads, head_dim), got shape {tuple(t.shape)}")
        if t.shape != q.shape:
            raise ValueError(f"attention: {name} has shape {tuple(t.shape)}, q has {tuple(q.shape)}; they must match")
        if t.dtype != q.dtype:
            raise ValueError(f"attention: {name} is {t.dtype}, q is {q.dtype}; cast all three to one dtype")
        if t.device != q.device:
            raise ValueError(f"attention: {name} is on {t.device}, q on {q.device}; move all three to one device")
        if t.stride(-1) != 1:
            raise ValueError(f"attention: {name} has head_dim stride {t.stride(-1)}; pass a view with stride 1 "
                             f"along head_dim (e.g. {name}.contiguous())")
    if not INTERPRET and q.device.type != "cuda":
        raise ValueError(f"attention: tensors are on {q.device}; use a CUDA device, or set TRITON_INTERPRET=1 "
                         "before importing h3_triton to run on the CPU interpreter")
    if q.dtype not in DTYPES:
        raise ValueError(f"attention: dtype {q.dtype} is not supported; use one of {DTYPES}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"attention: head_dim {q.shape[-1]} is not supported; use one of {HEAD_DIMS}")
    if q.shape[1] == 0:
        raise ValueError("attention: the sequence is empty (S == 0); softmax over no keys is undefined")


def _contraction(dtype: torch.dtype) -> dict:
    """Launch options: float32 compiles without FMA contraction, so a GPU computes what the interpreter (which
    never fuses) verified: a score scaled and then shifted by the row max rounds like the max did, and a row's
    largest probability is exactly 1 (fused, it is exp2 of the multiply's rounding residual). float32 is the
    correctness path; bfloat16, the speed path, keeps the FMAs."""
    return {"enable_fp_fusion": False} if dtype == torch.float32 else {}


def _described(*tensors: torch.Tensor) -> bool:
    """Whether the kernels read these (B, S, H, D) tensors through tensor descriptors: bfloat16 with every head on
    a 16-byte boundary (any contiguous layout); float32 and other layouts take the pointer kernels."""
    return tensors[0].dtype == torch.bfloat16 and all(aligned(t, _outer_strides(t)) for t in tensors)


def _grid(B: int, H: int, S: int, block: str):
    return lambda meta: (cdiv(S, meta[block]), B * H)


def _forward_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's output and its saved row max and log2 row sum, uninitialised."""
    B, S, H, D = q.shape
    row_max = torch.empty((B * H, S), dtype=torch.float32, device=q.device)
    return torch.empty((B, S, H, D), dtype=q.dtype, device=q.device), row_max, torch.empty_like(row_max)


def _qk_scale(D: int) -> float:
    """The softmax scale 1/sqrt(D) times log2(e): scores are exponentiated in base 2."""
    return (1.0 / math.sqrt(D)) * math.log2(math.e)


def backward_scales(D: int) -> tuple[float, float]:
    """The backward kernels' scale arguments: the softmax scale 1/sqrt(D) (of the gradients) and
    :func:`_qk_scale` (of the recomputed scores)."""
    return 1.0 / math.sqrt(D), _qk_scale(D)


def triton_forward(q, k, v, o, row_max, row_log_sum) -> None:
    """The Triton forward kernel into ``o`` and the row statistics, whatever :func:`attention_hopper.applies` says
    (the reference the Hopper kernel is compared with bitwise)."""
    B, S, H, D = q.shape
    described = _described(q, k, v, o)
    if described:
        set_scratch_allocator()
    _fwd(
        _grid(B, H, S, "BLOCK_M"),
        q, k, v, o, row_max, row_log_sum,
        *_outer_strides(q), *_outer_strides(k), *_outer_strides(v), *_outer_strides(o),
        H, S, _qk_scale(D),
        HEAD_DIM=D, DESCRIBED=described, UPCAST=INTERPRET, **_contraction(q.dtype),
        branches={"keys": lambda meta: paths.tiles(S, meta["BLOCK_N"])},
    )


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, row_max, row_log_sum = _forward_outputs(q)
        if attention_hopper.applies(q) and _described(q, k, v, o):  # else triton_forward checks the layout
            set_scratch_allocator()
            attention_hopper.forward(q, k, v, o, row_max, row_log_sum, _qk_scale(q.shape[-1]))
        else:
            triton_forward(q, k, v, o, row_max, row_log_sum)
        ctx.save_for_backward(q, k, v, o, row_max, row_log_sum)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, row_max, row_log_sum = ctx.saved_tensors
        B, S, H, D = q.shape
        if do.stride(-1) != 1:  # autograd may hand a broadcast gradient (stride 0); the kernels need stride 1
            do = do.contiguous()
        delta = row_delta(o, do)
        dq = torch.empty((B, S, H, D), dtype=q.dtype, device=q.device)
        dk = torch.empty_like(dq)
        dv = torch.empty_like(dq)
        saved = (q, k, v, do, row_max, row_log_sum, delta)
        if attention_hopper.applies(q) and _described(q, k, v, do, dk):  # else triton_backward checks the layout
            set_scratch_allocator()
            attention_hopper.backward(*saved, dq, dk, dv, *backward_scales(D))
        else:
            triton_backward(*saved, dq, dk, dv)
        return dq, dk, dv


def row_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """delta = rowsum(dO * O) of every (batch x head, query row), float32 (:func:`_delta_kernel`)."""
    B, S, H, D = o.shape
    delta = torch.empty((B * H, S), dtype=torch.float32, device=o.device)
    _delta(
        _grid(B, H, S, "BLOCK_M"),
        o, do, delta, *_outer_strides(o), *_outer_strides(do), H, S,
        HEAD_DIM=D, UPCAST=INTERPRET, **_contraction(o.dtype),
    )
    return delta


def _backward_strides(q, k, v, do, grad) -> tuple:
    """The backward kernels' stride and scale arguments; every gradient shares ``grad``'s strides."""
    B, S, H, D = q.shape
    return (*_outer_strides(q), *_outer_strides(k), *_outer_strides(v), *_outer_strides(do), *_outer_strides(grad),
            H, S, *backward_scales(D))


def triton_backward(q, k, v, do, row_max, row_log_sum, delta, dq, dk, dv) -> None:
    """The Triton kernels' dQ, dK and dV (``dk`` and ``dv`` one contiguous allocation's strides), whatever
    :func:`attention_hopper.applies` says (the reference the Hopper kernel is compared with: dK and dV bitwise,
    dQ within a bfloat16 rounding)."""
    saved = (q, k, v, do, row_max, row_log_sum, delta)
    triton_dkdv(*saved, dk, dv)
    triton_dq(*saved, dq)


def triton_dq(q, k, v, do, row_max, row_log_sum, delta, dq) -> None:
    """The Triton dQ kernel into ``dq`` (:func:`triton_backward`'s second kernel)."""
    B, S, H, D = q.shape
    _dq(
        _grid(B, H, S, "BLOCK_M"),
        q, k, v, do, row_max, row_log_sum, delta, dq, *_backward_strides(q, k, v, do, dq),
        HEAD_DIM=D, EXACT=q.dtype == torch.float32, UPCAST=INTERPRET, **_contraction(q.dtype),
        branches={"keys": lambda meta: paths.tiles(S, meta["BLOCK_N"])},
    )


def triton_dkdv(q, k, v, do, row_max, row_log_sum, delta, dk, dv) -> None:
    """The Triton dK/dV kernel into ``dk`` and ``dv`` (one contiguous allocation's strides), whatever
    :func:`attention_hopper.applies` says (the Hopper kernel's dK and dV are compared with it bitwise)."""
    B, S, H, D = q.shape
    common = _backward_strides(q, k, v, do, dk)
    if _described(q, k, v, do, dk):
        set_scratch_allocator()
        _dkdv_described(
            _grid(B, H, S, "BLOCK_N"),
            q, k, v, do, row_max, row_log_sum, delta, dk, dv, *common, HEAD_DIM=D, UPCAST=INTERPRET,
        )
    else:
        _dkdv(
            _grid(B, H, S, "BLOCK_N"),
            q, k, v, do, row_max, row_log_sum, delta, dk, dv, *common,
            HEAD_DIM=D, EXACT=q.dtype == torch.float32, UPCAST=INTERPRET, **_contraction(q.dtype),
            branches={"queries": lambda meta: paths.tiles(S, meta["BLOCK_M"])},
        )


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention of (B, S, H, D) ``q``, ``k``, ``v`` with scale 1/sqrt(D); returns (B, S, H, D) contiguous.

    Equals ``scaled_dot_product_attention`` on the (B, H, S, D) transposes up to rounding; differentiable in all
    three inputs. D must be 32, 64 or 128; dtype bfloat16 or float32; outer strides are free, head_dim stride 1.
    """
    _check(q, k, v)
    return _FlashAttention.apply(q, k, v)
