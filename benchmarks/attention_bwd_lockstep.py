"""The Hopper attention backward with its two consumer warp groups in one partition of 8 warps, in lockstep.

h3_triton's kernel (:func:`h3_triton.attention_hopper._backward_kernel`) runs its two consumers (64 keys each) as
two partitions: the default one and a worker. Compiled for sm_90, the worker's loop spills and the default's does
not, whichever half of the keys it takes (``attention_sass.py``: 20 local loads and stores a query tile, 50
``R2UR`` moves against 14, the loop's wgmma descriptors held in ordinary registers where the default partition
keeps them in uniform ones; each partition may hold 240 registers, and given 256 the worker stops spilling while
the default, left 224, starts). Its Nsight Compute profile counts those spills: 401.7 million local-memory
requests a launch of 28 heads, 400.5 million of them the worker's loop (8,372 programs x 598 query tiles x 4 warps
x 20), L1 84% busy.

Here both warp groups run the default partition's code, as FlashAttention-3's backward runs its two MMA warp
groups: every product takes the whole 128-key block (M = 128 over 8 warps, each warp group its 64 keys as
before), dQ's term is one product over the 128 keys with each warp group computing 64 of its columns, and the
warp groups meet at barriers instead of mbarriers. Every product is the same chain of the same wgmma instructions
on the same operands as h3_triton's (dQ's two chains of four key steps become one of eight, in the same order),
so the gradients should be bitwise h3_triton's: ``attention_bwd_gluon.py --lockstep`` checks that, then times
both. The producer and the dQ writers are h3_triton's own; the consumer's loop repeats h3_triton's with the wider
layouts, kept apart until an H200 has timed it (if it wins, it replaces h3_triton's consumers and kernel body).

Usage: imported by ``attention_bwd_gluon.py``; ``attention_sass.py`` compiles it for sm_90 on any machine.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from h3_triton.attention_hopper import (
    _backward_producer, _dq_writer_even, _dq_writer_odd, _head, _head_descriptor, _load_two, _row_terms_descriptor,
)

WARPS = 8


@gluon.constexpr_function
def _wgmma8_layout(columns, warps_along_columns):
    """The accumulator layout of a wgmma over ``columns`` output columns by both warp groups: stacked along the
    rows (1) or side by side along the columns (2)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS // warps_along_columns,
                                                                    warps_along_columns],
                                     instr_shape=[16, columns // warps_along_columns, 16])


@gluon.jit
def _lockstep_consumer(args):
    """The key block's dK and dV over every query tile, and each query tile's dQ term of the whole block (dS K),
    handed to the writer warps through shared memory: both consumer warp groups of h3_triton's kernel at once."""
    (k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_pairs,
     kv_bar, q_ready, do_ready, empty, dq_full, dq_empty, pid_n, S, sm_scale, qk_scale) = args
    STAGES: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[2]
    KEYS: gl.constexpr = k_smem.type.shape[0]
    scores_layout: gl.constexpr = _wgmma8_layout(BLOCK_M, 1)
    grads_layout: gl.constexpr = _wgmma8_layout(HEAD_DIM, 1)
    dq_layout: gl.constexpr = _wgmma8_layout(HEAD_DIM, 2)
    operand_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=grads_layout, k_width=2)
    queries_layout: gl.constexpr = gl.SliceLayout(0, scores_layout)
    row0 = pid_n * KEYS

    _load_two(kv_bar, k_desc, k_smem, v_desc, v_smem, row0)
    mbarrier.wait(kv_bar, 0)
    zeros = gl.zeros([KEYS, BLOCK_M], gl.float32, scores_layout)
    dq_zeros = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
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
        s_t = warpgroup_mma(k_smem, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(stage), phase)
        dp_t = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(1, deps=(s_t,))
        lse = lse_smem.index(stage).load(queries_layout)
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
        dv = warpgroup_mma(gl.convert_layout(p_t.to(gl.bfloat16), operand_layout), do_tile, dv, is_async=True)
        dp_t = warpgroup_mma_wait(1, deps=(dp_t,))
        delta = delta_smem.index(stage).load(queries_layout)
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        ds = ds_smem.index(pair)
        ds.store(ds_t.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()  # both warp groups' dS^T rows are written
        dk = warpgroup_mma(ds, q_tile, dk, is_async=True)
        dq = warpgroup_mma(ds.permute((1, 0)), k_smem, dq_zeros, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
        gl.thread_barrier()  # both warp groups' products have read the stage
        mbarrier.arrive(empty.index(stage), count=1)
        mbarrier.wait(dq_empty.index(pair), pair_phase ^ 1)  # the writer has added this buffer's last tile
        dq_pairs.index(pair).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(dq_full.index(pair), count=1)

    k_smem.store((dk * sm_scale).to(gl.bfloat16))  # the tiles stage the gradients
    v_smem.store(dv.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dk_desc, [row0, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [row0, 0], v_smem)
    tma.store_wait(0)


@gluon.jit
def _lockstep_backward_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_SUM, LOCKS,
                              stride_qb, stride_qs, stride_qh,
                              stride_kb, stride_ks, stride_kh,
                              stride_vb, stride_vs, stride_vh,
                              stride_dob, stride_dos, stride_doh,
                              stride_gb, stride_gs, stride_gh,
                              H, S, S_PADDED, sm_scale, qk_scale,
                              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                              STAGES: gl.constexpr):
    """:func:`h3_triton.attention_hopper._backward_kernel`'s arguments and results, its consumers in lockstep."""
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    COLS: gl.constexpr = HEAD_DIM // 2
    rows_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.bfloat16)
    keys_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.bfloat16)
    terms_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    q_desc = _head_descriptor(Q, _head(pid_bh, H, stride_qb, stride_qh), S, stride_qs, BLOCK_M, HEAD_DIM,
                              rows_layout)
    do_desc = _head_descriptor(DO, _head(pid_bh, H, stride_dob, stride_doh), S, stride_dos, BLOCK_M, HEAD_DIM,
                               rows_layout)
    k_desc = _head_descriptor(K, _head(pid_bh, H, stride_kb, stride_kh), S, stride_ks, BLOCK_N, HEAD_DIM,
                              keys_layout)
    v_desc = _head_descriptor(V, _head(pid_bh, H, stride_vb, stride_vh), S, stride_vs, BLOCK_N, HEAD_DIM,
                              keys_layout)
    grads = _head(pid_bh, H, stride_gb, stride_gh)
    dk_desc = _head_descriptor(DK, grads, S, stride_gs, BLOCK_N, HEAD_DIM, keys_layout)
    dv_desc = _head_descriptor(DV, grads, S, stride_gs, BLOCK_N, HEAD_DIM, keys_layout)
    lse_desc = _row_terms_descriptor(LSE, pid_bh, S_PADDED, BLOCK_M, terms_layout)
    delta_desc = _row_terms_descriptor(DELTA, pid_bh, S_PADDED, BLOCK_M, terms_layout)

    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, HEAD_DIM], keys_layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, HEAD_DIM], keys_layout)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, HEAD_DIM], rows_layout)
    do_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, HEAD_DIM], rows_layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], terms_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], terms_layout)
    ds_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], gl.bfloat16))
    # dQ's terms: the writers add each 64-column half on its own (h3_triton's layout, 64 x 64 a buffer); the
    # consumer stores each whole 64 x 128 term over two of them. Wider than the 128-byte swizzle, a tile is kept
    # in 128-byte column chunks one after the other, so two 64 x 64 tiles are one 64 x 128 tile.
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, COLS], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_M, COLS], dq_layout)
    dq_pairs = dq_smem._reinterpret(gl.float32, [2, BLOCK_M, HEAD_DIM],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float32))
    dq_desc = tma.make_tensor_descriptor(DQ_SUM + pid_bh.to(gl.int64) * S_PADDED * HEAD_DIM,
                                         shape=[S_PADDED, HEAD_DIM], strides=[HEAD_DIM, 1],
                                         block_shape=[BLOCK_M, COLS], layout=dq_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar.index(0), count=1)
    for i in gl.static_range(2):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    consumer = (k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem,
                dq_pairs, kv_bar.index(0), q_ready, do_ready, empty, dq_full, dq_empty, pid_n, S, sm_scale,
                qk_scale)
    producer = (q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                empty, S)
    writers = (dq_desc, dq_smem, dq_full, dq_empty, LOCKS, pid_n, pid_bh, gl.cdiv(S, BLOCK_M))
    gl.warp_specialize([
        (_lockstep_consumer, (consumer,)),
        (_backward_producer, ((consumer, producer, writers),)),
        (_dq_writer_even, ((consumer, producer, writers),)),
        (_dq_writer_odd, ((consumer, producer, writers),)),
    ], [1, 1, 1], [24, 24, 24])
