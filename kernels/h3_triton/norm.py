"""RMSNorm fused with the per-row AdaLN modulation of MiniMax-H3: one pass over the activations each way.

diffusers computes ``norm1(x) * (1 + scale[idx]) + shift[idx]`` as separate bf16 ops (RMSNorm, two row
gathers, add, multiply, add), each a trip through memory and a rounding. Here a program loads whole rows,
computes everything in float32 and rounds once. The tables are ``(R, C)`` views of the ``(R, 6C)``
modulation projection (R = timesteps x modalities, a handful), gathered per row through ``idx``; the same
kernel serves ``norm_out`` (idx = timestep per row) and plain RMSNorm (no tables).

Backward recomputes the row statistics from x rather than saving them: x is read anyway. Table and weight
gradients are row sums, reduced deterministically through :mod:`h3_triton.rowreduce`: slot 0 of each program
holds the weight gradient, slots 1..R the scale gradient and R+1..2R the shift gradient.
"""

import torch
import triton
import triton.language as tl

from h3_triton.rowreduce import (
    accumulate_rows, as_batch_rows, check_activation, check_row_index, check_table, clear_flags, flush_slot,
    full_row_tiling, new_slots, reduce_slots, split_rows,
)


@triton.jit
def _forward_kernel(
    x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, y_ptr,
    n_rows, seq_len, width, eps,
    sx_b, sx_s, sx_c, s_w, s_scale_r, s_scale_c, s_shift_r, s_shift_c, s_idx,
    MODULATED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < width
    mask = row_mask[:, None] & col_mask[None, :]
    batch = rows // seq_len
    seq = rows - batch * seq_len
    x_off = batch * sx_b + seq * sx_s
    x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / width + eps)
    w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    if MODULATED:
        r = tl.load(idx_ptr + seq * s_idx, mask=row_mask, other=0)
        scale = tl.load(scale_ptr + r[:, None] * s_scale_r + cols[None, :] * s_scale_c, mask=mask, other=0.0)
        shift = tl.load(shift_ptr + r[:, None] * s_shift_r + cols[None, :] * s_shift_c, mask=mask, other=0.0)
        y = y * (1.0 + scale.to(tl.float32)) + shift.to(tl.float32)
    tl.store(y_ptr + rows[:, None] * width + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(
    x_ptr, w_ptr, scale_ptr, idx_ptr, dy_ptr, dx_ptr, part_ptr, flag_ptr,
    n_rows, seq_len, width, eps, table_rows, rows_per_program,
    sx_b, sx_s, sx_c, sdy_b, sdy_s, sdy_c, s_w, s_scale_r, s_scale_c, s_idx,
    MODULATED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    slots = 1 + 2 * table_rows
    part_base = part_ptr + pid.to(tl.int64) * slots * width
    flag_base = flag_ptr + pid * slots
    clear_flags(flag_base, slots)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < width
    w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
    start = pid.to(tl.int64) * rows_per_program
    end = tl.minimum(start + rows_per_program, n_rows)
    acc_w = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_scale = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_shift = tl.zeros([BLOCK_C], dtype=tl.float32)
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
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / width + eps)
        x_hat = x * rstd[:, None]
        dy_x_hat = dy * x_hat
        if MODULATED:
            r = tl.load(idx_ptr + seq * s_idx, mask=row_mask, other=0).to(tl.int32)
            scale = tl.load(scale_ptr + r[:, None] * s_scale_r + cols[None, :] * s_scale_c, mask=mask, other=0.0)
            gain = 1.0 + scale.to(tl.float32)
            acc_w += tl.sum(dy_x_hat * gain, axis=0)
            dn = dy * gain * w[None, :]
            acc_scale, _ = accumulate_rows(
                acc_scale, run, dy_x_hat * w[None, :], r, row_mask, part_base + width, flag_base + 1,
                width, cols, col_mask,
            )
            acc_shift, run = accumulate_rows(
                acc_shift, run, dy, r, row_mask, part_base + (1 + table_rows) * width, flag_base + 1 + table_rows,
                width, cols, col_mask,
            )
        else:
            acc_w += tl.sum(dy_x_hat, axis=0)
            dn = dy * w[None, :]
        dx = rstd[:, None] * (dn - x_hat * (tl.sum(dn * x_hat, axis=1) / width)[:, None])
        tl.store(dx_ptr + rows[:, None] * width + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    flush_slot(acc_w, part_base, flag_base, 0, width, cols, col_mask)
    if MODULATED:
        flush_slot(acc_scale, part_base + width, flag_base + 1, run, width, cols, col_mask)
        flush_slot(
            acc_shift, part_base + (1 + table_rows) * width, flag_base + 1 + table_rows, run, width, cols, col_mask
        )


def _table_strides(table: torch.Tensor | None) -> tuple[int, int]:
    return (0, 0) if table is None else table.stride()


class _RMSNormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, scale, shift, idx):
        rows3 = as_batch_rows(x, "x")
        batch, seq_len, width = rows3.shape
        tiling = full_row_tiling(width, "x")
        y = torch.empty(rows3.shape, dtype=x.dtype, device=x.device)
        n_rows = batch * seq_len
        _forward_kernel[(triton.cdiv(n_rows, tiling.rows),)](
            rows3, weight, scale, shift, idx, y,
            n_rows, seq_len, width, eps,
            *rows3.stride(), weight.stride(0), *_table_strides(scale), *_table_strides(shift),
            0 if idx is None else idx.stride(0),
            MODULATED=scale is not None, BLOCK_S=tiling.rows, BLOCK_C=tiling.width, num_warps=tiling.warps,
        )
        ctx.save_for_backward(x, weight, scale, shift, idx)
        ctx.eps = eps
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, scale, shift, idx = ctx.saved_tensors
        rows3 = as_batch_rows(x, "x")
        dy3 = as_batch_rows(dy, "the output gradient")
        batch, seq_len, width = rows3.shape
        n_rows = batch * seq_len
        tiling = full_row_tiling(width, "x")
        programs, rows_per_program = split_rows(n_rows, tiling.rows, x.device)
        modulated = scale is not None
        table_rows = scale.shape[0] if modulated else 0
        parts, flags = new_slots(programs, 1 + 2 * table_rows, width, x.device)
        dx = torch.empty(rows3.shape, dtype=x.dtype, device=x.device)
        _backward_kernel[(programs,)](
            rows3, weight, scale, idx, dy3, dx, parts, flags,
            n_rows, seq_len, width, ctx.eps, table_rows, rows_per_program,
            *rows3.stride(), *dy3.stride(), weight.stride(0), *_table_strides(scale),
            0 if idx is None else idx.stride(0),
            MODULATED=modulated, BLOCK_S=tiling.rows, BLOCK_C=tiling.width, num_warps=tiling.warps,
        )
        dweight = reduce_slots(parts, flags, 0, torch.empty((1, width), dtype=weight.dtype, device=x.device))
        dscale = dshift = None
        if modulated:
            dscale = reduce_slots(parts, flags, 1, torch.empty(scale.shape, dtype=scale.dtype, device=x.device))
            dshift = reduce_slots(
                parts, flags, 1 + table_rows, torch.empty(shift.shape, dtype=shift.dtype, device=x.device)
            )
        return dx.view(x.shape), dweight.view(width), None, dscale, dshift, None


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
    return _RMSNormModulate.apply(x, weight, float(eps), scale, shift, idx)
