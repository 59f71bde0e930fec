"""Which kernel, tiling and specialisation every launch of this package takes: its *path*.

A path is the kernel's name, the dtypes of its tensor arguments, every constexpr and launch option it is given
(tile sizes, ``num_warps``, flags such as ``DESCRIBED``, ``MODULATED`` or ``SILU_GRAD``; not the interpreter's own
``UPCAST``/``INTERPRETED``, fixed for a process) and the few runtime conditions its code branches on that no
constexpr names (``keys=full+partial``: the key loop runs full tiles, then a masked partial one).

Every launch passes :func:`launch` (directly, or through :class:`h3_triton.tuning.Launcher`, which adds its
tiling). Nothing is recorded unless asked, which costs one global lookup a launch:

- :func:`recording` collects the path of every launch inside its body;
- :func:`planning` collects them without running any kernel (the launch returns at once, outputs stay
  uninitialised): the host code that picks a path runs as it would, so the paths of a call at any size come from
  empty tensors of its shapes, strides and dtypes on the device, in milliseconds (the kernel gate plans the release
  model's calls this way).

Both are global, not per thread: autograd runs a backward on threads of its own. :func:`left_out` names the paths
a call takes elsewhere that this process cannot launch (the Gluon attention of Hopper GPUs under the interpreter).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from h3_triton.launch import launch as _launch

# Constexprs that say which arithmetic this process runs (interpreter or GPU), the same for every launch of a process.
_PROCESS_WIDE = ("UPCAST", "INTERPRETED")

_sink: list | None = None  # the paths launched while recording or planning
_planning = False


@dataclass(frozen=True)
class Path:
    kernel: str  # module.function
    spec: tuple[tuple[str, object], ...]

    def __str__(self) -> str:
        return f"{self.kernel}[{' '.join(f'{k}={v}' for k, v in self.spec)}]"


def _name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__.rpartition('.')[2]}.{fn.__name__}"


def _dtypes(args) -> str:
    names = [str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)]
    return "+".join(dict.fromkeys(names))


def _path_of(kernel, args, meta: dict, branches: dict) -> Path:
    """The path of ``kernel`` launched on ``args`` with constexprs and options ``meta`` and runtime ``branches``."""
    spec = [("dtypes", _dtypes(args))]
    spec += [(k, v) for k, v in meta.items() if k not in _PROCESS_WIDE]
    spec += sorted(branches.items())
    return Path(_name(kernel), tuple(spec))


def tiles(length: int, tile: int) -> str:
    """Which tiles a loop over ``length`` in steps of ``tile`` runs: ``full``, ``partial`` or ``full+partial``."""
    kinds = (["full"] if length >= tile else []) + (["partial"] if length % tile else [])
    return "+".join(kinds)


def skipped(kernel, args, meta: dict, branches: dict | None = None) -> bool:
    """Notes the path of a launch of ``kernel`` while recording or planning; True while planning, where the caller
    launches nothing. ``branches``: runtime conditions the kernel's code branches on, each a value or a function of
    the launch's ``meta`` (a tile size the launcher chose)."""
    if _sink is None:
        return False
    _sink.append(_path_of(kernel, args, meta, {k: v(meta) if callable(v) else v for k, v in (branches or {}).items()}))
    return _planning


def launch(kernel, grid, *args, branches: dict | None = None, **meta):
    """``kernel[grid](*args, **meta)`` (through :func:`h3_triton.launch.launch`), its path noted while recording, and
    not run while planning."""
    if not skipped(kernel, args, meta, branches):
        _launch(kernel, grid, args, meta)


@contextlib.contextmanager
def _collecting(planning: bool) -> Iterator[list[Path]]:
    global _sink, _planning
    if _sink is not None:
        raise RuntimeError("h3_triton paths: already recording or planning (they do not nest)")
    _sink, _planning = [], planning
    try:
        yield _sink
    finally:
        _sink, _planning = None, False


def recording() -> contextlib.AbstractContextManager[list[Path]]:
    """Within the body, the path of every launch is appended to the list it yields; the kernels run."""
    return _collecting(planning=False)


def planning() -> contextlib.AbstractContextManager[list[Path]]:
    """Within the body, the path of every launch is appended to the list it yields and no kernel runs."""
    return _collecting(planning=True)


HOPPER_REASON = ("Gluon kernels for Hopper GPUs (compute capability 9.0) with Triton 3.6; Triton's CPU interpreter "
                 "cannot run Gluon, so the CPU suite qualifies the Triton kernels they reproduce (bitwise for the "
                 "output, row statistics, dK and dV; dQ within a bfloat16 rounding), and on an H200 "
                 "tests/kernels/test_attention.py compares the two")


def left_out(op: str, args: dict, autograd: bool) -> list[tuple[str, str]]:
    """The paths ``op`` called on ``args`` takes on a device this process is not, which it cannot launch: (path,
    why). On a Hopper GPU with Triton 3.6 the planned launches hold them instead."""
    from h3_triton import attention, attention_hopper

    if op != "attention" or not attention_hopper.suits(args["q"]) or attention_hopper.applies(args["q"]):
        return []
    if not attention._described(args["q"], args["k"], args["v"]):
        return []
    kernels = ["_forward_kernel"] + (["_backward_kernel"] if autograd else [])
    return [(f"attention_hopper.{kernel}[dtypes=bfloat16 HEAD_DIM={attention_hopper.HEAD_DIM}]", HOPPER_REASON)
            for kernel in kernels]
