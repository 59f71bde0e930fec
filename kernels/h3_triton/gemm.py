"""The GEMMs of the H3 blocks: ``linear`` (q/k/v, out, ffn up/down) and ``silu_linear`` (the AdaLN modulation).

One tiled kernel computes ``C = act(A) @ B (+ bias) (* silu'(Z))`` with float32 accumulation and grouped
(swizzled) program order, so programs running together share operand panels in L2. Every product of both functions
is this kernel with other strides: the forward reads the weight (N, K) as B = W^T, the input gradient is
dY @ W, the weight gradient is written as dW^T = act(X)^T @ dY (the transpose lives only in the strides), and
the bias gradient is ones(1, M) @ dY, a column sum with the same fixed-order reduction (over few rows summed
by the weight gradient's kernel as it reads dY). ``silu_linear`` fuses the SiLU into the load of A (forward and
weight gradient) and its derivative into the epilogue (input gradient), so the tiny activation never makes a
round trip through memory and the weight is streamed once.

Two shapes of the AdaLN projection (3 rows at release) get kernels of their own, each reducing in an order that
depends on the shape alone: a skinny product with a long K (its input gradient, K = 96,768) is split K, chunks of
4,096 reduced in parallel and their float32 sums added in chunk order by a second kernel; a product over at most
16 reduction indices (its weight gradient over the rows, its bias gradient summed on the way) is a sum of outer
products, one multiply-add per element and index. On an H200 they took the AdaLN's forward+backward from 1.312 to
0.641 ms at the first tilings (``benchmarks/results/h200-perf/silu-linear-*.log``). When both the input and the
weight need gradients (the AdaLN in training, the text tokens' projections), one kernel does the whole backward
over at most 16 rows with those same bits (:func:`_few_rows_backward_kernel`): W is read once for dX while dW is
written beside it, and the chunk sums are added by the last program of each column tile, in chunk order, so three
launches become one. The step was host-bound, each Triton launch costing the host more than these kernels' GPU
time: on an H200 the AdaLN's forward+backward went from 0.56x to 0.74x the provider's in the release bench, though
its GPU time first grew (0.525 against 0.467 ms at the first tilings: the one kernel reached 50% of the DRAM
bandwidth where the split-K input gradient alone reached 90%), then fell to 0.408 ms (the provider's 0.404) once it
formed act(x) once and dW transposed (``benchmarks/results/h200-perf/silu-linear/``).

Rows: an input (..., K) is addressed without copies when its leading dimensions collapse to at most two
strides (``outer``, ``inner``), which covers 2-D and 3-D slices of larger buffers. The reduction over rows of
the weight and bias gradients loops over outer blocks and then inner rows in a fixed order; the one atomic (the
few-rows backward's counter) decides only which program adds the chunks, not their order, so results are bitwise
reproducible.

bfloat16 products of large matrices (the block's projections, forward and backward) take a second kernel when
their layouts allow it, the Hopper recipe: operands read through tensor descriptors (TMA bulk copies into shared
memory, out-of-range rows and columns filled with zeros, so no masks and no address arithmetic per element) and
one program per SM looping over output tiles in the same grouped order, so the epilogue of one tile overlaps the
loads of the next. On an H200 it reaches 0.93x cuBLAS at the q/k/v shape of the release model where the pointer
kernel reaches 0.72x (``benchmarks/results/h200-perf/gemm-variants.log``). Its reduction along K is the same
64-deep steps in the same order; it covers every product whose operands and output each have one unit stride
and 16-byte aligned rows (:func:`_descriptor_layout`); the rest (strided views, split rows, the SiLU fusions,
float32) run the pointer kernel.
"""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from h3_triton import paths
from h3_triton.interpret import INTERPRET, device_function, mma, to_dtype
from h3_triton.launch import cdiv, stream_of
from h3_triton.tma import aligned, program_slots, set_scratch_allocator
from h3_triton.tuning import Launcher, configs

DTYPES = (torch.bfloat16, torch.float32)

# Up to this many rows the "skinny" tiles (16 rows) apply: the AdaLN projection has one row per timestep and
# the bias gradient one row in all, where 128-row tiles would be almost all padding.
_SKINNY_ROWS = 16
# A skinny product whose (unsplit) K exceeds two chunks is split K: its chunks of _K_CHUNK (a multiple of every
# tiling's BLOCK_K) are reduced by parallel programs, their float32 sums added in chunk order by a second kernel.
# The AdaLN input gradient (3 rows, K = 96,768, N = 2,688 at release) otherwise runs 42 programs on 132 SMs. The
# chunks depend on K alone, so the bits do not depend on the tiling.
_K_CHUNK = 4096
_CHUNK_SUM_N = 128


