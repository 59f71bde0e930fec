"""Compare a tensor with its reference: relative L2, max abs, bias, ULP distances, non-finite counts.

relative_l2 = ||x - ref|| / ||ref|| with both norms accumulated in float64, so the metric itself adds no
error at any tensor size. ULP distances are measured in ``x``'s own dtype after rounding the reference to
it: the integer distance between the two bit patterns on the monotone (sign-magnitude folded) number line,
so 0 means bitwise equal and 1 means adjacent representable values. All of it is vectorized torch, on the
device ``x`` is on: a release block's 646 M parameter gradients take minutes to reduce on a host's cores, and a
fraction of a second on its GPU (whose float64 sums may differ from the host's in the last bit).
"""

from __future__ import annotations

import math

import torch

_INT_OF = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}


_CHUNK = 1 << 26  # elements reduced at a time in float64 (0.5 GB per copy) once a tensor is larger


def _chunks(x: torch.Tensor, ref: torch.Tensor):
    """``(x, ref)`` whole, or flattened in chunks of 64 M elements once larger: a release block gate's SwiGLU tap has
    1.1 G elements, whose float64 copies (9 GB each) do not fit beside the block gate's 120 GB of weights and taps
    on one H200. Tensors of one chunk or less are reduced whole, so their results are the plain reductions'."""
    x, ref = x.detach(), ref.detach()
    if x.numel() <= _CHUNK:
        yield x.double(), ref.double()
        return
    x, ref = x.reshape(-1), ref.reshape(-1)
    for start in range(0, x.numel(), _CHUNK):
        yield x[start:start + _CHUNK].double(), ref[start:start + _CHUNK].double()


def relative_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; 0 when both are zero, inf when only ref is zero."""
    norms = [(torch.linalg.vector_norm(x64 - ref64).item(), torch.linalg.vector_norm(ref64).item())
             for x64, ref64 in _chunks(x, ref)]
    numerator, denominator = (math.hypot(*parts) for parts in zip(*norms))
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else math.inf
    return numerator / denominator


def max_abs(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| in float64; 0 for empty tensors."""
    return max(((x64 - ref64).abs().max().item() for x64, ref64 in _chunks(x, ref) if x64.numel()), default=0.0)


_BIAS_GROUPS = 32  # contiguous groups whose means give the bias's standard error


def bias(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """``(bias, standard error)``: the mean of the error signed along the reference, ``mean((x - ref) * sign(ref))``,
    over the reference's mean magnitude, and that mean's standard error on the same scale; ``(0, 0)`` where the
    reference is zero or empty.

    Rounding to nearest errs either way, so its bias is a few standard errors at most; a scaling or truncation bug
    errs one way, so its bias stands out however small against relative L2. Signed along the reference, so that
    magnitudes too large (positive) or too small (negative) do not cancel over a zero-mean tensor. The standard
    error is that of the means of contiguous groups of elements, not of single elements: errors within a row are
    correlated (a softmax row's rounded normaliser scales all of it), and groups of whole rows absorb that."""
    sums, counts, magnitude = [], [], 0.0
    for x64, ref64 in _chunks(x, ref):
        along = ((x64 - ref64) * ref64.sign()).reshape(-1)
        for part in torch.tensor_split(along, min(_BIAS_GROUPS, along.numel())):
            sums.append(part.sum().item())
            counts.append(part.numel())
        magnitude += ref64.abs().sum().item()
    if magnitude == 0.0:
        return 0.0, 0.0
    n = sum(counts)
    mean = sum(sums) / n
    means = [total / count for total, count in zip(sums, counts)]
    between = sum(count * (m - mean) ** 2 for m, count in zip(means, counts)) / n
    scale = magnitude / n
    return mean / scale, math.sqrt(between / (len(counts) - 1 or 1)) / scale


def _ordered(bits: torch.Tensor, width: int) -> torch.Tensor:
    """Map IEEE bit patterns (as signed ints) onto a monotone integer line, in int64."""
    bits = bits.to(torch.int64)
    sign_mask = 1 << (width - 1)
    return torch.where(bits < 0, -(bits & (sign_mask - 1)), bits)


def ulp_distance(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Elementwise ULP distance (int64) between ``x`` and ``ref`` rounded to ``x.dtype``."""
    dtype = x.dtype
    if dtype not in _INT_OF:
        raise TypeError(f"ULP distance is defined for floating tensors, got {dtype}")
    int_dtype = _INT_OF[dtype]
    width = torch.iinfo(int_dtype).bits
    a = _ordered(x.detach().contiguous().view(int_dtype), width)
    b = _ordered(ref.detach().to(dtype).contiguous().view(int_dtype), width)
    return (a - b).abs()


def compare(x: torch.Tensor, ref: torch.Tensor) -> dict:
    """Every metric of ``x`` against ``ref`` as a JSON-ready dict, computed on ``x``'s device."""
    if x.shape != ref.shape:
        raise ValueError(f"shape {tuple(x.shape)} differs from the reference's {tuple(ref.shape)}")
    x, ref = x.detach(), ref.detach().to(x.device)
    finite = torch.isfinite(x)
    result = {
        "relative_l2": relative_l2(x, ref),
        "max_abs": max_abs(x, ref),
        "nan": int(torch.isnan(x).sum()),
        "inf": int(torch.isinf(x).sum()),
        "all_zero": bool(x.numel() and not x.any()),
        "reference_all_zero": bool(ref.numel() and not ref.any()),
        "dtype": str(x.dtype).removeprefix("torch."),
        "numel": x.numel(),
    }
    ulp = ulp_distance(x, ref)[finite] if x.numel() else torch.zeros(0, dtype=torch.int64)
    if ulp.numel():
        ulp_float = ulp.double()
        result.update(
            ulp_max=int(ulp.max()),
            ulp_mean=ulp_float.mean().item(),
            # The k-th smallest by sorting: CUDA's kthvalue selects within one thread block per slice, which on a
            # 154 M-value parameter gradient is a single block walking all of it, 32 times.
            ulp_p99=float(ulp.sort().values[math.ceil(0.99 * ulp.numel()) - 1]),
            bitwise_equal_fraction=(ulp == 0).double().mean().item(),
        )
    return result
