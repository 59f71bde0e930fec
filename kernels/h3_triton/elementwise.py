"""The feed-forward SwiGLU activation and the gated residual add of MiniMax-H3 blocks, one pass each way.

diffusers evaluates ``h * silu(g)`` (h, g the halves of the up-projection) and ``residual + gate[idx] * y``
as separate bf16 ops with a rounding and a trip through memory after each. These kernels compute in float32
and round once. The gate is an ``(R, C)`` view of the modulation projection picked per row through ``idx``;
its gradient is a row sum, reduced deterministically through :mod:`h3_triton.rowreduce`.
"""

import torch
import triton
import triton.language as tl

from h3_triton import paths
from h3_triton.interpret import to_dtype
from h3_triton.launch import cdiv
from h3_triton.rowreduce import (
    UPCAST, accumulate_rows, as_batch_rows, check_activation, check_row_index, check_table, clear_flags, flush_slot,
    full_row_tiling, new_slots, reduce_slots, split_rows, warps_for,
)

# Column tile of SwiGLU (whose rows, 2 x 14336 wide at release, need no reduction), and rows per tile.
_SWIGLU_COLUMNS = 1024
_SWIGLU_ELEMENTS = 4096


@triton.jit
def _swiglu_forward_kernel(
    h_ptr, y_ptr, n_rows, seq_len, half, sh_b, sh_s, sh_c,
    BLOCK_S: tl.constexpr, BLOCK_F: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < n_rows)[:, None] & (cols < half)[None, :]
    batch = rows // seq_len
    a_ptrs = h_ptr + (batch * sh_b + (rows - batch * seq_len) * sh_s)[:, None] + cols[None, :] * sh_c
    a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(a_ptrs + half * sh_c, mask=mask, other=0.0).to(tl.float32)
    y = a * b * tl.sigmoid(b)
    tl.store(y_ptr + rows[:, None] * half + cols[None, :], to_dtype(y, y_ptr.dtype.element_ty, UPCAST), mask=mask)


@triton.jit
def _swiglu_backward_kernel(
    h_ptr, dy_ptr, dh_ptr, n_rows, seq_len, half, sh_b, sh_s, sh_c, sdy_b, sdy_s, sdy_c,
    BLOCK_S: tl.constexpr, BLOCK_F: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < n_rows)[:, None] & (cols < half)[None, :]
    batch = rows // seq_len
    seq = rows - batch * seq_len
    a_ptrs = h_ptr + (batch * sh_b + seq * sh_s)[:, None] + cols[None, :] * sh_c
    a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(a_ptrs + half * sh_c, mask=mask, other=0.0).to(tl.float32)
    dy_ptrs = dy_ptr + (batch * sdy_b + seq * sdy_s)[:, None] + cols[None, :] * sdy_c
    dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(b)
    da = dy * b * sig
    db = dy * a * sig * (1.0 + b * (1.0 - sig))
    da_ptrs = dh_ptr + rows[:, None] * (2 * half) + cols[None, :]
    tl.store(da_ptrs, to_dtype(da, dh_ptr.dtype.element_ty, UPCAST), mask=mask)
    tl.store(da_ptrs + half, to_dtype(db, dh_ptr.dtype.element_ty, UPCAST), mask=mask)


