"""Numerics modes: golden, provider and the provider variants, each a scoped change of global state.

A mode is the weights it runs (fp32 copy or checkpoint precision), the process-wide switches it sets
(attention backend, fp32 precision of matmul and convolution, BLAS library, threads) and optionally a wrapper of the model
(``torch.compile``). :func:`activate` snapshots *every* switch any mode touches before applying the mode and
restores all of them on exit, also when the body raises — a leaked BLAS choice once contaminated the next
seed of a qualification run.

Variants exist so bounds can be calibrated from the spread of legitimate provider arithmetic. On CPU only
``sdpa-math`` and ``compiled`` change the arithmetic (H3_FACTS: flash SDPA, one thread and oneDNN off are
bitwise equal to the provider); the bounds module drops such duplicates and records that it did.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

import torch
from diffusers.models.attention_dispatch import _AttentionBackendRegistry


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    fp32_weights: bool = False
    attention_backend: str | None = None
    fp32_precision: str | None = None  # "ieee" turns TF32 (and oneDNN's bf16 fp32 path) off everywhere
    blas: str | None = None
    threads: int | None = None
    compiled: bool = False
    dtypes: tuple[str, ...] | None = None  # the floating dtypes its forced attention backend takes; None: all
    every_shape: bool = True  # whether its forced attention backend takes every shape the kernel gate draws
    deterministic: bool = True  # whether it runs under torch's deterministic algorithms (cuDNN SDPA has no kernel)

    @property
    def sets_switches(self) -> bool:
        """Whether it changes process-wide state (``compiled`` and ``golden`` change the model, not the process)."""
        return any(v is not None for v in (self.attention_backend, self.fp32_precision, self.blas, self.threads))

    def takes(self, dtype: str) -> bool:
        """Whether the mode runs at ``dtype`` (flash and cuDNN attention on CUDA take bf16 and fp16 only)."""
        return self.dtypes is None or dtype in self.dtypes


GOLDEN = Mode(
    "golden",
    "fp32 copy of the weights, math SDPA, TF32 off, highest matmul precision",
    fp32_weights=True,
    attention_backend="_native_math",
    fp32_precision="ieee",
)
PROVIDER = Mode("provider", "checkpoint precision, default backends")

_CPU_VARIANTS = (
    Mode("sdpa-math", "provider with SDPA forced to the math kernel", attention_backend="_native_math"),
    Mode("sdpa-flash", "provider with SDPA forced to the CPU flash kernel", attention_backend="_native_flash"),
    Mode("threads-1", "provider on one intra-op thread", threads=1),
    Mode("compiled", "provider under torch.compile (inductor fuses and keeps intermediates in fp32)", compiled=True),
)
_HALF = ("bfloat16", "float16")
_CUDA_VARIANTS = (
    Mode("sdpa-flash", "provider with SDPA forced to flash attention", attention_backend="_native_flash",
         dtypes=_HALF),
    Mode("sdpa-efficient", "provider with SDPA forced to memory-efficient attention", attention_backend="_native_efficient"),
    Mode("sdpa-cudnn", "provider with SDPA forced to cuDNN attention", attention_backend="_native_cudnn",
         dtypes=_HALF, every_shape=False, deterministic=False),  # "No available kernel" for a one-row sequence and
    # under torch.use_deterministic_algorithms(True)
    Mode("sdpa-math", "provider with SDPA forced to the math kernel", attention_backend="_native_math"),
    Mode("blas-cublaslt", "provider with cuBLASLt as the BLAS library", blas="cublaslt"),
    Mode("compiled", "provider under torch.compile (inductor fuses and keeps intermediates in fp32)", compiled=True),
)


def device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def one_cpu_thread() -> None:
    """Compute with one thread, torch's and numpy's BLAS (on which Triton's interpreter runs ``tl.dot``), unless
    ``OMP_NUM_THREADS`` says otherwise: torch's bits depend on its thread count (the block gate's backward differs in
    the last bits between one thread and two), and CPU gates and power tables must give the same bits on any number
    of cores."""
    host_threads(1)


def host_threads(count: int) -> None:
    """Compute on ``count`` threads, torch's and numpy's BLAS, unless ``OMP_NUM_THREADS`` says otherwise. numpy's
    BLAS is limited through threadpoolctl (the scikit-learn project's runtime control of BLAS and OpenMP pools:
    OpenBLAS reads its environment only when it loads, before a session starts)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(count)
    threadpool_limits(limits=count, user_api="blas")


