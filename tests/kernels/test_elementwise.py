"""swiglu and gated_residual against diffusers' formulas, with float64 as the truth.

Criterion for every output and gradient: relative L2 error (float64) of the kernel <= 2 x that of the provider
(diffusers' formula at the same precision) + u, the largest relative error of one rounding to the dtype.
Every input lives inside a NaN-filled buffer, so a load that strays past a view's edge poisons the result.
"""

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_minimax_h3 import (
    MiniMaxH3RotaryPosEmbed,
    MiniMaxH3TransformerBlock,
)

from h3_triton.elementwise import gated_residual, swiglu
from kernel_checks import assert_bounded, nan_padded, strided_index, table_index
from sm90 import compile_for_h200

TABLE_ROWS = 6
RUNS = [4, 1, 0, 4, 3]  # table rows left out stay unreferenced: their gradients must be 0
SHAPES = [((), 1, 48), ((2,), 7, 80), ((), 65, 96), ((2,), 130, 48), ((), 600, 80)]  # (batch dims, S, C or F)
SHAPE_IDS = [f"S{s}-C{c}" for _, s, c in SHAPES]
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])


def provider_swiglu(h):
    """diffusers' ``SwiGLU`` after its projection: ``hidden_states * silu(gate)`` of the two halves."""
    hidden_states, gate = h.chunk(2, dim=-1)
    return hidden_states * F.silu(gate)


def provider_gated(residual, y, gate=None, idx=None):
    """The block's ``residual + gate_msa.index_select(0, adaln_indices) * attn_output``."""
    return residual + y if gate is None else residual + gate.index_select(0, idx) * y


