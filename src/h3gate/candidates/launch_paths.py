"""Which code path each launch of a candidate's kernels takes: the paths a model's op calls take, planned shape-only,
against the paths the kernel gate's examples reached.

A candidate that can say which kernel, tiling and specialisation a launch takes declares it through
:class:`LaunchPaths` (``Candidate.launch_paths()``; h3_triton's come from :mod:`h3_triton.paths`): ``recording()``
collects the path of every launch inside it, ``planning()`` the same without running a kernel, so a call's paths
come from uninitialised tensors of its shapes, strides and dtypes on the device (:func:`planned`): the release
model's calls in seconds on any machine, since path selection is a function of shapes, dtypes and the device
alone. ``left_out`` names the paths a call takes on another device that this process cannot launch, and why.

A candidate that declares none is reported by the model-shaped examples alone: each path class of the model's calls
(its dims but the free ones) and the example that ran it.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Mapping

import torch

from h3gate import op_calls


def _none_left_out(op: str, args: dict, autograd: bool) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True, eq=False)
class LaunchPaths:
    """How a candidate's launches say their paths: context managers yielding the list every launch inside appends its
    path to (``planning`` runs no kernel), the ops those launches belong to, and the paths a call takes elsewhere
    that this process never launches, each with the reason."""

    recording: Callable[[], ContextManager[list]]
    planning: Callable[[], ContextManager[list]]
    ops: Mapping[str, Callable]
    left_out: Callable[[str, dict, bool], list[tuple[str, str]]] = _none_left_out


def call_args(call: op_calls.Call, device) -> dict:
    """The call's arguments as uninitialised tensors of its shapes, strides, storage offsets and dtypes on ``device``
    (integer ones zero), needing gradients as in the call, with its scalars. Nothing is written to a floating one, so
    a release-size call costs address space, not memory."""
    args = dict(call.scalars)
    for name, arg in call.args:
        if arg is None:
            args[name] = None
            continue
        dtype = getattr(torch, arg.dtype)
        size = arg.offset + 1 + sum((n - 1) * s for n, s in zip(arg.shape, arg.stride)) if all(arg.shape) else 0
        make = torch.empty if dtype.is_floating_point else torch.zeros
        storage = make(size, dtype=dtype, device=device)
        args[name] = storage.as_strided(arg.shape, arg.stride, arg.offset).requires_grad_(arg.grad)
    return args


_MODES = {op_calls.AUTOGRAD: contextlib.nullcontext, op_calls.NO_GRAD: torch.no_grad,
          op_calls.INFERENCE: torch.inference_mode}


@functools.lru_cache(maxsize=256)
def planned(paths: LaunchPaths, call: op_calls.Call, device: str) -> tuple[tuple[str, ...],
                                                                          tuple[tuple[str, str], ...]]:
    """The paths ``call`` launches on ``device`` (its forward, and its backward with autograd), planned without
    running a kernel, and the paths it takes elsewhere that this process cannot launch, with the reason."""
    args = call_args(call, device)
    autograd = call.mode == op_calls.AUTOGRAD
    with paths.planning() as launched:
        with _MODES[call.mode]():
            out = paths.ops[call.op](**args)
        if autograd:
            torch.autograd.backward(out, torch.empty_like(out))
    return tuple(dict.fromkeys(map(str, launched))), tuple(paths.left_out(call.op, args, autograd))


def call_label(call: op_calls.Call) -> str:
    """A model call in a line: op, mode and its tensor arguments' shapes and dtypes."""
    shown = " ".join(f"{name}={tuple(arg.shape)}:{arg.dtype}" for name, arg in call.args if arg is not None)
    return f"{call.op} {call.mode} {shown}"


@dataclass
class Entry:
    """One path the model's calls take: those calls, the example that reached it (None: none did), or why no
    example of this process can."""

    path: str
    calls: list[str] = field(default_factory=list)
    reached_by: str | None = None
    left_out: str | None = None

    def line(self) -> str:
        where = (f"left out: {self.left_out}" if self.left_out else
                 f"reached by {self.reached_by}" if self.reached_by else "UNREACHED: no example launched it")
        return f"{self.path}: {where} (model calls: {'; '.join(self.calls)})"


def report(model_paths: Mapping[str, list[str]], left: Mapping[str, tuple[str, list[str]]],
           reached: Mapping[str, str]) -> list[Entry]:
    """Per path the model takes (``model_paths``: path -> its calls; ``left``: path -> (why, its calls)), the example
    that reached it (``reached``: path -> example) or why none can."""
    entries = [Entry(path, list(calls), reached.get(path)) for path, calls in model_paths.items()]
    entries += [Entry(path, list(calls), left_out=why)
                for path, (why, calls) in left.items() if path not in model_paths]
    return entries
