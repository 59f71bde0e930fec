"""Attention on Hopper GPUs, written in Gluon (Triton's explicit layer: mbarriers, TMA and asynchronous wgmma by
hand), for bfloat16 tensors with head_dim 128 that tensor descriptors can read: the forward and the backward.

Triton's compiler runs both warp groups of :func:`h3_triton.attention._fwd_kernel` in lockstep, so the tensor
cores wait while the softmax runs. The forward schedules FlashAttention-3's way: two consumer warp groups of 64
query rows each take turns at the tensor cores (a pair of mbarriers passes the turn), so one's softmax runs while
the other's products do; on its turn a consumer issues the scores of key tile j + 1 together with the P V of
tile j. A producer warp streams key and value tiles through a ring of three TMA stages, refilling a stage once
both consumers have freed it. The arithmetic is h3_triton's, step for step (base-2 online softmax with the
scale folded into the exponent, P rounded to bfloat16 before P V, float32 accumulation, only the last key tile
masked), so the output and the saved row statistics are bitwise those of the Triton kernel
(``tests/kernels/test_attention.py`` compares them on a Hopper GPU). On an H200 at release shape it runs in
67.2-67.7 ms (619-623 TFLOP/s) against the Triton kernel's 75.1 ms and cuDNN's 73.1-77.1 ms
(``benchmarks/results/h200-perf/attention-fwd-gluon.log``, ``benchmarks/results/h200-release.json``).

The backward takes the five products it needs in one pass over each 128-key block (FlashAttention-3's
schedule), where the Triton kernels take seven in two (a dQ kernel recomputes P). Two consumer warp groups own 64
keys each (K, V resident) while a producer warp streams 64-row query and dO tiles, with their row terms, through
TMA stages. Each consumer forms P^T and dS^T of its keys, accumulates dV and dK as the Triton dK/dV kernel does
(same products, same order: dK and dV are bitwise its own), and writes dS^T to shared memory, where the other
consumer reads it: consumer h then forms columns [64 h, 64 h + 64) of the tile's dQ term over the whole key block,
dS K. Two writer warps (even and odd query tiles) add each term into a float32 dQ sum with a bulk TMA reduction,
in the order of the key blocks: a lock per (batch x head, query tile) counts the programs that have added, and a
program adds once it reads its own key block's index. So dQ is the same sum, bit for bit, on every run, though not
the Triton dQ kernel's bits (it adds each 64-key product inside the tensor cores' accumulator; the two stay within
a bfloat16 rounding of each other, ``tests/kernels/test_attention.py``). Programs of one (batch, head) start in
key-block order, so the program a lock waits for is running or done. On an H200 at release shape the backward
runs in 195.0-195.2 ms (537 TFLOP/s counted as five products) against the Triton kernels' 261.6-268.4 ms
and the provider's 193.7-195.6 ms (``benchmarks/attention_bwd_gluon.py``,
``benchmarks/results/h200-perf/attention-bwd-gluon-fused.log``). The float32 dQ sum costs 4 bytes per element of
the heads it holds: a launch holds at most 1 GiB of it, and the heads go in as many launches as that needs (two of
0.55 GB at release shape, no slower than one).

They run where :func:`applies`: a GPU of compute capability 9.0 (wgmma is Hopper's instruction) with Triton 3.6,
the release they are written and qualified against (Gluon is experimental: Triton 3.9 no longer has the TMA copy
they call). Everywhere else (other GPUs, other Triton releases, the CPU interpreter, float32, other head_dims)
the Triton kernels run.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from h3_triton import paths
from h3_triton.interpret import INTERPRET
from h3_triton.launch import cdiv

HEAD_DIM = 128
BLOCK_M = 128  # query rows a program: two consumers of 64
BLOCK_N = 128  # keys a tile
STAGES = 3  # 64 KB a stage: 224 of the 227 KB of shared memory with the query tile
QUALIFIED_TRITON = "3.6."


def suits(q: torch.Tensor) -> bool:
    """Whether ``q``'s dtype and head_dim are the ones the kernels here take, on whatever device."""
    return q.dtype == torch.bfloat16 and q.shape[-1] == HEAD_DIM


