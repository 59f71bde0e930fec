"""How each kernel's tiling is chosen: Triton's autotuner on a GPU, one fixed tiling under the interpreter.

Every tuned kernel of this package launches through a :class:`Launcher`, which owns its list of tilings.
Triton's own ``triton.autotune`` does the timing; its results are kept on disk (``cache_results``: keyed by
triton version, GPU architecture, kernel source and tuning key), so a run does not re-tune what an earlier
run on the same machine tuned.

``H3_TRITON_AUTOTUNE=0`` (read at import) pins every kernel to the first tiling of its list (for the attention
forward and the tiled GEMM the fastest measured at release shapes on an H200): no timing runs, and the tiling,
and so the bits of kernels whose reduction order follows it (attention's key blocks), no longer depend on
timings a machine happened to measure.
The kernel gate on a GPU runs this way (tuning every hypothesis-drawn shape afresh costs minutes per op), and
``tests/kernels/test_tilings.py`` runs every tiling of every launcher (:data:`LAUNCHERS`) through
:meth:`Launcher.forcing`, so no tiling the autotuner may pick goes unchecked.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import triton

from h3_triton.interpret import INTERPRET


def _autotune_setting() -> bool:
    value = os.environ.get("H3_TRITON_AUTOTUNE", "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"H3_TRITON_AUTOTUNE={value!r}: set it to 1 (autotune each shape, the default) or 0 (the first tiling "
            "of every kernel, no timing runs)"
        )
    return value == "1"


AUTOTUNE: bool = _autotune_setting()

LAUNCHERS: list["Launcher"] = []


class Launcher:
    """Launches ``kernel[grid](*args, **meta)`` with a tiling from ``tilings``.

    ``tilings`` maps the element size of the kernel's first tensor argument (2: bfloat16, 4: float32) to its
    candidate configs, the preferred first; ``key`` names the arguments the autotuner keys on (Triton adds the
    dtypes).
    Under the interpreter the tiling is ``interpreter`` (the interpreter's cost is per program and per step, not
    per element, so it gets few large tiles).
    """

    def __init__(self, kernel, tilings: dict[int, list[triton.Config]], key: list[str], interpreter: dict):
        self.kernel = kernel
        self.tilings = tilings
        self.interpreter = interpreter
        self._forced: triton.Config | None = None
        self._first_arg = kernel.arg_names[0]
        self._tuned = None
        if not INTERPRET:
            self._tuned = triton.autotune(
                configs=[c for configs in tilings.values() for c in configs],
                key=key,
                prune_configs_by={
                    "early_config_prune": lambda configs, named_args, **_: self._suiting(named_args[self._first_arg])
                },
                cache_results=True,
            )(kernel)
        LAUNCHERS.append(self)

    @property
    def name(self) -> str:
        return self.kernel.__name__

    def _suiting(self, first_tensor) -> list[triton.Config]:
        return self.tilings[first_tensor.element_size()]

    def __call__(self, grid, *args, **meta):
        if self._forced is not None:
            return self.kernel[grid](*args, **meta, **self._forced.all_kwargs())
        if INTERPRET:
            return self.kernel[grid](*args, **meta, **self.interpreter)
        if not AUTOTUNE:
            return self.kernel[grid](*args, **meta, **self._suiting(args[0])[0].all_kwargs())
        return self._tuned[grid](*args, **meta)

    @contextmanager
    def forcing(self, config: triton.Config) -> Iterator[None]:
        """Every launch inside runs ``config``, whatever the tuner or the interpreter would choose."""
        self._forced = config
        try:
            yield
        finally:
            self._forced = None


def configs(rows, names: tuple[str, ...], **fixed) -> list[triton.Config]:
    """Configs from rows of (one size per name in ``names``..., num_warps, num_stages), plus ``fixed`` sizes."""
    return [
        triton.Config({**dict(zip(names, row[:-2])), **fixed}, num_warps=row[-2], num_stages=row[-1]) for row in rows
    ]
