"""RMSNorm fused with the per-row AdaLN modulation of MiniMax-H3: one pass over the activations each way.

diffusers computes ``norm1(x) * (1 + scale[idx]) + shift[idx]`` as separate bf16 ops (RMSNorm, two row
gathers, add, multiply, add), each a trip through memory and a rounding. Here a program loads whole rows,
computes everything in float32 and rounds once; a wide row is read in chunks, twice (the second time from
cache), rather than held in registers. The tables are ``(R, C)`` views of the ``(R, 6C)``
modulation projection (R = timesteps x modalities, a handful), gathered per row through ``idx``; the same
kernel serves ``norm_out`` (idx = timestep per row) and plain RMSNorm (no tables).

Backward recomputes the row statistics from x rather than saving them: x is read anyway. The gradients of
the tables and the weight are row sums, reduced deterministically through :mod:`h3_triton.rowreduce`. Per
table row r the backward kernel sums A_r = dy * x_hat and D_r = dy over the rows that use r; then
dscale_r = weight * A_r, dshift_r = D_r and dweight = sum_r (1 + scale_r) * A_r. Keeping two running sums
instead of three keeps the 5376-wide rows of the release model in registers.
"""

import dataclasses

import torch
import triton
import triton.language as tl

from h3_triton import paths
from h3_triton.interpret import column_sum, to_dtype
from h3_triton.launch import cdiv
from h3_triton.rowreduce import (
    UPCAST, accumulate_rows, as_batch_rows, check_activation, check_row_index, check_table, clear_flags, flush_slot,
    full_row_tiling, new_slots, reduce_slots, slot_blocks, split_rows, sum_slots,
)


_FORWARD_CHUNK = 1024  # columns per chunk of a wide row's forward, see _forward_tiling


