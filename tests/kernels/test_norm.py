"""rms_norm_modulate against diffusers' RMSNorm + AdaLN modulation, with float64 as the truth.

Criterion for every output and gradient: relative L2 error (float64) of the kernel <= 2 x that of the provider
(diffusers' formula at the same precision) + u, the largest relative error of one rounding to the dtype.
Every input lives inside a NaN-filled buffer, so a load that strays past a view's edge poisons the result.
"""

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AdaLayerNormOut

from h3_triton.norm import rms_norm_modulate
from kernel_checks import assert_bounded, nan_padded, strided_index, table_index
from sm90 import compile_for_h200

EPS = 1e-6
TABLE_ROWS = 6
RUNS = [2, 0, 5, 2, 1]  # table rows left out stay unreferenced: their gradients must be 0
# (batch dims, S, C); 4500 columns take the single-row forward: five chunks of 1024, the last one partial
SHAPES = [((), 1, 48), ((2,), 7, 80), ((), 65, 96), ((2,), 130, 48), ((), 600, 80), ((), 3, 4500)]


def provider(x, weight, scale=None, shift=None, idx=None):
    """diffusers' ``norm1(x) * (1 + scale_msa[idx]) + shift_msa[idx]``, op for op, in the inputs' dtype."""
    y = F.rms_norm(x, (x.shape[-1],), weight, EPS)
    if scale is None:
        return y
    return y * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)


def candidate_run(x, weight, tables, idx, dy):
    """Output and gradients (x, weight, shift, scale) of the kernel on NaN-padded inputs.

    shift and scale are chunks 0 and 1 of one NaN-filled (R, 6C) projection, as diffusers hands them over;
    idx is a strided view.
    """
    width = x.shape[-1]
    x_buffer, x_view = nan_padded(x, requires_grad=True)
    w_buffer, w_view = nan_padded(weight, requires_grad=True)
    buffers = [x_buffer, w_buffer]
    shift = scale = None
    if tables is not None:
        projection = torch.full((TABLE_ROWS, 6 * width), float("nan"), dtype=x.dtype)
        projection[:, :2 * width] = torch.cat(tables, dim=1)
        projection.requires_grad_()
        shift, scale = projection[:, :width], projection[:, width:2 * width]
        buffers.append(projection)
    y = rms_norm_modulate(x_view, w_view, EPS, scale, shift, None if idx is None else strided_index(idx, TABLE_ROWS))
    y.backward(nan_padded(dy)[1])
    for buffer in buffers:
        assert torch.isfinite(buffer.grad).all(), "a NaN from the padding reached a gradient"
    inner = slice(1, -2)
    results = [y, x_buffer.grad[(inner,) * x.dim()], w_buffer.grad[inner]]
    if tables is not None:
        assert not projection.grad[:, 2 * width:].any(), "gradient leaked into the other chunks"
        results += [projection.grad[:, :width], projection.grad[:, width:2 * width]]
    return results


