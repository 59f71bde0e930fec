"""Attention on Hopper GPUs, written in Gluon (Triton's explicit layer: mbarriers, TMA and asynchronous wgmma by
hand), for bfloat16 tensors with head_dim 128 that tensor descriptors can read: the forward, and the backward's
dK/dV and dQ kernels.

Triton's compiler runs both warp groups of :func:`h3_triton.attention._fwd_kernel` in lockstep, so the tensor
cores wait while the softmax runs. The forward schedules FlashAttention-3's way: two consumer warp groups of 64
query rows each take turns at the tensor cores (a pair of mbarriers passes the turn), so one's softmax runs while
the other's products do; on its turn a consumer issues the scores of key tile j + 1 together with the P V of
tile j. A producer warp streams key and value tiles through a ring of three TMA stages, refilling a stage once
both consumers have freed it. The arithmetic is h3_triton's, step for step (base-2 online softmax with the
scale folded into the exponent, P rounded to bfloat16 before P V, float32 accumulation, only the last key tile
masked), so the output and the saved row statistics are bitwise those of the Triton kernel
(``tests/kernels/test_attention.py`` compares them on a Hopper GPU). On an H200 at release shape it runs in
67.3-67.7 ms (619-623 TFLOP/s) against the Triton kernel's 75.1 ms and cuDNN's 73.3-75.9 ms
(``benchmarks/results/h200-perf/attention-fwd-gluon.log``, ``benchmarks/results/h200-release.json``).

The backward keeps h3_triton's deterministic split (no two programs add into one element): a dK/dV kernel whose
two consumer warp groups own 64 keys each of a 128-key block while a producer warp streams query and dO tiles,
with their row terms, through TMA stages; and a dQ kernel whose two consumers own 64 query rows each while the
producer streams key and value tiles. P^T, dS^T and dS reach wgmma from registers. The products are the Triton
kernels' in the same order, so dK, dV and dQ are bitwise theirs (the same test; at release shape
``benchmarks/attention_bwd_gluon.py``).

They run where :func:`applies`: a GPU of compute capability 9.0 (wgmma is Hopper's instruction) with Triton 3.6,
the release they are written and qualified against (Gluon is experimental: Triton 3.9 no longer has the TMA copy
they call). Everywhere else (other GPUs, other Triton releases, the CPU interpreter, float32, other head_dims)
the Triton kernels run.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from h3_triton.interpret import INTERPRET

HEAD_DIM = 128
BLOCK_M = 128  # query rows a program: two consumers of 64
BLOCK_N = 128  # keys a tile
STAGES = 3  # 64 KB a stage: 224 of the 227 KB of shared memory with the query tile
QUALIFIED_TRITON = "3.6."


def applies(q: torch.Tensor) -> bool:
    """Whether the kernels here run for ``q`` (the caller checks that tensor descriptors can read the tensors)."""
    return (not INTERPRET and q.dtype == torch.bfloat16 and q.shape[-1] == HEAD_DIM
            and triton.__version__.startswith(QUALIFIED_TRITON)
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
    have freed it (the forward's and dQ's producer)."""
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
    _forward_kernel[(triton.cdiv(S, BLOCK_M), B * H)](
        q, k, v, o, row_max, row_log_sum,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], H, S, qk_scale,
        HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES, num_warps=4, maxnreg=168,
    )


# The backward's dK and dV ------------------------------------------------------------------------------------

DKDV_BLOCK_M = 64  # query rows a stage: both consumers' S^T and dP^T tiles are 64 x 64
DKDV_BLOCK_N = 128  # keys a program: two consumers of 64
DKDV_STAGES = 2