def applies(q: torch.Tensor) -> bool:
    """Whether the kernels here run for ``q`` (the caller checks that tensor descriptors can read the tensors)."""
    return (not INTERPRET and suits(q) and triton.__version__.startswith(QUALIFIED_TRITON)
            and torch.cuda.get_device_capability(q.device) == (9, 0))


@gluon.constexpr_function
def _wgmma_layout(columns):
    """The accumulator layout of one warp group's wgmma over ``columns`` output columns."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, columns, 16])


@gluon.jit
def _load_two(bar, a_desc, a_smem, b_desc, b_smem, row):
    """TMA loads of the tiles of two descriptors at ``row`` into shared memory, both completing on ``bar``."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [row, 0], bar, a_smem)
    tma.async_copy_global_to_shared(b_desc, [row, 0], bar, b_smem)


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale):
    """One key tile of the online softmax: P (float32), the new row max and sum, and the accumulator's rescale."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + gl.sum(p, 1), gl.expand_dims(alpha, 1)


@gluon.jit
def _pingpong_softmax(s, m_i, l_i, acc, qk_scale, tile, S, mma_layout: gl.constexpr, p_layout: gl.constexpr,
                      MASK: gl.constexpr):
    """Softmax of one consumer's score tile ``tile``: P as the next P V's operand, the new row max and sum, and
    the accumulator rescaled (its previous P V complete). Only the last tile is masked."""
    if MASK:
        BLOCK_N: gl.constexpr = s.shape[1]
        keys = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout))
        s = gl.where(gl.expand_dims(keys < S, 0), s, float("-inf"))
    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale)
    return gl.convert_layout(p.to(gl.bfloat16), p_layout), m_i, l_i, acc * alpha


@gluon.jit
def _pingpong_step(ring, p, m_i, l_i, acc, zeros, j, S, qk_scale, STAGES: gl.constexpr, FIRST: gl.constexpr,
                   mma_layout: gl.constexpr, p_layout: gl.constexpr, MASK: gl.constexpr):
    """One consumer's tile j + 1: on its turn it issues the scores of tile j + 1 and the P V of tile j together
    and hands the tensor cores to the other consumer; it then waits for both, frees tile j's stage and runs the
    softmax of tile j + 1 while the other consumer's products run."""
    q_half, k_smem, v_smem, k_ready, v_ready, kv_empty, my_turn, their_turn = ring
    nxt = (j + 1) % STAGES
    stage = j % STAGES
    mbarrier.wait(k_ready.index(nxt), ((j + 1) // STAGES) & 1)
    mbarrier.wait(v_ready.index(stage), (j // STAGES) & 1)
    mbarrier.wait(my_turn, ((j + 1) & 1) ^ FIRST)  # this consumer's turn number j + 1
    s = warpgroup_mma(q_half, k_smem.index(nxt).permute((1, 0)), zeros, use_acc=False, is_async=True)
    acc = warpgroup_mma(p, v_smem.index(stage), acc, is_async=True)
    mbarrier.arrive(their_turn, count=1)
    s, acc = warpgroup_mma_wait(0, deps=(s, acc))
    mbarrier.arrive(kv_empty.index(stage), count=1)
    return _pingpong_softmax(s, m_i, l_i, acc, qk_scale, j + 1, S, mma_layout, p_layout, MASK)


@gluon.jit
def _pingpong_consumer(args, HALF: gl.constexpr):
    """Rows [HALF * 64, HALF * 64 + 64) of the query block: one warp group's whole forward."""
    (q_desc, o_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns,
     ROW_MAX, ROW_LOG_SUM, pid_m, pid_bh, S, qk_scale) = args
    STAGES: gl.constexpr = k_smem.type.shape[0]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[2]
    gl.static_assert(BLOCK_N == HEAD_DIM, "scores and output share one wgmma layout")
    # The first half takes the first turn: a fresh mbarrier reads as having completed a phase of parity 1, so
    # turn t waits for parity (t & 1) ^ FIRST.
    FIRST: gl.constexpr = 1 - HALF
    mma_layout: gl.constexpr = _wgmma_layout(BLOCK_N)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    my_turn = turns.index(HALF)
    their_turn = turns.index(1 - HALF)
    q_half = q_smem.index(HALF)
    row0 = pid_m * 2 * ROWS + HALF * ROWS

    mbarrier.expect(q_bars.index(HALF), q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, 0], q_bars.index(HALF), q_half)
    mbarrier.wait(q_bars.index(HALF), 0)
    n_tiles = gl.cdiv(S, BLOCK_N)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, rows_layout)
    l_i = gl.zeros([ROWS], gl.float32, rows_layout)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, mma_layout)
    zeros = gl.zeros([ROWS, BLOCK_N], gl.float32, mma_layout)
    mbarrier.wait(k_ready.index(0), 0)
    mbarrier.wait(my_turn, FIRST)
    s = warpgroup_mma(q_half, k_smem.index(0).permute((1, 0)), zeros, use_acc=False, is_async=True)
    mbarrier.arrive(their_turn, count=1)
    s = warpgroup_mma_wait(0, deps=(s,))
    if n_tiles == 1:
        p, m_i, l_i, acc = _pingpong_softmax(s, m_i, l_i, acc, qk_scale, 0, S, mma_layout, p_layout, True)
    else:
        p, m_i, l_i, acc = _pingpong_softmax(s, m_i, l_i, acc, qk_scale, 0, S, mma_layout, p_layout, False)
    ring = (q_half, k_smem, v_smem, k_ready, v_ready, kv_empty, my_turn, their_turn)
    for j in range(0, n_tiles - 2):
        p, m_i, l_i, acc = _pingpong_step(ring, p, m_i, l_i, acc, zeros, j, S, qk_scale, STAGES, FIRST, mma_layout,
                                          p_layout, False)
    if n_tiles > 1:  # the last tile's scores are masked
        p, m_i, l_i, acc = _pingpong_step(ring, p, m_i, l_i, acc, zeros, n_tiles - 2, S, qk_scale, STAGES, FIRST,
                                          mma_layout, p_layout, True)
    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    mbarrier.wait(my_turn, (n_tiles & 1) ^ FIRST)
    acc = warpgroup_mma(p, v_smem.index(last % STAGES), acc, is_async=True)
    mbarrier.arrive(their_turn, count=1)
    acc = warpgroup_mma_wait(0, deps=(acc,))

    q_half.store((acc / gl.expand_dims(l_i, 1)).to(gl.bfloat16))  # its Q is no longer read: the tile stages O
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [row0, 0], q_half)
    rows = row0 + gl.arange(0, ROWS, layout=rows_layout)
    rows_out = pid_bh.to(gl.int64) * S + rows
    gl.store(ROW_MAX + rows_out, m_i, mask=rows < S)
    gl.store(ROW_LOG_SUM + rows_out, gl.log2(l_i), mask=rows < S)
    tma.store_wait(0)