def grads_of(fn, tensors, dy):
    """Output and input gradients of ``fn`` on fresh leaves holding ``tensors``."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(dy)
    return [out] + [leaf.grad for leaf in leaves]


def check_against_float64(names, got, provided, reference, dtype):
    for name, candidate, provider_value, ref in zip(names, got, provided, reference):
        assert candidate.shape == ref.shape and candidate.dtype == dtype, name
        assert_bounded(name, candidate, provider_value, ref)


def swiglu_candidate(h, dy):
    buffer, view = nan_padded(h, requires_grad=True)
    y = swiglu(view)
    y.backward(nan_padded(dy)[1])
    assert torch.isfinite(buffer.grad).all(), "a NaN from the padding reached a gradient"
    return [y, buffer.grad[(slice(1, -2),) * h.dim()]]


@DTYPES
@pytest.mark.parametrize("batch, seq_len, half", SHAPES, ids=SHAPE_IDS)
def test_swiglu_matches_float64_reference(batch, seq_len, half, dtype):
    generator = torch.Generator().manual_seed(0)
    h = (torch.randn(*batch, seq_len, 2 * half, generator=generator) * 3).to(dtype)
    dy = torch.randn(*batch, seq_len, half, generator=generator).to(dtype)
    got = swiglu_candidate(h, dy)
    provided = grads_of(provider_swiglu, [h], dy)
    reference = grads_of(provider_swiglu, [h.double()], dy.double())
    check_against_float64(["y", "dh"], got, provided, reference, dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy exp
def test_swiglu_saturates_without_nan():
    """silu at +-100 and beyond: exp overflows inside sigmoid, the result must stay finite and right."""
    h = torch.tensor([[1.0, -2.0, 3.0, 0.5, -100.0, 100.0, 1e4, -1e4]])
    got = swiglu_candidate(h, torch.ones(1, 4))
    reference = grads_of(provider_swiglu, [h.double()], torch.ones(1, 4, dtype=torch.float64))
    for candidate, ref in zip(got, reference):
        torch.testing.assert_close(candidate.double(), ref, rtol=1e-6, atol=1e-30)


def gated_inputs(batch, seq_len, width, dtype, mode, seed=0):
    generator = torch.Generator().manual_seed(seed)
    residual, y, dout = (torch.randn(*batch, seq_len, width, generator=generator).to(dtype) for _ in range(3))
    gate = idx = None
    if mode != "plain":
        gate = (0.5 * torch.randn(TABLE_ROWS, width, generator=generator)).to(dtype)
        idx = table_index(mode, seq_len, generator, TABLE_ROWS, RUNS)
    return residual, y, gate, idx, dout


def gated_candidate(residual, y, gate, idx, dout):
    """Output and gradients of the kernel on NaN-padded inputs; the gate is chunk 2 of a NaN-filled (R, 6C)
    projection and idx a strided view."""
    buffers, views = zip(*(nan_padded(t, requires_grad=True) for t in (residual, y)))
    gate_view = table = None
    if gate is not None:
        width = gate.shape[1]
        table = torch.full((TABLE_ROWS, 6 * width), float("nan"), dtype=gate.dtype)
        table[:, 2 * width:3 * width] = gate
        table.requires_grad_()
        gate_view = table[:, 2 * width:3 * width]
    out = gated_residual(*views, gate_view, None if idx is None else strided_index(idx, TABLE_ROWS))
    out.backward(nan_padded(dout)[1])
    inner = (slice(1, -2),) * residual.dim()
    grads = [buffer.grad[inner] for buffer in buffers]
    if table is not None:
        assert (table.grad[:, :2 * width] == 0).all() and (table.grad[:, 3 * width:] == 0).all()
        grads.append(table.grad[:, 2 * width:3 * width])
    for grad in grads:
        assert torch.isfinite(grad).all(), "a NaN from the padding reached a gradient"
    return [out, *grads]


@DTYPES
@pytest.mark.parametrize("mode", ["plain", "random", "runs"])
@pytest.mark.parametrize("batch, seq_len, width", SHAPES, ids=SHAPE_IDS)
def test_gated_residual_matches_float64_reference(batch, seq_len, width, mode, dtype):
    residual, y, gate, idx, dout = gated_inputs(batch, seq_len, width, dtype, mode)
    tensors = [residual, y] if gate is None else [residual, y, gate]
    got = gated_candidate(residual, y, gate, idx, dout)
    provided = grads_of(lambda *t: provider_gated(*t, idx=idx), tensors, dout)
    reference = grads_of(lambda *t: provider_gated(*t, idx=idx), [t.double() for t in tensors], dout.double())
    check_against_float64(["out", "dresidual", "dy", "dgate"], got, provided, reference, dtype)
    if mode == "runs":
        unreferenced = torch.ones(TABLE_ROWS, dtype=torch.bool)
        unreferenced[idx.unique()] = False
        assert unreferenced.any() and (got[3][unreferenced] == 0).all()


@pytest.mark.parametrize("mode", ["random", "runs"])
def test_gate_gradient_is_bitwise_deterministic(mode):
    inputs = gated_inputs((), 600, 48, torch.bfloat16, mode, seed=1)
    first, second = (gated_candidate(*inputs) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_empty_sequence_has_zero_gradients():
    residual, y, gate, idx, dout = gated_inputs((2,), 0, 48, torch.float32, "random")
    out, dresidual, dy, dgate = gated_candidate(residual, y, gate, idx, dout)
    assert out.shape == dresidual.shape == dy.shape == (2, 0, 48) and not dgate.any()
    h, dh = swiglu_candidate(torch.zeros(2, 0, 96), torch.zeros(2, 0, 48))
    assert h.shape == (2, 0, 48) and dh.shape == (2, 0, 96)


def test_providers_are_diffusers_block():
    """The provider formulas above are, bit for bit, what a diffusers MiniMax-H3 block computes in bf16."""
    torch.manual_seed(4)
    block = MiniMaxH3TransformerBlock(
        hidden_size=48, num_attention_heads=2, attention_head_dim=24, ffn_dim=80, time_embed_dim=16,
        norm_eps=1e-6, qk_norm_eps=1e-6,
    ).to(torch.bfloat16)
    seen = {}
    for name in ("attn", "ff", "adaln_proj", "ff.net.0.proj", "ff.net.0"):
        block.get_submodule(name).register_forward_hook(lambda _, __, out, name=name: seen.setdefault(name, out))
    x = torch.randn(1, 37, 48, dtype=torch.bfloat16)
    adaln_indices = torch.randint(0, 6, (37,))
    rotary_emb = MiniMaxH3RotaryPosEmbed(4)(torch.randint(0, 16, (37, 3)))
    with torch.no_grad():
        out = block(x, torch.randn(2, 16), adaln_indices, rotary_emb)
        _, _, gate_msa, _, _, gate_mlp = seen["adaln_proj"]
        hidden = provider_gated(x, seen["attn"], gate_msa, adaln_indices)
        assert torch.equal(out, provider_gated(hidden, seen["ff"], gate_mlp, adaln_indices))
        assert torch.equal(seen["ff.net.0"], provider_swiglu(seen["ff.net.0.proj"]))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: swiglu(torch.zeros(4, 8, dtype=torch.float64)), TypeError, "h has dtype torch.float64"),
        (lambda: swiglu(torch.zeros(4, 7)), ValueError, "even, non-zero last dim"),
        (lambda: swiglu(torch.zeros(8)), ValueError, r"h must be \(\.\.\., rows, 2F\)"),
        (lambda: gated_residual(torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bfloat16)), ValueError,
         "must match residual"),
        (lambda: gated_residual(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(3, 8)), ValueError,
         "gate and idx go together"),
        (lambda: gated_residual(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(3, 8), torch.zeros(5).long()),
         ValueError, r"idx must be an int32 or int64 \(4,\)"),
        (lambda: gated_residual(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8), torch.zeros(4).long()),
         ValueError, r"gate must be a floating \(R, 8\)"),
    ],
)
def test_rejects_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_compiles_for_h200():
    """SwiGLU over the release model's 28,672-wide up-projection and the gated residual over its width 5,376 (with
    and without a gate), forward and backward, at the tilings the launches pick, compiled for sm_90."""
    compile_for_h200("""
import h3_triton.elementwise as E
from h3_triton.rowreduce import full_row_tiling
tensors = dict(h_ptr="*bf16", y_ptr="*bf16", dy_ptr="*bf16", dh_ptr="*bf16", res_ptr="*bf16", gate_ptr="*bf16",
               idx_ptr="*i64", out_ptr="*bf16", dout_ptr="*bf16", part_ptr="*fp32", flag_ptr="*i32")
_, swiglu = E._swiglu_grid(38733, 14336)
warps = swiglu.pop("num_warps")
compile_(E._swiglu_forward_kernel, swiglu, tensors, warps, 1)
compile_(E._swiglu_backward_kernel, swiglu, tensors, warps, 1)
row = full_row_tiling(5376, "residual")
for gated in (True, False):
    compile_(E._gated_forward_kernel, dict(GATED=gated, BLOCK_S=row.rows, BLOCK_C=row.width), tensors, row.warps, 1)
compile_(E._gated_backward_kernel, dict(BLOCK_S=row.rows, BLOCK_C=row.width), tensors, row.warps, 1)
""")
