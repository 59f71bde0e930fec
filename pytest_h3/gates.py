"""Per-kind runners: how a gate item of each kind calls the engine (check, or freeze under --h3-freeze)."""

from __future__ import annotations

import pytest

from h3gate import bounds as bounds_mod
from h3gate import numerics
from h3gate.contract import load_model_contract
from h3gate.gates import block as block_gate
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
        return model_gate.check(session.model, session.candidate, contract, frozen, session.device, progress=bar.step)


def run_block(item):
    session = item.session
    block = item.params["block"]
    contract_path, contract = _model_contract(session)
    force = session.config.getoption("--h3-freeze-force")
    if session.freezing:
        names = _variant_names(session)
        with item.progress(len(names) + 3) as bar:
            frozen = block_gate.freeze(
                session.model, contract, session.device, block, session.thresholds, session.out, names, force,
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
            max_examples=item.options.get("max_examples", 8),
            progress=bar.step,
        )


RUNNERS = {"kernel": run_kernel, "block": run_block, "model": run_model}
