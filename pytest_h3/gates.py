"""Per-kind runners: how a gate item of each kind calls the engine (check, or freeze under --h3-freeze)."""

from __future__ import annotations

import pytest

from h3gate import bounds as bounds_mod
from h3gate import numerics
from h3gate.contract import load_model_contract
from h3gate.gates import kernel as kernel_gate
from h3gate.gates import model as model_gate


def run_model(item):
    session = item.session
    model = session.model
    contract_path = session.thresholds / model.name / "model-contract.json"
    contract = load_model_contract(contract_path)
    if session.freezing:
        variants = session.config.getoption("--h3-variants")
        names = variants.split(",") if variants else [mode.name for mode in numerics.variants(session.device)]
        with item.progress(len(names) + 2) as bar:
            frozen = model_gate.freeze(
                model,
                contract,
                session.device,
                session.thresholds,
                names,
                session.config.getoption("--h3-freeze-force"),
                progress=bar.step,
            )
        return item.frozen(frozen)
    device_class = bounds_mod.device_class(session.device)
    path = bounds_mod.bounds_path(session.thresholds, model.name, device_class, model_gate.GATE)
    try:
        frozen = bounds_mod.load(path, model_gate.GATE, model.identity, device_class)
        if frozen.provenance.get("contract") != contract.to_json():
            raise bounds_mod.BoundsError(f"{path} was frozen for another model contract than {contract_path}")
    except bounds_mod.BoundsError as error:
        return item.missing_bounds(error)
    with item.progress(3) as bar:
        return model_gate.check(model, session.candidate, contract, frozen, session.device, progress=bar.step)


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


RUNNERS = {"kernel": run_kernel, "model": run_model}
