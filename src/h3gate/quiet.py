"""Warnings that nobody running the gates can act on, silenced by message, category and module: those diffusers'
MiniMax-H3 classes raise through torch on every build, and numpy's overflow and invalid-value warnings from Triton's
CPU interpreter, where a kernel's arithmetic gives inf or NaN as the GPU gives them, silently: a sigmoid's ``1 / (1 +
exp(-x))`` overflows for a very negative x, and the kernel gate's non-finite examples feed NaN and inf on purpose.
The gates judge the values: a kernel whose inf or NaN is wrong fails them. Any other warning of those modules, and
these messages raised elsewhere, still show. The plugin adds them to pytest's own warning filters (which pytest
applies per test, over Python's); the command line installs them in Python's.
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
    # Triton's interpreter computing a kernel's arithmetic through numpy.
    ("overflow encountered in", RuntimeWarning, "triton.runtime.interpreter"),
    ("invalid value encountered in", RuntimeWarning, "triton.runtime.interpreter"),
)


def install() -> None:
    """Ignore :data:`FOREIGN` in this process (the command line's)."""
    for message, category, module in FOREIGN:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category, module=re.escape(module) + "$")


def pytest_filters() -> list[str]:
    """:data:`FOREIGN` as lines of pytest's ``filterwarnings`` (action:message:category:module, regular expressions)."""
    return [f"ignore:{re.escape(message)}:{category.__name__}:{re.escape(module)}$"
            for message, category, module in FOREIGN]
