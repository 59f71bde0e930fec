"""The mutant catalogue: realistic broken variants of a candidate's kernels, one small bug each.

A gate that cannot fail is worthless: every gate must be shown to reject the bugs it exists for. Each mutant
wraps one standalone op of a base candidate (``h3_triton`` by default, any program-based candidate works) so
that it computes exactly what the buggy kernel would — a dropped key tile *is* attention over fewer keys, RoPE
on the wrong half *is* RoPE on permuted channels — and the rest of the candidate stays as it is. They are
candidates in their own right (``--h3-candidate mutant:<name>``); each docstring names the gates meant to
catch it, which :mod:`h3gate.gates.power` checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from h3gate.candidates import Candidate, CandidateError, load

KEY_TILE = 64  # the key tile of a flash kernel on the GPU (BLOCK_N); the row tile of a GEMM's reduction
MMA_K = 16  # the K of one bf16 tensor-core instruction: what a bf16 accumulator rounds after


@dataclass(frozen=True)
class Mutant:
    name: str
    op: str  # the standalone op it breaks
    caught_by: tuple[str, ...]  # the gates meant to catch it
    wrap: Callable[[Callable], Callable]  # the base op -> the broken op

    @property
    def description(self) -> str:
        return (self.wrap.__doc__ or "").strip().splitlines()[0]


class _EditGradient(torch.autograd.Function):
    """Identity forward; the backward passes the gradient through ``edit``."""

    @staticmethod
    def forward(ctx, x, edit):
        ctx.edit = edit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.edit(grad), None


class _WrittenInto(torch.autograd.Function):
    """``value`` written into ``target``'s memory and returned in it, as a kernel storing through a pointer does:
    autograd's version counter stays as it was, so nothing notices. The gradient passes to ``value``."""

    @staticmethod
    def forward(ctx, value, target):
        with torch.autograd._unsafe_preserve_version_counter(target):
            target.copy_(value)
        return target.view_as(target)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def dropped_key_tile(attention):
    """Attention that forgets the last partial key tile (a masking bug of flash kernels).

    Attention over fewer keys than queries is computed by the provider's attention (a self-attention kernel
    takes one length for both); only sequences with a partial last tile are affected."""
    from h3gate.op_registry import attention as over_kept_keys

    def broken(q, k, v):
        keep = k.shape[1] - k.shape[1] % KEY_TILE
        if keep == k.shape[1]:
            return attention(q, k, v)
        if keep == 0:  # no full tile at all: the kernel's normalisation divides 0 by 0
            return q * float("nan")
        return over_kept_keys(q, k[:, :keep], v[:, :keep])

    return broken


def softmax_scale(attention):
    """Softmax scale 1/sqrt(d+1) instead of 1/sqrt(d)."""

    def broken(q, k, v):
        d = q.shape[-1]
        return attention(q * (d / (d + 1)) ** 0.5, k, v)

    return broken


def rope_wrong_half(qk_norm_rope):
    """RoPE rotating the trailing channels of each head instead of the leading ones."""

    def broken(x, weight, eps, cos=None, sin=None):
        if cos is None:
            return qk_norm_rope(x, weight, eps, cos, sin)
        rotary = cos.shape[-1]
        order = torch.cat([torch.arange(x.shape[-1] - rotary, x.shape[-1]), torch.arange(0, x.shape[-1] - rotary)]).to(x.device)
        back = torch.argsort(order)
        return qk_norm_rope(x[..., order], weight[order], eps, cos, sin)[..., back]

    return broken


def rope_axes_swapped(qk_norm_rope):
    """RoPE with the t and h axes of the 3-axis frequency layout swapped."""

    def broken(x, weight, eps, cos=None, sin=None):
        if cos is None:
            return qk_norm_rope(x, weight, eps, cos, sin)
        third = cos.shape[-1] // 6
        order = torch.arange(cos.shape[-1]).view(2, 3, third)[:, [1, 0, 2]].reshape(-1).to(cos.device)
        return qk_norm_rope(x, weight, eps, cos[:, order], sin[:, order])

    return broken