@device_function
def _row_offsets(rows, inner, s_outer, s_inner, SPLIT: tl.constexpr):
    """int64 offsets of row indices laid out as ``rows // inner`` blocks of ``inner`` rows.

    The unsplit case skips the division so Triton still sees contiguous rows (vectorised loads of A^T). ``rows``
    may be one index (a loop variable: a plain int under the interpreter).
    """
    rows = tl.cast(rows, tl.int64)
    if SPLIT:
        return (rows // inner) * s_outer + (rows % inner) * s_inner
    else:
        return rows * s_inner


@device_function
def _grouped_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row block, column block) of output tile number ``tile`` in grouped order: GROUP_M row blocks take each
    column block in turn, so programs running together share operand panels in L2."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def _gemm_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, z_ptr,
    M, N, M_INNER, K_OUTER, K_INNER, K_CHUNK,
    s_a_mo, s_a_mi, s_a_ko, s_a_ki,
    s_b_ko, s_b_ki, s_b_n,
    s_c_split, s_c_mo, s_c_mi, s_c_n,
    s_bias,
    s_z_mo, s_z_mi, s_z_n,
    M_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, A_SILU: tl.constexpr, SILU_GRAD: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) tile of C; the K axis is K_OUTER blocks of K_INNER, reduced in order.

    With K_CHUNK < K_INNER (split K, ``K_OUTER`` 1) program (tile, j) reduces the K_CHUNK entries from j * K_CHUNK
    and stores its float32 sum at ``c_ptr + j * s_c_split``, for :func:`_chunk_sum_kernel`.
    INTERPRETED selects the interpreter's workarounds: float32 operands for bfloat16 dots (``mma``'s UPCAST)
    and rounding on the bits (``to_dtype``).
    """
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    chunk = tl.program_id(1).to(tl.int64)
    k_start = chunk * K_CHUNK
    k_len = tl.minimum(K_INNER - k_start, K_CHUNK)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    in_m = rm < M
    in_n = rn < N

    a_outer = a_ptr + _row_offsets(rm, M_INNER, s_a_mo, s_a_mi, M_SPLIT)[:, None] + (k_start + rk)[None, :] * s_a_ki
    b_outer = b_ptr + rn.to(tl.int64)[None, :] * s_b_n + (k_start + rk)[:, None] * s_b_ki
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K_OUTER):
        a_ptrs = a_outer
        b_ptrs = b_outer
        for k in range(0, k_len, BLOCK_K):
            in_k = rk < k_len - k
            # Masked K entries must be zero in BOTH operands: 0 * NaN from a neighbour would poison the sum.
            a = tl.load(a_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0)
            if A_SILU:
                a = a.to(tl.float32)
                a = to_dtype(a * tl.sigmoid(a), b.dtype, INTERPRETED)
            acc = mma(a, b, acc, INTERPRETED)
            a_ptrs += BLOCK_K * s_a_ki
            b_ptrs += BLOCK_K * s_b_ki
        a_outer += s_a_ko
        b_outer += s_b_ko

    _finish_tile(acc, rm, rn, M, N, M_INNER, c_ptr + chunk * s_c_split, s_c_mo, s_c_mi, s_c_n, bias_ptr, s_bias,
                 z_ptr, s_z_mo, s_z_mi, s_z_n, M_SPLIT, HAS_BIAS, SILU_GRAD, INTERPRETED)


@device_function
def _finish_tile(acc, rm, rn, M, N, M_INNER, c_ptr, s_c_mo, s_c_mi, s_c_n, bias_ptr, s_bias, z_ptr, s_z_mo, s_z_mi,
                 s_z_n, M_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_GRAD: tl.constexpr,
                 INTERPRETED: tl.constexpr):
    """The epilogue of a float32 tile ``acc`` of rows ``rm`` and columns ``rn``: (+ bias) (* silu'(z)), rounded
    once to C's dtype and stored."""
    in_n = rn < N
    in_c = (rm < M)[:, None] & in_n[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn * s_bias, mask=in_n, other=0.0).to(tl.float32)[None, :]
    if SILU_GRAD:
        z_ptrs = z_ptr + _row_offsets(rm, M_INNER, s_z_mo, s_z_mi, M_SPLIT)[:, None] + rn[None, :] * s_z_n
        z = tl.load(z_ptrs, mask=in_c, other=0.0).to(tl.float32)
        sig = tl.sigmoid(z)
        acc = acc * (sig * (1.0 + z * (1.0 - sig)))
    c_ptrs = c_ptr + _row_offsets(rm, M_INNER, s_c_mo, s_c_mi, M_SPLIT)[:, None] + rn.to(tl.int64)[None, :] * s_c_n
    tl.store(c_ptrs, to_dtype(acc, c_ptr.dtype.element_ty, INTERPRETED), mask=in_c)


@triton.jit
def _chunk_sum_kernel(
    partial_ptr, c_ptr, bias_ptr, z_ptr,
    M, N, M_INNER, CHUNKS,
    s_c_mo, s_c_mi, s_c_n,
    s_bias,
    s_z_mo, s_z_mi, s_z_n,
    M_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_GRAD: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """C = the sum of the split-K partials (CHUNKS, M, N) float32 contiguous, added in chunk order, and the
    epilogue (:func:`_finish_tile`)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_p = (rm < M)[:, None] & (rn < N)[None, :]
    p_ptrs = partial_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, CHUNKS):
        acc += tl.load(p_ptrs, mask=in_p, other=0.0)
        p_ptrs += M * N
    _finish_tile(acc, rm, rn, M, N, M_INNER, c_ptr, s_c_mo, s_c_mi, s_c_n, bias_ptr, s_bias,
                 z_ptr, s_z_mo, s_z_mi, s_z_n, M_SPLIT, HAS_BIAS, SILU_GRAD, INTERPRETED)


@triton.jit
def _outer_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, z_ptr, sums_ptr,
    M, N, M_INNER, K, K_INNER,
    s_a_mo, s_a_mi, s_a_ko, s_a_ki,
    s_b_ko, s_b_ki, s_b_n,
    s_c_mo, s_c_mi, s_c_n,
    s_bias,
    s_z_mo, s_z_mi, s_z_n,
    s_sums,
    M_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, A_SILU: tl.constexpr, B_SILU: tl.constexpr,
    SILU_GRAD: tl.constexpr, SUM_A: tl.constexpr, SUM_B: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) tile of C = act(A) @ act(B) for a short K (at most _SKINNY_ROWS): a sum of K outer
    products, one multiply-add per element and index of K, in index order, whatever the tiling. K's indices are
    rows ``K // K_INNER`` blocks of ``K_INNER`` (a weight gradient's reduction over few rows); the SiLU applies to
    A or B (``A_SILU``, ``B_SILU``). ``SUM_A`` (``SUM_B``) also stores A's row sums (B's column sums) over K, of
    the loaded values in index order, at ``sums_ptr``: a bias gradient beside its weight gradient, written by the
    programs of the first column (row) block."""
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // num_n
    pid_n = tl.program_id(0) % num_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = rm < M
    in_n = rn < N
    a_rows = a_ptr + _row_offsets(rm, M_INNER, s_a_mo, s_a_mi, M_SPLIT)
    b_cols = b_ptr + rn.to(tl.int64) * s_b_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a_sums = tl.zeros((BLOCK_M,), dtype=tl.float32)
    b_sums = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, K):
        k_offset = (k // K_INNER).to(tl.int64)
        a = tl.load(a_rows + k_offset * s_a_ko + (k % K_INNER) * s_a_ki, mask=in_m, other=0.0)
        b = tl.load(b_cols + k_offset * s_b_ko + (k % K_INNER) * s_b_ki, mask=in_n, other=0.0)
        if SUM_A:
            a_sums += a.to(tl.float32)
        if SUM_B:
            b_sums += b.to(tl.float32)
        if A_SILU:
            a = a.to(tl.float32)
            a = to_dtype(a * tl.sigmoid(a), b.dtype, INTERPRETED)
        if B_SILU:
            b = b.to(tl.float32)
            b = to_dtype(b * tl.sigmoid(b), a.dtype, INTERPRETED)
        acc += a.to(tl.float32)[:, None] * b.to(tl.float32)[None, :]
    if SUM_A:
        if pid_n == 0:
            tl.store(sums_ptr + rm * s_sums, to_dtype(a_sums, sums_ptr.dtype.element_ty, INTERPRETED), mask=in_m)
    if SUM_B:
        if pid_m == 0:
            tl.store(sums_ptr + rn * s_sums, to_dtype(b_sums, sums_ptr.dtype.element_ty, INTERPRETED), mask=in_n)
    _finish_tile(acc, rm, rn, M, N, M_INNER, c_ptr, s_c_mo, s_c_mi, s_c_n, bias_ptr, s_bias,
                 z_ptr, s_z_mo, s_z_mi, s_z_n, M_SPLIT, HAS_BIAS, SILU_GRAD, INTERPRETED)


@triton.jit
def _few_rows_backward_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, dbias_ptr, partial_ptr, count_ptr,
    N, K, R_INNER, N_CHUNK, CHUNKS,
    s_dy_mo, s_dy_mi, s_dy_n,
    s_x_mo, s_x_mi, s_x_k,
    s_w_n, s_w_k,
    s_dx_mo, s_dx_mi, s_dx_k,
    s_dw_n, s_dw_k,
    s_dbias,
    R: tl.constexpr, M_SPLIT: tl.constexpr, SILU: tl.constexpr, HAS_DBIAS: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The whole backward of ``y = act(x) @ W^T (+ b)`` over R <= _SKINNY_ROWS rows in one pass over W: program
    (k, j) takes columns k * BLOCK_K.. of W and chunk j of its N rows (N_CHUNK of them, _K_CHUNK or all N).

    For each 64-row step of its chunk it adds dY[:, step] @ W[step, columns] into its dX tile (the skinny kernel's
    64-deep steps, in the same order) and writes dW[step, columns] = sum over r of dY[r, step]^T act(x[r, columns]),
    one multiply-add per row in row order (the outer-product kernel's arithmetic); the programs of the first column
    tile also write dbias = dY's column sums (``HAS_DBIAS``). With one chunk its dX tile is finished (* silu'(x))
    and stored; with CHUNKS > 1 it stores its float32 partial, and the last program of the column tile to finish
    (a counter per tile, zero before the launch and reset by that program) adds the CHUNKS partials in chunk order
    and finishes dX: the split-K kernel and its chunk sum, bit for bit, in one launch.

    R is a constexpr (a kernel per row count, at most 16): the loop over rows unrolls, so the loop over W's rows
    holds no loop of its own (with a runtime R, 534 us on an H200 at the AdaLN's release shape, 40% of the DRAM
    bandwidth; with R unrolled 427 us, 50%, both at 128 columns, 4 warps, 3 stages). act(x) is formed once, before
    that loop, and dW's tile is formed transposed (columns by rows), whose layout Triton stores without a pass
    through shared memory: on an H200 the AdaLN's forward+backward took 0.425 ms of GPU time at that tiling against
    0.566 with act(x) reloaded every step into a rows-by-columns tile, the same bits
    (``benchmarks/few_rows_variants.py``, the flags ``TRANS+XT``: ``results/h200-perf/silu-linear/``).
    """
    STEP: tl.constexpr = 64
    ROWS: tl.constexpr = 16
    pid_k = tl.program_id(0)
    chunk = tl.program_id(1).to(tl.int64)
    n_start = chunk * N_CHUNK
    n_len = tl.minimum(N - n_start, N_CHUNK)
    rr = tl.arange(0, ROWS)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rs = tl.arange(0, STEP)
    in_r = rr < R
    in_k = rk < K
    dy_rows = dy_ptr + _row_offsets(rr, R_INNER, s_dy_mo, s_dy_mi, M_SPLIT)
    w_cols = w_ptr + rk.to(tl.int64) * s_w_k
    dw_cols = dw_ptr + rk.to(tl.int64) * s_dw_k
    # act(x) for every row, once: each step takes row r from this tile (a sum of its value and zeros, exact)
    xs = tl.load(x_ptr + _row_offsets(rr, R_INNER, s_x_mo, s_x_mi, M_SPLIT)[:, None] + rk[None, :] * s_x_k,
                 mask=in_r[:, None] & in_k[None, :], other=0.0)
    if SILU:
        xs = xs.to(tl.float32)
        xs = to_dtype(xs * tl.sigmoid(xs), dy_ptr.dtype.element_ty, INTERPRETED)
    xs = xs.to(tl.float32)
    acc = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    for step in range(0, n_len, STEP):
        n = n_start + step + rs
        in_n = rs < n_len - step
        g = tl.load(dy_rows[:, None] + n[None, :] * s_dy_n, mask=in_r[:, None] & in_n[None, :], other=0.0)
        w = tl.load(w_cols[None, :] + n[:, None] * s_w_n, mask=in_n[:, None] & in_k[None, :], other=0.0)
        acc = mma(g, w, acc, INTERPRETED)
        dw_t = tl.zeros((BLOCK_K, STEP), dtype=tl.float32)  # dW's tile transposed: columns by rows
        sums = tl.zeros((STEP,), dtype=tl.float32)
        for r in tl.static_range(R):
            g_r = tl.load(dy_ptr + _row_offsets(r, R_INNER, s_dy_mo, s_dy_mi, M_SPLIT) + n * s_dy_n, mask=in_n,
                          other=0.0).to(tl.float32)
            x_r = tl.sum(tl.where(rr[:, None] == r, xs, 0.0), axis=0)
            dw_t += x_r[:, None] * g_r[None, :]
            sums += g_r
        tl.store(dw_cols[:, None] + n.to(tl.int64)[None, :] * s_dw_n,
                 to_dtype(dw_t, dw_ptr.dtype.element_ty, INTERPRETED), mask=in_k[:, None] & in_n[None, :])
        if HAS_DBIAS:
            if pid_k == 0:
                tl.store(dbias_ptr + n * s_dbias, to_dtype(sums, dbias_ptr.dtype.element_ty, INTERPRETED), mask=in_n)
    _finish_chunks(acc, pid_k, chunk, rr, rk, R, K, R_INNER, CHUNKS, partial_ptr, count_ptr,
                   dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, x_ptr, s_x_mo, s_x_mi, s_x_k, M_SPLIT, SILU, INTERPRETED)


@device_function
def _finish_chunks(acc, pid_k, chunk, rr, rk, R: tl.constexpr, K, R_INNER, CHUNKS, partial_ptr, count_ptr,
                   dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, x_ptr, s_x_mo, s_x_mi, s_x_k,
                   M_SPLIT: tl.constexpr, SILU: tl.constexpr, INTERPRETED: tl.constexpr):
    """dX of :func:`_few_rows_backward_kernel`'s program (column tile ``pid_k``, chunk ``chunk``) from its float32
    ``acc``: finished at once with one chunk; else its partial stored, and the column tile's last program to finish
    adds the CHUNKS partials in chunk order and finishes them."""
    in_dx = (rr < R)[:, None] & (rk < K)[None, :]
    if CHUNKS > 1:
        tile = rr[:, None] * K + rk[None, :]
        tl.store(partial_ptr + chunk * R * K + tile, acc, mask=in_dx)
        # Every thread's partial is written before the counter moves (release), and read after it (acquire).
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + pid_k, 1, sem="acq_rel", scope="gpu") == CHUNKS - 1:
            tl.debug_barrier()
            acc = tl.zeros_like(acc)
            for j in range(0, CHUNKS):
                acc += tl.load(partial_ptr + j * R * K + tile, mask=in_dx, other=0.0, cache_modifier=".cg")
            _finish_dx(acc, rr, rk, R, K, R_INNER, dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, x_ptr, s_x_mo, s_x_mi, s_x_k,
                       M_SPLIT, SILU, INTERPRETED)
            tl.store(count_ptr + pid_k, 0)
    else:
        _finish_dx(acc, rr, rk, R, K, R_INNER, dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, x_ptr, s_x_mo, s_x_mi, s_x_k,
                   M_SPLIT, SILU, INTERPRETED)


@device_function
def _finish_dx(acc, rr, rk, R, K, R_INNER, dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, x_ptr, s_x_mo, s_x_mi, s_x_k,
               M_SPLIT: tl.constexpr, SILU: tl.constexpr, INTERPRETED: tl.constexpr):
    """dX = acc (* silu'(x) under ``SILU``), stored in dX's dtype: :func:`_finish_tile`'s epilogue, no bias."""
    _finish_tile(acc, rr, rk, R, K, R_INNER, dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, dx_ptr, 0,
                 x_ptr, s_x_mo, s_x_mi, s_x_k, M_SPLIT, False, SILU, INTERPRETED)


@device_function
def _operand_descriptor(ptr, MN, K, stride, TRANSPOSED: tl.constexpr, BLOCK_MN: tl.constexpr, BLOCK_K: tl.constexpr):
    """A tensor descriptor of an (MN, K) operand stored (MN, K), or (K, MN) when ``TRANSPOSED``, with row stride
    ``stride``; its tiles are read by :func:`_tma_operand`."""
    if TRANSPOSED:
        return tl.make_tensor_descriptor(ptr, shape=[K, MN], strides=[stride, 1], block_shape=[BLOCK_K, BLOCK_MN])
    else:
        return tl.make_tensor_descriptor(ptr, shape=[MN, K], strides=[stride, 1], block_shape=[BLOCK_MN, BLOCK_K])

@device_function
def _tma_operand(desc, offset_mn, offset_k, TRANSPOSED: tl.constexpr):
    """The (MN, K) tile of an operand stored (MN, K), or (K, MN) when ``TRANSPOSED``, as (MN, K)."""
    if TRANSPOSED:
        return desc.load([offset_k, offset_mn]).T
    else:
        return desc.load([offset_mn, offset_k])


@triton.jit
def _tma_gemm_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr,
    M, N, K, s_a, s_b, s_c, s_bias,
    A_T: tl.constexpr, B_T: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr, NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """C (M, N) row-major = A @ B (+ bias); A is stored (M, K) or, ``A_T``, (K, M); B is stored (N, K) or,
    ``B_T``, (K, N); ``s_*`` are the row strides of those stored matrices. Persistent: ``NUM_SMS`` programs
    walk the output tiles in the pointer kernel's grouped order."""
    a_desc = _operand_descriptor(a_ptr, M, K, s_a, A_T, BLOCK_M, BLOCK_K)
    b_desc = _operand_descriptor(b_ptr, N, K, s_b, B_T, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[s_c, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = _tma_operand(a_desc, off_m, ki * BLOCK_K, A_T)
            b = _tma_operand(b_desc, off_n, ki * BLOCK_K, B_T)
            acc = mma(a, b.T, acc, INTERPRETED)
        if HAS_BIAS:
            rn = off_n + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + rn * s_bias, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        c_desc.store([off_m, off_n], to_dtype(acc, c_ptr.dtype.element_ty, INTERPRETED))


def _launcher(bf16_rows: list[tuple[int, int, int, int]], fp32_rows: list[tuple[int, int, int, int]],
              interpreter_block_m: int) -> Launcher:
    """Tuned on the GEMM's sizes over rows of (BLOCK_M, BLOCK_N, num_warps, num_stages) per dtype of B (A is
    float32 under ``silu_linear``'s SiLU, B has the product's dtype), preferred first.

    BLOCK_K is 64 in every config, so the reduction order along K, and thus the result bits, do not depend on
    which config the tuner picks. float32 tiles take twice the shared memory per element, so they get their own
    smaller rows (the bfloat16 ones do not fit 227 KiB); float32 is a correctness path, not a speed path.
    Under the interpreter, fixed tiles 64 deep and 128 wide: its cost is per program and per step, not per
    element, and ragged test sizes still end in a partial tile along every axis.
    """
    fixed = {"BLOCK_K": 64, "GROUP_M": 8}
    return Launcher(
        _gemm_kernel,
        {2: configs(bf16_rows, ("BLOCK_M", "BLOCK_N"), **fixed), 4: configs(fp32_rows, ("BLOCK_M", "BLOCK_N"), **fixed)},
        key=["M", "N", "K_OUTER", "K_INNER", "K_CHUNK"],
        interpreter={"BLOCK_M": interpreter_block_m, "BLOCK_N": 128, **fixed},
        sized_by="b_ptr",
    )


_TILED = _launcher(
    [(128, 256, 8, 3), (256, 128, 8, 3), (128, 256, 8, 4), (128, 128, 8, 3), (128, 128, 4, 4), (128, 128, 8, 4)],
    [(128, 64, 8, 3), (64, 128, 8, 3), (64, 64, 4, 3)],
    interpreter_block_m=128,
)
# The TMA kernel, bfloat16 only: 128x256 with 3 stages is the measured best at the release q/k/v shape (0.93x
# cuBLAS on an H200); 4 stages of it need 262 KB of shared memory, past the 227 KiB an SM has.
_DESCRIBED = Launcher(
    _tma_gemm_kernel,
    {2: configs([(128, 256, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4)], ("BLOCK_M", "BLOCK_N"),
                BLOCK_K=64, GROUP_M=8)},
    key=["M", "N", "K", "A_T", "B_T"],
    interpreter={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
)
# GEMV-like: memory bound, a 16-row tile spans all rows and each program streams a BLOCK_N slice of B. First the
# tuner's pick at the AdaLN's release shapes on an H200 (its forward 0.155 ms against 0.211 ms at 16 x 64).
_SKINNY = _launcher(
    [(16, 256, 4, 3), (16, 64, 4, 3), (16, 64, 4, 5), (16, 128, 4, 3), (16, 128, 4, 5), (16, 256, 8, 4)],
    [(16, 64, 4, 3), (16, 128, 4, 3)],
    interpreter_block_m=_SKINNY_ROWS,
)

# Products whose K is at most _SKINNY_ROWS (a weight gradient over few rows: the AdaLN's is 2,688 x 96,768 over 3
# rows at release) write far more than they read: K outer products summed in registers, no padding of K to a
# 64-deep MMA step, C written in tiles as wide as its contiguous axis allows. First the fastest in GPU time of 15
# tilings at the AdaLN's release shape on an H200 (benchmarks/gemm_tilings.py: 0.481 ms for silu_linear's
# forward+backward against 0.540 ms at 64 x 256).
_OUTER = Launcher(
    _outer_kernel,
    {size: configs([(128, 128, 4, 1), (64, 256, 4, 1), (32, 256, 4, 1)], ("BLOCK_M", "BLOCK_N")) for size in (2, 4)},
    key=["M", "N", "K", "K_INNER", "s_c_mi", "s_c_n"],
    interpreter={"BLOCK_M": 128, "BLOCK_N": 128},
    sized_by="b_ptr",
)


# The whole backward over few rows in one launch (the AdaLN's: W 96,768 x 2,688 read once for dX while dW is
# written beside it): a tile of BLOCK_K columns per program. In GPU time at the AdaLN's release shape on an H200,
# with its forward (benchmarks/results/h200-perf/silu-linear/few-rows-variants-2.log, TRANS+XT): 128 x 4 warps x
# 2 stages 0.408 ms, 128 x 8 x 3 0.417, 128 x 4 x 3 0.425 (0.424-0.427 in three runs; the same SASS as 2 stages,
# which declare half its shared memory), 64 x 4 x 3 0.436, 256 x 8 x 3 0.464 (the provider 0.404). float32 takes
# half as wide a tile (its W step and dW tile double in bytes).
_FEW_ROWS_BACKWARD = Launcher(
    _few_rows_backward_kernel,
    {2: configs([(128, 4, 2), (128, 8, 3), (128, 4, 3), (64, 4, 3), (256, 8, 3)], ("BLOCK_K",)),
     4: configs([(64, 4, 3), (128, 8, 2)], ("BLOCK_K",))},
    key=["N", "K", "CHUNKS"],
    interpreter={"BLOCK_K": 128},
    sized_by="w_ptr",
)


class _Axis(NamedTuple):
    """A GEMM axis of ``count`` indices, addressed as ``count // inner`` blocks of ``inner``."""

    count: int
    inner: int

    @staticmethod
    def flat(count: int) -> "_Axis":
        return _Axis(count, max(count, 1))


class _Mat(NamedTuple):
    """A strided matrix view: ``rows`` and ``cols`` are (outer, inner) stride pairs of its two axes."""

    t: torch.Tensor
    rows: tuple[int, int]
    cols: tuple[int, int]

    @property
    def T(self) -> "_Mat":
        return _Mat(self.t, self.cols, self.rows)

    @staticmethod
    def of_weight(w: torch.Tensor) -> "_Mat":
        return _Mat(w, (0, w.stride(0)), (0, w.stride(1)))


def _row_breaks(t: torch.Tensor) -> set[int]:
    """Leading dimensions of ``t`` after which the rows cannot continue with one stride (none where ``t`` is
    contiguous and not empty: checked at once, the common case)."""
    if t.is_contiguous() and t.numel():
        return set()
    lead = [i for i in range(t.dim() - 1) if t.shape[i] != 1]
    return {a for a, b in zip(lead, lead[1:]) if t.stride(a) != t.stride(b) * t.shape[b]}


def _row_split(*ts: torch.Tensor) -> tuple[_Axis, list[_Mat]]:
    """The rows shared by tensors of one leading shape, and each tensor as a (rows, last dim) matrix.

    The tensors must break their rows at no more than one common place; the caller checks that first.
    """
    lead = [i for i in range(ts[0].dim() - 1) if ts[0].shape[i] != 1]
    count = math.prod(ts[0].shape[:-1])
    breaks = set().union(*map(_row_breaks, ts))
    if count == 0:
        return _Axis(0, 1), [_Mat(t, (0, 0), (0, t.stride(-1))) for t in ts]
    if not breaks:
        return _Axis.flat(count), [_Mat(t, (0, t.stride(lead[-1]) if lead else 0), (0, t.stride(-1))) for t in ts]
    (split,) = breaks
    inner = math.prod(ts[0].shape[split + 1:-1])
    return _Axis(count, inner), [_Mat(t, (t.stride(split), t.stride(lead[-1])), (0, t.stride(-1))) for t in ts]


def _rows_compatible(*ts: torch.Tensor) -> bool:
    return len(set().union(*map(_row_breaks, ts))) <= 1


def _descriptor_layout(mat: _Mat) -> tuple[bool, int] | None:
    """(whether it is row-major, the stride of its other axis) for a matrix a tensor descriptor can read; None
    if neither axis has unit stride or it is not 16-byte aligned."""
    for row_major, (unit, other) in ((True, (mat.cols[1], mat.rows[1])), (False, (mat.rows[1], mat.cols[1]))):
        if unit == 1:
            return (row_major, other) if aligned(mat.t, (other,)) else None
    return None


def _described_matmul(a: _Mat, b: _Mat, c: _Mat, m: _Axis, n: int, k: _Axis, bias: torch.Tensor | None) -> bool:
    """``c = a @ b (+ bias)`` through the TMA kernel if it suits the operands (see the module docstring);
    False, having done nothing, if not. A column-major ``c`` is computed as the product c^T = b^T a^T."""
    if c.t.dtype != torch.bfloat16 or m.inner != m.count or k.inner != k.count:
        return False
    if c.cols[1] != 1 and bias is None:
        a, b, c, m, n = b.T, a.T, c.T, _Axis.flat(n), m.count
    if m.count <= _SKINNY_ROWS:
        return False
    layouts = [_descriptor_layout(x) for x in (a, b, c)]
    if None in layouts or not layouts[2][0]:
        return False
    (a_row_major, s_a), (b_row_major, s_b), (_, s_c) = layouts
    slots = program_slots(c.t.device)
    set_scratch_allocator()
    _DESCRIBED(
        lambda meta: (min(slots, cdiv(m.count, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"])),),
        a.t, b.t, c.t, c.t if bias is None else bias,
        m.count, n, k.count, s_a, s_b, s_c, 0 if bias is None else bias.stride(0),
        A_T=not a_row_major, B_T=b_row_major, HAS_BIAS=bias is not None, INTERPRETED=INTERPRET, NUM_SMS=slots,
    )
    return True


def _matmul(a: _Mat, b: _Mat, c: _Mat, m: _Axis, n: int, k: _Axis, *, bias: torch.Tensor | None = None,
            z: _Mat | None = None, a_silu: bool = False, b_sums: torch.Tensor | None = None) -> None:
    """``c = act(a) @ b (+ bias) (* silu'(z))`` for a (m, k) @ (k, n); ``z`` is laid out like ``c``.

    ``b_sums`` (n,) also receives ones(1, k) @ b, B's column sums (a bias gradient beside its weight gradient),
    in its dtype: by the outer-product kernel when that computes ``c`` (one launch fewer), else by that product
    of its own; the bits are the same either way (one float32 sum in index order, rounded once).
    """
    empty = m.count == 0 or n == 0
    described = not empty and z is None and not a_silu and _described_matmul(a, b, c, m, n, k, bias)
    if b_sums is not None and (empty or described or k.count > _SKINNY_ROWS):
        _column_sums(b, n, k, b_sums)
        b_sums = None
    if empty or described:
        return
    z_args = (*z.rows, z.cols[1]) if z is not None else (0, 0, 0)
    bias_args = (c.t if bias is None else bias, c.t if z is None else z.t)
    epilogue = dict(M_SPLIT=m.inner != m.count, HAS_BIAS=bias is not None, SILU_GRAD=z is not None,
                    INTERPRETED=INTERPRET)
    if k.count <= _SKINNY_ROWS:
        b_silu, sum_a, sum_b = False, False, b_sums is not None
        if c.rows[1] == 1 and c.cols[1] != 1 and m.inner == m.count and bias is None and z is None:
            # C^T = B^T act(A)^T: tiles are written along their last axis, here C's contiguous one.
            a, b, c, m, n = b.T, a.T, c.T, _Axis.flat(n), m.count
            a_silu, b_silu, sum_a, sum_b = False, a_silu, sum_b, False
        _OUTER(
            lambda meta: (cdiv(m.count, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),),
            a.t, b.t, c.t, *bias_args, c.t if b_sums is None else b_sums,
            m.count, n, m.inner, k.count, k.inner,
            *a.rows, *a.cols, *b.rows, b.cols[1], *c.rows, c.cols[1],
            0 if bias is None else bias.stride(0), *z_args, 0 if b_sums is None else b_sums.stride(0),
            A_SILU=a_silu, B_SILU=b_silu, SUM_A=sum_a, SUM_B=sum_b, **epilogue,
        )
        return
    skinny = m.count <= _SKINNY_ROWS
    chunks = cdiv(k.count, _K_CHUNK) if skinny and k.inner == k.count and k.count > 2 * _K_CHUNK else 1
    out, out_strides = c, (0, *c.rows, c.cols[1])
    if chunks > 1:
        partial = torch.empty((chunks, m.count, n), dtype=torch.float32, device=c.t.device)
        out = _Mat(partial, (m.inner * n, n), (0, 1))
        out_strides = (m.count * n, *out.rows, 1)
    (_SKINNY if skinny else _TILED)(
        lambda meta: (cdiv(m.count, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]), chunks),
        a.t, b.t, out.t, *bias_args,
        m.count, n, m.inner, k.count // k.inner, k.inner, _K_CHUNK if chunks > 1 else k.inner,
        *a.rows, *a.cols,
        *b.rows, b.cols[1],
        *out_strides,
        0 if bias is None else bias.stride(0),
        *z_args,
        A_SILU=a_silu, **(epilogue if chunks == 1 else {**epilogue, "HAS_BIAS": False, "SILU_GRAD": False}),
        branches={"split_k": chunks > 1},
    )
    if chunks > 1:
        paths.launch(
            _chunk_sum_kernel, (cdiv(m.count, _SKINNY_ROWS), cdiv(n, _CHUNK_SUM_N)),
            partial, c.t, *bias_args, m.count, n, m.inner, chunks, *c.rows, c.cols[1],
            0 if bias is None else bias.stride(0), *z_args, **epilogue, BLOCK_M=_SKINNY_ROWS, BLOCK_N=_CHUNK_SUM_N,
        )


def _few_rows_backward(dy: _Mat, x: _Mat, dx: _Mat, weight: torch.Tensor, dweight: torch.Tensor,
                       dbias: torch.Tensor | None, rows: _Axis, silu: bool) -> bool:
    """dX, dW (and dbias) of at most _SKINNY_ROWS rows in one launch of :func:`_few_rows_backward_kernel`, with the
    bits the split-K (or skinny) and outer-product kernels give them apart; False, having done nothing, for more
    rows or an empty axis."""
    (n, k), r = weight.shape, rows.count
    if not 0 < r <= _SKINNY_ROWS or n == 0 or k == 0:
        return False
    chunks = cdiv(n, _K_CHUNK) if n > 2 * _K_CHUNK else 1
    partial, count = _chunk_scratch(chunks * r * k, cdiv(k, 16), dx.t.device) if chunks > 1 else (dx.t, dx.t)
    _FEW_ROWS_BACKWARD(
        lambda meta: (cdiv(k, meta["BLOCK_K"]), chunks),
        dy.t, x.t, weight, dx.t, dweight, dx.t if dbias is None else dbias, partial, count,
        n, k, rows.inner, _K_CHUNK if chunks > 1 else n, chunks,
        *dy.rows, dy.cols[1], *x.rows, x.cols[1], weight.stride(0), weight.stride(1), *dx.rows, dx.cols[1],
        dweight.stride(0), dweight.stride(1), 0 if dbias is None else dbias.stride(0),
        R=r, M_SPLIT=rows.inner != rows.count, SILU=silu, HAS_DBIAS=dbias is not None, INTERPRETED=INTERPRET,
        branches={"split_k": chunks > 1},
    )
    return True


_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _chunk_scratch(partials: int, counters: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """At least ``partials`` float32 chunk sums and ``counters`` zeroed counters (one per column tile of any width
    from 16) for :func:`_few_rows_backward_kernel`, kept per device and stream and grown when too small.

    The kernel leaves its counters zero again (so the autotuner's repeated launches count afresh), so they are
    zeroed when made, not before every launch: a fill kernel and two allocations fewer on the host's way to the
    launch, which bounds the AdaLN's step. Launches on one stream run in order and never use them at once.
    """
    key = (device, stream_of(device.index) if device.type == "cuda" else 0)
    partial, count = _SCRATCH.get(key, (None, None))
    if partial is None or partial.numel() < partials:
        partial = torch.empty((partials,), dtype=torch.float32, device=device)
    if count is None or count.numel() < counters:
        count = torch.zeros((counters,), dtype=torch.int32, device=device)
    _SCRATCH[key] = partial, count
    return partial, count


def _column_sums(b: _Mat, n: int, k: _Axis, sums: torch.Tensor) -> None:
    """``sums`` (n,) = ones(1, k) @ b: B's column sums in ``sums``' dtype (a bias gradient)."""
    ones = torch.ones((1,), dtype=b.t.dtype, device=b.t.device)
    _matmul(_Mat(ones, (0, 0), (0, 0)), b, _Mat(sums, (0, 0), (0, sums.stride(0))), _Axis.flat(1), n, k)


class _Linear(torch.autograd.Function):
    """``act(x) @ weight.T + bias`` with ``act`` = identity or SiLU (rounded to the weight's dtype)."""

    @staticmethod
    def forward(ctx, x, weight, bias, silu):
        N, K = weight.shape
        y = torch.empty((*x.shape[:-1], N), dtype=weight.dtype, device=x.device)
        rows, (xm, ym) = _row_split(x, y)
        _matmul(xm, _Mat.of_weight(weight).T, ym, rows, N, _Axis.flat(K), bias=bias, a_silu=silu)
        ctx.save_for_backward(x, weight)
        ctx.silu = silu
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        N, K = weight.shape
        if not _rows_compatible(x, dy):
            # Autograd hands gradients in whatever layout the next op produced; a contiguous copy always
            # shares the rows of x, whose layout the forward accepted.
            dy = dy.contiguous()
        dbias = torch.empty((N,), dtype=weight.dtype, device=dy.device) if ctx.needs_input_grad[2] else None
        dx = torch.empty_like(x, memory_format=torch.contiguous_format) if ctx.needs_input_grad[0] else None
        dweight = torch.empty_like(weight, memory_format=torch.contiguous_format) if ctx.needs_input_grad[1] else None
        # dx is contiguous: it adds no row break, so one split serves both products
        rows, (dym, xm, *dxm) = _row_split(dy, x, *([] if dx is None else [dx]))
        if dx is not None:
            if dweight is not None and _few_rows_backward(dym, xm, dxm[0], weight, dweight, dbias, rows, ctx.silu):
                return dx, dweight, dbias, None
            _matmul(dym, _Mat.of_weight(weight), dxm[0], rows, K, _Axis.flat(N), z=xm if ctx.silu else None)
        if dweight is not None:
            _matmul(xm.T, dym, _Mat.of_weight(dweight).T, _Axis.flat(K), N, rows, a_silu=ctx.silu, b_sums=dbias)
        elif dbias is not None:
            rows, (dym,) = _row_split(dy)
            _column_sums(dym, N, rows, dbias)
        return dx, dweight, dbias, None


def _check(fn: str, x: torch.Tensor, x_name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise ValueError naming the bad argument and the fix."""
    if weight.dim() != 2:
        raise ValueError(f"{fn}: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if weight.dtype not in DTYPES:
        raise ValueError(f"{fn}: weight dtype {weight.dtype} is not supported; use one of {DTYPES}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{fn}: {x_name} of shape {tuple(x.shape)} must end in weight's in_features {weight.shape[1]} "
            f"(weight shape {tuple(weight.shape)})"
        )
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise ValueError(
            f"{fn}: bias must have shape ({weight.shape[0]},) and weight's dtype {weight.dtype}, "
            f"got {tuple(bias.shape)} {bias.dtype}"
        )
    devices = {t.device for t in (x, weight, bias) if t is not None}
    if len(devices) != 1:
        raise ValueError(f"{fn}: {x_name}, weight and bias must be on one device, got {sorted(map(str, devices))}")
    if len(_row_breaks(x)) > 1:
        raise ValueError(
            f"{fn}: the leading dimensions of {x_name} (shape {tuple(x.shape)}, strides {x.stride()}) do not "
            f"collapse to two strides; pass {x_name}.contiguous()"
        )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` like ``torch.nn.functional.linear``, float32 accumulation, in x's dtype.

    x (..., K), weight (N, K), bias (N,) or None, all of one dtype (bfloat16 or float32).
    """
    _check("linear", x, "x", weight, bias)
    if x.dtype != weight.dtype:
        raise ValueError(f"linear: x dtype {x.dtype} differs from weight dtype {weight.dtype}; cast x to it")
    return _Linear.apply(x, weight, bias, False)


def silu_linear(temb: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``linear(silu(temb).to(weight.dtype), weight, bias)``: diffusers' ``MiniMaxH3AdaLayerNormModulation``.

    The SiLU runs in float32 on temb's values and is rounded to weight's dtype before the product, exactly
    as diffusers does. temb (..., E) of any float dtype (float32 in the checkpoint); output in weight's
    dtype; the temb gradient is in temb's dtype, taken through the SiLU in float32.
    """
    _check("silu_linear", temb, "temb", weight, bias)
    if temb.dtype not in DTYPES:
        raise ValueError(f"silu_linear: temb dtype {temb.dtype} is not supported; use one of {DTYPES}")
    return _Linear.apply(temb, weight, bias, True)
