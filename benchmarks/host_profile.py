"""The host's time to enqueue one op of ``h3gate bench``, the candidate's beside the provider's, and where the
candidate's goes.

Usage (GPU): python benchmarks/host_profile.py silu_linear --backward [--batches 10] [--steps 50] [--top 25]
       (any machine): python benchmarks/host_profile.py silu_linear --backward --plan --device cpu

For a step whose kernels are shorter than its host code (the AdaLN's forward+backward: 0.41 ms of GPU time, and
0.41-0.87 ms of the host's between runs of ``gemm_tilings.py``, which times one sample of 20 calls), the wall time
is the host's. Here it is the median of ``--batches`` batches of ``--steps`` calls, each batch timed without
synchronising (the GPU runs behind) from an idle GPU, candidate and provider in one process; then the candidate's
calls run under cProfile (the standard library's deterministic profiler), its ``--top`` functions by own time
printed: cProfile slows Python, not the driver, so read its shares rather than its totals. A step whose kernels
outlast its host code fills the launch queue and times the GPU instead.

``--plan`` plans the candidate's launches instead of running them (``h3_triton.paths.planning``: its host code
runs, notes each launch's path and launches nothing), on any machine: the candidate's own Python, without
Triton's launcher, the CUDA driver or the provider (the noting adds a little of its own).
"""

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from profile_op import add_op_arguments, op_step

from h3_triton import paths


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def host_ms(step, device: str, batches: int, steps: int) -> tuple[float, float, float]:
    """(median, lowest, highest) over the batches of the host's milliseconds per ``step()``."""
    for _ in range(3):  # compilation, allocator growth
        step()
    samples = []
    for _ in range(batches):
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        samples.append((time.perf_counter() - start) * 1e3 / steps)
    _synchronize(device)
    return statistics.median(samples), min(samples), max(samples)


def print_top(step, device: str, steps: int, top: int) -> None:
    """cProfile's ``top`` functions by own time over ``steps`` calls of ``step()``."""
    profiler = cProfile.Profile()
    _synchronize(device)
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    _synchronize(device)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_op_arguments(parser)
    parser.add_argument("--batches", type=int, default=10, help="timed batches; the median is reported (default 10)")
    parser.add_argument("--steps", type=int, default=50, help="calls in a batch, and under cProfile (default 50)")
    parser.add_argument("--top", type=int, default=25, help="cProfile's functions printed; 0: no cProfile (default 25)")
    parser.add_argument("--plan", action="store_true",
                        help="plan the candidate's launches instead of running them: its own host code, any device")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.steps < 1 or args.top < 0:
        parser.error("--batches and --steps take 1 or more, --top 0 or more")
    what = "forward+backward" if args.backward else "forward"
    if args.plan:
        with paths.planning():
            case, step = op_step(parser, args, provider=False)
            median, low, high = host_ms(step, args.device, args.batches, args.steps)
            print(f"{case.label} {what}, {args.candidate} planned on {args.device}: {median:.4f} ms of host code a "
                  f"call (batches {low:.4f}-{high:.4f})", flush=True)
            if args.top:
                print_top(step, args.device, args.steps, args.top)
        return
    if not args.device.startswith("cuda"):
        parser.error(f"--device {args.device}: the host's enqueue is timed beside a GPU; pass --device cuda, or --plan "
                     "for the candidate's own host code on this machine")
    steps = {}
    for who, provider in ((args.candidate, False), ("provider", True)):
        case, steps[who] = op_step(parser, args, provider)
        median, low, high = host_ms(steps[who], args.device, args.batches, args.steps)
        print(f"{case.label} {what}, {who}: the host enqueues a call in {median:.4f} ms (batches {low:.4f}-{high:.4f})",
              flush=True)
    if args.top:
        print_top(steps[args.candidate], args.device, args.steps, args.top)


if __name__ == "__main__":
    main()