@gluon.jit
def _pingpong_first(consumer):
    """The default partition (the kernel's own 4 warps): the first half of the query rows."""
    _pingpong_consumer(consumer, 0)


@gluon.jit
def _pingpong_second(workers):
    """A worker partition: the second half. Workers share one signature, so each takes its part of
    (consumer, producer)."""
    _pingpong_consumer(workers[0], 1)


@gluon.jit
def _key_value_producer(workers):
    """One warp streaming the key and value tiles through the ring; a stage is refilled once both consumers
    have freed it."""
    (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, S) = workers[1]
    STAGES: gl.constexpr = k_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    for t in range(gl.cdiv(S, BLOCK_N)):
        stage = t % STAGES
        mbarrier.wait(kv_empty.index(stage), ((t // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [t * BLOCK_N, 0], k_ready.index(stage), k_smem.index(stage))
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [t * BLOCK_N, 0], v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _head_descriptor(ptr, head, S, stride_s, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, layout: gl.constexpr):
    """A tensor descriptor of one head's (S, HEAD_DIM) matrix, ROWS rows a tile (rows past S read as zeros and
    are not written)."""
    return tma.make_tensor_descriptor(ptr + head, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                      block_shape=[ROWS, HEAD_DIM], layout=layout)


@gluon.jit
def _head(pid_bh, H, stride_b, stride_h):
    """Offset of (batch, head) ``pid_bh`` in a (B, S, H, D) tensor, in int64."""
    return (pid_bh // H).to(gl.int64) * stride_b + (pid_bh % H).to(gl.int64) * stride_h


@gluon.jit
def _forward_kernel(Q, K, V, O, ROW_MAX, ROW_LOG_SUM,
                    stride_qb, stride_qs, stride_qh,
                    stride_kb, stride_ks, stride_kh,
                    stride_vb, stride_vs, stride_vh,
                    stride_ob, stride_os, stride_oh,
                    H, S, qk_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """One query block of one (batch, head): :func:`h3_triton.attention._fwd_kernel`'s arguments."""
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    ROWS: gl.constexpr = BLOCK_M // 2
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], gl.bfloat16)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.bfloat16)
    q_desc = _head_descriptor(Q, _head(pid_bh, H, stride_qb, stride_qh), S, stride_qs, ROWS, HEAD_DIM, half_layout)
    o_desc = _head_descriptor(O, _head(pid_bh, H, stride_ob, stride_oh), S, stride_os, ROWS, HEAD_DIM, half_layout)
    k_desc = _head_descriptor(K, _head(pid_bh, H, stride_kb, stride_kh), S, stride_ks, BLOCK_N, HEAD_DIM,
                              tile_layout)
    v_desc = _head_descriptor(V, _head(pid_bh, H, stride_vb, stride_vh), S, stride_vs, BLOCK_N, HEAD_DIM,
                              tile_layout)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, HEAD_DIM], half_layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)
    consumer = (q_desc, o_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty, turns,
                ROW_MAX, ROW_LOG_SUM, pid_m, pid_bh, S, qk_scale)
    producer = (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, S)
    gl.warp_specialize([
        (_pingpong_first, (consumer,)),
        (_pingpong_second, ((consumer, producer),)),
        (_key_value_producer, ((consumer, producer),)),
    ], [4, 1], [240, 24])