def _swiglu_grid(n_rows: int, half: int) -> tuple[tuple[int, int], dict]:
    block_f = min(triton.next_power_of_2(half), _SWIGLU_COLUMNS)
    block_s = max(1, _SWIGLU_ELEMENTS // block_f)
    grid = (cdiv(n_rows, block_s), cdiv(half, block_f))
    return grid, dict(BLOCK_S=block_s, BLOCK_F=block_f, num_warps=warps_for(block_s * block_f))


class _SwiGLU(torch.autograd.Function):
    """On (batch, seq, 2F) views; the public function merges and restores the leading dims."""

    @staticmethod
    def forward(ctx, h):
        batch, seq_len, width = h.shape
        half = width // 2
        y = torch.empty((batch, seq_len, half), dtype=h.dtype, device=h.device)
        grid, meta = _swiglu_grid(batch * seq_len, half)
        paths.launch(_swiglu_forward_kernel, grid, h, y, batch * seq_len, seq_len, half, *h.stride(), **meta)
        ctx.save_for_backward(h)
        return y

    @staticmethod
    def backward(ctx, dy):
        (h,) = ctx.saved_tensors
        batch, seq_len, width = h.shape
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        grid, meta = _swiglu_grid(batch * seq_len, width // 2)
        paths.launch(
            _swiglu_backward_kernel, grid,
            h, dy, dh, batch * seq_len, seq_len, width // 2, *h.stride(), *dy.stride(), **meta
        )
        return dh


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """``h[..., :F] * silu(h[..., F:])`` for h (..., 2F) with any strides; float32 math, rounded once."""
    check_activation(h, "h")
    if h.dim() < 2 or h.shape[-1] % 2 or h.shape[-1] == 0:
        raise ValueError(f"h must be (..., rows, 2F) with an even, non-zero last dim, got shape {tuple(h.shape)}")
    return _SwiGLU.apply(as_batch_rows(h, "h")).view(*h.shape[:-1], h.shape[-1] // 2)


@triton.jit
def _gated_forward_kernel(
    res_ptr, y_ptr, gate_ptr, idx_ptr, out_ptr, n_rows, seq_len, width,
    sr_b, sr_s, sr_c, sy_b, sy_s, sy_c, s_gate_r, s_gate_c, s_idx,
    GATED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_C)
    mask = row_mask[:, None] & (cols < width)[None, :]
    batch = rows // seq_len
    seq = rows - batch * seq_len
    res = tl.load(
        res_ptr + (batch * sr_b + seq * sr_s)[:, None] + cols[None, :] * sr_c, mask=mask, other=0.0
    ).to(tl.float32)
    y = tl.load(y_ptr + (batch * sy_b + seq * sy_s)[:, None] + cols[None, :] * sy_c, mask=mask, other=0.0)
    y = y.to(tl.float32)
    if GATED:
        r = tl.load(idx_ptr + seq * s_idx, mask=row_mask, other=0)
        gate = tl.load(gate_ptr + r[:, None] * s_gate_r + cols[None, :] * s_gate_c, mask=mask, other=0.0)
        y = y * gate.to(tl.float32)
    out = res + y
    tl.store(
        out_ptr + rows[:, None] * width + cols[None, :], to_dtype(out, out_ptr.dtype.element_ty, UPCAST), mask=mask
    )


@triton.jit
def _gated_backward_kernel(
    y_ptr, gate_ptr, idx_ptr, dout_ptr, dy_ptr, part_ptr, flag_ptr,
    n_rows, seq_len, width, table_rows, rows_per_program,
    sy_b, sy_s, sy_c, sdo_b, sdo_s, sdo_c, s_gate_r, s_gate_c, s_idx,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    part_base = part_ptr + pid.to(tl.int64) * table_rows * width
    flag_base = flag_ptr + pid * table_rows
    clear_flags(flag_base, table_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < width
    start = pid.to(tl.int64) * rows_per_program
    end = tl.minimum(start + rows_per_program, n_rows)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    run = tl.load(idx_ptr + (start % seq_len) * s_idx).to(tl.int32)
    for row0 in range(start, end, BLOCK_S):
        rows = row0 + tl.arange(0, BLOCK_S)
        row_mask = rows < end
        mask = row_mask[:, None] & col_mask[None, :]
        batch = rows // seq_len
        seq = rows - batch * seq_len
        y = tl.load(y_ptr + (batch * sy_b + seq * sy_s)[:, None] + cols[None, :] * sy_c, mask=mask, other=0.0)
        dout = tl.load(
            dout_ptr + (batch * sdo_b + seq * sdo_s)[:, None] + cols[None, :] * sdo_c, mask=mask, other=0.0
        ).to(tl.float32)
        r = tl.load(idx_ptr + seq * s_idx, mask=row_mask, other=0).to(tl.int32)
        gate = tl.load(gate_ptr + r[:, None] * s_gate_r + cols[None, :] * s_gate_c, mask=mask, other=0.0)
        dy = dout * gate.to(tl.float32)
        tl.store(
            dy_ptr + rows[:, None] * width + cols[None, :], to_dtype(dy, dy_ptr.dtype.element_ty, UPCAST), mask=mask
        )
        acc, run = accumulate_rows(
            acc, run, dout * y.to(tl.float32), r, row_mask, part_base, flag_base, width, cols, col_mask
        )
    flush_slot(acc, part_base, flag_base, run, width, cols, col_mask)


def _gate_args(gate: torch.Tensor | None, idx: torch.Tensor | None) -> tuple[int, int, int]:
    """Gate and idx strides as kernel arguments; zeros for a plain add."""
    return (0, 0, 0) if gate is None else (*gate.stride(), idx.stride(0))


class _GatedResidual(torch.autograd.Function):
    """On (batch, seq, C) views; the public function merges and restores the leading dims."""

    @staticmethod
    def forward(ctx, residual, y, gate, idx):
        batch, seq_len, width = residual.shape
        tiling = full_row_tiling(width, "residual")
        out = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
        n_rows = batch * seq_len
        paths.launch(
            _gated_forward_kernel, (cdiv(n_rows, tiling.rows),),
            residual, y, gate, idx, out, n_rows, seq_len, width,
            *residual.stride(), *y.stride(), *_gate_args(gate, idx),
            GATED=gate is not None, BLOCK_S=tiling.rows, BLOCK_C=tiling.width, num_warps=tiling.warps,
        )
        ctx.save_for_backward(y, gate, idx)
        return out

    @staticmethod
    def backward(ctx, dout):
        y, gate, idx = ctx.saved_tensors
        if gate is None:
            return dout, dout, None, None
        batch, seq_len, width = y.shape
        n_rows = batch * seq_len
        tiling = full_row_tiling(width, "residual")
        programs, rows_per_program = split_rows(n_rows, tiling.rows, y.device)
        table_rows = gate.shape[0]
        parts, flags = new_slots(programs, table_rows, width, y.device)
        dy = torch.empty(y.shape, dtype=y.dtype, device=y.device)
        paths.launch(
            _gated_backward_kernel, (programs,),
            y, gate, idx, dout, dy, parts, flags,
            n_rows, seq_len, width, table_rows, rows_per_program,
            *y.stride(), *dout.stride(), *_gate_args(gate, idx),
            BLOCK_S=tiling.rows, BLOCK_C=tiling.width, num_warps=tiling.warps,
        )
        dgate = reduce_slots(parts, flags, 0, torch.empty(gate.shape, dtype=gate.dtype, device=y.device))
        return dout, dy, dgate, None


def gated_residual(
    residual: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor | None = None,
    idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + gate[idx] * y``, or ``residual + y`` without a gate; float32 math, rounded once.

    residual and y are (..., S, C) of one dtype, any strides; gate an (R, C) table (a column slice of the
    modulation projection is fine) and idx (S,) int32/int64 with values in [0, R), both or neither.
    Gradients: residual, y, gate (table rows summed deterministically).
    """
    check_activation(residual, "residual")
    if y.shape != residual.shape or y.dtype != residual.dtype or y.device != residual.device:
        raise ValueError(
            f"y ({y.dtype} {tuple(y.shape)} on {y.device}) must match residual "
            f"({residual.dtype} {tuple(residual.shape)} on {residual.device})"
        )
    rows = (as_batch_rows(residual, "residual"), as_batch_rows(y, "y"))
    if (gate is None) != (idx is None):
        raise ValueError("gate and idx go together: pass both for a gated residual, or neither for a plain add")
    if gate is not None:
        check_table(gate, "gate", residual.shape[-1], residual.device)
        check_row_index(idx, residual.shape[-2], residual.device)
    return _GatedResidual.apply(*rows, gate, idx).view(residual.shape)
