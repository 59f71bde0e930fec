"""The ``h3_triton`` candidate: the block program of :mod:`h3gate.block_program` over this package's kernels.

Installing it replaces the forwards of every transformer block, every token-refiner block, the refiner
and ``norm_out`` with the op program over Triton kernels (through :class:`h3gate.block_program.Installation`,
which removes cleanly). Any op group can be run as the provider's op instead (``provider_groups``), which is
how the block gate attributes an error to one group.
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton

from h3gate.block_program import OP_GROUPS, PROVIDER_OPS, Installation, Ops
from h3gate.candidates import Candidate, CandidateError, source_digest

from h3_triton import attention, elementwise, gemm, norm, rope
from h3_triton.interpret import INTERPRET

PACKAGE_ROOT = Path(__file__).resolve().parent


def _eps(module, x):
    return module.eps if module.eps is not None else torch.finfo(x.dtype).eps


def _qk_norm_rope(module, x, rotary_emb):
    cos, sin = rotary_emb if rotary_emb is not None else (None, None)
    return rope.qk_norm_rope(x, module.weight, _eps(module, x), cos, sin)


TRITON_OPS = Ops(
    linear=lambda module, x: gemm.linear(x, module.weight, module.bias),
    modulation=lambda module, temb: gemm.silu_linear(temb, module.linear.weight, module.linear.bias),
    norm_modulate=lambda module, x, scale, shift, idx: norm.rms_norm_modulate(
        x, module.weight, _eps(module, x), scale, shift, idx
    ),
    qk_norm_rope=_qk_norm_rope,
    attention=lambda processor, q, k, v: attention.attention(q, k, v),
    swiglu=elementwise.swiglu,
    gated_residual=elementwise.gated_residual,
)

# The standalone ops the kernel gate qualifies, with the functional signatures of this package.
KERNEL_OPS = {
    "linear": gemm.linear,
    "silu_linear": gemm.silu_linear,
    "rms_norm_modulate": norm.rms_norm_modulate,
    "qk_norm_rope": rope.qk_norm_rope,
    "attention": attention.attention,
    "swiglu": elementwise.swiglu,
    "gated_residual": elementwise.gated_residual,
}


class H3Triton(Candidate):
    """Triton kernels for every op of the MiniMax-H3 block; ``provider_groups`` (``a+b``) run as the provider."""

    name = "h3_triton"

    def __init__(self, provider_groups: str = ""):
        groups = tuple(filter(None, provider_groups.replace(",", "+").split("+")))
        unknown = sorted(set(groups) - set(OP_GROUPS))
        if unknown:
            raise CandidateError(f"h3_triton: unknown op group(s) {unknown}; groups: {'+'.join(OP_GROUPS)}")
        self.provider_groups = tuple(g for g in OP_GROUPS if g in groups)
        self.ops = TRITON_OPS.mixed(PROVIDER_OPS, self.provider_groups)

    def identity(self) -> dict:
        return {
            "name": self.name,
            "source_sha256": source_digest(PACKAGE_ROOT),
            "provider_groups": list(self.provider_groups),
            "triton": triton.__version__,
            "interpreter": INTERPRET,
        }

    def install(self, transformer):
        device = next(transformer.parameters()).device
        if device.type == "cpu" and not INTERPRET and len(self.provider_groups) < len(OP_GROUPS):
            raise CandidateError(
                "h3_triton runs on CPU tensors only under Triton's interpreter: set TRITON_INTERPRET=1 before "
                "starting Python (pytest-h3 does so for --h3-device=cpu)"
            )
        return Installation(transformer, self.ops)

    def with_provider_groups(self, groups) -> "H3Triton":
        return H3Triton("+".join(sorted(set(self.provider_groups) | set(groups))))

    def kernel_ops(self) -> dict:
        return dict(KERNEL_OPS)
