"""The attention forward in Gluon, three schedules, against h3_triton's Triton kernel and cuDNN at release shape.

Usage (GPU): python benchmarks/attention_fwd_gluon.py [--schedule pingpong|lockstep|lag-pv] [--stages 3]

``pingpong`` is the kernel h3_triton runs on Hopper (:mod:`h3_triton.attention_hopper`: two consumer warp groups
taking turns at the tensor cores, a producer warp for the TMA loads). The two others, kept to show what the
turns buy, are one program of 8 warps (both warp groups over 128 query rows in lockstep, as Triton's compiler
runs h3_triton's forward) with the schedule FlashAttention-3 calls intra-warpgroup overlap: the scores of key tile
j + 1 are issued before the softmax of tile j, so the tensor cores run them under it, and key and value tiles
stream through a ring of TMA stages, each guarded by an mbarrier; ``lockstep`` waits for each P V with the next
scores, ``lag-pv`` one tile later (so the next softmax also runs under it; 3 stages or more). Every schedule does
h3_triton's arithmetic step for step: the script checks that the output and the saved row statistics are bitwise
h3_triton's, and that two runs agree, before timing.

Measured on an H200 (``results/h200-perf/attention-fwd-gluon.log``): lockstep 96.5 ms with 2 stages and 78.2 ms
with 3, lag-pv 79.1 ms, pingpong 82.8 ms with 2 stages and 67.7 ms (619 TFLOP/s) with 3, against h3_triton's
Triton kernel at 73.2-76.1 ms and cuDNN at 71.9-73.7 ms in the same runs.
"""

import argparse
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait,
)

from h3_triton import attention, attention_hopper
from h3_triton.attention_hopper import _softmax_tile
from h3_triton.tma import set_scratch_allocator
from h3gate.bench import RELEASE, cases, median_ms

BLOCK = 128
HEAD_DIM = 128


@gluon.jit
def _prefetch(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, tile, n_tiles, STAGES: gl.constexpr,
              BLOCK_N: gl.constexpr):
    """Starts the TMA loads of key and value tile ``tile`` into its stage, if the tile exists."""
    stage = tile % STAGES
    exists = tile < n_tiles
    mbarrier.expect(k_bars.index(stage), k_desc.block_type.nbytes, pred=exists)
    tma.async_copy_global_to_shared(k_desc, [tile * BLOCK_N, 0], k_bars.index(stage), k_smem.index(stage),
                                    pred=exists)
    mbarrier.expect(v_bars.index(stage), v_desc.block_type.nbytes, pred=exists)
    tma.async_copy_global_to_shared(v_desc, [tile * BLOCK_N, 0], v_bars.index(stage), v_smem.index(stage),
                                    pred=exists)


@gluon.jit
def _gluon_fwd_kernel(Q, K, V, O, ROW_MAX, ROW_LOG_SUM,
                      stride_b, stride_s, stride_h, H, S, qk_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      LAG_PV: gl.constexpr):
    """One query block of one (batch, head); q, k, v and o share the (B, S, H, D) strides (b, s, h)."""
    gl.static_assert(BLOCK_N == HEAD_DIM, "scores and output share one wgmma layout")
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    head = (pid_bh // H).to(gl.int64) * stride_b + (pid_bh % H).to(gl.int64) * stride_h
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.bfloat16)
    q_desc = tma.make_tensor_descriptor(Q + head, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM], layout=tile_layout)
    k_desc = tma.make_tensor_descriptor(K + head, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM], layout=tile_layout)
    v_desc = tma.make_tensor_descriptor(V + head, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM], layout=tile_layout)
    o_desc = tma.make_tensor_descriptor(O + head, shape=[S, HEAD_DIM], strides=[stride_s, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM], layout=tile_layout)

    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    cols_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, HEAD_DIM], tile_layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    n_tiles = gl.cdiv(S, BLOCK_N)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [pid_m * BLOCK_M, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES - 1 if LAG_PV else STAGES):
        _prefetch(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, n_tiles, STAGES, BLOCK_N)

    zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma_layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zeros, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))

    # Every tile but the last is full: its scores need no mask. The next tile's scores are issued before this
    # tile's softmax, so the tensor cores run them under it. LAG_PV: this tile's P V is waited for one tile
    # later, after the next softmax, which then also runs under it (a stage is refilled only once the P V
    # that read it is done, so the ring needs a third stage); otherwise it is waited for with the scores.
    if LAG_PV:
        acc = warpgroup_mma_init(acc)  # carried through the loop as an in-flight accumulator
    for j in range(0, n_tiles - 1):
        stage = j % STAGES
        nxt = (j + 1) % STAGES
        mbarrier.wait(k_bars.index(nxt), ((j + 1) // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), zeros, use_acc=False, is_async=True)
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale)
        if LAG_PV:
            acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous tile's P V, issued before s_next
            _prefetch(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j + STAGES - 1, n_tiles, STAGES, BLOCK_N)
        mbarrier.wait(v_bars.index(stage), (j // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(stage), acc * alpha,
                            is_async=True)
        if LAG_PV:
            s = warpgroup_mma_wait(1, deps=(s_next,))
        else:
            s, acc = warpgroup_mma_wait(0, deps=(s_next, acc))
            _prefetch(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j + STAGES, n_tiles, STAGES, BLOCK_N)

    last = n_tiles - 1
    keys = last * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_layout)
    s = gl.where(gl.expand_dims(keys < S, 0), s, float("-inf"))
    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(last % STAGES), acc * alpha,
                        is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    q_smem.store((acc / gl.expand_dims(l_i, 1)).to(gl.bfloat16))  # Q is no longer read: its tile stages O
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [pid_m * BLOCK_M, 0], q_smem)
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_layout)
    rows_out = pid_bh.to(gl.int64) * S + rows
    gl.store(ROW_MAX + rows_out, m_i, mask=rows < S)
    gl.store(ROW_LOG_SUM + rows_out, gl.log2(l_i), mask=rows < S)
    tma.store_wait(0)


