"""Per-kind runners: how a gate item of each kind calls the engine (check, or freeze under --h3-freeze)."""

from __future__ import annotations

import contextlib

import pytest

from pytest_h3 import distribution
from h3gate import bounds as bounds_mod
from h3gate import numerics
from h3gate.contract import load_model_contract
from h3gate.gates import KINDS
from h3gate import generation_contract
from h3gate.gates import block as block_gate
from h3gate.gates import generation as generation_gate
from h3gate.gates import kernel as kernel_gate
from h3gate.gates import model as model_gate
from h3gate.verdict import Check, GateResult


def _variant_names(session) -> list[str]:
    variants = session.config.getoption("--h3-variants")
    return variants.split(",") if variants else [mode.name for mode in numerics.variants(session.device)]


def _model_contract(session):
    path = session.thresholds / session.model_name / "model-contract.json"
    return path, load_model_contract(path)


def _absent_bounds(item, gate: str, stem: str) -> GateResult | None:
    """Bounds that are not there fail the item at once, before a model is built or an input captured."""
    session = item.session
    path = bounds_mod.bounds_path(session.thresholds, session.model_name, bounds_mod.device_class(session.device), stem)
    return None if path.is_file() else item.missing_bounds(bounds_mod.BoundsError(f"no frozen {gate} bounds at {path}"))


def _frozen_bounds(item, gate: str, stem: str, contract, contract_path) -> bounds_mod.Bounds | GateResult:
    """The item's frozen bounds, or the failing result that says how to freeze them."""
    absent = _absent_bounds(item, gate, stem)
    if absent is not None:
        return absent
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
    """The model gate. Whatever happens, its outcome for this model and candidate is recorded (passed, failed,
    crashed, missing bounds), so the generation items of the run - maybe waiting on other xdist workers - end at once
    when it did not pass."""
    session = item.session
    if session.freezing:
        contract_path, contract = _model_contract(session)
        names = _variant_names(session)
        with item.progress(len(names) + 2) as bar:
            frozen = model_gate.freeze(
                session.model, contract, session.device, session.thresholds, names,
                session.config.getoption("--h3-freeze-force"), progress=bar.step,
            )
        return item.frozen(frozen)
    record_model_gate(session, item.node.nodeid, generation_gate.RUNNING)
    try:
        result = _check_model(item)
    except BaseException as error:
        outcome = generation_gate.DID_NOT_RUN if isinstance(error, pytest.skip.Exception) else generation_gate.CRASHED
        with contextlib.suppress(Exception):  # the error itself is what the item reports
            record_model_gate(session, item.node.nodeid, outcome, generation_gate.one_line(error))
        raise
    missing = [check for check in result.checks if check.kind == "missing"]
    if missing:
        record_model_gate(session, item.node.nodeid, generation_gate.MISSING_BOUNDS, missing[0].detail["reason"])
    elif result.passed:
        record_model_gate(session, item.node.nodeid, generation_gate.PASSED, bounds_sha256=result.context["bounds_sha256"])
    else:
        record_model_gate(session, item.node.nodeid, generation_gate.FAILED, result.summary(), result.context.get("bounds_sha256", ""))
    return result


def _check_model(item) -> GateResult:
    session = item.session
    contract_path, contract = _model_contract(session)
    frozen = _frozen_bounds(item, model_gate.GATE, model_gate.GATE, contract, contract_path)
    if isinstance(frozen, GateResult):
        return frozen
    with item.progress(3) as bar:
        return model_gate.check(session.model, session.candidate, contract, frozen, session.device, progress=bar.step)


def record_model_gate(session, nodeid: str, outcome: str, reason: str = "", bounds_sha256: str = "") -> None:
    """Record a model gate item's outcome for the session's model and candidate, under this run's id."""
    generation_gate.record_model_gate_outcome(
        session.out, session.model_ref(), session.candidate.identity(), outcome, reason=reason,
        bounds_sha256=bounds_sha256, run=session.run_id,
    )
    if outcome != generation_gate.RUNNING:
        session.model_gate_recorded.add(nodeid)


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
    contract = generation_contract.load(session.thresholds / session.model_name / f"{name}-contract.json")
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
    absent = _absent_bounds(item, contract.name, contract.name)
    if absent is not None:
        return absent
    try:
        frozen = generation_gate.load_bounds(session.thresholds, session.model, contract, session.device)
    except bounds_mod.BoundsError as error:
        return item.missing_bounds(error)
    override = session.config.getoption("--h3-skip-model-gate")
    if not override and session.model_gate_scheduled and distribution.worker_index() is not None:
        # Under xdist the model gate may still run on another worker (in one process it ran before: ORDER); every
        # model gate item records its outcome under this run's id, so this ends when it ends, passed or not.
        generation_gate.wait_for_model_gate(session.out, session.model, session.candidate.identity(), session.run_id, stream)
    try:
        return generation_gate.check(
            session.model, session.candidate, contract, frozen, session.device, seed, session.out,
            verify_last_step=session.config.getoption("--h3-verify-last-step"), progress=stream,
            model_gate_override=override,
        )
    except generation_gate.ModelGateNotPassed as error:
        return GateResult(item.kind, item.params, [Check.failed("model_gate", "not passed", str(error))])


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
assert tuple(RUNNERS) == KINDS, "one runner per gate kind, in the kinds' order"
