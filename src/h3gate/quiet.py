"""Warnings that nobody running the gates can act on, silenced by message, category and module: those diffusers'
MiniMax-H3 classes raise through torch on every build, and numpy's overflow warning from Triton's CPU interpreter,
where a kernel's ``exp`` of a large argument gives inf as the GPU gives it, silently (a sigmoid's ``1 / (1 +
exp(-x))`` for a very negative x; a kernel whose inf becomes a NaN or a wrong value fails the gates, which judge the
values). Any other warning of those modules, and these messages raised elsewhere, still show. The plugin adds them to pytest's own warning filters (which pytest applies per test, over
Python's); the command line installs them in Python's.
"""

from __future__ import annotations

import re
import warnings

FOREIGN = (
    # The audio VAE's weight norm (diffusers builds it with the deprecated torch.nn.utils.weight_norm).
    ("`torch.nn.utils.weight_norm` is deprecated in favor of `torch.nn.utils.parametrizations.weight_norm`.",
     FutureWarning, "torch.nn.utils.weight_norm"),
    # The audio VAE's scripted helpers.
    ("`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`.",
     DeprecationWarning, "torch.jit._script"),
    # Triton's interpreter computing a kernel's exp (and exp2) through numpy.
    ("overflow encountered in exp", RuntimeWarning, "triton.runtime.interpreter"),
)


def install() -> None:
    """Ignore :data:`FOREIGN` in this process (the command line's)."""
    for message, category, module in FOREIGN:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category, module=re.escape(module) + "$")


def pytest_filters() -> list[str]:
    """:data:`FOREIGN` as lines of pytest's ``filterwarnings`` (action:message:category:module, regular expressions)."""
    return [f"ignore:{re.escape(message)}:{category.__name__}:{re.escape(module)}$"
            for message, category, module in FOREIGN]