SCHEDULES = ("pingpong", "lockstep", "lag-pv")


def gluon_forward(q, k, v, schedule: str, stages: int):
    """o, row_max, row_log_sum of ``attention(q, k, v)`` by one schedule; q, k, v contiguous (B, S, H, 128)."""
    B, S, H, D = q.shape
    o, row_max, row_log_sum = attention._forward_outputs(q)
    qk_scale = attention._qk_scale(D)
    set_scratch_allocator()
    if schedule == "pingpong":
        if stages != attention_hopper.STAGES:
            raise SystemExit(f"--stages: the pingpong kernel is h3_triton's, built with {attention_hopper.STAGES}")
        attention_hopper.forward(q, k, v, o, row_max, row_log_sum, qk_scale)
    else:
        _gluon_fwd_kernel[(triton.cdiv(S, BLOCK), B * H)](
            q, k, v, o, row_max, row_log_sum, q.stride(0), q.stride(1), q.stride(2), H, S, qk_scale,
            HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, STAGES=stages, LAG_PV=schedule == "lag-pv", num_warps=8,
        )
    return o, row_max, row_log_sum


def triton_forward(q, k, v):
    """o, row_max, row_log_sum of h3_triton's Triton forward kernel (on any GPU)."""
    outputs = attention._forward_outputs(q)
    attention.triton_forward(q, k, v, *outputs)
    return outputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=3, help="TMA stages of the key and value ring (default 3)")
    parser.add_argument("--schedule", choices=SCHEDULES, default="pingpong",
                        help="pingpong: h3_triton's Hopper kernel; lockstep: 8 warps, each P V waited for with the "
                        "next scores; lag-pv: each P V waited for one tile later (3+ stages)")
    args = parser.parse_args()

    case = next(c for c in cases(RELEASE, "cuda") if c.op == "attention")
    q, k, v = (case.make()[name] for name in ("q", "k", "v"))
    reference = triton_forward(q, k, v)
    outputs = gluon_forward(q, k, v, args.schedule, args.stages)
    differences = ", ".join(f"{name} {(got.float() - want.float()).abs().max().item():.2e}" for name, got, want in
                            zip(("o", "row max", "log2 row sum"), outputs, reference))
    bitwise = all(torch.equal(got, want) for got, want in zip(outputs, reference))
    again = all(torch.equal(a, b) for a, b in zip(outputs, gluon_forward(q, k, v, args.schedule, args.stages)))
    print(f"{case.label} {args.schedule}, {args.stages} stages: max differences from the Triton kernel's: "
          f"{differences}; bitwise equal: {bitwise}; repeatable: {again}")
    flops = 4.0 * q.shape[0] * q.shape[2] * q.shape[1] ** 2 * q.shape[3]
    runs = {
        "gluon": lambda: gluon_forward(q, k, v, args.schedule, args.stages),
        "triton": lambda: triton_forward(q, k, v),
        "cudnn": lambda: torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))),
    }
    for name, run in runs.items():
        ms = median_ms(run, "cuda")
        print(f"{case.label} forward {name:10s} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
