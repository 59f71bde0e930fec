"""Seeded random values that are the same bits on every CPU.

What the gates compare bit-exactly with frozen data (a model's identity, a contract's inputs) must not follow the
checking machine's CPU. ``torch.randn`` on CPU does: its vectorised Box-Muller (Sleef's log, sin and cos on the AVX2
and AVX-512 dispatch levels, libm on the default one) gives other bits under ``ATEN_CPU_CAPABILITY=default`` than
on an AVX2 machine. ``torch.rand`` does not: a uniform is an integer of the Mersenne Twister scaled by a power of
two, exact on every dispatch level; and a sum or product of two tensors is one correctly rounded IEEE operation,
whatever the SIMD width. So :func:`normal` builds its values from those alone: the Irwin-Hall sum of four float64
uniforms, centred and scaled to unit variance (mean 0, variance 1, bounded by +-2 sqrt(3)). That is close enough to a
normal for random weights and test inputs, and provably the same everywhere.

:func:`independent_of_machine` applies the same rule to library code that initialises its own modules (diffusers'
VAEs, transformers' text encoder): every ``normal_`` and ``uniform_`` inside it is replaced by draws built this way,
from the same generator (a ``TorchDispatchMode``, the one hook below every ``torch.nn.init`` function).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SCALE = math.sqrt(3.0)  # the sum of four U(0, 1) has variance 1/3
_CHUNK = 1 << 22  # values per draw: four float64 uniforms each, 128 MiB at a time


def uniform(shape, generator: torch.Generator | None = None) -> torch.Tensor:
    """float64 uniforms in [0, 1) of ``shape`` (exact on every CPU)."""
    return torch.rand(tuple(shape), dtype=torch.float64, generator=generator)


def normal(shape, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Unit-variance values of ``shape`` and ``dtype`` from ``generator`` (the global CPU generator when None),
    bitwise the same on every CPU (module docstring). Drawn in chunks, so a release-size tensor needs no more than
    128 MiB of temporaries."""
    out = torch.empty(tuple(shape), dtype=dtype)
    flat = out.view(-1)
    for start in range(0, flat.numel(), _CHUNK):
        n = min(_CHUNK, flat.numel() - start)
        u = uniform((4, n), generator)
        flat[start:start + n] = ((u[0] + u[1]) + (u[2] + u[3]) - 2.0) * _SCALE
    return out


class _MachineIndependentDraws(TorchDispatchMode):
    """``normal_`` and ``uniform_`` on CPU tensors drawn by :func:`normal` / :func:`uniform`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type != "cpu":
            return func(*args, **kwargs)
        if func is torch.ops.aten.normal_.default:
            tensor, mean, std = (list(args) + [0.0, 1.0])[:3]
            mean, std = kwargs.get("mean", mean), kwargs.get("std", std)
            values = normal(tensor.shape, kwargs.get("generator"), torch.float64) * float(std) + float(mean)
            return tensor.copy_(values)
        if func is torch.ops.aten.uniform_.default:
            tensor, low, high = (list(args) + [0.0, 1.0])[:3]
            low, high = kwargs.get("from", low), kwargs.get("to", high)
            values = uniform(tensor.shape, kwargs.get("generator")) * (float(high) - float(low)) + float(low)
            return tensor.copy_(values)
        return func(*args, **kwargs)


@contextlib.contextmanager
def independent_of_machine():
    """Inside the body, every CPU ``normal_`` / ``uniform_`` draw (so every ``torch.nn.init`` function) gives the same
    bits on every CPU. For building modules only: it adds Python work to every op."""
    with _MachineIndependentDraws():
        yield