def qk_norm_eps(qk_norm_rope):
    """QK-norm with eps 1e4 times too large (read from the wrong config field)."""

    def broken(x, weight, eps, cos=None, sin=None):
        return qk_norm_rope(x, weight, eps * 1e4, cos, sin)

    return broken


def rms_eps_missing(rms_norm_modulate):
    """RMSNorm without its eps (visible where a row's mean square is near eps)."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        return rms_norm_modulate(x, weight, 0.0, scale, shift, idx)

    return broken


def wrong_modality_row(rms_norm_modulate):
    """Audio rows modulated with the neighbouring modality's (text's) AdaLN row."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        if idx is not None:
            idx = torch.where(idx % 3 == 2, idx - 1, idx)
        return rms_norm_modulate(x, weight, eps, scale, shift, idx)

    return broken


def norm_weight_grad_zeroed(rms_norm_modulate):
    """RMSNorm whose weight gradient is never written (zero)."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        return rms_norm_modulate(x, _EditGradient.apply(weight, torch.zeros_like), eps, scale, shift, idx)

    return broken


def gate_on_residual(gated_residual):
    """The AdaLN gate applied to the residual instead of the branch."""

    def broken(residual, y, gate=None, idx=None):
        return gated_residual(y, residual, gate, idx)

    return broken


def nondeterministic_table_grad(gated_residual):
    """A gate-table gradient reduced in a run-dependent order (here: a random last-bit perturbation)."""

    def jitter(grad):
        noise = torch.randint(-1, 2, grad.shape, device=grad.device).to(grad.dtype)
        return grad + noise * grad.abs() * torch.finfo(grad.dtype).eps

    def broken(residual, y, gate=None, idx=None):
        if gate is not None:
            gate = _EditGradient.apply(gate, jitter)
        return gated_residual(residual, y, gate, idx)

    return broken


def swiglu_halves_swapped(swiglu):
    """SwiGLU gating the wrong half: silu(value) * gate."""

    def broken(h):
        a, g = h.chunk(2, dim=-1)
        return swiglu(torch.cat([g, a], dim=-1))

    return broken


def gemm_bf16_accumulate(linear):
    """A GEMM accumulating in the output dtype (bf16): the running sum rounds after every 16-deep MMA step."""

    def broken(x, weight, bias=None):
        total = None
        for start in range(0, x.shape[-1], MMA_K):
            part = linear(x[..., start : start + MMA_K], weight[:, start : start + MMA_K])
            total = part if total is None else (total + part).to(part.dtype)
        return total if bias is None else (total + bias).to(total.dtype)

    return broken


def weight_grad_missing_tile(linear):
    """A GEMM whose weight gradient misses the last row tile of its reduction."""

    def broken(x, weight, bias=None):
        rows = x.reshape(-1, x.shape[-1])
        cut = rows.shape[0] - (rows.shape[0] % KEY_TILE or min(KEY_TILE, rows.shape[0]))  # the last tile goes
        head = linear(rows[:cut], weight, bias)
        tail = linear(rows[cut:], weight.detach(), bias)
        return torch.cat([head, tail]).view(*x.shape[:-1], weight.shape[0])

    return broken


def silu_grad_missing(silu_linear):
    """AdaLN modulation whose temb gradient leaves out SiLU's derivative, as an input-gradient epilogue that forgot
    it: dY W instead of (dY W) * silu'(temb). Its output and its weight and bias gradients are right."""

    def broken(temb, weight, bias=None):
        out = silu_linear(temb.detach(), weight, bias)
        identity = torch.nn.functional.linear(temb.to(weight.dtype), weight.detach())
        return out + (identity - identity.detach())  # adds exact zeros: only the gradient of temb changes

    return broken


