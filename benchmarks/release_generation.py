"""The generation gate's preflight contract at release size on one GPU: provider and h3_triton, one seed.

Builds the release-size pipeline in-process with random weights, directly on the device, as the gate does with
``--h3-model=release``: the release transformer (:func:`h3gate.model.factory.build_release`) and the other components
(:data:`h3gate.generation.components.RELEASE_COMPONENTS`: the Qwen3-VL text encoder in bf16, both VAEs in float32).
Every generation goes through the gate's own :func:`h3gate.gates.generation.run_generation` (run store, cached
encodings, the text encoder back on the host once they are made, tiled decode).

Prints and logs (JSON) per candidate and workflow: time per transformer call, the text encoder's build with every
encoding it made, each decode, each with its peak memory (:func:`h3gate.generation.pipeline.measured`); the generation's wall
time, its peak GPU memory (the largest of its parts') and the process's peak RSS; and the metrics of h3_triton's
generation against the provider's.

    python benchmarks/release_generation.py                      # release on CUDA
    TRITON_INTERPRET=1 python benchmarks/release_generation.py --model tiny --device cpu   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

from h3gate import candidates
from h3gate.files import dumps, write_atomic
from h3gate.gates import generation as gate
from h3gate.generation import contract as generation_contract, metrics
from h3gate.model.factory import load_model

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def peak_gib(costs: dict) -> float:
    """A run's peak GPU memory: the largest of its parts' (each part resets torch's peak, so the run's own reading
    would be its last decode's), the transformer calls that held ops to the op contract among them: what the gate's
    run needs."""
    parts = [*costs["decode"].values(), costs["encoding"].get("text_encoder_and_all_encodings", {})]
    peaks = [part["peak_memory_bytes"] for part in parts if "peak_memory_bytes" in part]
    calls = [costs["transformer_call_peak_memory_bytes"], costs["contract_held_call_peak_memory_bytes"]]
    return max([*peaks, *(peak for peak in calls if peak is not None)]) / GIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="release", help="release (CUDA) or a preset/checkpoint the gate loads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--contract", default=None,
                        help="default: thresholds/<model>/generation-preflight-contract.json")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--candidates", default="provider,h3_triton", help="provider and/or candidate names")
    parser.add_argument("--out", default="h3-out/release-generation", help="the gate's output folder (run store)")
    parser.add_argument("--log", default="benchmarks/results/release-generation.json")
    args = parser.parse_args()
    contract = generation_contract.load(args.contract or ROOT / "thresholds" / args.model /
                                        "generation-preflight-contract.json")
    cuda = torch.device(args.device).type == "cuda"
    report = {"command": " ".join(sys.argv), "model": args.model, "device": args.device, "contract": str(contract.path),
              "seed": args.seed, "build_seconds": {}, "runs": {}}
    if cuda:
        report["gpu"] = torch.cuda.get_device_name(args.device)

    start = time.perf_counter()
    model = load_model(args.model)
    report["build_seconds"]["transformer"] = time.perf_counter() - start
    start = time.perf_counter()
    gate._components(model.source, args.device)  # built once, then shared by every run
    report["build_seconds"]["components"] = time.perf_counter() - start

    references = {}
    for name in args.candidates.split(","):
        candidate = None if name == "provider" else candidates.load(name)
        for workflow in contract.workflows:
            start = time.perf_counter()
            generated = gate.run_generation(
                model, contract, args.seed, args.device, args.out, workflow=workflow, candidate=candidate,
                expected_first_inputs=references[workflow].first_call_inputs if workflow in references else None,
            )
            run = {
                "wall_seconds": time.perf_counter() - start,
                **generated.summary(),
                "peak_gpu_gib": peak_gib(generated.costs) if cuda else None,
                "peak_rss_gib": peak_rss_gib(),
            }
            if name == "provider":
                references[workflow] = generated
            elif workflow in references:
                reference = references[workflow]
                values = metrics.compare(generated.video, generated.audio, reference.video, reference.audio)
                run["metrics"] = {key: value for key, value in values.items() if key != "per_frame"}
            report["runs"][f"{name}.{workflow}"] = run
            calls = generated.costs["transformer_call_seconds"]
            decode = generated.costs["decode"]
            encoding = generated.costs["encoding"].get("text_encoder_and_all_encodings")
            print(f"{name} {workflow}: {run['wall_seconds']:.1f} s; "
                  + (f"text encoder built and {', '.join(generated.costs['encoding']['with'])} encoded in "
                     f"{encoding['seconds']:.1f} s at {encoding['peak_memory_bytes'] / GIB:.1f} GiB; " if encoding else "")
                  + "transformer calls "
                  f"{', '.join(f'{s:.2f}' for s in calls) or 'reused'} s; decode "
                  + ", ".join(f"{k} {v['seconds']:.2f} s at {v['peak_memory_bytes'] / GIB:.1f} GiB" for k, v in decode.items())
                  + (f"; peak GPU {run['peak_gpu_gib']:.1f} GiB" if cuda else "")
                  + f"; peak RSS {run['peak_rss_gib']:.1f} GiB"
                  + (f"; {json.dumps(run['metrics'])}" if "metrics" in run else ""), flush=True)
            write_atomic(args.log, dumps(report))
    print(f"log: {args.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
