"""Seconds per phase of the model gate on one machine: build, golden, each provider variant, candidate, compare.

Usage: python benchmarks/model_gate_phases.py [--model small] [--device cpu] [--candidate h3_triton]
Freezes into a temporary thresholds folder (the committed one is never touched), then checks the candidate.
On CPU the h3_triton kernels run under Triton's interpreter (TRITON_INTERPRET=1 must be set before start).
"""

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from h3gate.bounds import lock_files
from h3gate.candidates import load
from h3gate.contract import load_model_contract
from h3gate.gates import model as model_gate
from h3gate.model import load_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--candidate", default="h3_triton")
    args = parser.parse_args()
    start = time.perf_counter()
    model = load_model(args.model)
    build = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        thresholds = Path(folder)
        contract_path = thresholds / model.name / "model-contract.json"
        contract_path.parent.mkdir(parents=True)
        shutil.copy(Path("thresholds") / model.name / "model-contract.json", contract_path)
        lock_files(thresholds, [contract_path])
        contract = load_model_contract(contract_path)
        frozen = model_gate.freeze(model, contract, args.device, thresholds)
        result = model_gate.check(model, load(args.candidate), contract, frozen, args.device)
    print(f"model {model.name} on {args.device}, candidate {args.candidate}: {result.summary()}")
    print(f"{'build':28s} {build:8.2f} s")
    for phase, seconds in frozen.provenance["timings_s"].items():
        print(f"{'freeze: ' + phase:28s} {seconds:8.2f} s")
    for phase, seconds in result.timings.items():
        print(f"{'check: ' + phase:28s} {seconds:8.2f} s")


if __name__ == "__main__":
    main()