def _toward_zero(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a truncating store leaves it: where truncation and rounding to nearest differ (about every other
    value), the value one ULP nearer zero; here every other element, so that runs stay deterministic."""
    ints = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
    if t.dtype not in ints:
        return t
    bits = t.contiguous().view(ints[t.dtype])  # one less on the magnitude bits is one ULP toward zero, either sign
    every_other = torch.arange(t.numel(), device=t.device).view(t.shape) % 2 == 0
    return torch.where(every_other & (t != 0), (bits - 1).view(t.dtype), t)


def output_truncated(op):
    """An output stored by truncation instead of rounding to nearest: magnitudes biased low by half an ULP."""

    def broken(*args, **kwargs):
        out = op(*args, **kwargs)
        return out + (_toward_zero(out.detach()) - out.detach())  # exact: the difference is one ULP or none

    return broken


def dq_truncated(attention):
    """Attention whose dQ is stored by truncation instead of rounding to nearest (backward only)."""

    def broken(q, k, v):
        return attention(_EditGradient.apply(q, _toward_zero), k, v)

    return broken


def weight_grad_truncated(gemm):
    """A GEMM whose weight gradient is stored by truncation instead of rounding to nearest (backward only).

    ``linear(x, weight, bias=None)`` and ``silu_linear(temb, weight, bias)`` alike: the weight is their second
    argument, passed by position or by name."""

    def broken(*args, **kwargs):
        if "weight" in kwargs:
            kwargs["weight"] = _EditGradient.apply(kwargs["weight"], _toward_zero)
        else:
            args = (args[0], _EditGradient.apply(args[1], _toward_zero), *args[2:])
        return gemm(*args, **kwargs)

    return broken


def last_row_neighbour_gate(gated_residual):
    """The last packed row gated with its neighbour's AdaLN row (a one-row last tile reading the previous row's index)."""

    def broken(residual, y, gate=None, idx=None):
        if idx is not None and idx.numel() > 1:
            idx = torch.cat([idx[:-1], idx[-2:-1]])
        return gated_residual(residual, y, gate, idx)

    return broken


def key_tail_grad_dropped(attention):
    """dK and dV of a last key tile holding one row after full tiles are never written (zero; backward only)."""

    def drop_last_key(grad):
        return torch.cat([grad[:, :-1], torch.zeros_like(grad[:, -1:])], dim=1)

    def broken(q, k, v):
        if k.shape[1] <= KEY_TILE or k.shape[1] % KEY_TILE != 1:
            return attention(q, k, v)
        return attention(q, _EditGradient.apply(k, drop_last_key), _EditGradient.apply(v, drop_last_key))

    return broken


def _grad_from_first_sample(call, batch: int) -> torch.Tensor:
    """``call(samples, cut)`` over the whole batch, its parameter gradient summed over the first sample only:
    ``cut`` says the parameter must be detached for those samples (a reduction ignoring the batch stride)."""
    if batch < 2:
        return call(slice(None), False)
    return torch.cat([call(slice(0, 1), False), call(slice(1, None), True)])


def norm_weight_grad_first_batch(rms_norm_modulate):
    """RMSNorm whose weight gradient sums the first batch element only (a row reduction ignoring the batch stride)."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        return _grad_from_first_sample(
            lambda samples, cut: rms_norm_modulate(x[samples], weight.detach() if cut else weight, eps, scale, shift, idx),
            x.shape[0])

    return broken


def gate_grad_first_batch(gated_residual):
    """A gated residual whose gate-table gradient sums the first batch element only (backward only)."""

    def broken(residual, y, gate=None, idx=None):
        if gate is None:
            return gated_residual(residual, y, gate, idx)
        return _grad_from_first_sample(
            lambda samples, cut: gated_residual(residual[samples], y[samples], gate.detach() if cut else gate, idx),
            residual.shape[0])

    return broken


def batch_keys_shared(attention):
    """Attention reading every sample's keys and values at the first sample's offset (a batch stride of zero):
    right at batch 1 only."""

    def broken(q, k, v):
        if q.shape[0] < 2:
            return attention(q, k, v)
        return attention(q, k[:1].expand_as(k), v[:1].expand_as(v))

    return broken


def width_tail_zeroed(swiglu):
    """SwiGLU whose last column block is never stored where the width is not a multiple of its 64-wide tile
    (zeros from the allocation): right at every power-of-two width of 64 and more."""

    def broken(h):
        out = swiglu(h)
        full = out.shape[-1] - out.shape[-1] % KEY_TILE
        if full in (0, out.shape[-1]):
            return out
        return torch.cat([out[..., :full], torch.zeros_like(out[..., full:])], dim=-1)

    return broken