def forward(q, k, v, o, row_max, row_log_sum, qk_scale: float) -> None:
    """Fills ``o`` and the row statistics as :func:`h3_triton.attention._fwd_kernel` does; the caller has set the
    scratch allocator the in-kernel tensor descriptors need."""
    B, S, H, _ = q.shape
    # 12 warps (the producer's warp group rounded up) at 168 registers leave each consumer 240.
    paths.launch(
        _forward_kernel, (cdiv(S, BLOCK_M), B * H),
        q, k, v, o, row_max, row_log_sum,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], H, S, qk_scale,
        HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES, num_warps=4, maxnreg=168,
        branches={"keys": paths.tiles(S, BLOCK_N)},
    )


# The backward -------------------------------------------------------------------------------------------------

BWD_BLOCK_M = 64  # query rows a stage: both consumers' S^T and dP^T tiles are 64 x 64, dQ's terms 64 x 64
BWD_BLOCK_N = 128  # keys a program: two consumers of 64
BWD_STAGES = 2  # 226 of the 227 KB of shared memory with the resident keys, dS^T and dQ's terms (two each)


@gluon.jit
def _backward_consumer(args, HALF: gl.constexpr):
    """Keys [HALF * 64, HALF * 64 + 64) of the key block: one warp group's dK and dV over every query tile, and
    columns [HALF * 64, HALF * 64 + 64) of each query tile's dQ term of the whole key block (dS K, with the other
    half's dS^T), handed to the writer warps through shared memory."""
    (k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem,
     kv_bars, q_ready, do_ready, empty, ds_ready, dq_full, dq_empty, done, pid_n, S, sm_scale, qk_scale) = args
    STAGES: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[2]
    KEYS: gl.constexpr = k_smem.type.shape[1]
    COLS: gl.constexpr = HEAD_DIM // 2
    scores_layout: gl.constexpr = _wgmma_layout(BLOCK_M)
    grads_layout: gl.constexpr = _wgmma_layout(HEAD_DIM)
    dq_layout: gl.constexpr = _wgmma_layout(COLS)
    operand_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=grads_layout, k_width=2)
    queries_layout: gl.constexpr = gl.SliceLayout(0, scores_layout)
    k_half = k_smem.index(HALF)
    v_half = v_smem.index(HALF)
    k_cols_first = k_smem.index(0).slice(HALF * COLS, COLS, dim=1)
    k_cols_second = k_smem.index(1).slice(HALF * COLS, COLS, dim=1)
    row0 = pid_n * 2 * KEYS + HALF * KEYS

    _load_two(kv_bars.index(HALF), k_desc, k_half, v_desc, v_half, row0)
    mbarrier.wait(kv_bars.index(0), 0)
    mbarrier.wait(kv_bars.index(1), 0)
    zeros = gl.zeros([KEYS, BLOCK_M], gl.float32, scores_layout)
    dq_zeros = gl.zeros([BLOCK_M, COLS], gl.float32, dq_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, grads_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, grads_layout)
    for i in range(gl.cdiv(S, BLOCK_M)):
        stage = i % STAGES
        phase = (i // STAGES) & 1
        pair = i % 2
        pair_phase = (i // 2) & 1
        q_tile = q_smem.index(stage)
        do_tile = do_smem.index(stage)
        mbarrier.wait(q_ready.index(stage), phase)
        s_t = warpgroup_mma(k_half, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(stage), phase)
        dp_t = warpgroup_mma(v_half, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(1, deps=(s_t,))
        lse = lse_smem.index(stage).load(queries_layout)
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
        dv = warpgroup_mma(gl.convert_layout(p_t.to(gl.bfloat16), operand_layout), do_tile, dv, is_async=True)
        dp_t = warpgroup_mma_wait(1, deps=(dp_t,))
        delta = delta_smem.index(stage).load(queries_layout)
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        ds_own = ds_smem.index(2 * pair + HALF)
        ds_own.store(ds_t.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(pair), count=1)
        dk = warpgroup_mma(ds_own, q_tile, dk, is_async=True)
        mbarrier.wait(ds_ready.index(pair), pair_phase)  # the other half's dS^T is written
        dq = warpgroup_mma(ds_smem.index(2 * pair).permute((1, 0)), k_cols_first, dq_zeros, use_acc=False,
                           is_async=True)
        dq = warpgroup_mma(ds_smem.index(2 * pair + 1).permute((1, 0)), k_cols_second, dq, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
        mbarrier.arrive(empty.index(stage), count=1)
        mbarrier.wait(dq_empty.index(pair), pair_phase ^ 1)  # the writer has added this buffer's last tile
        dq_smem.index(2 * pair + HALF).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(dq_full.index(pair), count=1)

    mbarrier.arrive(done, count=1)
    mbarrier.wait(done, 0)  # the other half's dQ products no longer read these keys
    k_half.store((dk * sm_scale).to(gl.bfloat16))  # the tiles stage the gradients
    v_half.store(dv.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [row0, 0], k_half)
    tma.async_copy_shared_to_global(dv_desc, [row0, 0], v_half)
    tma.store_wait(0)


@gluon.jit
def _backward_first(consumer):
    """The default partition: the first half of the keys."""
    _backward_consumer(consumer, 0)


@gluon.jit
def _backward_second(workers):
    """A worker partition: the second half of the keys."""
    _backward_consumer(workers[0], 1)


@gluon.jit
def _backward_producer(workers):
    """One warp streaming query tiles with their row terms, and dO tiles with theirs, through the ring; a stage is
    refilled once both consumers have freed it."""
    (q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready, empty,
     S) = workers[1]
    STAGES: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[1]
    for i in range(gl.cdiv(S, BLOCK_M)):
        stage = i % STAGES
        mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)
        ready = q_ready.index(stage)
        mbarrier.expect(ready, q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [i * BLOCK_M, 0], ready, q_smem.index(stage))
        tma.async_copy_global_to_shared(lse_desc, [i * BLOCK_M], ready, lse_smem.index(stage))
        ready = do_ready.index(stage)
        mbarrier.expect(ready, do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [i * BLOCK_M, 0], ready, do_smem.index(stage))
        tma.async_copy_global_to_shared(delta_desc, [i * BLOCK_M], ready, delta_smem.index(stage))


@builtin
def _tma_add(tensor_desc, coord, src, _semantic=None):
    """Adds the shared-memory tile ``src`` into the global tile of ``tensor_desc`` at ``coord`` with one bulk TMA
    reduction (the op behind Triton's ``tensor_descriptor.atomic_add``, which Gluon 3.6 does not name)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _bulk_wait_complete(anchor):
    """Waits until this thread's bulk TMA operations are complete, their writes performed (``tma.store_wait``
    waits only until their shared memory may be reused)."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0; mov.u32 $0, 0;", "=r,r", [anchor], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _acquire(lock, turn):
    """Spins until ``lock`` reads ``turn`` (acquire: the adds of the programs before are then visible)."""
    seen = gl.atomic_add(lock, 0, sem="acquire", scope="gpu")
    while seen != turn:
        seen = gl.atomic_add(lock, 0, sem="acquire", scope="gpu")


@gluon.jit
def _dq_writer(workers, PAIR: gl.constexpr):
    """One warp adding dQ's terms of the query tiles of parity ``PAIR`` into DQ_SUM in the key blocks' order: for
    each it waits for the previous key block's program to have added (the tile's lock reads this program's
    index), adds both consumers' columns with bulk TMA reductions, waits for them to complete and passes the turn
    on; the other parity's warp does the same meanwhile."""
    dq_desc, dq_smem, dq_full, dq_empty, LOCKS, pid_n, pid_bh, n_tiles = workers[2]
    BLOCK_M: gl.constexpr = dq_smem.type.shape[1]
    COLS: gl.constexpr = dq_smem.type.shape[2]
    locks = LOCKS + pid_bh.to(gl.int64) * n_tiles
    for i in range(PAIR, n_tiles, 2):
        _acquire(locks + i, pid_n)
        mbarrier.wait(dq_full.index(PAIR), (i // 2) & 1)
        for half in gl.static_range(2):
            _tma_add(dq_desc, [i * BLOCK_M, half * COLS], dq_smem.index(2 * PAIR + half))
        _bulk_wait_complete(pid_n)
        gl.thread_barrier()
        mbarrier.arrive(dq_empty.index(PAIR), count=1)
        gl.atomic_add(locks + i, 1, sem="release", scope="gpu")


@gluon.jit
def _dq_writer_even(workers):
    """A worker partition: the even query tiles' additions."""
    _dq_writer(workers, 0)


@gluon.jit
def _dq_writer_odd(workers):
    """A worker partition: the odd query tiles' additions."""
    _dq_writer(workers, 1)


@gluon.jit
def _row_terms_descriptor(ptr, pid_bh, S_PADDED, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """A tensor descriptor of one (batch, head)'s row of a (B * H, S_PADDED) float32 matrix, BLOCK_M at a time."""
    return tma.make_tensor_descriptor(ptr + pid_bh.to(gl.int64) * S_PADDED, shape=[S_PADDED], strides=[1],
                                      block_shape=[BLOCK_M], layout=layout)


@gluon.jit
def _backward_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_SUM, LOCKS,
                     stride_qb, stride_qs, stride_qh,
                     stride_kb, stride_ks, stride_kh,
                     stride_vb, stride_vs, stride_vh,
                     stride_dob, stride_dos, stride_doh,
                     stride_gb, stride_gs, stride_gh,
                     H, S, S_PADDED, sm_scale, qk_scale,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """dK and dV of one key block of one (batch, head), and its terms of dQ added into DQ_SUM (float32,
    (B * H, S_PADDED, HEAD_DIM)) in the order of the key blocks: :func:`h3_triton.attention._dkdv_described_kernel`'s
    arguments with the row terms padded, and the zeroed sum and locks (:func:`backward`)."""
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    KEYS: gl.constexpr = BLOCK_N // 2
    rows_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.bfloat16)
    keys_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HEAD_DIM], gl.bfloat16)
    terms_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    q_desc = _head_descriptor(Q, _head(pid_bh, H, stride_qb, stride_qh), S, stride_qs, BLOCK_M, HEAD_DIM,
                              rows_layout)
    do_desc = _head_descriptor(DO, _head(pid_bh, H, stride_dob, stride_doh), S, stride_dos, BLOCK_M, HEAD_DIM,
                               rows_layout)
    k_desc = _head_descriptor(K, _head(pid_bh, H, stride_kb, stride_kh), S, stride_ks, KEYS, HEAD_DIM, keys_layout)
    v_desc = _head_descriptor(V, _head(pid_bh, H, stride_vb, stride_vh), S, stride_vs, KEYS, HEAD_DIM, keys_layout)
    grads = _head(pid_bh, H, stride_gb, stride_gh)
    dk_desc = _head_descriptor(DK, grads, S, stride_gs, KEYS, HEAD_DIM, keys_layout)
    dv_desc = _head_descriptor(DV, grads, S, stride_gs, KEYS, HEAD_DIM, keys_layout)
    lse_desc = _row_terms_descriptor(LSE, pid_bh, S_PADDED, BLOCK_M, terms_layout)
    delta_desc = _row_terms_descriptor(DELTA, pid_bh, S_PADDED, BLOCK_M, terms_layout)

    k_smem = gl.allocate_shared_memory(gl.bfloat16, [2, KEYS, HEAD_DIM], keys_layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [2, KEYS, HEAD_DIM], keys_layout)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, HEAD_DIM], rows_layout)
    do_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, HEAD_DIM], rows_layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], terms_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], terms_layout)
    ds_smem = gl.allocate_shared_memory(gl.bfloat16, [4, KEYS, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], gl.bfloat16))
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM // 2], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_M, HEAD_DIM // 2], dq_layout)
    dq_desc = tma.make_tensor_descriptor(DQ_SUM + pid_bh.to(gl.int64) * S_PADDED * HEAD_DIM,
                                         shape=[S_PADDED, HEAD_DIM], strides=[HEAD_DIM, 1],
                                         block_shape=[BLOCK_M, HEAD_DIM // 2], layout=dq_layout)
    kv_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(done.index(0), count=2)
    for i in gl.static_range(2):
        mbarrier.init(kv_bars.index(i), count=1)
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(dq_full.index(i), count=2)
        mbarrier.init(dq_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    consumer = (k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem,
                dq_smem, kv_bars, q_ready, do_ready, empty, ds_ready, dq_full, dq_empty, done.index(0), pid_n, S,
                sm_scale, qk_scale)
    producer = (q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                empty, S)
    writers = (dq_desc, dq_smem, dq_full, dq_empty, LOCKS, pid_n, pid_bh, gl.cdiv(S, BLOCK_M))
    gl.warp_specialize([
        (_backward_first, (consumer,)),
        (_backward_second, ((consumer, producer, writers),)),
        (_backward_producer, ((consumer, producer, writers),)),
        (_dq_writer_even, ((consumer, producer, writers),)),
        (_dq_writer_odd, ((consumer, producer, writers),)),
    ], [4, 1, 1, 1], [240, 24, 24, 24])


def padded_row_terms(row_max, row_log_sum, delta) -> tuple[torch.Tensor, torch.Tensor]:
    """The row terms of :func:`backward`: row max + log2 row sum (the sum the Triton kernel forms, so P has its bits)
    and delta, each (B * H, S) padded with zeros to a whole number of query tiles, so every tile's terms are one
    TMA load (whose rows must start on 16 bytes). Padded rows read as zeros, as the Triton kernel's masked loads."""
    BH, S = row_max.shape
    terms = torch.zeros((2, BH, cdiv(S, BWD_BLOCK_M) * BWD_BLOCK_M), dtype=torch.float32,
                        device=row_max.device)
    torch.add(row_max, row_log_sum, out=terms[0, :, :S])
    terms[1, :, :S] = delta
    return terms[0], terms[1]


DQ_SUM_BYTES = 1 << 30  # the float32 dQ sum of one launch at most; heads are split into launches that fit


def backward(q, k, v, do, row_max, row_log_sum, delta, dq, dk, dv, sm_scale: float, qk_scale: float,
             stages: int = BWD_STAGES, sum_bytes: int = DQ_SUM_BYTES) -> None:
    """Fills ``dk`` and ``dv`` (one contiguous allocation's strides) as
    :func:`h3_triton.attention._dkdv_described_kernel` does, bitwise, and ``dq`` with each key block's term added in
    the order of the key blocks: repeatable, but not the bits of :func:`h3_triton.attention._dq_kernel`, whose
    float32 accumulator adds each 64-key product inside the tensor cores. The caller has set the scratch allocator.
    ``stages``: query tiles in flight (benchmarks compare them). The heads go in as few launches as keep each
    launch's float32 dQ sum within ``sum_bytes`` (two at release shape, 0.55 GB each); every (batch, head) is
    computed alike in any launch, so the split does not change a bit.

    The programs of one (batch, head) start in the order of their key blocks (CUDA's order of a grid's first
    dimension), so each program's predecessor is running or done when it waits for its turn."""
    B, S, H, D = q.shape
    lse, padded_delta = (terms.view(B, H, -1) for terms in padded_row_terms(row_max, row_log_sum, delta))
    S_PADDED = lse.shape[-1]
    launches = min(H, cdiv(B * H * S_PADDED * D * 4, sum_bytes))
    group = cdiv(H, launches)
    sums = torch.empty((B * group, S_PADDED, D), dtype=torch.float32, device=q.device)  # reused by every launch
    all_locks = torch.empty((B * group, S_PADDED // BWD_BLOCK_M), dtype=torch.int32, device=q.device)
    for first in range(0, H, group):
        heads = slice(first, min(H, first + group))
        count = heads.stop - heads.start
        dq_sum, locks = sums[:B * count].zero_(), all_locks[:B * count].zero_()
        views = [t[:, :, heads] for t in (q, k, v, do, dk, dv)]
        # the kernel reads each (batch, head)'s row terms as one row of a contiguous matrix
        terms = [t[:, heads].reshape(B * count, S_PADDED).contiguous() for t in (lse, padded_delta)]
        paths.launch(
            _backward_kernel, (cdiv(S, BWD_BLOCK_N), B * count),
            *views[:4], *terms, *views[4:], dq_sum, locks, *(stride for t in views[:5] for stride in t.stride()[:3]),
            count, S, S_PADDED, sm_scale, qk_scale,
            HEAD_DIM=HEAD_DIM, BLOCK_M=BWD_BLOCK_M, BLOCK_N=BWD_BLOCK_N, STAGES=stages, num_warps=4, maxnreg=168,
        )
        dq[:, :, heads].copy_(dq_sum.mul_(sm_scale).view(B, count, S_PADDED, D)[:, :, :S].transpose(1, 2))
