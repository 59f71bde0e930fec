"""The phases of a gate as ``h3gate.measure.timed`` records them: seconds, and profiler ranges whose GPU kernel
time :func:`h3gate.measure.kernel_seconds` adds up (the split behind ``gate_phases.py --profile``)."""

from types import SimpleNamespace

import torch
from torch.autograd import DeviceType

from h3gate.measure import kernel_seconds, timed


def _event(name, device_type, start_us, end_us):
    """A kineto event as ``profile.profiler.kineto_results.events()`` yields it (times in ns)."""
    return SimpleNamespace(name=lambda: name, device_type=lambda: device_type, start_ns=lambda: start_us * 1000,
                           end_ns=lambda: end_us * 1000)


def _profile(events):
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events)))


def test_timed_adds_seconds_and_marks_a_profiler_range():
    timings = {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(2):
            with timed(timings, "golden"):
                torch.ones(64, 64) @ torch.ones(64, 64)
    ranges = [e for e in profile.events() if e.name == "h3gate:golden"]
    assert len(ranges) == 2 and all(e.device_type == DeviceType.CPU for e in ranges)
    assert timings["golden"] > 0
    assert kernel_seconds(profile) == {"golden": 0.0}  # no GPU, no kernel time


def test_kernel_seconds_counts_only_kernel_time_inside_each_phase():
    events = [
        _event("h3gate:golden", DeviceType.CPU, 0, 1_000_000),
        _event("h3gate:compare", DeviceType.CPU, 1_000_000, 2_000_000),
        _event("h3gate:golden", DeviceType.CUDA, 0, 1_000_000),  # the GPU-side copy of the range: not a kernel
        _event("gemm", DeviceType.CUDA, 100_000, 400_000),  # 0.3 s inside golden
        _event("attention", DeviceType.CUDA, 900_000, 1_200_000),  # 0.1 s in golden, 0.2 s in compare
        _event("copy_kernel", DeviceType.CUDA, 0, 1_500_000),  # another stream: 1 s in golden, 0.5 s in compare
        _event("Memcpy DtoH (Device -> Pageable)", DeviceType.CUDA, 1_300_000, 1_900_000),  # a tap copy
        _event("aten::mm", DeviceType.CPU, 100_000, 400_000),  # host work
    ]
    seconds = kernel_seconds(_profile(events))
    assert seconds == {"golden": 1.4, "compare": 0.7}