def residual_in_place(gated_residual):
    """A gated residual added into its residual input in place and returned in it (``residual += gate * y``).

    Its values and gradients are right; the caller's residual is overwritten, and the output aliases it."""

    def broken(residual, y, gate=None, idx=None):
        return _WrittenInto.apply(gated_residual(residual, y, gate, idx), residual.detach())

    return broken


def output_float32(op):
    """An output allocated in float32, the compute dtype, holding the values rounded to the input's dtype.

    Only on the unvectorized path, rows whose width is not a multiple of 8: the model's widths never are (in it the
    next GEMM would refuse the float32 input), the kernel gate's odd-width edge examples are."""

    def broken(*args, **kwargs):
        out = op(*args, **kwargs)
        return out.float() if out.shape[-1] % 8 else out

    return broken


def single_key_returns_v(attention):
    """Attention short-cutting a one-key sequence to its values (exact: softmax over one key is 1) by returning
    ``v`` itself, not a copy, so the output aliases an input."""

    def broken(q, k, v):
        return v if k.shape[1] == 1 else attention(q, k, v)

    return broken


# Triggers only the shipped model reaches: rows past 2,048, more than two heads, long reductions, logits past 88,
# calls without autograd, inputs of different strides, a second call.

WIDE_ROW = 2048  # the widest row a chunked row kernel holds in one chunk
EXP_OVERFLOW = 88.72  # float32 exp overflows past this


def norm_wide_padded_mean(rms_norm_modulate):
    """RMSNorm of rows wider than 2,048 (read in chunks) whose mean square divides by the padded power-of-two width
    instead of the row's: right at every power-of-two width and every row of one chunk."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        width = x.shape[-1]
        padded = 1 << (width - 1).bit_length()
        if width <= WIDE_ROW or padded == width:
            return rms_norm_modulate(x, weight, eps, scale, shift, idx)
        a = (width / padded) ** 0.5  # rms(a x) / a = x / sqrt(sum(x^2) / padded + eps)
        return rms_norm_modulate(x * a, weight / a, eps, scale, shift, idx)

    return broken


def residual_wide_chunk_gate(gated_residual):
    """A gated residual over rows wider than 2,048 (in chunks) reading the gate at the chunk's own column (c mod
    2,048) instead of the row's."""

    def broken(residual, y, gate=None, idx=None):
        if gate is not None and gate.shape[-1] > WIDE_ROW:
            gate = gate.index_select(1, torch.arange(gate.shape[-1], device=gate.device) % WIDE_ROW)
        return gated_residual(residual, y, gate, idx)

    return broken


def kv_heads_modulo_two(attention):
    """Attention reading key and value head h % 2 for query head h: a grouped-query kernel's key/value head count
    left at 2. Right at one and two heads."""

    def broken(q, k, v):
        heads = torch.arange(q.shape[2], device=q.device) % 2
        if q.shape[2] <= 2:
            return attention(q, k, v)
        return attention(q, k.index_select(2, heads), v.index_select(2, heads))

    return broken


def qk_norm_heads_tile_two(qk_norm_rope):
    """QK-norm + RoPE whose heads tile is fixed at 2: heads past the second are never stored (zeros)."""

    def broken(x, weight, eps, cos=None, sin=None):
        out = qk_norm_rope(x, weight, eps, cos, sin)
        return torch.cat([out[:, :, :2], torch.zeros_like(out[:, :, 2:])], dim=2)

    return broken


def softmax_without_max(attention):
    """Attention exponentiating scores before subtracting the row max: a row whose largest scaled logit passes 88.7
    overflows float32 (inf / inf = NaN). QK-norm keeps a toy's logits far below that."""

    def broken(q, k, v):
        scores = torch.einsum("bshd,bthd->bsht", q.float(), k.float()) * q.shape[-1] ** -0.5
        overflow = (scores.amax(-1, keepdim=True) > EXP_OVERFLOW).to(q.device)
        out = attention(q, k, v)
        return torch.where(overflow, torch.full_like(out, float("nan")), out)

    return broken


