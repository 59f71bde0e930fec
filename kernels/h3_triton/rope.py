"""Per-head RMSNorm fused with rotary embedding, the Q/K preparation of every MiniMax-H3 attention.

diffusers runs ``_apply_rotary_emb(norm_q(q), cos, sin)`` as an RMSNorm, a cast of cos/sin to bf16, slices,
a negation, two concatenations and a final ``.contiguous()``: about ten passes over q. Here one program
normalises every head of a few positions in float32, rotates their leading ``R = cos.shape[-1]`` channels
with the rotate-half convention (channel c pairs with c +- R/2) and passes the rest through, rounding once.
The partner channel is a second load of the row just read, served from cache; cos and sin are loaded once per
position for all its heads (tiling (batch, seq, head) rows instead loaded them per row, three times the bytes
of x at release: 63% of the copy bandwidth on an H200 against 74% this way,
``benchmarks/results/h200-perf/rope-variants.log``).

Backward recomputes the row statistics from x; the weight gradient is a row sum, reduced deterministically
through :mod:`h3_triton.rowreduce`. cos and sin are constants of the positions and get no gradient.
"""

import torch
import triton
import triton.language as tl

from h3_triton import paths
from h3_triton.interpret import column_sum, device_function, to_dtype
from h3_triton.launch import cdiv
from h3_triton.rowreduce import (
    UPCAST, check_activation, clear_flags, flush_slot, full_row_tiling, new_slots, reduce_slots, split_rows,
)


@device_function
def _head_rows(rows, seq_len, heads):
    """(batch, seq, head) of rows numbered over batch x seq x heads."""
    head = rows % heads
    batch_seq = rows // heads
    batch = batch_seq // seq_len
    return batch, batch_seq - batch * seq_len, head


@triton.jit
def _forward_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr,
    n_positions, seq_len, heads, dim, rotary, eps,
    sx_b, sx_s, sx_h, sx_d, s_w, s_cos_s, s_cos_d, s_sin_s, s_sin_d,
    ROPE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """A (positions, heads, channels) tile: all heads of BLOCK_P positions, so each position's cos and sin
    are loaded once for all its heads."""
    positions = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    batch = positions // seq_len
    seq = positions - batch * seq_len
    h = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    head_mask = (positions < n_positions)[:, None] & (h < heads)[None, :]
    mask = head_mask[:, :, None] & col_mask[None, None, :]
    x_row = x_ptr + (batch * sx_b + seq * sx_s)[:, None, None] + (h * sx_h)[None, :, None]
    x = tl.load(x_row + cols[None, None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=2) / dim + eps)[:, :, None]
    w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
    y = x * rstd * w[None, None, :]
    if ROPE:
        half = rotary // 2
        rot_cols = cols < rotary
        partner = tl.where(cols < half, cols + half, cols - half)
        x_p = tl.load(x_row + partner[None, None, :] * sx_d, mask=mask & rot_cols[None, None, :],
                      other=0.0).to(tl.float32)
        w_p = tl.load(w_ptr + partner * s_w, mask=rot_cols, other=0.0).to(tl.float32)
        rot_mask = (positions < n_positions)[:, None] & rot_cols[None, :]
        cos = tl.load(cos_ptr + seq[:, None] * s_cos_s + cols[None, :] * s_cos_d, mask=rot_mask, other=1.0)
        sin = tl.load(sin_ptr + seq[:, None] * s_sin_s + cols[None, :] * s_sin_d, mask=rot_mask, other=0.0)
        # rotate_half(n) = cat(-n2, n1): channel c < R/2 takes -n[c + R/2], channel c >= R/2 takes n[c - R/2].
        sign = tl.where(cols < half, -1.0, 1.0)
        rotated = x_p * rstd * (sign * w_p)[None, None, :]
        y = y * cos.to(tl.float32)[:, None, :] + rotated * sin.to(tl.float32)[:, None, :]
    out = y_ptr + ((positions * heads)[:, None] + h[None, :])[:, :, None] * dim + cols[None, None, :]
    tl.store(out, to_dtype(y, y_ptr.dtype.element_ty, UPCAST), mask=mask)


@triton.jit
def _backward_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, dy_ptr, dx_ptr, part_ptr, flag_ptr,
    n_rows, seq_len, heads, dim, rotary, eps, rows_per_program,
    sx_b, sx_s, sx_h, sx_d, sdy_b, sdy_s, sdy_h, sdy_d, s_w, s_cos_s, s_cos_d, s_sin_s, s_sin_d,
    ROPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    part_base = part_ptr + pid.to(tl.int64) * dim
    flag_base = flag_ptr + pid
    clear_flags(flag_base, 1)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    w = tl.load(w_ptr + cols * s_w, mask=col_mask, other=0.0).to(tl.float32)
    half = rotary // 2
    rot_cols = cols < rotary
    partner = tl.where(cols < half, cols + half, cols - half)
    # The transpose of rotate_half: channel c < R/2 takes +g[c + R/2], channel c >= R/2 takes -g[c - R/2].
    sign = tl.where(cols < half, 1.0, -1.0)
    start = pid.to(tl.int64) * rows_per_program
    end = tl.minimum(start + rows_per_program, n_rows)
    acc_w = tl.zeros([BLOCK_D], dtype=tl.float32)
    for row0 in range(start, end, BLOCK_M):
        rows = row0 + tl.arange(0, BLOCK_M)
        row_mask = rows < end
        mask = row_mask[:, None] & col_mask[None, :]
        batch, seq, head = _head_rows(rows, seq_len, heads)
        x = tl.load(
            x_ptr + (batch * sx_b + seq * sx_s + head * sx_h)[:, None] + cols[None, :] * sx_d, mask=mask, other=0.0
        ).to(tl.float32)
        dy_row = dy_ptr + (batch * sdy_b + seq * sdy_s + head * sdy_h)[:, None]
        dn = tl.load(dy_row + cols[None, :] * sdy_d, mask=mask, other=0.0).to(tl.float32)
        if ROPE:
            rot_mask = row_mask[:, None] & rot_cols[None, :]
            dy_p = tl.load(dy_row + partner[None, :] * sdy_d, mask=rot_mask, other=0.0).to(tl.float32)
            cos = tl.load(cos_ptr + seq[:, None] * s_cos_s + cols[None, :] * s_cos_d, mask=rot_mask, other=1.0)
            sin_p = tl.load(sin_ptr + seq[:, None] * s_sin_s + partner[None, :] * s_sin_d, mask=rot_mask, other=0.0)
            dn = dn * cos.to(tl.float32) + sign[None, :] * dy_p * sin_p.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / dim + eps)
        x_hat = x * rstd[:, None]
        acc_w += column_sum(dn * x_hat, UPCAST)
        g = dn * w[None, :]
        dx = rstd[:, None] * (g - x_hat * (tl.sum(g * x_hat, axis=1) / dim)[:, None])
        tl.store(dx_ptr + rows[:, None] * dim + cols[None, :], to_dtype(dx, dx_ptr.dtype.element_ty, UPCAST), mask=mask)
    flush_slot(acc_w, part_base, flag_base, 0, dim, cols, col_mask)


