"""The provider's arithmetic of every block op as a plain tensor function, in the signatures of a candidate's
standalone ops (:meth:`h3gate.candidates.Candidate.kernel_ops`).

These are diffusers' formulas op by op (RMSNorm through ``F.rms_norm`` as ``nn.RMSNorm`` does, RoPE through
diffusers' own ``_apply_rotary_emb``, SDPA through diffusers' attention dispatch): the kernel gate runs them at low
precision and in float64 as the reference, the benchmark times them as the provider, and the ``provider``
candidate offers them as its kernels.
"""

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


OPS = {
    "linear": linear,
    "silu_linear": silu_linear,
    "rms_norm_modulate": rms_norm_modulate,
    "qk_norm_rope": qk_norm_rope,
    "attention": attention,
    "swiglu": swiglu,
    "gated_residual": gated_residual,
}
