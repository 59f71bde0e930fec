"""The ``h3_triton`` candidate: the block program of :mod:`h3gate.block_program` over this package's kernels.

Installing it replaces the forwards of every transformer block, every token-refiner block, the refiner
and ``norm_out`` with the op program over Triton kernels (through :class:`h3gate.block_program.Installation`,
which removes cleanly). Any op group can be run as the provider's op instead (``provider_groups``), which is
how the block gate attributes an error to one group; any standalone op can be replaced (``with_kernel_ops``),
which is how mutants are made.
"""

from __future__ import annotations

from pathlib import Path

import triton

from h3gate.block_program import OP_GROUPS
from h3gate.candidates import CandidateError, ProgramCandidate, source_digest
from h3gate.candidates.launch_paths import LaunchPaths

from h3_triton import attention, elementwise, gemm, norm, paths, rope
from h3_triton.interpret import INTERPRET
from h3_triton.launch import DIRECT
from h3_triton.tuning import AUTOTUNE

PACKAGE_ROOT = Path(__file__).resolve().parent

# The standalone ops: what the kernel gate qualifies one by one, and what the block program runs.
KERNEL_OPS = {
    "linear": gemm.linear,
    "silu_linear": gemm.silu_linear,
    "rms_norm_modulate": norm.rms_norm_modulate,
    "qk_norm_rope": rope.qk_norm_rope,
    "attention": attention.attention,
    "swiglu": elementwise.swiglu,
    "gated_residual": elementwise.gated_residual,
}
# Which kernel, tiling and specialisation each launch of these ops takes (a mutant made by with_kernel_ops keeps them:
# the model's paths are those of these kernels).
LAUNCH_PATHS = LaunchPaths(paths.recording, paths.planning, KERNEL_OPS, paths.left_out)


class H3Triton(ProgramCandidate):
    """Triton kernels for every op of the MiniMax-H3 block; ``provider_groups`` (``a+b``) run as the provider."""

    name = "h3_triton"
    supports = {"dtypes": tuple(str(dtype).removeprefix("torch.") for dtype in attention.DTYPES),
                "head_dim": attention.HEAD_DIMS}  # the attention kernel's

    def __init__(self, provider_groups: str = ""):
        super().__init__(KERNEL_OPS, tuple(filter(None, provider_groups.replace(",", "+").split("+"))))

    def identity(self) -> dict:
        return {
            **super().identity(),
            "source_sha256": source_digest(PACKAGE_ROOT),
            "replaced_ops": sorted(op for op, fn in self.kernels.items() if KERNEL_OPS.get(op) is not fn),
            "triton": triton.__version__,
            "interpreter": INTERPRET,
            "tiling": "autotuned" if AUTOTUNE else "first",
            "launch": "direct" if DIRECT else "triton",
        }

    def launch_paths(self) -> LaunchPaths:
        return LAUNCH_PATHS

    def install(self, transformer):
        device = next(transformer.parameters()).device
        if device.type == "cpu" and not INTERPRET and len(self.provider_groups) < len(OP_GROUPS):
            raise CandidateError(
                "h3_triton runs on CPU tensors only under Triton's interpreter: set TRITON_INTERPRET=1 before "
                "starting Python (pytest-h3 does so for --h3-device=cpu)"
            )
        return super().install(transformer)
