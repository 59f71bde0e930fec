"""qk_norm_rope against diffusers' ``_apply_rotary_emb(norm_q(q), cos, sin)``, with float64 as the truth.

Criterion for every output and gradient: relative L2 error (float64) of the kernel <= 2 x that of the provider
(diffusers' own code at the same precision) + u, the largest relative error of one rounding to the dtype.
Every input lives inside a NaN-filled buffer, so a load that strays past a view's edge poisons the result.
"""

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3RotaryPosEmbed, _apply_rotary_emb

from h3_triton.rope import qk_norm_rope
from kernel_checks import assert_bounded, nan_padded
from sm90 import compile_for_h200

EPS = 1e-6
# (batch, S, heads, head_dim, rope_freq_dim): R = 6 x rope_freq_dim rotated channels, R/2 odd in two cases,
# R = head_dim in one.
SHAPES = [(1, 1, 2, 48, 4), (2, 7, 3, 80, 5), (1, 65, 2, 96, 8), (2, 130, 2, 48, 8), (1, 600, 2, 80, 3)]


def provider(x, weight, cos=None, sin=None):
    """The attention processor's ``_apply_rotary_emb(attn.norm_q(query), cos, sin)``, in x's dtype."""
    y = F.rms_norm(x, (x.shape[-1],), weight, EPS)
    return y if cos is None else _apply_rotary_emb(y, cos, sin)


def inputs(batch, seq_len, heads, dim, freq_dim, dtype, rope, seed=0):
    generator = torch.Generator().manual_seed(seed)
    # Head magnitudes from 1e-3 to 10: the smallest heads have mean squares near eps, so eps matters.
    magnitude = 10 ** (4 * torch.rand(batch, seq_len, heads, 1, generator=generator) - 3)
    x = ((torch.randn(batch, seq_len, heads, dim, generator=generator) + 0.2) * magnitude).to(dtype)
    weight = (1 + 0.5 * torch.randn(dim, generator=generator)).to(dtype)
    dy = torch.randn(batch, seq_len, heads, dim, generator=generator).to(dtype)
    positions = torch.randint(0, 64, (seq_len, 3), generator=generator)
    cos, sin = MiniMaxH3RotaryPosEmbed(freq_dim)(positions) if rope else (None, None)
    return x, weight, cos, sin, dy


def candidate_run(x, weight, cos, sin, dy):
    """Output, dx, dweight of the kernel on NaN-padded inputs; asserts NaN never reaches a gradient."""
    x_buffer, x_view = nan_padded(x, requires_grad=True)
    w_buffer, w_view = nan_padded(weight, requires_grad=True)
    tables = [None if t is None else nan_padded(t)[1] for t in (cos, sin)]
    y = qk_norm_rope(x_view, w_view, EPS, *tables)
    y.backward(nan_padded(dy)[1])
    for grad in (x_buffer.grad, w_buffer.grad):
        assert torch.isfinite(grad).all(), "a NaN from the padding reached a gradient"
    inner = slice(1, -2)
    return [y, x_buffer.grad[inner, inner, inner, inner], w_buffer.grad[inner]]


def provider_run(x, weight, cos, sin, dy):
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight)]
    y = provider(*leaves, cos, sin)
    y.backward(dy)
    return [y] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norm"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"S{s[1]}-D{s[3]}-R{6 * s[4]}" for s in SHAPES])
def test_matches_float64_reference(shape, rope, dtype):
    x, weight, cos, sin, dy = inputs(*shape, dtype, rope)
    got = candidate_run(x, weight, cos, sin, dy)
    provided = provider_run(x, weight, cos, sin, dy)
    tables64 = [None if t is None else t.double() for t in (cos, sin)]
    reference = provider_run(x.double(), weight.double(), *tables64, dy.double())
    for name, candidate, provider_value, ref in zip(["y", "dx", "dweight"], got, provided, reference):
        assert candidate.shape == ref.shape and candidate.dtype == dtype, name
        assert_bounded(name, candidate, provider_value, ref)
    assert got[0].is_contiguous()


def test_backward_is_bitwise_deterministic():
    x, weight, cos, sin, dy = inputs(2, 300, 3, 48, 4, torch.bfloat16, rope=True, seed=1)
    first, second = (candidate_run(x, weight, cos, sin, dy) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_empty_sequence_has_zero_gradients():
    x, weight, cos, sin, dy = inputs(2, 0, 3, 48, 4, torch.float32, rope=True)
    y, dx, dweight = candidate_run(x, weight, cos, sin, dy)
    assert y.shape == dx.shape == (2, 0, 3, 48) and not dweight.any()


def test_fused_qkv_view():
    """q as diffusers' fused projection hands it over: a (B, S, H, D) view with row stride 3 x H x D."""
    x, weight, cos, sin, _ = inputs(1, 65, 2, 48, 4, torch.float32, rope=True, seed=2)
    qkv = torch.cat([x.flatten(2), torch.full((1, 65, 2 * 96), float("nan"))], dim=-1)
    query = qkv.chunk(3, dim=-1)[0].unflatten(-1, (2, 48))
    assert torch.equal(qk_norm_rope(query, weight, EPS, cos, sin), qk_norm_rope(x.contiguous(), weight, EPS, cos, sin))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(x=torch.zeros(1, 4, 2, 8, dtype=torch.float64)), TypeError, "x has dtype torch.float64"),
        (dict(x=torch.zeros(4, 2, 8)), ValueError, r"x must be \(batch, seq, heads, head_dim\)"),
        (dict(weight=torch.ones(6)), ValueError, r"weight must be a floating \(8,\)"),
        (dict(cos=torch.zeros(4, 6)), ValueError, "cos and sin go together"),
        (dict(cos=torch.zeros(4, 5), sin=torch.zeros(4, 5)), ValueError, "must be even"),
        (dict(cos=torch.zeros(4, 10), sin=torch.zeros(4, 10)), ValueError, "must be even and in 1..head_dim=8"),
        (dict(cos=torch.zeros(3, 6), sin=torch.zeros(3, 6)), ValueError, r"cos must be a floating \(4, R\)"),
        (dict(cos=torch.zeros(4, 6, requires_grad=True), sin=torch.zeros(4, 6)), ValueError, "cos.detach()"),
    ],
)
def test_rejects_bad_inputs(kwargs, error, match):
    args = dict(x=torch.zeros(1, 4, 2, 8), weight=torch.ones(8), eps=EPS) | kwargs
    with pytest.raises(error, match=match):
        qk_norm_rope(**args)


def test_compiles_for_h200():
    """Forward and backward at the release model's 56 heads of 128, with and without RoPE, at the tilings the
    launches pick, compiled for sm_90 as the GPU compiles them."""
    compile_for_h200("""
import triton
import h3_triton.rope as R
from h3_triton.rowreduce import full_row_tiling
heads, dim = 56, 128
tensors = dict(x_ptr="*bf16", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", y_ptr="*bf16", dy_ptr="*bf16",
               dx_ptr="*bf16", part_ptr="*fp32", flag_ptr="*i32")
block_h = triton.next_power_of_2(heads)
forward, backward = full_row_tiling(block_h * dim, "x"), full_row_tiling(dim, "x")
for rope in (True, False):
    compile_(R._forward_kernel, dict(ROPE=rope, BLOCK_P=forward.rows, BLOCK_H=block_h,
                                     BLOCK_D=forward.width // block_h), tensors, forward.warps, 1)
    compile_(R._backward_kernel, dict(ROPE=rope, BLOCK_M=backward.rows, BLOCK_D=backward.width), tensors,
             backward.warps, 1)
""")
