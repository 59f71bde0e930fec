"""The kernel, in the signature kernel libraries offer (Liger-Kernel's ``LigerRMSNormFunction.apply(X, W, eps)`` takes
the same first three): here a pure-torch stand-in that computes in float32 and rounds once, so the example runs on
any CPU. A Triton kernel of the same signature drops in unchanged."""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)