def norm_unmodulated_without_autograd(rms_norm_modulate):
    """RMSNorm + AdaLN whose forward-only launch (taken without autograd, at every generation step) leaves out the
    modulation tables."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        if not torch.is_grad_enabled():
            scale = shift = idx = None
        return rms_norm_modulate(x, weight, eps, scale, shift, idx)

    return broken


def residual_in_place_without_autograd(gated_residual):
    """A gated residual that, without autograd (where no backward needs the residual), adds into the residual in
    place and returns it: the caller's residual is overwritten at every generation step."""

    def broken(residual, y, gate=None, idx=None):
        out = gated_residual(residual, y, gate, idx)
        if torch.is_grad_enabled():
            return out
        return residual.copy_(out)

    return broken


def _with_strides_of(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t``'s memory read with ``like``'s strides, as a kernel passed the wrong tensor's strides reads it (only
    where those stay inside ``t``'s storage; elsewhere ``t``)."""
    if t.stride() == like.stride():
        return t
    end = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, like.stride())) + 1
    return t.as_strided(t.shape, like.stride()) if end * t.element_size() <= t.untyped_storage().nbytes() else t


def kv_read_with_q_strides(attention):
    """Attention addressing k and v with q's strides (one stride set passed for all three): right whenever the three
    share a layout, as every call of the model does; not for slices of a fused QKV buffer."""

    def broken(q, k, v):
        return attention(q, _with_strides_of(k, q), _with_strides_of(v, q))

    return broken


def residual_y_read_with_residual_strides(gated_residual):
    """A gated residual addressing the branch ``y`` with the residual's strides."""

    def broken(residual, y, gate=None, idx=None):
        return gated_residual(residual, _with_strides_of(y, residual), gate, idx)

    return broken


def output_reused(op):
    """An output written into one buffer per shape, allocated on the first call and handed back on every later one
    (an allocation saved): a caller keeping the previous call's result finds it overwritten. The buffer is an ordinary
    tensor even when the first call is under ``torch.inference_mode()``, as a kernel's own allocation is: an inference
    tensor keeps no version counter, and the mutant would raise instead of reusing it."""
    buffers = {}

    def broken(*args, **kwargs):
        out = op(*args, **kwargs)
        key = (tuple(out.shape), out.dtype, out.device)
        if key not in buffers:
            with torch.inference_mode(False):
                buffers[key] = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        return _WrittenInto.apply(out, buffers[key])

    return broken


# Precision lost in a backward reduction: an accumulator held in bfloat16, rounded to nearest even after every 64-row
# (or 64-output) step of the kernel's loop, as a GPU's cast rounds it. Over a toy's few hundred rows it stays within
# an ULP or two of torch's; over the release model's 38,733 rows (96,768 outputs for the AdaLN input gradient) it
# drifts by several, which the kernel gate's release-length examples show. (Triton's CPU interpreter cannot run such a
# kernel as a GPU would: it adds bfloat16 tensors as their bit patterns, and its casts to bfloat16 truncate.)


class _GradFrom(torch.autograd.Function):
    """Zeros shaped like ``like``: added to an op's output (exactly), it hands ``param`` the gradient
    ``grad_of(upstream)`` in place of the op's own, the op being called with ``param`` detached."""

    @staticmethod
    def forward(ctx, param, like, grad_of):
        ctx.grad_of = grad_of
        return torch.zeros_like(like)

    @staticmethod
    def backward(ctx, grad):
        return ctx.grad_of(grad), None, None


def _tiles(t: torch.Tensor) -> torch.Tensor:
    """``t`` (steps, ...) as (tiles, KEY_TILE, ...), the last tile padded with zeros."""
    pad = t.new_zeros(((-t.shape[0]) % KEY_TILE, *t.shape[1:]))
    return torch.cat([t, pad]).view(-1, KEY_TILE, *t.shape[1:])


def _bf16_accumulated(partials: torch.Tensor) -> torch.Tensor:
    """``partials.sum(0)`` as an accumulator held in bfloat16 sums them: each added in float32, the running sum
    rounded to bfloat16 after every step."""
    total = torch.zeros_like(partials[0], dtype=torch.float32)
    for part in partials.float():
        total = (total + part).to(torch.bfloat16).float()
    return total


