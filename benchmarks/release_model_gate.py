"""The streamed model gate at release size on one GPU: peak memory, seconds per phase, projection to 50 blocks.

Usage: python benchmarks/release_model_gate.py [--model release|tiny|small] [--layers N] [--device cuda]
           [--candidate h3_triton] [--freeze sdpa-flash,...] [--saved-on host|device] [--profile] [--out log.json]

Builds the release transformer's first N blocks on the GPU (``h3gate.model.factory.build_release``: random weights, no
checkpoint folder) and runs :func:`h3gate.streaming.stream_errors` at the release contract (124 frames at
1344x768: 38,222 rows): the check step (golden against the provider and the candidate at once) and, for each
``--freeze`` variant, a freeze step (golden against that variant alone). Each step reports its peak GPU memory
(``torch.cuda.max_memory_allocated``), its peak host RSS (sampled), its seconds per phase and, with ``--profile``,
the share of each phase outside GPU kernels. The projection to the 50-block model adds the missing blocks' weights
(and, where they are kept, saved inputs) to the peaks and their median block's seconds to the time. On a CPU,
``--model tiny --candidate provider`` is a smoke test (tests/test_streaming.py runs it).
"""

import argparse
import contextlib
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from h3gate import bench, numerics
from h3gate.candidates import load
from h3gate.files import write_json
from h3gate.measure import kernel_seconds
from h3gate.model.contract import load_model_contract, model_inputs
from h3gate.model.factory import build_preset, build_release
from h3gate.model.presets import RELEASE, RELEASE_CONFIG
from h3gate.streaming import SAVED_ON, stream_errors

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
SHOWN = ("outputs.video", "outputs.audio", "input_gradients.hidden_states")


class HostPeak:
    """The largest resident set of this process while the body runs, sampled every 20 ms (``ru_maxrss`` is the
    process's whole-life peak, which a second step cannot reset)."""

    def __enter__(self):
        self.peak, self._done = self.now(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())

    def _sample(self):
        while not self._done.wait(0.02):
            self.peak = max(self.peak, self.now())

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()


def step(model, device, runs, inputs, upstream, saved_on, profile):
    """One stream_errors call with its peaks, timings and a summary of its errors."""
    timings = {}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    profiler = torch.profiler.profile(activities=[
        torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
    ]) if profile else contextlib.nullcontext()
    start = time.perf_counter()
    with HostPeak() as host, profiler:
        errors = stream_errors(
            model, device, numerics.GOLDEN, runs, inputs, upstream, timings=timings, saved_on=saved_on,
            progress=lambda phase: print(f"  {time.perf_counter() - start:8.1f} s  {phase}", flush=True),
        )
    record = {
        "runs": list(runs),
        "seconds": time.perf_counter() - start,
        "timings_s": timings,
        "peak_gpu_allocated_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
        "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved() if device.startswith("cuda") else None,
        "peak_host_rss_bytes": host.peak,
        "errors": {run: summary(tap_errors) for run, tap_errors in errors.items()},
    }
    if profile:
        inside = kernel_seconds(profiler)
        record["outside_kernels"] = {phase: 1 - inside.get(phase, 0.0) / seconds for phase, seconds in timings.items()}
    return record


def summary(tap_errors: dict) -> dict:
    worst = max(tap_errors, key=lambda tap: tap_errors[tap]["relative_l2"])
    return {
        "taps": len(tap_errors),
        **{tap: tap_errors[tap]["relative_l2"] for tap in SHOWN},
        "worst": [worst, tap_errors[worst]["relative_l2"]],
    }


def projection(record: dict, model, sequence: int, saved_on: str, blocks: int) -> dict:
    """The step at ``RELEASE_CONFIG["num_layers"]`` blocks: the median block's seconds and the missing blocks' bytes."""
    timings = record["timings_s"]
    per_block = [timings[f"forward.block{i}"] + timings[f"backward.block{i}"] for i in range(blocks)]
    steady = per_block[1:] or per_block  # the first block also compiles and tunes kernels
    fixed = sum(seconds for phase, seconds in timings.items() if "." in phase and "block" not in phase)
    full = RELEASE_CONFIG["num_layers"]
    missing = full - blocks
    block_bytes = sum(p.numel() * p.element_size() for p in model.transformer.transformer_blocks[0].parameters())
    # golden keeps float32 inputs, each compared run its stack's dtype; one per block (and the stack's output).
    stack_bytes = next(model.transformer.context_embedder.parameters()).element_size()
    saved_per_block = sequence * model.config["hidden_size"] * (4 + stack_bytes * (len(record["runs"])))
    gpu = record["peak_gpu_allocated_bytes"]
    return {
        "blocks": full,
        "median_block_s": statistics.median(steady),
        "seconds": fixed + full * statistics.median(steady),
        "peak_gpu_allocated_bytes": None if gpu is None else gpu + missing * (
            block_bytes + (saved_per_block if saved_on == "device" else 0)
        ),
        "peak_host_rss_bytes": record["peak_host_rss_bytes"] + (missing * saved_per_block if saved_on == "host" else 0),
    }