def variants(device: str | torch.device) -> tuple[Mode, ...]:
    """The provider variants that exist on ``device``'s type. On a CPU ``compiled`` is offered only where ATen runs
    the vector level it chose itself: inductor compiles C++ for the machine's own ISA, and under a level forced by
    ``ATEN_CPU_CAPABILITY`` its code does not build (``default``; torch 2.13: ``'at::vec' has not been declared``) or
    computes NaN (``avx2`` on an AVX-512 machine, in the tiny model's first block:
    ``benchmarks/results/compiled-forced-avx2-cpu.log``); nor where the CPU has no AVX2 (``default`` on its own)."""
    if device_type(device) == "cuda":
        return _CUDA_VARIANTS
    if "ATEN_CPU_CAPABILITY" in os.environ or torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        return tuple(mode for mode in _CPU_VARIANTS if not mode.compiled)
    return _CPU_VARIANTS


def get(name: str, device: str | torch.device) -> Mode:
    """A mode by name; an unknown name is an error listing the valid ones on this device."""
    modes = {mode.name: mode for mode in (GOLDEN, PROVIDER, *variants(device))}
    if name not in modes:
        raise ValueError(
            f"unknown numerics mode {name!r} on {device_type(device)}; valid modes: {', '.join(modes)}"
        )
    return modes[name]


# torch's fp32 precision switches, new API only: torch >= 2.9 refuses to read the legacy ones
# (allow_tf32, float32_matmul_precision) once the two APIs were mixed in one process.
_FP32_PRECISION = (
    "fp32_precision",
    "cuda.matmul.fp32_precision",
    "cudnn.conv.fp32_precision",
    "cudnn.rnn.fp32_precision",
    "mkldnn.matmul.fp32_precision",
    "mkldnn.conv.fp32_precision",
    "mkldnn.rnn.fp32_precision",
)


def _backend_attribute(path: str):
    *parents, leaf = path.split(".")
    owner = torch.backends
    for parent in parents:
        owner = getattr(owner, parent)
    return (lambda: getattr(owner, leaf)), (lambda value: setattr(owner, leaf, value))


def _switches() -> list[tuple[str, Callable[[], object], Callable[[object], None]]]:
    """(name, read, write) of every process-wide switch a mode may touch."""
    switches = [
        (
            "attention_backend",
            lambda: _AttentionBackendRegistry._active_backend,
            _AttentionBackendRegistry.set_active_backend,
        ),
        ("num_threads", torch.get_num_threads, torch.set_num_threads),
        ("preferred_blas_library", torch.backends.cuda.preferred_blas_library, torch.backends.cuda.preferred_blas_library),
    ]
    switches += [(path, *_backend_attribute(path)) for path in _FP32_PRECISION]
    return switches


def snapshot() -> dict[str, object]:
    """The current value of every switch (for tests and for :func:`activate`)."""
    return {name: read() for name, read, _ in _switches()}


@contextlib.contextmanager
def activate(mode: Mode):
    """Apply ``mode``'s switches for the body; restore every switch afterwards, whatever happens."""
    saved = [(write, read()) for _, read, write in _switches()]
    try:
        if mode.attention_backend is not None:
            _AttentionBackendRegistry.set_active_backend(mode.attention_backend)
        if mode.fp32_precision is not None:
            for path in _FP32_PRECISION:
                _backend_attribute(path)[1](mode.fp32_precision)
        if mode.blas is not None:
            torch.backends.cuda.preferred_blas_library(mode.blas)
        if mode.threads is not None:
            torch.set_num_threads(mode.threads)
        yield mode
    finally:
        for write, value in reversed(saved):
            write(value)


@contextlib.contextmanager
def deterministic():
    """torch's deterministic algorithms, strictly, for the body; the previous setting restored afterwards, also
    on error.

    Not a mode: on CUDA the provider's own backward scatters gradients with atomics (index_select's backward,
    the AdaLN table gradients, flash attention's dq), so two provider runs differ in the last bits; checks that
    compare two runs bitwise run both inside this. Strict, not warn-only: warn-only leaves flash attention's
    backward on its atomic path (two H200 runs differed in the query gradient). cuBLAS is deterministic only
    with a fixed workspace, named by ``CUBLAS_WORKSPACE_CONFIG``; it is set here when the caller has not.
    """
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def scoped(mode: Mode, function: Callable) -> Callable:
    """``function`` with ``mode``'s switches active during each call only: a generation's provider variant varies the
    transformer, which candidates replace, while the VAEs and the text encoder keep the provider's defaults (flash
    SDPA cannot take the video VAE decoder's float32 attention)."""

    def call(*args, **kwargs):
        with activate(mode):
            return function(*args, **kwargs)

    return call


def runner(mode: Mode, transformer: torch.nn.Module) -> Callable:
    """The callable a run under ``mode`` invokes: the transformer itself, or its compiled form."""
    if mode.compiled:
        return torch.compile(transformer, dynamic=False)
    return transformer
