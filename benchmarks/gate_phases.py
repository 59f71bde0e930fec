"""Seconds per phase of the model or block gate on one machine, split into GPU kernel time and the gate's own.

Usage: python benchmarks/gate_phases.py [--gate model|block] [--model small|release] [--device cpu]
                                        [--candidate h3_triton] [--variants sdpa-flash,...] [--profile]
Freezes into a temporary thresholds folder (the committed one is never touched), then checks the candidate.
On CPU the h3_triton kernels run under Triton's interpreter (TRITON_INTERPRET=1 must be set before start).

``--model release`` is the release transformer cut to one block, with the random weights ``h3gate bench``
uses, at the release contract (sequence 38,222): the whole release model does not fit one H200 (README, "At
release size"), so the block gate on block 0 is the release-size gate that runs there; its capture is a
forward of that one-block transformer.

``--profile`` (on a GPU) runs freeze and check under ``torch.profiler`` and splits each phase into time in GPU
kernels and the rest: taps copied to the host, comparisons on the host, hashing, launches, Python. The gate's
own cost is that rest; the target is at most 10% of the gate's time. Kernel time is the GPU time of every kernel
inside the phase's range (kineto puts CPU and GPU events on one clock, and each phase waits for the device at its
end); memory copies and fills are not kernels.
"""

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import torch

from h3gate import bench
from h3gate.bounds import lock_files
from h3gate.candidates import load
from h3gate.files import write_json
from h3gate.gates import block as block_gate, model as model_gate
from h3gate.measure import kernel_seconds
from h3gate.model.contract import load_model_contract
from h3gate.model.factory import load_model
from h3gate.model.identity import Model


def profiling(enabled: bool, device: str):
    """A profiler of CPU and CUDA activity when ``enabled``; a context that records nothing otherwise."""
    if not enabled:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def print_phases(stage: str, timings: dict[str, float], profile) -> None:
    kernels = kernel_seconds(profile) if profile is not None else {}
    for phase, seconds in timings.items():
        line = f"{stage + ': ' + phase:28s} {seconds:8.2f} s"
        if profile is not None:
            in_kernels = kernels.get(phase, 0.0)
            line += f"   in GPU kernels {in_kernels:8.2f} s, outside {1 - in_kernels / seconds:6.1%}"
        print(line, flush=True)
    if profile is not None:
        total, in_kernels = sum(timings.values()), sum(kernels.get(phase, 0.0) for phase in timings)
        print(f"{stage + ': all phases':28s} {total:8.2f} s   in GPU kernels {in_kernels:8.2f} s, "
              f"outside {1 - in_kernels / total:6.1%}", flush=True)


def release_block_model(device: str) -> Model:
    """The release transformer with one block (``h3gate.bench``'s random weights), built on ``device``."""
    transformer, config = bench.random_transformer("release", 1, device)
    return Model(name="release-1block", source="h3gate.bench:release:1 block:seed=0", transformer=transformer,
                 identity="h3gate.bench release, 1 block, seed 0", config=config)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", choices=("model", "block"), default="model")
    parser.add_argument("--model", default="small",
                        help="tiny, small, a checkpoint folder, or release (one release-size block; block gate only)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--candidate", default="h3_triton")
    parser.add_argument("--variants", help="comma-separated provider variants to freeze with (default: all of the "
                        "device's); the gate itself always runs all")
    parser.add_argument("--profile", action="store_true",
                        help="split each phase into time in GPU kernels and outside them (needs a CUDA device)")
    args = parser.parse_args()
    if args.profile and not args.device.startswith("cuda"):
        parser.error("--profile measures time in GPU kernels: use it with --device cuda")
    if args.model == "release" and args.gate != "block":
        parser.error("the release model does not fit one GPU: --model release runs with --gate block")
    start = time.perf_counter()
    model = release_block_model(args.device) if args.model == "release" else load_model(args.model)
    build = time.perf_counter() - start

    def progress(message: str) -> None:  # elapsed seconds per phase start, in case the run is cut short
        print(f"{time.perf_counter() - start:8.1f} s  {message}", flush=True)

    with tempfile.TemporaryDirectory() as folder:
        thresholds = Path(folder)
        contract_path = thresholds / model.name / "model-contract.json"
        contract_path.parent.mkdir(parents=True)
        if args.model == "release":
            write_json(contract_path, bench.contract("release").to_json())
        else:
            shutil.copy(Path("thresholds") / model.name / "model-contract.json", contract_path)
        lock_files(thresholds, [contract_path])
        contract = load_model_contract(contract_path)
        variants = args.variants.split(",") if args.variants else None
        with profiling(args.profile, args.device) as freeze_profile:
            if args.gate == "model":
                frozen = model_gate.freeze(model, contract, args.device, thresholds, variant_names=variants)
            else:
                frozen = block_gate.freeze(model, contract, args.device, 0, thresholds, variants,
                                           progress=progress)
        print(f"{'build':28s} {build:8.2f} s")
        print_phases("freeze", frozen.provenance["timings_s"], freeze_profile)
        with profiling(args.profile, args.device) as check_profile:
            candidate = load(args.candidate)
            if args.gate == "model":
                result = model_gate.check(model, candidate, contract, frozen, args.device)
            else:
                result = block_gate.check(model, candidate, contract, frozen, args.device, 0, thresholds,
                                          progress=progress)
    print_phases("check", result.timings, check_profile)
    print(f"{args.gate} gate of {model.name} on {args.device}, candidate {args.candidate}: {result.summary()}")


if __name__ == "__main__":
    main()
