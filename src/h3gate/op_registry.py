"""Every standalone op of the MiniMax-H3 block, one row each: its name, its op group and the provider's formula.

The name keys every op table (a candidate's ``kernel_ops``, the kernel gate's input draws, the benchmark's
cases, the block program's ``Ops``); the group is what the block gate's hybrids run as the provider to attribute
an error; the formula is diffusers' arithmetic for the op as a plain tensor function in the signature of a
candidate's standalone op (RMSNorm through ``F.rms_norm`` as ``nn.RMSNorm`` does, RoPE through diffusers' own
``_apply_rotary_emb``, SDPA through diffusers' attention dispatch). The kernel gate runs it at low precision and
in float64 as the reference, the benchmark times it as the provider, the ``provider`` candidate offers it.

Tables kept elsewhere pass through :func:`keyed` where they are built, so an op added here that one of them
lacks stops that module from importing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb


def linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


def silu_linear(temb, weight, bias):
    return F.linear(F.silu(temb).to(weight.dtype), weight, bias)


def rms_norm_modulate(x, weight, eps, scale=None, shift=None, idx=None):
    y = F.rms_norm(x, (x.shape[-1],), weight, eps)
    if scale is None:
        return y
    return y * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)


def qk_norm_rope(x, weight, eps, cos=None, sin=None):
    y = F.rms_norm(x, (x.shape[-1],), weight, eps)
    if cos is None:
        return y
    return _apply_rotary_emb(y, cos, sin)


def attention(q, k, v):
    # diffusers' own dispatch, so the active attention backend (a provider variant) applies as in the model
    return dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)


def swiglu(h):
    a, gate = h.chunk(2, dim=-1)
    return a * F.silu(gate)


def gated_residual(residual, y, gate=None, idx=None):
    if gate is None:
        return residual + y
    return residual + gate.index_select(0, idx) * y


@dataclass(frozen=True)
class Op:
    """One op: ``name`` keys the op tables, ``group`` is its block-program op group, ``provider`` its formula,
    ``switches`` the provider variants' switches (:class:`h3gate.numerics.Mode` fields) that can change its arithmetic:
    the BLAS library and TF32 reach a GEMM (and SDPA's math kernel), the attention backend attention alone, the
    thread count every op on a CPU."""

    name: str
    group: str
    provider: Callable
    switches: tuple[str, ...] = ("threads",)


_GEMM = ("blas", "fp32_precision", "threads")
OPS = (
    Op("linear", "gemm", linear, _GEMM),
    Op("silu_linear", "adaln", silu_linear, _GEMM),
    Op("rms_norm_modulate", "norm", rms_norm_modulate),
    Op("qk_norm_rope", "qk_norm_rope", qk_norm_rope),
    Op("attention", "attention", attention, ("attention_backend", *_GEMM)),
    Op("swiglu", "swiglu", swiglu),
    Op("gated_residual", "residual", gated_residual),
)


def keyed(table: Mapping[str, object], what: str) -> list[tuple[Op, object]]:
    """``(op, table[op.name])`` for every op in registry order; a :class:`LookupError` naming ``what`` where the
    table lacks an op or has a name that is no op, so a table that drifts from the registry fails where it is
    built instead of skipping an op."""
    names = [op.name for op in OPS]
    missing = [name for name in names if name not in table]
    unknown = sorted(set(table) - set(names))
    problems = []
    if missing:
        problems.append(f"no entry for op(s) {missing}")
    if unknown:
        problems.append(f"entries for unknown op(s) {unknown}")
    if problems:
        raise LookupError(f"{what}: {', '.join(problems)}; ops: {', '.join(names)}")
    return [(op, table[op.name]) for op in OPS]


def by_name(name: str) -> Op:
    """The registry's op of that name; a :class:`KeyError` naming the ops for another."""
    for op in OPS:
        if op.name == name:
            return op
    raise KeyError(f"no op {name!r}; ops: {', '.join(op.name for op in OPS)}")


def provider_ops() -> dict[str, Callable]:
    """The provider's op table: every op of the registry by name, as diffusers computes it, in the signatures of a
    candidate's standalone ops (:meth:`h3gate.candidates.Candidate.kernel_ops`)."""
    return {op.name: op.provider for op in OPS}
