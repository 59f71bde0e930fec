"""How every kernel of this package is launched: ``kernel[grid](*args, **meta)``, Triton's per-call binding skipped
for a call signature launched before.

Why: ops of few microseconds of GPU work (the AdaLN's ``silu_linear``) take longer on the host than on the GPU, and
Triton's ``kernel[grid]`` binds and specialises every argument, builds its cache key from them and reads its knobs
at every call: on an H100 machine's host 45 us a launch of a 44-argument kernel, of which the compiled kernel's own
launcher takes 18 us (``benchmarks/launch_costs.py``).

A *call signature* is what Triton picks its compiled kernel by, made stricter: the current device, each argument's
type, every scalar argument's value, every tensor argument's dtype and whether its address is a multiple of 16
(the only properties of a tensor Triton specialises on), and the constexprs and launch options by name and value.
The first launch of a signature goes through ``kernel[grid]`` (which compiles or finds the kernel, checks the
globals it reads and launches it) and keeps the compiled kernel it returns; the later ones hand the same arguments
to that compiled kernel's launcher on the current stream, as ``kernel[grid]`` does. The same compiled kernel runs
on the same arguments, so the bits are the same either way.

This applies to plain ``triton.jit`` kernels on an NVIDIA GPU, with ``H3_TRITON_DIRECT_LAUNCH=1`` (read at import; the
default 0 launches every kernel through ``kernel[grid]`` until the direct launch has been timed and gated on a GPU),
with Triton versions whose launcher interface it calls (:data:`LAUNCHER_VERSIONS`), while no launch hook is set
(profilers such as Proton set one). Every other launch, every launch under the interpreter and every Gluon kernel
(long kernels, launched as Triton launches them) goes through ``kernel[grid]``.
"""

from __future__ import annotations

import operator
import os

import torch
import triton
from triton import knobs
from triton.runtime.jit import JITFunction

from h3_triton.interpret import INTERPRET

# Triton versions whose CompiledKernel.run takes (grid_x, grid_y, grid_z, stream, function, packed_metadata,
# launch_metadata, enter_hook, exit_hook, *every_parameter), as their JITFunction.run calls it (read in Triton 3.6's
# runtime/jit.py, compiler/compiler.py and backends/nvidia/driver.py), and whose NVIDIA backend specialises a tensor
# on its dtype and 16-byte alignment alone (asked of it by tests/kernels/test_launch.py; AMD's backend specialises
# on more, so ROCm is refused).
LAUNCHER_VERSIONS = ("3.6.",)


def _direct_setting() -> bool:
    value = os.environ.get("H3_TRITON_DIRECT_LAUNCH", "0")
    if value not in ("0", "1"):
        raise ValueError(f"H3_TRITON_DIRECT_LAUNCH={value!r}: set it to 0 (every launch through Triton's "
                         "kernel[grid]: the default) or 1 (a call signature launched before, directly)")
    if value == "1" and (INTERPRET or torch.version.hip or not triton.__version__.startswith(LAUNCHER_VERSIONS)):
        runs = ("Triton's CPU interpreter" if INTERPRET else "a ROCm build of torch" if torch.version.hip
                else f"Triton {triton.__version__}")
        raise ValueError(f"H3_TRITON_DIRECT_LAUNCH=1 launches compiled kernels of Triton {', '.join(LAUNCHER_VERSIONS)}x "
                         f"on an NVIDIA GPU; this process runs {runs}: unset it")
    return value == "1"


DIRECT: bool = _direct_setting()

# Signatures kept per kernel; past it the kernel's are forgotten (and found again by their next launch): shapes drawn
# by the gates' shape search would otherwise grow it without end.
_KEPT = 1024
_SCALARS = (int, bool, float, type(None))
_META = (*_SCALARS, str)
_UNSEEN = object()


def stream_of(device: int | None) -> int:
    """The handle of the current stream of the GPU of index ``device``, as Triton's launcher takes it (0 under the
    interpreter)."""
    return 0 if INTERPRET else torch._C._cuda_getCurrentRawStream(device)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host code: ``triton.cdiv`` is a constexpr function whose wrapper costs microseconds a
    call outside a kernel."""
    return (a + b - 1) // b


def launch(kernel, grid, args: tuple, meta: dict) -> None:
    """``kernel[grid](*args, **meta)``; with ``H3_TRITON_DIRECT_LAUNCH=1`` the compiled kernel of a call signature
    launched before, directly."""
    if DIRECT and type(kernel) is JITFunction and not (knobs.runtime.launch_enter_hook.calls
                                                       or knobs.runtime.launch_exit_hook.calls):
        _direct(kernel).launch(grid, args, meta)
    else:
        kernel[grid](*args, **meta)


def _picker(indices: list[int]):
    """A function of the arguments giving those at ``indices`` as a tuple."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        (index,) = indices
        return lambda args: (args[index],)
    return lambda args: ()


class _Direct:
    """One kernel's compiled kernels by call signature."""

    def __init__(self, kernel: JITFunction):
        self.kernel = kernel
        self.compiled: dict[tuple, object] = {}
        self.pickers: dict[tuple, tuple | None] = {}  # argument types -> (tensors, scalars), None: not kept
        self.params = [(param.name, param.default) for param in kernel.params]
        self.positions = {name: i for i, (name, _) in enumerate(self.params)}

    def _pickers(self, types: tuple) -> tuple | None:
        tensors = [i for i, kind in enumerate(types) if issubclass(kind, torch.Tensor)]
        scalars = [i for i, kind in enumerate(types) if issubclass(kind, _SCALARS)]
        pickers = (_picker(tensors), _picker(scalars)) if len(tensors) + len(scalars) == len(types) else None
        self.pickers[types] = pickers
        return pickers

    def launch(self, grid, args: tuple, meta: dict) -> None:
        types = tuple(map(type, args))
        pickers = self.pickers.get(types, _UNSEEN)
        if pickers is _UNSEEN:
            pickers = self._pickers(types)
        if pickers is None:
            self.kernel[grid](*args, **meta)
            return
        tensors, scalars = pickers
        device = torch.cuda.current_device()
        key = (device, types, scalars(args), tuple([(t.dtype, t.data_ptr() % 16 == 0) for t in tensors(args)]),
               tuple(meta.items()))
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **meta)
            if all(isinstance(value, _META) for value in meta.values()):  # else a key of object identities: not kept
                if len(self.compiled) >= _KEPT:
                    self.compiled.clear()
                self.compiled[key] = compiled
            return
        rest = [meta[name] if name in meta else default for name, default in self.params[len(args):]]
        if callable(grid):  # of the parameters by name, as Triton calls it
            grid = grid(_Named(meta, self.positions, args, rest))
        size = len(grid)
        compiled.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                     stream_of(device), compiled.function, compiled.packed_metadata,
                     None, None, None, *args, *rest)


class _Named(dict):
    """The launch's parameters by name, for a grid function: the constexprs and options given, the other parameters
    looked up when asked for (building the whole dict would cost a few microseconds a launch)."""

    def __init__(self, meta: dict, positions: dict, args: tuple, rest: list):
        super().__init__(meta)
        self.positions, self.args, self.rest = positions, args, rest

    def __missing__(self, name: str):
        index = self.positions[name]
        return self.args[index] if index < len(self.args) else self.rest[index - len(self.args)]


_DIRECTS: dict[JITFunction, _Direct] = {}


def _direct(kernel: JITFunction) -> _Direct:
    found = _DIRECTS.get(kernel)
    if found is None:
        found = _DIRECTS[kernel] = _Direct(kernel)
    return found
