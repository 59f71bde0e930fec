"""The MiniMax-H3 blocks written as calls to the ops of :mod:`h3gate.op_registry`.

diffusers computes a transformer block, a token-refiner block and ``norm_out`` as one Python expression each.
To swap single ops for kernels (and back, one group at a time, for attribution) the same arithmetic is
written here as a program over an op table. :data:`PROVIDER_OPS` issues exactly the torch calls diffusers
issues, in the same order, so the program with the provider table is bitwise equal to diffusers (a test
holds this); a candidate supplies its own table for some groups.

The program also names its intermediate results (``tap`` points): the block gate compares them between
runs. The names are the same for every op table, so golden, provider and candidate are comparable.

Op groups and the program's calls (``m`` is the diffusers submodule whose parameters the op uses); the ops
that use no submodule are the registry's provider formulas themselves:

==============  ==================================================================  =====================
group           call                                                                provider arithmetic
==============  ==================================================================  =====================
gemm            ``linear(m, x)``                                                    ``m(x)``
adaln           ``silu_linear(m, temb)`` -> (R, n*C) table, ``m`` holds ``linear``    ``m.linear(silu(temb).to(dtype))``
norm            ``rms_norm_modulate(m, x, scale, shift, idx)`` (tables may be None)   ``m(x) * (1 + scale[idx]) + shift[idx]``
qk_norm_rope    ``qk_norm_rope(m, x, rotary_emb)`` (rotary may be None)              ``_apply_rotary_emb(m(x), *rotary)``
attention       ``attention(processor, q, k, v)``                                    ``dispatch_attention_fn``
swiglu          ``swiglu(h)``                                                       ``a * silu(g)``
residual        ``gated_residual(residual, y, gate, idx)`` (gate may be None)         ``residual + gate[idx] * y``
==============  ==================================================================  =====================
"""

from __future__ import annotations

import contextvars
import functools
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, dispatch_attention_fn
from diffusers.models.modeling_utils import get_parameter_dtype
from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

from h3gate import op_registry

OP_GROUPS = tuple(dict.fromkeys(op.group for op in op_registry.OPS))


@dataclass(frozen=True)
class Ops:
    """One implementation per op of the registry, in the program's signatures; :meth:`mixed` builds hybrids."""

    linear: Callable
    silu_linear: Callable
    rms_norm_modulate: Callable
    qk_norm_rope: Callable
    attention: Callable
    swiglu: Callable
    gated_residual: Callable

    def mixed(self, other: "Ops", groups) -> "Ops":
        """This table with the ops of ``groups`` taken from ``other``."""
        unknown = sorted(set(groups) - set(OP_GROUPS))
        if unknown:
            raise ValueError(f"unknown op group(s) {unknown}; valid groups: {', '.join(OP_GROUPS)}")
        return replace(self, **{op.name: getattr(other, op.name) for op in op_registry.OPS if op.group in groups})


# an op added to the registry stops the program from importing until it has its field here
op_registry.keyed({f.name: f for f in fields(Ops)}, "the block program's Ops fields")


def _provider_silu_linear(module, temb):
    linear = module.linear
    return linear(F.silu(temb).to(get_parameter_dtype(linear)))


def _provider_rms_norm_modulate(norm, x, scale, shift, idx):
    x = norm(x)
    if scale is None:
        return x
    return x * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)


def _provider_qk_norm_rope(norm, x, rotary_emb):
    x = norm(x)
    if rotary_emb is None:
        return x
    return _apply_rotary_emb(x, *rotary_emb)


MATH_SCORES_BYTES = 2**31  # score-matrix bytes the math SDPA backend may hold at once, see _provider_attention