def linear_weight_grad_bf16_accumulator(linear):
    """A GEMM whose weight gradient (a reduction over the rows) accumulates in bfloat16, rounded every 64-row K step."""

    def broken(x, weight, bias=None):
        out = linear(x, weight.detach(), bias)

        def grad(dy):
            rows_x = _tiles(x.detach().reshape(-1, x.shape[-1]).float())
            rows_dy = _tiles(dy.reshape(-1, dy.shape[-1]).float())
            return _bf16_accumulated(rows_dy.transpose(1, 2) @ rows_x).to(weight.dtype)

        return out + _GradFrom.apply(weight, out, grad)

    return broken


def norm_weight_grad_bf16_accumulator(rms_norm_modulate):
    """RMSNorm whose weight gradient (a row sum of dy x^ (1 + scale)) accumulates in bfloat16, rounded every 64 rows."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        out = rms_norm_modulate(x, weight.detach(), eps, scale, shift, idx)

        def grad(dy):
            rows = x.detach().float()
            terms = dy.float() * rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps)
            if scale is not None:
                terms = terms * (1.0 + scale.detach().float().index_select(0, idx))
            return _bf16_accumulated(_tiles(terms.reshape(-1, x.shape[-1])).sum(1)).to(weight.dtype)

        return out + _GradFrom.apply(weight, out, grad)

    return broken


def gate_grad_bf16_accumulator(gated_residual):
    """A gated residual whose gate-table gradient (per table row, a sum of dout y over its rows) accumulates in
    bfloat16, every table row's running sum rounded every 64 rows."""

    def broken(residual, y, gate=None, idx=None):
        if gate is None:
            return gated_residual(residual, y, gate, idx)
        out = gated_residual(residual, y, gate.detach(), idx)

        def grad(dout):
            terms = (dout.float() * y.detach().float()).reshape(-1, y.shape[-1])
            table_rows = idx.repeat(terms.shape[0] // idx.numel())  # the rows are batch-major
            partials = [torch.zeros(gate.shape, device=terms.device).index_add_(0, rows, part)
                        for part, rows in zip(terms.split(KEY_TILE), table_rows.split(KEY_TILE))]
            return _bf16_accumulated(torch.stack(partials)).to(gate.dtype)

        return out + _GradFrom.apply(gate, out, grad)

    return broken


def adaln_input_grad_bf16_accumulator(silu_linear):
    """AdaLN modulation whose temb gradient, (dY W) silu'(temb) reduced over the outputs, accumulates in bfloat16,
    rounded every 64 outputs."""

    def broken(temb, weight, bias=None):
        out = silu_linear(temb.detach(), weight, bias)

        def grad(dy):
            products = _tiles(dy.float().transpose(0, 1)).transpose(1, 2) @ _tiles(weight.detach().float())
            t = temb.detach().float()
            sig = torch.sigmoid(t)
            return (_bf16_accumulated(products) * sig * (1.0 + t * (1.0 - sig))).to(temb.dtype)

        return out + _GradFrom.apply(temb, out, grad)

    return broken


# NaN and infinity swallowed: caught only where an input holds one, which the kernel gate's nonfinite tier puts there.


def softmax_nan_rows_zeroed(attention):
    """Attention whose online softmax zeroes a row its normaliser leaves non-finite (a guard for rows without keys
    that also swallows the NaN a key carries)."""

    def broken(q, k, v):
        out = attention(q, k, v)
        return torch.where(torch.isfinite(out).all(-1, keepdim=True), out, torch.zeros_like(out))

    return broken


def norm_nan_dropping_max(rms_norm_modulate):
    """RMSNorm guarding its mean square with a maximum that drops NaN (Triton's ``tl.maximum`` returns the other
    operand): a row holding a NaN is scaled by 1/sqrt(eps) instead of becoming NaN, only the NaN element itself stays
    NaN."""

    def broken(x, weight, eps, scale=None, shift=None, idx=None):
        out = rms_norm_modulate(x, weight, eps, scale, shift, idx)
        mean_square = x.detach().float().pow(2).mean(-1, keepdim=True)
        y = x.float() * eps ** -0.5 * weight.float()
        if scale is not None:
            y = y * (1.0 + scale.float().index_select(0, idx)) + shift.float().index_select(0, idx)
        return torch.where(mean_square.isnan(), y.to(out.dtype), out)

    return broken


MUTANTS = {
    m.name: m
    for m in (
        Mutant("dropped-key-tile", "attention", ("kernel", "block", "model", "generation"), dropped_key_tile),
        # 1/sqrt(d+1) moves the logits by 1.5 % at d=32: the kernel gate sees it; at the outputs of a bf16
        # block or model it stays inside the provider's own spread (the power table shows where).
        Mutant("softmax-scale", "attention", ("kernel",), softmax_scale),
        Mutant("rope-wrong-half", "qk_norm_rope", ("kernel", "block", "model"), rope_wrong_half),
        Mutant("rope-axes-swapped", "qk_norm_rope", ("kernel", "block", "model"), rope_axes_swapped),
        Mutant("qk-norm-eps", "qk_norm_rope", ("kernel",), qk_norm_eps),
        Mutant("rms-eps-missing", "rms_norm_modulate", ("kernel",), rms_eps_missing),
        Mutant("wrong-modality-row", "rms_norm_modulate", ("kernel", "block", "model", "generation"), wrong_modality_row),
        Mutant("norm-weight-grad-zeroed", "rms_norm_modulate", ("kernel", "block", "model"), norm_weight_grad_zeroed),
        Mutant("gate-on-residual", "gated_residual", ("kernel", "block", "model"), gate_on_residual),
        Mutant("nondeterministic-table-grad", "gated_residual", ("kernel",), nondeterministic_table_grad),
        Mutant("swiglu-halves-swapped", "swiglu", ("kernel", "block", "model"), swiglu_halves_swapped),
        Mutant("gemm-bf16-accumulate", "linear", ("kernel",), gemm_bf16_accumulate),
        Mutant("weight-grad-missing-tile", "linear", ("kernel", "block", "model"), weight_grad_missing_tile),
        Mutant("adaln-silu-grad-missing", "silu_linear", ("kernel", "block", "model"), silu_grad_missing),
        # Systematic precision losses: within 2 x torch's + 2 ULP in relative L2 and max abs; only the kernel
        # gate's bias check sees them (at the block's and model's outputs they stay within the bounds).
        Mutant("swiglu-output-truncated", "swiglu", ("kernel",), output_truncated),
        Mutant("rms-output-truncated", "rms_norm_modulate", ("kernel",), output_truncated),
        Mutant("dq-truncated", "attention", ("kernel",), dq_truncated),
        Mutant("weight-grad-truncated", "linear", ("kernel",), weight_grad_truncated),
        Mutant("attention-output-truncated", "attention", ("kernel",), output_truncated),
        Mutant("adaln-weight-grad-truncated", "silu_linear", ("kernel",), weight_grad_truncated),
        # Shape-conditional: the tiny model's last row shares its neighbour's AdaLN row, its one sequence length
        # leaves no one-row key tile, its batch is 1; the kernel gate's examples reach them.
        Mutant("last-row-neighbour-gate", "gated_residual", ("kernel",), last_row_neighbour_gate),
        Mutant("key-tail-grad-dropped", "attention", ("kernel",), key_tail_grad_dropped),
        Mutant("norm-weight-grad-first-batch", "rms_norm_modulate", ("kernel",), norm_weight_grad_first_batch),
        # Shape-conditional at batch 2 and at widths that are not powers of two: tiny's model and block gates never
        # meet them, the kernel gate's edge examples and the edge preset's model and block gates do.
        Mutant("gate-grad-first-batch", "gated_residual", ("kernel",), gate_grad_first_batch),
        Mutant("batch-keys-shared", "attention", ("kernel",), batch_keys_shared),
        Mutant("width-tail-zeroed", "swiglu", ("kernel",), width_tail_zeroed),
        # Op-contract breaches: values and gradients exactly the base's, so in the kernel gate only its contract
        # checks (inputs unchanged, outputs' dtype, shape, device and storage) see them. (In the model, the
        # residual overwritten in place also corrupts gradients that saved it: the model gate saw that on CPU.)
        Mutant("residual-in-place", "gated_residual", ("kernel",), residual_in_place),
        Mutant("rms-output-float32", "rms_norm_modulate", ("kernel",), output_float32),
        Mutant("single-key-returns-v", "attention", ("kernel",), single_key_returns_v),
        # Triggers only the shipped model's calls reach; the kernel gate's model-shaped, long-reduction, layout and
        # range examples do on the CPU.
        Mutant("norm-wide-padded-mean", "rms_norm_modulate", ("kernel",), norm_wide_padded_mean),
        Mutant("residual-wide-chunk-gate", "gated_residual", ("kernel",), residual_wide_chunk_gate),
        Mutant("kv-heads-modulo-two", "attention", ("kernel",), kv_heads_modulo_two),
        Mutant("qk-norm-heads-tile-two", "qk_norm_rope", ("kernel",), qk_norm_heads_tile_two),
        Mutant("softmax-without-max", "attention", ("kernel",), softmax_without_max),
        Mutant("norm-unmodulated-without-autograd", "rms_norm_modulate", ("kernel",),
               norm_unmodulated_without_autograd),
        Mutant("residual-in-place-without-autograd", "gated_residual", ("kernel",), residual_in_place_without_autograd),
        Mutant("kv-read-with-q-strides", "attention", ("kernel",), kv_read_with_q_strides),
        Mutant("residual-y-read-with-residual-strides", "gated_residual", ("kernel",),
               residual_y_read_with_residual_strides),
        Mutant("swiglu-output-reused", "swiglu", ("kernel",), output_reused),
        # Backward reductions accumulated in bfloat16: only the kernel gate's release-length examples.
        Mutant("linear-weight-grad-bf16-accumulator", "linear", ("kernel",), linear_weight_grad_bf16_accumulator),
        Mutant("norm-weight-grad-bf16-accumulator", "rms_norm_modulate", ("kernel",),
               norm_weight_grad_bf16_accumulator),
        Mutant("gate-grad-bf16-accumulator", "gated_residual", ("kernel",), gate_grad_bf16_accumulator),
        Mutant("adaln-input-grad-bf16-accumulator", "silu_linear", ("kernel",), adaln_input_grad_bf16_accumulator),
        # A NaN or infinity in an input, propagated as torch propagates it: only the kernel gate's nonfinite tier.
        Mutant("softmax-nan-rows-zeroed", "attention", ("kernel",), softmax_nan_rows_zeroed),
        Mutant("norm-nan-dropping-max", "rms_norm_modulate", ("kernel",), norm_nan_dropping_max),
    )
}


class MutantCandidate(Candidate):
    """``mutant:<name>``: the base candidate with one op replaced by its mutant."""

    def __init__(self, variant: str, base: str = "h3_triton"):
        if variant not in MUTANTS:
            raise CandidateError(f"unknown mutant {variant!r}; mutants: {', '.join(MUTANTS)}")
        self.mutant = MUTANTS[variant]
        self.base = load(base) if isinstance(base, str) else base
        original = self.base.kernel_ops()
        if self.mutant.op not in original:
            raise CandidateError(f"base candidate {self.base.name} has no standalone {self.mutant.op} to mutate")
        self.inner = self.base.with_kernel_ops({self.mutant.op: self.mutant.wrap(original[self.mutant.op])})
        self.name = f"mutant:{variant}"
        self.supports = self.base.supports

    def identity(self) -> dict:
        return {**self.inner.identity(), "name": self.name, "mutant": self.mutant.name, "base": self.base.name}

    def install(self, transformer):
        return self.inner.install(transformer)

    def with_provider_groups(self, groups) -> Candidate:
        return self.inner.with_provider_groups(groups)

    def kernel_ops(self) -> dict:
        return self.inner.kernel_ops()

    def launch_paths(self):
        return self.inner.launch_paths()
