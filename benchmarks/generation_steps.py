"""Time per denoising step of one generation, h3_triton against the provider, through the pipeline as shipped.

Usage: python benchmarks/generation_steps.py --model small --contract thresholds/small/generation-contract.json
Runs the contract's first seed twice per candidate (the first run warms up kernels and autotuning) and prints
the median time of a transformer call (CUDA-synchronised) for the provider and for the candidate.
"""

import argparse
import statistics
import time

import torch

from h3gate.candidates import load
from h3gate.generation import contract as generation_contract
from h3gate.generation.pipeline import build_components, generate, load_reference_image, make_pipeline
from h3gate.model.factory import load_model


def step_times(pipe, contract, seed, device):
    times, start = [], {}
    transformer = pipe.transformer

    def before(*_):
        torch.cuda.synchronize() if device == "cuda" else None
        start["t"] = time.perf_counter()

    def after(*_):
        torch.cuda.synchronize() if device == "cuda" else None
        times.append(time.perf_counter() - start["t"])

    handles = [transformer.register_forward_pre_hook(before), transformer.register_forward_hook(after)]
    try:
        image = load_reference_image() if contract.workflow == "fl2va" else None
        video, audio = generate(
            pipe, workflow=contract.workflow, prompt=contract.prompt, seed=seed, num_frames=contract.num_frames,
            height=contract.height, width=contract.width, num_inference_steps=contract.num_inference_steps, image=image,
        )
    finally:
        for handle in handles:
            handle.remove()
    return times, video, audio


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--contract", default="thresholds/small/generation-contract.json")
    parser.add_argument("--candidate", default="h3_triton")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    contract = generation_contract.load(args.contract)
    model = load_model(args.model)
    pipe = make_pipeline(build_components(args.model, 0), model.transformer)
    pipe.to(args.device)
    seed = contract.seeds[0]
    results = {}
    for name in ("provider", args.candidate):
        candidate = load(name)
        with candidate.installed(model.transformer):
            step_times(pipe, contract, seed, args.device)  # warm-up: compilation and autotuning
            times, video, audio = step_times(pipe, contract, seed, args.device)
        results[name] = (statistics.median(times), len(times), video, audio)
        print(f"{name:10s}: {len(times)} transformer calls, median {statistics.median(times) * 1e3:.2f} ms per call")
    provider, candidate = results["provider"], results[args.candidate]
    print(f"ratio provider/candidate per step: {provider[0] / candidate[0]:.2f}")
    print(f"max |video difference| {abs(provider[2] - candidate[2]).max():.4g}, audio {abs(provider[3] - candidate[3]).max():.4g}")


if __name__ == "__main__":
    main()