def _provider_attention(processor, q, k, v):
    """``dispatch_attention_fn``; under the math backend in query chunks when the scores would not fit.

    The math backend materialises every score: a release block (56 heads, 38,222 rows) needs 305 GiB of them in
    float32, so the block gate's golden run and its sdpa-math variant could not run on one GPU. Softmax is per
    query row, so the rows go in chunks whose scores stay within :data:`MATH_SCORES_BYTES`, each chunk
    recomputed in the backward (``torch.utils.checkpoint``) rather than its probabilities kept. Below that size
    (the embedded presets) the call is diffusers' own, bitwise.
    """
    attend = functools.partial(
        dispatch_attention_fn,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        backend=processor._attention_backend,
        parallel_config=processor._parallel_config,
    )
    backend = processor._attention_backend or _AttentionBackendRegistry.get_active_backend()[0]
    batch, rows, heads, _ = q.shape
    row_bytes = batch * heads * k.shape[1] * q.element_size()
    if AttentionBackendName(backend) != AttentionBackendName._NATIVE_MATH or rows * row_bytes <= MATH_SCORES_BYTES:
        return attend(q, k, v)
    chunk = max(1, MATH_SCORES_BYTES // row_bytes)
    return torch.cat(
        [checkpoint(attend, q[:, start:start + chunk], k, v, use_reentrant=False) for start in range(0, rows, chunk)],
        dim=1,
    )


# diffusers' own submodules where an op uses one (their calls, hooks included, bitwise), the registry's formulas
# where none is used
PROVIDER_OPS = Ops(
    linear=lambda m, x: m(x),
    silu_linear=_provider_silu_linear,
    rms_norm_modulate=_provider_rms_norm_modulate,
    qk_norm_rope=_provider_qk_norm_rope,
    attention=_provider_attention,
    swiglu=op_registry.swiglu,
    gated_residual=op_registry.gated_residual,
)

def _eps(module, x):
    return module.eps if module.eps is not None else torch.finfo(x.dtype).eps


def ops_from_kernels(kernels: dict) -> Ops:
    """The op table over standalone tensor functions (the signatures of :mod:`h3gate.op_registry`)."""

    def qk_norm_rope(module, x, rotary_emb):
        cos, sin = rotary_emb if rotary_emb is not None else (None, None)
        return kernels["qk_norm_rope"](x, module.weight, _eps(module, x), cos, sin)

    return Ops(
        linear=lambda module, x: kernels["linear"](x, module.weight, module.bias),
        silu_linear=lambda module, temb: kernels["silu_linear"](temb, module.linear.weight, module.linear.bias),
        rms_norm_modulate=lambda module, x, scale, shift, idx: kernels["rms_norm_modulate"](
            x, module.weight, _eps(module, x), scale, shift, idx
        ),
        qk_norm_rope=qk_norm_rope,
        attention=lambda processor, q, k, v: kernels["attention"](q, k, v),
        swiglu=kernels["swiglu"],
        gated_residual=kernels["gated_residual"],
    )


# Where the program reports its named intermediate results: a callable (module, name, tensor) or None.
TAP_POINT: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("h3gate_tap_point", default=None)

# Names of the tap points of a transformer block, in program order (a refiner block has the subset
# without modulation).
BLOCK_TAP_POINTS = (
    "norm1_modulated",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.q_rotated",
    "attn.k_rotated",
    "attn.attention",
    "attn.to_out",
    "attn_residual",
    "norm2_modulated",
    "ff.up",
    "ff.swiglu",
    "ff.down",
    "ff_residual",
)


@torch.compiler.disable  # a tap point is host I/O: under torch.compile the graph breaks here
def _tap(module, name, tensor):
    point = TAP_POINT.get()
    if point is not None:
        point(module, name, tensor)
    return tensor


def attention_forward(ops: Ops, attn, x, rotary_emb, block):
    q = _tap(block, "attn.q", ops.linear(attn.to_q, x))
    k = _tap(block, "attn.k", ops.linear(attn.to_k, x))
    v = _tap(block, "attn.v", ops.linear(attn.to_v, x))
    q = q.unflatten(-1, (attn.heads, -1))
    k = k.unflatten(-1, (attn.heads, -1))
    v = v.unflatten(-1, (attn.heads, -1))
    q = _tap(block, "attn.q_rotated", ops.qk_norm_rope(attn.norm_q, q, rotary_emb))
    k = _tap(block, "attn.k_rotated", ops.qk_norm_rope(attn.norm_k, k, rotary_emb))
    out = ops.attention(attn.processor, q, k, v)
    out = _tap(block, "attn.attention", out.flatten(2, 3).type_as(q))
    out = ops.linear(attn.to_out[0], out)
    return _tap(block, "attn.to_out", attn.to_out[1](out))


def feed_forward(ops: Ops, ff, x, block):
    swiglu_module, dropout, down = ff.net[0], ff.net[1], ff.net[2]
    h = _tap(block, "ff.up", ops.linear(swiglu_module.proj, x))
    h = _tap(block, "ff.swiglu", ops.swiglu(h))
    h = dropout(h)
    h = ops.linear(down, h)
    for extra in ff.net[3:]:
        h = extra(h)
    return _tap(block, "ff.down", h)


def transformer_block_forward(ops: Ops, block, hidden_states, temb, adaln_indices, rotary_emb, attention_mask=None):
    """``MiniMaxH3TransformerBlock.forward`` over ``ops``."""
    if attention_mask is not None:
        raise ValueError("MiniMax-H3 blocks run unmasked; the op program takes no attention_mask")
    table = ops.silu_linear(block.adaln_proj, temb).view(-1, 6 * block.adaln_proj.hidden_size)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = table.chunk(6, dim=-1)
    x = _tap(block, "norm1_modulated", ops.rms_norm_modulate(block.norm1, hidden_states, scale_msa, shift_msa, adaln_indices))
    attn_output = attention_forward(ops, block.attn, x, rotary_emb, block)
    hidden_states = _tap(
        block, "attn_residual", ops.gated_residual(hidden_states, attn_output, gate_msa, adaln_indices)
    )
    x = _tap(block, "norm2_modulated", ops.rms_norm_modulate(block.norm2, hidden_states, scale_mlp, shift_mlp, adaln_indices))
    ff_output = feed_forward(ops, block.ff, x, block)
    return _tap(block, "ff_residual", ops.gated_residual(hidden_states, ff_output, gate_mlp, adaln_indices))


def refiner_block_forward(ops: Ops, block, hidden_states):
    """``MiniMaxH3TokenRefinerBlock.forward`` over ``ops``."""
    x = _tap(block, "norm1_modulated", ops.rms_norm_modulate(block.norm1, hidden_states, None, None, None))
    hidden_states = _tap(
        block, "attn_residual", ops.gated_residual(hidden_states, attention_forward(ops, block.attn, x, None, block), None, None)
    )
    x = _tap(block, "norm2_modulated", ops.rms_norm_modulate(block.norm2, hidden_states, None, None, None))
    return _tap(block, "ff_residual", ops.gated_residual(hidden_states, feed_forward(ops, block.ff, x, block), None, None))


def norm_out_forward(ops: Ops, norm_out, hidden_states, temb, timestep_indices):
    """``MiniMaxH3AdaLayerNormOut.forward`` over ``ops``."""
    shift, scale = ops.silu_linear(norm_out, temb).chunk(2, dim=-1)
    return ops.rms_norm_modulate(norm_out.norm, hidden_states, scale, shift, timestep_indices)


def token_refiner_forward(ops: Ops, refiner, hidden_states):
    """``MiniMaxH3TokenRefiner.forward`` over ``ops`` (its blocks run their own, installed forwards)."""
    for block in refiner.refiner_blocks:
        if torch.is_grad_enabled() and refiner.gradient_checkpointing:
            hidden_states = refiner._gradient_checkpointing_func(block, hidden_states)
        else:
            hidden_states = block(hidden_states)
    return ops.rms_norm_modulate(refiner.final_norm, hidden_states, None, None, None)


class Installation:
    """Forwards of one transformer replaced by the program over an op table; :meth:`remove` restores them.

    Only instance attributes are set (``module.forward``), so removal is deleting them: the classes, the
    parameters and every hook stay as they were.
    """

    def __init__(self, transformer, ops: Ops):
        if getattr(transformer, "_h3gate_installation", None) is not None:
            raise RuntimeError("an op program is already installed in this transformer; remove it first")
        self.transformer = transformer
        self.ops = ops
        self.patched = []
        for block in transformer.transformer_blocks:
            self._patch(block, functools.partial(transformer_block_forward, ops, block))
        for block in transformer.token_refiner.refiner_blocks:
            self._patch(block, functools.partial(refiner_block_forward, ops, block))
        self._patch(transformer.token_refiner, functools.partial(token_refiner_forward, ops, transformer.token_refiner))
        self._patch(transformer.norm_out, functools.partial(norm_out_forward, ops, transformer.norm_out))
        transformer._h3gate_installation = self

    def _patch(self, module, forward):
        module.forward = forward
        self.patched.append(module)

    def remove(self) -> None:
        for module in self.patched:
            del module.forward
        self.patched = []
        self.transformer._h3gate_installation = None


def install(transformer, ops: Ops) -> Installation:
    """Run ``transformer``'s blocks, refiner and ``norm_out`` through the program over ``ops``."""
    return Installation(transformer, ops)
