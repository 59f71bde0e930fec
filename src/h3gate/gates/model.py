"""The ``model`` gate: the whole transformer, forward and backward, at the contract input.

Freeze (provider configurations only, never the candidate): the provider and every variant, each streamed against
golden; their relative L2 to golden per tap gives the bounds by the ensemble rule. Check: the provider (for the
report) and the candidate streamed against golden; per tap the candidate's relative L2 to golden must not exceed
its bound; the run's tap inventory must equal the bounds' keys; a gradient that is exactly zero where golden's is
not fails whatever its bound; non-finite output is an error naming the tap; a replaced op that served none of its
calls fails (:mod:`h3gate.candidates.coverage`).

Every run is streamed (:func:`h3gate.streaming.stream_errors`): golden made one block at a time, the compared runs
in lockstep with it, every tap reduced to its errors as it appears, the backward recomputing each block from its
saved input. That is what lets the gate run at release size on one H200; on a CPU its errors are bitwise those of
holding every tap (tests/test_streaming.py). A freeze streams one configuration at a time against golden: golden
and one bf16 run's saved inputs (58.5 GiB at release size) fit the host beside nothing else.
"""

from __future__ import annotations

from pathlib import Path

from h3gate import bounds as bounds_mod, numerics
from h3gate.candidates import Candidate, CandidateError, coverage
from h3gate.files import FileFormatError
from h3gate.model.contract import ModelContract, load_model_contract, model_inputs
from h3gate.model.identity import Model
from h3gate.streaming import stream_errors
from h3gate.verdict import Check, GateResult, Provenance, raised_under_determinism, repeatability

GATE = "model"


def phases(model: Model) -> int:
    """The progress phases of one streamed run: the part before the blocks, each block forward and back, the head."""
    return 2 * model.config["num_layers"] + 3


def _phase_seconds(timings: dict) -> dict[str, float]:
    """A streamed run's seconds per kind of phase (forward, backward, forward_backward.head, compare)."""
    summed: dict[str, float] = {}
    for phase, seconds in timings.items():
        kind = phase.split(".")[0] if phase.startswith(("forward.", "backward.")) else phase
        summed[kind] = summed.get(kind, 0.0) + seconds
    return summed


def freeze(
    model: Model,
    contract: ModelContract,
    device: str,
    thresholds: Path,
    variant_names: list[str] | None = None,
    force_reason: str | None = None,
    progress=lambda message: None,
) -> bounds_mod.Bounds:
    """Stream each provider configuration against golden and freeze the ensemble bounds (and lock them)."""
    inputs, upstream = model_inputs(contract, model.config)
    device_class = bounds_mod.device_class(device)
    path = bounds_mod.bounds_path(thresholds, model.name, device_class, GATE)
    bounds_mod.refuse_overwrite(path, force_reason)  # before minutes of measuring, not after
    modes = [numerics.PROVIDER] + [
        numerics.get(name, device) for name in (variant_names or [m.name for m in numerics.variants(device)])
    ]
    timings: dict[str, dict] = {}
    errors = {}
    for mode in modes:
        phase_timings: dict[str, float] = {}
        streamed = stream_errors(model, device, numerics.GOLDEN, {mode.name: (mode, None)}, inputs, upstream,
                                 progress=lambda phase, name=mode.name: progress(f"{name} {phase}"), timings=phase_timings)
        errors[mode.name] = {tap: metrics["relative_l2"] for tap, metrics in streamed[mode.name].items()}
        timings[mode.name] = _phase_seconds(phase_timings)
    frozen = bounds_mod.frozen_by_ensemble(
        GATE, model, device_class, errors, {"contract": contract.to_json(), "timings_s": timings}
    )
    bounds_mod.save(frozen, path, thresholds, force_reason)
    return frozen


AGAIN = "candidate[again]"
REPEATED = "candidate[run twice]"


