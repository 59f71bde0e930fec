"""h3_triton: Triton kernels for every op of the MiniMax-H3 transformer block, and the candidate installing them."""

from h3_triton.backend import H3Triton

__all__ = ["H3Triton"]