@gluon.jit
def _dkdv_consumer(args, HALF: gl.constexpr):
    """Keys [HALF * 64, HALF * 64 + 64) of the key block: one warp group's dK and dV over every query tile."""
    (k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bars,
     q_ready, do_ready, empty, pid_n, S, sm_scale, qk_scale) = args
    STAGES: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[2]
    KEYS: gl.constexpr = k_smem.type.shape[1]
    scores_layout: gl.constexpr = _wgmma_layout(BLOCK_M)
    grads_layout: gl.constexpr = _wgmma_layout(HEAD_DIM)
    operand_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=grads_layout, k_width=2)
    queries_layout: gl.constexpr = gl.SliceLayout(0, scores_layout)
    k_half = k_smem.index(HALF)
    v_half = v_smem.index(HALF)
    row0 = pid_n * 2 * KEYS + HALF * KEYS

    _load_two(kv_bars.index(HALF), k_desc, k_half, v_desc, v_half, row0)
    mbarrier.wait(kv_bars.index(HALF), 0)
    zeros = gl.zeros([KEYS, BLOCK_M], gl.float32, scores_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, grads_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, grads_layout)
    for i in range(gl.cdiv(S, BLOCK_M)):
        stage = i % STAGES
        phase = (i // STAGES) & 1
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
        dk = warpgroup_mma(gl.convert_layout(ds_t.to(gl.bfloat16), operand_layout), q_tile, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
        mbarrier.arrive(empty.index(stage), count=1)

    k_half.store((dk * sm_scale).to(gl.bfloat16))  # its keys are no longer read: the tiles stage the gradients
    v_half.store(dv.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [row0, 0], k_half)
    tma.async_copy_shared_to_global(dv_desc, [row0, 0], v_half)
    tma.store_wait(0)


@gluon.jit
def _dkdv_first(consumer):
    """The default partition: the first half of the keys."""
    _dkdv_consumer(consumer, 0)


@gluon.jit
def _dkdv_second(workers):
    """A worker partition: the second half of the keys."""
    _dkdv_consumer(workers[0], 1)


@gluon.jit
def _dkdv_producer(workers):
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


@gluon.jit
def _row_terms_descriptor(ptr, pid_bh, S_PADDED, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """A tensor descriptor of one (batch, head)'s row of a (B * H, S_PADDED) float32 matrix, BLOCK_M at a time."""
    return tma.make_tensor_descriptor(ptr + pid_bh.to(gl.int64) * S_PADDED, shape=[S_PADDED], strides=[1],
                                      block_shape=[BLOCK_M], layout=layout)


@gluon.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                 stride_qb, stride_qs, stride_qh,
                 stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vs, stride_vh,
                 stride_dob, stride_dos, stride_doh,
                 stride_gb, stride_gs, stride_gh,
                 H, S, S_PADDED, sm_scale, qk_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """dK and dV of one key block of one (batch, head): :func:`h3_triton.attention._dkdv_described_kernel`'s
    arguments, with the row terms padded (:func:`dkdv`)."""
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
    kv_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    consumer = (k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bars,
                q_ready, do_ready, empty, pid_n, S, sm_scale, qk_scale)
    producer = (q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                empty, S)
    gl.warp_specialize([
        (_dkdv_first, (consumer,)),
        (_dkdv_second, ((consumer, producer),)),
        (_dkdv_producer, ((consumer, producer),)),
    ], [4, 1], [240, 24])


def padded_row_terms(row_max, row_log_sum, delta) -> tuple[torch.Tensor, torch.Tensor]:
    """The row terms of :func:`dkdv`: row max + log2 row sum (the sum the Triton kernel forms, so P has its bits)
    and delta, each (B * H, S) padded with zeros to a whole number of query tiles, so every tile's terms are one
    TMA load (whose rows must start on 16 bytes). Padded rows read as zeros, as the Triton kernel's masked loads."""
    BH, S = row_max.shape
    terms = torch.zeros((2, BH, triton.cdiv(S, DKDV_BLOCK_M) * DKDV_BLOCK_M), dtype=torch.float32,
                        device=row_max.device)
    torch.add(row_max, row_log_sum, out=terms[0, :, :S])
    terms[1, :, :S] = delta
    return terms[0], terms[1]


def dkdv(q, k, v, do, row_max, row_log_sum, delta, dk, dv, sm_scale: float, qk_scale: float,
         stages: int = DKDV_STAGES) -> None:
    """Fills ``dk`` and ``dv`` (one contiguous allocation's strides) as
    :func:`h3_triton.attention._dkdv_described_kernel` does; the caller has set the scratch allocator.
    ``stages``: query tiles in flight (benchmarks compare them)."""
    B, S, H, _ = q.shape
    lse, padded_delta = padded_row_terms(row_max, row_log_sum, delta)
    _dkdv_kernel[(triton.cdiv(S, DKDV_BLOCK_N), B * H)](
        q, k, v, do, lse, padded_delta, dk, dv,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3],
        H, S, lse.shape[1], sm_scale, qk_scale,
        HEAD_DIM=HEAD_DIM, BLOCK_M=DKDV_BLOCK_M, BLOCK_N=DKDV_BLOCK_N, STAGES=stages, num_warps=4, maxnreg=168,
    )


# The backward's dQ ----------------------------------------------------------------------------------------

DQ_BLOCK_M = 128  # query rows a program: two consumers of 64
DQ_BLOCK_N = 64  # keys a stage
DQ_STAGES = 2


@gluon.jit
def _dq_consumer(args, HALF: gl.constexpr):
    """Rows [HALF * 64, HALF * 64 + 64) of the query block: one warp group's dQ over every key tile."""
    (q_desc, do_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
     ROW_MAX, ROW_LOG_SUM, DELTA, pid_m, pid_bh, S, sm_scale, qk_scale) = args
    STAGES: gl.constexpr = k_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[2]
    ROWS: gl.constexpr = q_smem.type.shape[1]
    scores_layout: gl.constexpr = _wgmma_layout(BLOCK_N)
    dq_layout: gl.constexpr = _wgmma_layout(HEAD_DIM)
    operand_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, scores_layout)
    q_half = q_smem.index(HALF)
    do_half = do_smem.index(HALF)
    row0 = pid_m * 2 * ROWS + HALF * ROWS

    _load_two(q_bars.index(HALF), q_desc, q_half, do_desc, do_half, row0)
    rows = row0 + gl.arange(0, ROWS, layout=rows_layout)
    rows_at = pid_bh.to(gl.int64) * S + rows
    in_seq = rows < S
    lse = gl.load(ROW_MAX + rows_at, mask=in_seq, other=0.0) + gl.load(ROW_LOG_SUM + rows_at, mask=in_seq, other=0.0)
    delta = gl.load(DELTA + rows_at, mask=in_seq, other=0.0)
    zeros = gl.zeros([ROWS, BLOCK_N], gl.float32, scores_layout)
    dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, dq_layout)
    mbarrier.wait(q_bars.index(HALF), 0)
    n_tiles = gl.cdiv(S, BLOCK_N)
    for j in range(n_tiles):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        k_tile = k_smem.index(stage)
        mbarrier.wait(k_ready.index(stage), phase)
        s = warpgroup_mma(q_half, k_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(stage), phase)
        dp = warpgroup_mma(do_half, v_smem.index(stage).permute((1, 0)), zeros, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        if j == n_tiles - 1:  # only the last key tile has keys past S
            keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, scores_layout))
            p = gl.where(gl.expand_dims(keys < S, 0), p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp,))
        ds = p * (dp - gl.expand_dims(delta, 1))
        dq = warpgroup_mma(gl.convert_layout(ds.to(gl.bfloat16), operand_layout), k_tile, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq,))
        mbarrier.arrive(kv_empty.index(stage), count=1)

    q_half.store((dq * sm_scale).to(gl.bfloat16))  # its Q is no longer read: the tile stages dQ
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [row0, 0], q_half)
    tma.store_wait(0)