def provider_run(x, weight, tables, idx, dy):
    """Outputs and gradients (x, weight, shift, scale) of the provider formula at the inputs' dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, *(tables or ()))]
    shift, scale = leaves[2:] if tables is not None else (None, None)
    y = provider(leaves[0], leaves[1], scale, shift, idx)
    y.backward(dy)
    return [y] + [leaf.grad for leaf in leaves]


def inputs(batch, seq_len, width, dtype, modulated, seed=0):
    generator = torch.Generator().manual_seed(seed)
    # Row magnitudes from 1e-3 to 10: the smallest rows have mean squares near eps, so eps matters.
    magnitude = 10 ** (4 * torch.rand(*batch, seq_len, 1, generator=generator) - 3)
    x = ((torch.randn(*batch, seq_len, width, generator=generator) + 0.5) * magnitude).to(dtype)
    weight = (1 + 0.5 * torch.randn(width, generator=generator)).to(dtype)
    dy = torch.randn(*batch, seq_len, width, generator=generator).to(dtype)
    tables = None
    if modulated:
        tables = tuple((0.3 * torch.randn(TABLE_ROWS, width, generator=generator)).to(dtype) for _ in range(2))
    return x, weight, tables, dy, generator


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("mode", ["plain", "random", "runs"])
@pytest.mark.parametrize("batch, seq_len, width", SHAPES, ids=[f"S{s}-C{c}" for _, s, c in SHAPES])
def test_matches_float64_reference(batch, seq_len, width, mode, dtype):
    x, weight, tables, dy, generator = inputs(batch, seq_len, width, dtype, mode != "plain")
    idx = None if tables is None else table_index(mode, seq_len, generator, TABLE_ROWS, RUNS)
    unreferenced = torch.ones(TABLE_ROWS, dtype=torch.bool)
    if mode == "runs":  # rows no sequence position uses are never read, so they may hold anything
        unreferenced[idx.unique()] = False
        tables = tuple(t.masked_fill(unreferenced[:, None], float("nan")) for t in tables)
    got = candidate_run(x, weight, tables, idx, dy)
    provided = provider_run(x, weight, tables, idx, dy)
    reference = provider_run(
        x.double(), weight.double(), None if tables is None else tuple(t.double() for t in tables), idx, dy.double()
    )
    names = ["y", "dx", "dweight", "dshift", "dscale"]
    for name, candidate, provider_value, ref in zip(names, got, provided, reference):
        assert candidate.shape == ref.shape and candidate.dtype == dtype, name
        assert_bounded(name, candidate, provider_value, ref)
    if mode == "runs":
        assert unreferenced.any() and all((grad[unreferenced] == 0).all() for grad in got[3:])


@pytest.mark.parametrize("mode", ["random", "runs"])
def test_backward_is_bitwise_deterministic(mode):
    x, weight, tables, dy, generator = inputs((), 600, 48, torch.bfloat16, modulated=True, seed=1)
    idx = table_index(mode, 600, generator, TABLE_ROWS, RUNS)
    first, second = (candidate_run(x, weight, tables, idx, dy) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_int32_index():
    x, weight, tables, dy, generator = inputs((), 65, 48, torch.float32, modulated=True, seed=2)
    idx = table_index("random", 65, generator, TABLE_ROWS, RUNS)
    got = candidate_run(x, weight, tables, idx.int(), dy)
    expected = candidate_run(x, weight, tables, idx, dy)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_empty_sequence_has_zero_gradients():
    x, weight, tables, dy, _ = inputs((2,), 0, 48, torch.float32, modulated=True)
    y, dx, dweight, dshift, dscale = candidate_run(x, weight, tables, torch.zeros(0, dtype=torch.int64), dy)
    assert y.shape == dx.shape == (2, 0, 48)
    assert not dweight.any() and not dshift.any() and not dscale.any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bf16", "fp64"])
def test_provider_is_diffusers_norm_out(dtype):
    """The provider formula above is, bit for bit, what diffusers' modulated RMSNorm computes."""
    torch.manual_seed(3)
    module = MiniMaxH3AdaLayerNormOut(hidden_size=48, time_embed_dim=16, eps=EPS).to(dtype)
    with torch.no_grad():
        module.norm.weight.normal_(1.0, 0.5)
    x = torch.randn(2, 33, 48, dtype=dtype)
    temb = torch.randn(3, 16, dtype=dtype)
    timestep_indices = torch.randint(0, 3, (33,))
    with torch.no_grad():
        shift, scale = module.linear(F.silu(temb)).chunk(2, dim=-1)
        assert torch.equal(
            module(x, temb, timestep_indices), provider(x, module.norm.weight, scale, shift, timestep_indices)
        )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(x=torch.zeros(4, 8, dtype=torch.float64)), TypeError, "x has dtype torch.float64"),
        (dict(weight=torch.zeros(7)), ValueError, r"weight must be a floating \(8,\)"),
        (dict(scale=torch.zeros(3, 8)), ValueError, "scale, shift and idx go together"),
        (dict(scale=torch.zeros(3, 8), shift=torch.zeros(2, 8), idx=torch.zeros(4, dtype=torch.int64)),
         ValueError, "must have the same rows"),
        (dict(scale=torch.zeros(3, 8), shift=torch.zeros(3, 8), idx=torch.zeros(4)), ValueError, "idx must be"),
        (dict(scale=torch.zeros(3, 7), shift=torch.zeros(3, 8), idx=torch.zeros(4, dtype=torch.int64)),
         ValueError, r"scale must be a floating \(R, 8\)"),
        (dict(x=torch.zeros(2, 3, 4, 8).transpose(0, 1)), ValueError, "cannot merge into one batch dim"),
    ],
)
def test_rejects_bad_inputs(kwargs, error, match):
    args = dict(x=torch.zeros(4, 8), weight=torch.ones(8), eps=EPS) | kwargs
    with pytest.raises(error, match=match):
        rms_norm_modulate(**args)


def test_forward_compiles_for_h200():
    """The forward at the release width (5376: six chunks, the last partial), modulated or not, and at a narrow one
    (whole rows, many per tile), compiled for sm_90 as the GPU compiles it."""
    compile_for_h200("""
import h3_triton.norm as N
tensors = dict(x_ptr="*bf16", w_ptr="*bf16", scale_ptr="*bf16", shift_ptr="*bf16", idx_ptr="*i64", y_ptr="*bf16")
for width, modulated in ((5376, True), (5376, False), (96, True)):
    tiling = N._forward_tiling(width, "x")
    consts = dict(MODULATED=modulated, BLOCK_S=tiling.rows, BLOCK_C=tiling.width)
    compile_(N._forward_kernel, consts, tensors, tiling.warps, 1)
""")


def test_backward_compiles_for_h200():
    """The backward at the release width, modulated or not, the table gradients' finalize and the slot reduction
    (:mod:`h3_triton.rowreduce`, every op's weight gradient) at the slot counts of the release launches, compiled
    for sm_90 as the GPU compiles them."""
    compile_for_h200("""
import h3_triton.norm as N
import h3_triton.rowreduce as RR
tensors = dict(x_ptr="*bf16", w_ptr="*bf16", scale_ptr="*bf16", idx_ptr="*i64", dy_ptr="*bf16", dx_ptr="*bf16",
               part_ptr="*fp32", flag_ptr="*i32", dscale_ptr="*bf16", dshift_ptr="*bf16", wpart_ptr="*fp32",
               wflag_ptr="*i32", out_ptr="*bf16")
row = RR.full_row_tiling(5376, "x")
for modulated in (True, False):
    compile_(N._backward_kernel, dict(MODULATED=modulated, BLOCK_S=row.rows, BLOCK_C=row.width), tensors,
             row.warps, 1)
for programs in (4, 16, 32, 132):
    blocks = RR.slot_blocks(programs, 5376)
    compile_(N._table_grads_kernel, dict(BLOCK_G=blocks.rows, BLOCK_C=blocks.width), tensors, blocks.warps, 1)
    compile_(RR._reduce_slots_kernel, dict(BLOCK_G=blocks.rows, BLOCK_C=blocks.width), tensors, blocks.warps, 1)
""")