@triton.jit
def _forward_kernel(
    x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, y_ptr,
    n_rows, seq_len, width, eps,
    sx_b, sx_s, sx_c, s_w, s_scale_r, s_scale_c, s_shift_r, s_shift_c, s_idx,
    MODULATED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """BLOCK_S rows in two passes over chunks of BLOCK_C columns: the sum of squares, then the output.

    The second pass reads x again from L1/L2 (a release row is 10.7 KB); a row narrower than BLOCK_C is one chunk.
    """
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_mask = rows < n_rows
    batch = rows // seq_len
    seq = rows - batch * seq_len
    x_rows = x_ptr + (batch * sx_b + seq * sx_s)[:, None]
    chunk = tl.arange(0, BLOCK_C)
    squares = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for start in range(0, width, BLOCK_C):
        cols = start + chunk
        mask = row_mask[:, None] & (cols < width)[None, :]
        x = tl.load(x_rows + cols[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        squares += x * x
    rstd = tl.rsqrt(tl.sum(squares, axis=1) / width + eps)
    if MODULATED:
        r = tl.load(idx_ptr + seq * s_idx, mask=row_mask, other=0)
    for start in range(0, width, BLOCK_C):
        cols = start + chunk
        col_mask = cols < width
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_rows + cols[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        if MODULATED:
            scale = tl.load(scale_ptr + r[:, None] * s_scale_r + cols[None, :] * s_scale_c, mask=mask, other=0.0)
            shift = tl.load(shift_ptr + r[:, None] * s_shift_r + cols[None, :] * s_shift_c, mask=mask, other=0.0)
            y = y * (1.0 + scale.to(tl.float32)) + shift.to(tl.float32)
        tl.store(y_ptr + rows[:, None] * width + cols[None, :], to_dtype(y, y_ptr.dtype.element_ty, UPCAST),
                 mask=mask)


@triton.jit
def _backward_kernel(
    x_ptr, w_ptr, scale_ptr, idx_ptr, dy_ptr, dx_ptr, part_ptr, flag_ptr,
    n_rows, seq_len, width, eps, table_rows, rows_per_program,
    sx_b, sx_s, sx_c, sdy_b, sdy_s, sdy_c, s_w, s_scale_r, s_scale_c, s_idx,
    MODULATED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """dx per row; per table row r the sums of dy * x_hat (slot r) and of dy (slot R + r) over its rows.

    Without modulation slot 0 holds the sum of dy * x_hat, which is the weight gradient itself.
    """
    pid = tl.program_id(0)
    slots = 1
    if MODULATED:
        slots = 2 * table_rows
    part_base = part_ptr + pid.to(tl.int64) * slots * width
    flag_base = flag_ptr + pid * slots
    clear_flags(flag_base, slots)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < width
    start = pid.to(tl.int64) * rows_per_program
    end = tl.minimum(start + rows_per_program, n_rows)
    acc_dy_x_hat = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_dy = tl.zeros([BLOCK_C], dtype=tl.float32)
    run = 0
    if MODULATED:
        run = tl.load(idx_ptr + (start % seq_len) * s_idx).to(tl.int32)
    for row0 in range(start, end, BLOCK_S):
        rows = row0 + tl.arange(0, BLOCK_S)
        row_mask = rows < end
        mask = row_mask[:, None] & col_mask[None, :]
        batch = rows // seq_len
        seq = rows - batch * seq_len
        x_off = batch * sx_b + seq * sx_s
        dy_off = batch * sdy_b + seq * sdy_s
        x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + dy_off[:, None] + cols[None, :] * sdy_c, mask=mask, other=0.0).to(tl.float32)
        # Reloaded per tile (a cache hit) rather than held across the loop: registers are the scarce resource.
        w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / width + eps)
        x_hat = x * rstd[:, None]
        if MODULATED:
            r = tl.load(idx_ptr + seq * s_idx, mask=row_mask, other=0).to(tl.int32)
            scale = tl.load(scale_ptr + r[:, None] * s_scale_r + cols[None, :] * s_scale_c, mask=mask, other=0.0)
            dn = dy * (1.0 + scale.to(tl.float32)) * w[None, :]
            acc_dy_x_hat, _ = accumulate_rows(
                acc_dy_x_hat, run, dy * x_hat, r, row_mask, part_base, flag_base, width, cols, col_mask
            )
            acc_dy, run = accumulate_rows(
                acc_dy, run, dy, r, row_mask, part_base + table_rows * width, flag_base + table_rows,
                width, cols, col_mask,
            )
        else:
            acc_dy_x_hat += column_sum(dy * x_hat, UPCAST)
            dn = dy * w[None, :]
        dx = rstd[:, None] * (dn - x_hat * (tl.sum(dn * x_hat, axis=1) / width)[:, None])
        tl.store(
            dx_ptr + rows[:, None] * width + cols[None, :], to_dtype(dx, dx_ptr.dtype.element_ty, UPCAST), mask=mask
        )
    flush_slot(acc_dy_x_hat, part_base, flag_base, run, width, cols, col_mask)
    if MODULATED:
        flush_slot(acc_dy, part_base + table_rows * width, flag_base + table_rows, run, width, cols, col_mask)


@triton.jit
def _table_grads_kernel(
    part_ptr, flag_ptr, w_ptr, scale_ptr, dscale_ptr, dshift_ptr, wpart_ptr, wflag_ptr,
    programs, table_rows, width, s_w, s_scale_r, s_scale_c,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Table row r: dscale = w * A_r, dshift = D_r, and the weight gradient's share (1 + scale_r) * A_r.

    A_r and D_r are the slot sums of the backward kernel. The shares go to slots of their own, one per table
    row, which :func:`reduce_slots` sums into the weight gradient.
    """
    r = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < width
    a = sum_slots(part_ptr, flag_ptr, programs, 2 * table_rows, width, r, cols, col_mask, BLOCK_G, BLOCK_C)
    d = sum_slots(
        part_ptr, flag_ptr, programs, 2 * table_rows, width, table_rows + r, cols, col_mask, BLOCK_G, BLOCK_C
    )
    w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + r * s_scale_r + cols * s_scale_c, mask=col_mask, other=0.0).to(tl.float32)
    out = r.to(tl.int64) * width + cols
    tl.store(dscale_ptr + out, to_dtype(w * a, dscale_ptr.dtype.element_ty, UPCAST), mask=col_mask)
    tl.store(dshift_ptr + out, to_dtype(d, dshift_ptr.dtype.element_ty, UPCAST), mask=col_mask)
    # A table row no row uses has A_r = 0 exactly; its scale is never read forward, so not here either.
    tl.store(wpart_ptr + out, tl.where(a == 0.0, 0.0, (1.0 + scale) * a), mask=col_mask)
    tl.store(wflag_ptr + r, 1)


def _forward_tiling(width: int, name: str):
    """The forward's tiling: the shared one, except that a single wide row goes in chunks of 1024 with 4 warps.

    The shared tiling pads a row to a power of two (5376 -> 8192 lanes) and, for one row, up to 16 warps.
    Measured on an H200 at the release width 5376 (``benchmarks/row_tilings.py``; ``results/h200-perf/
    norm-variants.log``, ``row-tilings-chunks.log``): the whole padded row takes 0.309 ms (62% of the copy
    bandwidth) with 4 warps and 0.42 ms with 16; chunks of 1024 with 4 warps take 0.245 ms (79%), of 512 0.254 ms,
    of 2048 0.260 ms. Smaller tiles keep fewer registers live, so more rows are in flight per SM. The backward keeps
    the shared tiling: its row ranges, and so its summation order, follow from it.
    """
    tiling = full_row_tiling(width, name)
    if tiling.rows > 1:
        return tiling
    return dataclasses.replace(tiling, width=min(tiling.width, _FORWARD_CHUNK), warps=4)


def _table_strides(table: torch.Tensor | None) -> tuple[int, int]:
    return (0, 0) if table is None else table.stride()


class _RMSNormModulate(torch.autograd.Function):
    """On (batch, seq, C) views; the public function merges and restores the leading dims."""

    @staticmethod
    def forward(ctx, x, weight, eps, scale, shift, idx):
        batch, seq_len, width = x.shape
        tiling = _forward_tiling(width, "x")
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n_rows = batch * seq_len
        paths.launch(
            _forward_kernel, (cdiv(n_rows, tiling.rows),),
            x, weight, scale, shift, idx, y,
            n_rows, seq_len, width, eps,
            *x.stride(), weight.stride(0), *_table_strides(scale), *_table_strides(shift),
            0 if idx is None else idx.stride(0),
            MODULATED=scale is not None, BLOCK_S=tiling.rows, BLOCK_C=tiling.width, num_warps=tiling.warps,
            branches={"chunked": width > tiling.width},
        )
        ctx.save_for_backward(x, weight, scale, shift, idx)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, scale, shift, idx = ctx.saved_tensors
        batch, seq_len, width = x.shape
        n_rows = batch * seq_len
        tiling = full_row_tiling(width, "x")
        programs, rows_per_program = split_rows(n_rows, tiling.rows, x.device)
        modulated = scale is not None
        table_rows = scale.shape[0] if modulated else 0
        parts, flags = new_slots(programs, 2 * table_rows if modulated else 1, width, x.device)
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        paths.launch(
            _backward_kernel, (programs,),
            x, weight, scale, idx, dy, dx, parts, flags,
            n_rows, seq_len, width, ctx.eps, table_rows, rows_per_program,
            *x.stride(), *dy.stride(), weight.stride(0), *_table_strides(scale),
            0 if idx is None else idx.stride(0),
            MODULATED=modulated, BLOCK_S=tiling.rows, BLOCK_C=tiling.width, num_warps=tiling.warps,
        )
        dweight = torch.empty((1, width), dtype=weight.dtype, device=x.device)
        if not modulated:
            reduce_slots(parts, flags, 0, dweight)
            return dx, dweight.view(width), None, None, None, None
        dscale = torch.empty(scale.shape, dtype=scale.dtype, device=x.device)
        dshift = torch.empty(shift.shape, dtype=shift.dtype, device=x.device)
        weight_parts, weight_flags = new_slots(table_rows, 1, width, x.device)
        blocks = slot_blocks(programs, width)
        paths.launch(
            _table_grads_kernel, (cdiv(width, blocks.width), table_rows),
            parts, flags, weight, scale, dscale, dshift, weight_parts, weight_flags,
            programs, table_rows, width, weight.stride(0), *scale.stride(),
            BLOCK_G=blocks.rows, BLOCK_C=blocks.width, num_warps=blocks.warps,
        )
        reduce_slots(weight_parts, weight_flags, 0, dweight)
        return dx, dweight.view(width), None, dscale, dshift, None


def rms_norm_modulate(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x * rsqrt(mean(x**2) + eps) * weight * (1 + scale[idx]) + shift[idx]`` over the last dim of x.

    x is (..., S, C) with leading batch dims, any strides; weight (C,); scale and shift (R, C) tables (views
    such as column slices of the modulation projection are fine) or both None for a plain RMSNorm; idx (S,)
    int32/int64 picks a table row per sequence position and must hold values in [0, R). Computed in float32,
    rounded once to x's dtype. Gradients: x, weight, scale, shift (table rows summed deterministically).
    """
    check_activation(x, "x")
    rows = as_batch_rows(x, "x")
    width = x.shape[-1]
    if weight.shape != (width,) or not weight.is_floating_point() or weight.device != x.device:
        raise ValueError(
            f"weight must be a floating ({width},) tensor on {x.device}, got {weight.dtype} {tuple(weight.shape)} "
            f"on {weight.device}"
        )
    if (scale is None) != (shift is None) or (scale is None) != (idx is None):
        raise ValueError("scale, shift and idx go together: pass all three for modulation, or none for RMSNorm")
    if scale is not None:
        check_table(scale, "scale", width, x.device)
        check_table(shift, "shift", width, x.device)
        if scale.shape != shift.shape:
            raise ValueError(f"scale {tuple(scale.shape)} and shift {tuple(shift.shape)} must have the same rows")
        check_row_index(idx, x.shape[-2], x.device)
    return _RMSNormModulate.apply(rows, weight, float(eps), scale, shift, idx).view(x.shape)
