"""One measured run: a model under a numerics mode, optionally with a candidate installed, taps recorded.

This is the middle floor every gate stands on: model factory -> numerics mode -> run with taps. The
candidate is always removed again, also when the run raises, so the next run sees the provider.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import time

import torch
from torch.autograd import DeviceType

from h3gate import numerics, taps
from h3gate.candidates import Candidate, CandidateError
from h3gate.compare import compare
from h3gate.model.identity import Model


def run_taps(
    model: Model,
    device: str,
    mode: numerics.Mode,
    inputs: dict,
    upstream: dict,
    candidate: Candidate | None = None,
    nodes=taps.MODEL_NODES,
    internal=(),
    store: taps.TapStore | None = None,
) -> taps.TapStore:
    """Forward+backward of the whole transformer at ``inputs``; every tap into ``store``. Holding every tap, it is
    the plain reference the streamed model gate (:mod:`h3gate.streaming`) is tested against, where a model fits."""
    if candidate is not None and mode.fp32_weights:
        raise ValueError("a candidate runs at checkpoint precision, not under the golden mode")
    transformer = model.golden_transformer() if mode.fp32_weights else model.transformer
    transformer.to(device)
    store = store if store is not None else taps.TapStore()
    installed = candidate.installed(transformer) if candidate is not None else contextlib.nullcontext()
    with blamed_on(candidate), numerics.activate(mode), installed:
        taps.forward_backward(numerics.runner(mode, transformer), transformer, inputs, upstream, store, nodes, internal)
    if candidate is not None:
        for name in store:
            check_finite(candidate, name, store[name])
    return store


@contextlib.contextmanager
def blamed_on(candidate: Candidate | None):
    """A crash while ``candidate`` runs (a wrong shape, a kernel that refuses its input, a Triton compilation or
    interpreter error) becomes a :class:`CandidateError` naming it; running out of GPU memory is the machine's
    doing, not the candidate's, and passes unchanged, as does every error of a run without a candidate."""
    try:
        yield
    except (CandidateError, torch.OutOfMemoryError):
        raise
    except Exception as error:
        if candidate is None:
            raise
        raise CandidateError(
            f"candidate {candidate.name} failed in the whole-model run: {type(error).__name__}: {error}"
        ) from error


def check_finite(candidate: Candidate, name: str, tensor: torch.Tensor) -> None:
    """NaN or Inf from a candidate is an error that names the first tap it reached, not a large error."""
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
        raise CandidateError(
            f"candidate {candidate.name} produced non-finite values in {name} ({nan} NaN, {inf} Inf of "
            f"{tensor.numel()}); run the kernel gate to find the op"
        )


def errors_against(store: taps.TapStore, reference: taps.TapStore) -> dict[str, dict]:
    """Every tap of ``store`` compared with the same tap of ``reference`` (see :func:`h3gate.compare.compare`)."""
    return {name: compare(store[name], reference[name]) for name in store if name in reference}


_PHASE = "h3gate:"


@contextlib.contextmanager
def timed(timings: dict, phase: str):
    """Adds the phase's seconds to ``timings[phase]``, counting the GPU work it queued (it waits for the device at
    the end). The phase is also a profiler range ``h3gate:<phase>``, which ``benchmarks/gate_phases.py
    --profile`` splits into time in GPU kernels and time outside them."""
    start = time.perf_counter()
    try:
        with torch.profiler.record_function(_PHASE + phase):
            yield
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start


def kernel_seconds(profile) -> dict[str, float]:
    """Seconds of GPU kernels inside each :func:`timed` phase of a ``torch.profiler`` run, summed per phase.

    A kernel counts for the part of its GPU time that falls inside the phase's range: kineto puts CPU and GPU
    events on one clock, and a phase waits for the device before it ends. Memory copies and fills are not
    kernels; they count as the gate's own work, with the taps they move. Reads kineto's raw events rather than
    ``profile.events()``, whose tree of function events takes minutes to build for a gate's millions of ops.
    """
    spans, kernels = [], []
    for event in profile.profiler.kineto_results.events():
        name, device = event.name(), event.device_type()
        if device == DeviceType.CPU and name.startswith(_PHASE):
            spans.append((name.removeprefix(_PHASE), event.start_ns(), event.end_ns()))
        elif device == DeviceType.CUDA and not name.startswith((_PHASE, "Memcpy", "Memset")):
            kernels.append((event.start_ns(), event.end_ns()))
    kernels.sort()
    starts = [start for start, _ in kernels]
    latest_end = list(itertools.accumulate((end for _, end in kernels), max))
    seconds: dict[str, float] = {}
    for phase, low, high in spans:
        inside = 0
        # Kernels that start before the span ends, walked back until none earlier can still reach into it.
        for i in range(bisect.bisect_left(starts, high) - 1, -1, -1):
            if latest_end[i] <= low:
                break
            inside += max(0, min(kernels[i][1], high) - max(kernels[i][0], low))
        seconds[phase] = seconds.get(phase, 0.0) + inside / 1e9
    return seconds