def _rope_args(cos: torch.Tensor | None, sin: torch.Tensor | None) -> tuple[int, ...]:
    """Rotary width and cos/sin strides as kernel arguments; zeros without RoPE."""
    if cos is None:
        return 0, 0, 0, 0, 0
    return cos.shape[1], *cos.stride(), *sin.stride()


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, cos, sin):
        batch, seq_len, heads, dim = x.shape
        block_h = triton.next_power_of_2(heads)
        tiling = full_row_tiling(block_h * dim, "heads x head_dim of x")
        n_positions = batch * seq_len
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        rotary, *rope_strides = _rope_args(cos, sin)
        paths.launch(
            _forward_kernel, (cdiv(n_positions, tiling.rows),),
            x, weight, cos, sin, y,
            n_positions, seq_len, heads, dim, rotary, eps,
            *x.stride(), weight.stride(0), *rope_strides,
            ROPE=cos is not None, BLOCK_P=tiling.rows, BLOCK_H=block_h, BLOCK_D=tiling.width // block_h,
            num_warps=tiling.warps,
        )
        ctx.save_for_backward(x, weight, cos, sin)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, cos, sin = ctx.saved_tensors
        batch, seq_len, heads, dim = x.shape
        tiling = full_row_tiling(dim, "x")
        n_rows = batch * seq_len * heads
        programs, rows_per_program = split_rows(n_rows, tiling.rows, x.device)
        parts, flags = new_slots(programs, 1, dim, x.device)
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        rotary, *rope_strides = _rope_args(cos, sin)
        paths.launch(
            _backward_kernel, (programs,),
            x, weight, cos, sin, dy, dx, parts, flags,
            n_rows, seq_len, heads, dim, rotary, ctx.eps, rows_per_program,
            *x.stride(), *dy.stride(), weight.stride(0), *rope_strides,
            ROPE=cos is not None, BLOCK_M=tiling.rows, BLOCK_D=tiling.width, num_warps=tiling.warps,
        )
        dweight = reduce_slots(parts, flags, 0, torch.empty((1, dim), dtype=weight.dtype, device=x.device))
        return dx, dweight.view(dim), None, None, None


def _check_rope_table(table: torch.Tensor, name: str, seq_len: int, dim: int, device: torch.device) -> None:
    if table.dim() != 2 or table.shape[0] != seq_len or not table.is_floating_point():
        raise ValueError(f"{name} must be a floating ({seq_len}, R) tensor, got {table.dtype} {tuple(table.shape)}")
    rotary = table.shape[1]
    if rotary % 2 or not 0 < rotary <= dim:
        raise ValueError(f"{name} rotates {rotary} channels; that must be even and in 1..head_dim={dim}")
    if table.requires_grad:
        raise ValueError(f"{name} requires grad; rotary tables are constants here, pass {name}.detach()")
    if table.device != device:
        raise ValueError(f"{name} is on {table.device}, x on {device}")


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm over each head of x (B, S, H, D) times weight (D,), then RoPE on the leading R channels.

    cos and sin are (S, R) tables (float32 in diffusers; R even, R <= D) as made by ``MiniMaxH3RotaryPosEmbed``,
    or both None for the norm alone (refiner blocks). x may have any strides. Computed in float32, rounded
    once to x's dtype; the result is a contiguous (B, S, H, D) tensor. Gradients: x and weight.
    """
    check_activation(x, "x")
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, seq, heads, head_dim), got shape {tuple(x.shape)}")
    dim = x.shape[-1]
    if weight.shape != (dim,) or not weight.is_floating_point() or weight.device != x.device:
        raise ValueError(
            f"weight must be a floating ({dim},) tensor on {x.device}, got {weight.dtype} {tuple(weight.shape)} "
            f"on {weight.device}"
        )
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin go together: pass both for RoPE, or neither for the norm alone")
    if cos is not None:
        _check_rope_table(cos, "cos", x.shape[1], dim, x.device)
        _check_rope_table(sin, "sin", x.shape[1], dim, x.device)
        if cos.shape != sin.shape:
            raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape")
    return _QKNormRope.apply(x, weight, float(eps), cos, sin)