def gib(value) -> str:
    return "n/a" if value is None else f"{value / GIB:.1f} GiB"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=RELEASE, help="release (built on the GPU), tiny or small")
    parser.add_argument("--layers", type=int, default=4, help="leading release blocks to build (release only)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--candidate", default="h3_triton")
    parser.add_argument("--freeze", default="", help="comma-separated provider variants, one freeze step each")
    parser.add_argument("--saved-on", choices=SAVED_ON, default="host")
    parser.add_argument("--profile", action="store_true", help="split each phase into GPU kernels and the rest")
    parser.add_argument("--out", type=Path, help="JSON log (default: benchmarks/results/release-model-gate-<...>.json)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if args.model == RELEASE:
        model = build_release(layers=args.layers, device=args.device)
        contract = bench.contract("release")
    else:
        model = build_preset(args.model)
        contract = load_model_contract(ROOT / "thresholds" / args.model / "model-contract.json")
    build_s = time.perf_counter() - start
    inputs, upstream = model_inputs(contract, model.config)
    sequence, blocks = inputs["position_ids"].shape[0], model.config["num_layers"]
    weights = sum(p.numel() * p.element_size() for p in model.transformer.parameters())
    print(f"{model.name} ({model.source}), {blocks} blocks, sequence {sequence}: weights {gib(weights)}, "
          f"built in {build_s:.1f} s; saved inputs on the {args.saved_on}", flush=True)

    steps = {"check": {"provider": (numerics.PROVIDER, None), "candidate": (numerics.PROVIDER, load(args.candidate))}}
    for name in filter(None, args.freeze.split(",")):
        steps[f"freeze {name}"] = {name: (numerics.get(name, args.device), None)}
    log = {
        "model": model.name, "source": model.source, "identity": model.identity, "config": model.config,
        "candidate": args.candidate, "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "sequence": sequence, "saved_on": args.saved_on, "build_s": build_s,
        "weights_bytes": weights, "steps": {},
    }
    for name, runs in steps.items():
        print(f"{name}: golden against {', '.join(runs)}", flush=True)
        record = step(model, args.device, runs, inputs, upstream, args.saved_on, args.profile)
        record["projection"] = projection(record, model, sequence, args.saved_on, blocks)
        log["steps"][name] = record
        timings, projected = record["timings_s"], record["projection"]
        forward = sum(s for phase, s in timings.items() if phase.startswith("forward."))
        print(f"{name}: {record['seconds']:.1f} s (forward {forward:.1f} s, backward "
              f"{record['seconds'] - forward:.1f} s, comparisons {timings['compare']:.1f} s of them; median block "
              f"{projected['median_block_s']:.2f} s); peak GPU "
              f"{gib(record['peak_gpu_allocated_bytes'])} allocated, {gib(record['peak_gpu_reserved_bytes'])} reserved; "
              f"peak host RSS {gib(record['peak_host_rss_bytes'])}", flush=True)
        print(f"{name} at {projected['blocks']} blocks: {projected['seconds'] / 60:.1f} min, peak GPU "
              f"{gib(projected['peak_gpu_allocated_bytes'])}, peak host {gib(projected['peak_host_rss_bytes'])}", flush=True)
        for run, errors in record["errors"].items():
            print(f"  {run}: {errors}", flush=True)
        if "outside_kernels" in record:
            print(f"  outside GPU kernels: {record['outside_kernels']}", flush=True)
    out = args.out or ROOT / "benchmarks" / "results" / f"release-model-gate-{model.name}-{args.saved_on}.json"
    write_json(out, log)
    print(f"log: {out}")
    return log


if __name__ == "__main__":
    sys.exit(main() and 0)