def check(
    model: Model,
    candidate: Candidate,
    contract: ModelContract,
    frozen: bounds_mod.Bounds,
    device: str,
    progress=lambda message: None,
    repeat: bool = True,
) -> GateResult:
    """Qualify ``candidate`` against frozen bounds: it and the provider streamed in lockstep with golden; the
    candidate runs twice, and its two runs must agree bitwise. Coverage counts the calls of both candidate runs.

    The two runs are made under torch's deterministic algorithms. A candidate that fails there but runs without them
    has a backend with no deterministic kernel (cuDNN's SDPA, or a third-party kernel that refuses them): its numerics are still judged, from a run without them, and the determinism check
    fails naming the reason. ``repeat=False`` (a provider variant that has no deterministic kernel, calibration
    rather than a candidate: the power gate) judges the numerics of one run alone."""
    inputs, upstream = model_inputs(contract, model.config)
    phase_timings: dict[str, float] = {}

    def streamed_runs(twice: bool) -> tuple[dict, dict]:
        runs = {"provider": (numerics.PROVIDER, None), "candidate": (numerics.PROVIDER, candidate)}
        if twice:  # one more candidate run in the same stream: golden's and the provider's are computed once
            runs[AGAIN] = (numerics.PROVIDER, candidate)
        with coverage.counting(candidate) as counts:
            streamed = stream_errors(model, device, numerics.GOLDEN, runs, inputs, upstream, progress=progress,
                                     timings=phase_timings, deterministic=(("candidate", AGAIN) if twice else ()))
        return streamed, counts

    repeated = None
    try:
        streamed, counts = streamed_runs(twice=repeat)
        if repeat:
            repeated = repeatability(REPEATED, streamed["candidate"], streamed[AGAIN])
    except CandidateError as strict:
        if not repeat:
            raise
        try:
            streamed, counts = streamed_runs(twice=False)
        except CandidateError:
            raise strict from None
        repeated = raised_under_determinism(REPEATED, strict.__cause__ or strict, lambda: streamed_runs(twice=True))
    candidate_errors, provider_errors = streamed["candidate"], streamed["provider"]
    checks = inventory_checks(set(candidate_errors), set(frozen.bounds))
    if repeated is not None:
        checks.append(repeated)
    for tap, metrics in candidate_errors.items():
        if tap not in frozen.bounds:
            continue
        detail = {"max_abs": metrics["max_abs"], "provider_relative_l2": provider_errors[tap]["relative_l2"]}
        if bounds_mod.tap_kind(tap) == "gradient" and metrics["all_zero"] and not metrics["reference_all_zero"]:
            checks.append(
                Check.failed(tap, "zero_gradient", "exactly zero where golden's is not: an op whose output is detached "
                             "from autograd, or that drops a gradient, zeroes every gradient before it; "
                             f"{KERNEL_GATE_NAMES}", **detail)
            )
        checks.append(Check(tap, "relative_l2", metrics["relative_l2"], frozen.bounds[tap], metrics["relative_l2"] <= frozen.bounds[tap], detail))
    context = {"non_discriminating": frozen.non_discriminating}
    if not repeat:
        context["repeatability"] = "not run: a provider variant with no deterministic kernel, judged by its numerics"
    return coverage.judged(GateResult(
        gate=GATE,
        params={},
        checks=checks,
        context=context,
        metrics={"candidate": candidate_errors, "provider": provider_errors},
        timings=_phase_seconds(phase_timings),
        provenance=Provenance.of(frozen, model, candidate, frozen.device_class),
    ), counts)


# What a lost gradient's check adds: the gate that names the op that lost it.
KERNEL_GATE_NAMES = "the kernel gate's items name such an op"


def inventory_checks(measured: set[str], expected: set[str]) -> list[Check]:
    """The run's taps must be exactly the bounds' keys: a missing or extra tap is a failed check."""
    checks = []
    for tap in sorted(expected - measured):
        why = ": no gradient reached it, as when an op detaches its output from autograd; " \
              f"{KERNEL_GATE_NAMES}" if bounds_mod.tap_kind(tap) == "gradient" else ""
        checks.append(Check.failed(tap, "inventory", f"tap has a bound but was not recorded{why}"))
    for tap in sorted(measured - expected):
        checks.append(Check.failed(tap, "inventory", "tap was recorded but has no bound"))
    return checks


# The gate protocol (:mod:`h3gate.gates`) ------------------------------------------------------------------


def contract_of(run) -> tuple[Path, ModelContract]:
    """The model contract the model and block gates measure at: ``thresholds/<model>/model-contract.json``."""
    path = Path(run.thresholds) / run.model_name / "model-contract.json"
    if not path.is_file():
        raise FileFormatError(path, f"no model contract for {run.model_name}: write the default contracts with "
                              f"`{run.contracts_command()}`")
    return path, load_model_contract(path)


def frozen_for_contract(run, gate: str, stem: str) -> bounds_mod.Bounds:
    """Bounds ``<stem>-bounds.json`` of ``gate`` for the run's model and device class, frozen at today's contract."""
    contract_path, contract = contract_of(run)
    path = bounds_mod.bounds_path(run.thresholds, run.model_name, run.device_class, stem)
    frozen = bounds_mod.load(path, gate, run.model.identity, run.device_class)
    if frozen.provenance.get("contract") != contract.to_json():
        raise bounds_mod.BoundsError(f"{path} was frozen for another model contract than {contract_path}", path)
    return frozen


def items(run) -> list[dict]:
    return [{}]


def bounds_file(run) -> Path:
    return bounds_mod.bounds_path(run.thresholds, run.model_name, run.device_class, GATE)


def load_bounds(run) -> bounds_mod.Bounds:
    return frozen_for_contract(run, GATE, GATE)


def freeze_item(run) -> bounds_mod.Bounds:
    names = run.variant_names or [mode.name for mode in numerics.variants(run.device)]
    with run.progress((len(names) + 1) * phases(run.model)) as bar:
        return freeze(run.model, contract_of(run)[1], run.device, run.thresholds, names, run.force_reason, bar.step)


def check_item(run, frozen: bounds_mod.Bounds) -> GateResult:
    with run.progress(phases(run.model)) as bar:
        return check(run.model, run.candidate, contract_of(run)[1], frozen, run.device, progress=bar.step,
                     repeat=run.repeat)
