"""h3_triton.interpret.device_function: kernels stay ``triton.jit``; helpers skip the interpreter's re-patching."""

import importlib

import pytest
import torch
import triton
from triton.runtime import interpreter
from triton.runtime.jit import KernelInterface

from h3_triton import interpret
from h3_triton.interpret import INTERPRET, device_function
from h3_triton.norm import rms_norm_modulate

MODULES = ["interpret", "attention", "elementwise", "gemm", "norm", "rope", "rowreduce"]


def _jitted():
    """(name, jit function) of every jit function defined in h3_triton's kernel modules."""
    for name in MODULES:
        module = importlib.import_module(f"h3_triton.{name}")
        for attr, value in vars(module).items():
            if isinstance(value, KernelInterface) and value.fn.__module__ == module.__name__:
                yield f"{name}.{attr}", value


def test_triton_languages_own_functions_take_the_fast_path():
    import triton.language as tl

    assert isinstance(tl.sum, interpret._InterpretedDeviceFunction) == INTERPRET
    assert isinstance(tl.zeros, interpret._InterpretedDeviceFunction) == INTERPRET


def test_every_helper_is_a_device_function():
    """Kernels (launched with a grid, named ``*_kernel``) stay ``triton.jit``; everything else is a device function."""
    jitted = dict(_jitted())
    assert len(jitted) >= 40
    if not INTERPRET:
        assert device_function is triton.jit
        return
    for name, fn in jitted.items():
        kernel = name.endswith("_kernel")
        assert isinstance(fn, interpret._InterpretedDeviceFunction) != kernel, name


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's patching of triton.language")
def test_launch_patches_once(monkeypatch):
    """Inside a launch, device functions (rowreduce's helpers, column_sum, to_dtype) and triton.language's own jit
    functions (tl.zeros, tl.sum, ...) run on the launch's patch: only launches patch, and the first call of a
    triton.language function, which patches triton.language.core for good (upstream's path: it never restores)."""
    patched = []
    original = interpreter._patch_lang

    def counting(fn):
        patched.append(f"{fn.__module__}.{fn.__name__}")
        return original(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    assert not interpret._launch_patched(interpret.to_dtype.fn)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 64, generator=g).requires_grad_(True)
    weight, scale, shift = (torch.randn(*size, generator=g).requires_grad_(True) for size in ((64,), (3, 64), (3, 64)))
    idx = torch.randint(0, 3, (40,), generator=g)
    rms_norm_modulate(x, weight, 1e-6, scale, shift, idx).sum().backward()
    ours = [name for name in patched if name.startswith("h3_triton.")]
    assert ours and all(name.endswith("_kernel") for name in ours), ours
    assert len([name for name in patched if name.startswith("triton.language.")]) <= 1, patched
    assert not interpret._launch_patched(interpret.to_dtype.fn)  # the launch restored triton.language
