"""Per-kind runners: how a gate item of each kind calls the engine (check, or freeze under --h3-freeze)."""

from __future__ import annotations

import pytest

from pytest_h3 import distribution
from h3gate import bounds as bounds_mod
from h3gate import numerics
from h3gate.contract import load_model_contract
from h3gate import generation_contract
from h3gate.gates import block as block_gate
from h3gate.gates import generation as generation_gate
from h3gate.gates import kernel as kernel_gate
from h3gate.gates import model as model_gate
from h3gate.verdict import GateResult


def _variant_names(session) -> list[str]:
    variants = session.config.getoption("--h3-variants")
    return variants.split(",") if variants else [mode.name for mode in numerics.variants(session.device)]


def _model_contract(session):
    path = session.thresholds / session.model.name / "model-contract.json"
    return path, load_model_contract(path)


def _frozen_bounds(item, gate: str, stem: str, contract, contract_path) -> bounds_mod.Bounds | GateResult:
    """The item's frozen bounds, or the failing result that says how to freeze them."""
    session = item.session
    device_class = bounds_mod.device_class(session.device)
    path = bounds_mod.bounds_path(session.thresholds, session.model.name, device_class, stem)
    try:
        frozen = bounds_mod.load(path, gate, session.model.identity, device_class)
        if frozen.provenance.get("contract") != contract.to_json():
            raise bounds_mod.BoundsError(f"{path} was frozen for another model contract than {contract_path}")
    except bounds_mod.BoundsError as error:
        return item.missing_bounds(error)
    return frozen


def run_model(item):
    session = item.session
    contract_path, contract = _model_contract(session)
    force = session.config.getoption("--h3-freeze-force")
    if session.freezing:
        names = _variant_names(session)
        with item.progress(len(names) + 2) as bar:
            frozen = model_gate.freeze(
                session.model, contract, session.device, session.thresholds, names, force, progress=bar.step
            )
        return item.frozen(frozen)
    frozen = _frozen_bounds(item, model_gate.GATE, model_gate.GATE, contract, contract_path)
    if isinstance(frozen, GateResult):
        return frozen
    with item.progress(3) as bar:
        result = model_gate.check(session.model, session.candidate, contract, frozen, session.device, progress=bar.step)
    generation_gate.record_model_gate_outcome(
        session.out, session.model.identity, session.candidate.identity(), result.context["bounds_sha256"], result.passed
    )
    return result


def run_block(item):
    session = item.session
    block = item.params["block"]
    contract_path, contract = _model_contract(session)
    force = session.config.getoption("--h3-freeze-force")
    if session.freezing:
        names = _variant_names(session)
        with item.progress(len(names) + 3) as bar:
            frozen = block_gate.freeze(
                session.model, contract, session.device, block, session.thresholds, names, force,
                progress=bar.step,
            )
        return item.frozen(frozen)
    frozen = _frozen_bounds(item, block_gate.GATE, block_gate.bounds_stem(block), contract, contract_path)
    if isinstance(frozen, GateResult):
        return frozen
    with item.progress(4 + 8) as bar:
        return block_gate.check(
            session.model, session.candidate, contract, frozen, session.device, block, session.out, progress=bar.step
        )


def run_kernel(item):
    session = item.session
    if session.freezing:
        pytest.skip("the kernel gate has no bounds to freeze: its rule compares with torch in the same run")
    with item.progress(None) as bar:
        return kernel_gate.check(
            session.candidate,
            item.params["op"],
            session.device,
            dtypes=(item.params["dtype"],) if "dtype" in item.params else tuple(kernel_gate.DTYPES),
            max_examples=session.config.getoption("--h3-kernel-examples"),
            progress=bar.step,
        )


def run_generation(item):
    """One seed of the generation gate. Under --h3-freeze the session's first generation item freezes every
    seed of the contract (the calibrated bounds are the worst over all of them); the others report it."""
    session = item.session
    name = item.options.get("contract", "generation")
    contract = generation_contract.load(session.thresholds / session.model.name / f"{name}-contract.json")
    seed = item.params["seed"]
    if seed not in contract.seeds:
        raise pytest.UsageError(f"{item.node.nodeid}: seed {seed} is not among {contract.path}'s seeds {list(contract.seeds)}")
    stream = item.progress_stream()
    if session.freezing:
        path = bounds_mod.bounds_path(session.thresholds, session.model.name, bounds_mod.device_class(session.device), contract.name)
        if path not in session.frozen_here:
            generation_gate.freeze(
                session.model, contract, session.device, session.thresholds, _variant_names(session),
                session.config.getoption("--h3-freeze-force"), session.out, progress=stream,
            )
            session.frozen_here.add(path)
        return item.frozen(generation_gate.load_bounds(session.thresholds, session.model, contract, session.device))
    try:
        frozen = generation_gate.load_bounds(session.thresholds, session.model, contract, session.device)
    except bounds_mod.BoundsError as error:
        return item.missing_bounds(error)
    override = session.config.getoption("--h3-skip-model-gate")
    if not override and session.model_gate_scheduled and distribution.worker_index() is not None:
        # Under xdist the model gate may still run on another worker; in one process it ran before (ORDER).
        generation_gate.wait_for_model_gate(session.out, session.model.identity, session.candidate.identity(), stream)
    return generation_gate.check(
        session.model, session.candidate, contract, frozen, session.device, seed, session.out,
        verify_last_step=session.config.getoption("--h3-verify-last-step"), progress=stream,
        model_gate_override=override,
    )


def run_power(item):
    """Every gate against every mutant and provider variant (see h3gate.power); the mutants' base is the session's
    candidate on a GPU and the provider's ops on CPU, where the interpreter makes h3_triton gate runs slow."""
    session = item.session
    if session.freezing:
        pytest.skip("the power measurement freezes nothing: it uses the bounds the other gates froze")
    from h3gate import power
    from h3gate.candidates import ProviderCandidate

    base = session.candidate if session.device.startswith("cuda") else ProviderCandidate()
    with item.progress(None) as bar:
        report = power.run(session.model, session.device, session.thresholds, session.out / "power", base, progress=bar.step)
    return power.as_result(report, base)


RUNNERS = {
    "kernel": run_kernel,
    "block": run_block,
    "model": run_model,
    "generation": run_generation,
    "power": run_power,
}
# Cheap before expensive: the order gate items run in (a generation waits for the model gate's verdict).
ORDER = ("kernel", "block", "model", "generation", "power")
