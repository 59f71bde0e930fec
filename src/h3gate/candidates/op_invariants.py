"""The op contract: what a caller of an op relies on besides its values, as PyTorch's own operator tests check it.

An op's output has the provider's dtype, shape and device and owns its memory (an output sharing an input's storage
changes when either is written), and its inputs are unchanged after the call. The kernel gate checks this on every
drawn example, forward and backward (:mod:`h3gate.gates.kernel`); the model, block and generation gates hold the
first call of each op in every run to it (:func:`first_calls_checked`), so a kernel that breaks it at the model's
own shapes gets a verdict naming the op instead of a crash in the next op.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

_held = 0  # first calls held to the contract in this process: :func:`calls_held`


def calls_held() -> int:
    """How many first calls this process has held to the contract. A held call also copies its inputs and runs the
    provider's op beside the kernel, so a caller measuring a call's memory reads this before and after the call to
    tell such calls from the candidate's own (:mod:`h3gate.gates.generation`)."""
    return _held


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory under ``a`` and ``b`` overlaps: any view of one buffer shares it whole."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def breach(got, want: torch.Tensor, inputs: dict[str, torch.Tensor]) -> str | None:
    """How an output breaks the provider's contract, None where it keeps it."""
    def shown(value):
        return tuple(value) if isinstance(value, torch.Size) else str(value).removeprefix("torch.")

    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, provider's a tensor of shape {tuple(want.shape)}"
    for what in ("dtype", "shape", "device"):
        if getattr(got, what) != getattr(want, what):
            return f"{what} {shown(getattr(got, what))}, provider's {shown(getattr(want, what))} (shape {tuple(want.shape)})"
    shared = [name for name, tensor in inputs.items() if got.device == tensor.device and shares_storage(got, tensor)]
    return f"shares storage with input(s) {', '.join(shared)} (shape {tuple(got.shape)})" if shared else None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (a NaN input is the finite checks' business, not a change)."""
    return a.shape == b.shape and bool(((a == b) | ((a != a) & (b != b))).all())


def first_calls_checked(kernels: dict[str, Callable], provider: dict[str, Callable], on_breach: Callable) -> dict:
    """``kernels`` each of whose first call that it serves is held to the contract against ``provider``'s op of the
    same name, run on copies of the same inputs; ``on_breach(op, problem)`` is called (and raises) for a breach. A
    call the kernel declines (``NotImplemented``) is not its first."""
    return {name: _checked(name, kernel, provider[name], on_breach) for name, kernel in kernels.items()}


def _checked(name: str, kernel: Callable, provider: Callable, on_breach: Callable) -> Callable:
    pending = [True]

    @functools.wraps(kernel)
    def run(*args):
        if not pending:
            return kernel(*args)
        inputs = {f"argument {index}": a for index, a in enumerate(args) if isinstance(a, torch.Tensor)}
        before = {key: value.detach().clone() for key, value in inputs.items()}
        out = kernel(*args)
        if out is NotImplemented:
            return out
        pending.clear()
        global _held
        _held += 1
        changed = [key for key, value in inputs.items() if not _same(value.detach(), before[key])]
        if changed:
            on_breach(name, f"changed its input(s) {', '.join(changed)} in place")
        with torch.no_grad():
            want = provider(*[before.get(f"argument {index}", a) for index, a in enumerate(args)])
        problem = breach(out, want, inputs)
        if problem:
            on_breach(name, problem)
        return out

    return run
