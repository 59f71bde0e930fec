"""The kernels the candidate can run, in the signature kernel libraries offer (``rms_norm(x, weight, eps)``):

- ``stand-in``: pure torch, float32 then one rounding, so the example runs on any CPU;
- ``liger``: Liger-Kernel's Triton RMSNorm (``pip install 'h3-example-rmsnorm[liger]'``; a CUDA GPU: its kernels do
  not run under Triton's CPU interpreter). Called as ``LigerRMSNormFunction.apply(X, W, eps, offset, casting_mode,
  in_place)``: casting mode ``llama`` is what diffusers' RMSNorm does (normalise in float32, round, then multiply by
  the bfloat16 weight), and ``in_place=False`` because its default writes dX into the incoming gradient's memory,
  which the op contract forbids (inputs must be unchanged after the backward).
"""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def liger_rms_norm():
    """Liger-Kernel's RMSNorm in the signature above, or ImportError saying how to install it."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError as error:
        raise ImportError(f"kernel=liger needs Liger-Kernel: pip install 'h3-example-rmsnorm[liger]' ({error})") from None

    def rms_norm_liger(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)

    rms_norm_liger.__wrapped__ = LigerRMSNormFunction.forward  # the identity pins liger_kernel's distribution
    return rms_norm_liger


KERNELS = {"stand-in": lambda: rms_norm, "liger": liger_rms_norm}