@gluon.jit
def _dq_first(consumer):
    """The default partition: the first half of the query rows."""
    _dq_consumer(consumer, 0)


@gluon.jit
def _dq_second(workers):
    """A worker partition: the second half of the query rows."""
    _dq_consumer(workers[0], 1)


@gluon.jit
def _dq_kernel(Q, K, V, DO, ROW_MAX, ROW_LOG_SUM, DELTA, DQ,
               stride_qb, stride_qs, stride_qh,
               stride_kb, stride_ks, stride_kh,
               stride_vb, stride_vs, stride_vh,
               stride_dob, stride_dos, stride_doh,
               stride_gb, stride_gs, stride_gh,
               H, S, sm_scale, qk_scale,
               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """dQ of one query block of one (batch, head): :func:`h3_triton.attention._dq_kernel`'s arguments."""
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    ROWS: gl.constexpr = BLOCK_M // 2
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], gl.bfloat16)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.bfloat16)
    q_desc = _head_descriptor(Q, _head(pid_bh, H, stride_qb, stride_qh), S, stride_qs, ROWS, HEAD_DIM, half_layout)
    do_desc = _head_descriptor(DO, _head(pid_bh, H, stride_dob, stride_doh), S, stride_dos, ROWS, HEAD_DIM,
                               half_layout)
    dq_desc = _head_descriptor(DQ, _head(pid_bh, H, stride_gb, stride_gh), S, stride_gs, ROWS, HEAD_DIM,
                               half_layout)
    k_desc = _head_descriptor(K, _head(pid_bh, H, stride_kb, stride_kh), S, stride_ks, BLOCK_N, HEAD_DIM,
                              tile_layout)
    v_desc = _head_descriptor(V, _head(pid_bh, H, stride_vb, stride_vh), S, stride_vs, BLOCK_N, HEAD_DIM,
                              tile_layout)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, HEAD_DIM], half_layout)
    do_smem = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, HEAD_DIM], half_layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)
    consumer = (q_desc, do_desc, dq_desc, q_smem, do_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
                ROW_MAX, ROW_LOG_SUM, DELTA, pid_m, pid_bh, S, sm_scale, qk_scale)
    producer = (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, S)
    gl.warp_specialize([
        (_dq_first, (consumer,)),
        (_dq_second, ((consumer, producer),)),
        (_key_value_producer, ((consumer, producer),)),
    ], [4, 1], [240, 24])


def dq(q, k, v, do, row_max, row_log_sum, delta, dq, sm_scale: float, qk_scale: float,
       stages: int = DQ_STAGES) -> None:
    """Fills ``dq`` as :func:`h3_triton.attention._dq_kernel` does; the caller has set the scratch allocator.
    ``stages``: key tiles in flight (benchmarks compare them)."""
    B, S, H, _ = q.shape
    _dq_kernel[(triton.cdiv(S, DQ_BLOCK_M), B * H)](
        q, k, v, do, row_max, row_log_sum, delta, dq,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3],
        H, S, sm_scale, qk_scale,
        HEAD_DIM=HEAD_DIM, BLOCK_M=DQ_BLOCK_M, BLOCK_N=DQ_BLOCK_N, STAGES=stages, num_warps=4, maxnreg=168,
    )
