"""How a gate item of any registered kind calls the engine through the gate protocol (:mod:`h3gate.gates`): freeze
under --h3-freeze, else load the frozen bounds (a missing file fails at once, before a model is built) and check;
a :class:`h3gate.candidates.CandidateError` (NaN, a crash of a kernel, a broken op contract) is a failed verdict.
What a person must fix, whose message says how (a damaged or foreign run folder, a bad or missing file, params that
do not fit the frozen files), fails the item in that one line: a traceback through the engine would bury it.

A gate that another gate requires (the model gate, which generations wait for) records every outcome of its items
(passed, failed, crashed, missing bounds) under this run's id, so the waiting items - maybe on other xdist workers -
end at once when it did not pass.
"""

from __future__ import annotations

import contextlib
from typing import NoReturn

import pytest

from h3gate import bounds as bounds_mod, gates as registry
from h3gate.candidates import CandidateError
from h3gate.files import FileFormatError
from h3gate.gates import passes
from h3gate.generation.resume import Preempted, ResumeError
from h3gate.verdict import Check, GateResult, one_line
from pytest_h3 import distribution
from pytest_h3.options import WORKERS_PER_GPU


# An item's reason when the candidate does not claim it: the item is skipped, and the ledger records it as such.
NOT_CLAIMED = pytest.StashKey[str]()


def run(item) -> GateResult:
    """The item's result; a gate that runs out of GPU memory fails in one line, with that memory given back, and so
    does bad input, in its own line. An item that fails once a signal came is interrupted instead: the signal reached
    its compilers and subprocesses too (one process group), so its failure says nothing of the candidate."""
    noted = len(distribution.SIGNALS)
    try:
        result = _result(item)
    except (pytest.skip.Exception, KeyboardInterrupt):
        raise
    except BaseException:
        _interrupted(item, noted)
        raise
    if not result.passed:
        _interrupted(item, noted)
    return result


def _interrupted(item, noted: int) -> None:
    """Interrupt the item, unrecorded, where a signal came since ``noted``: under xdist a worker skips it and stops
    after it; in one process the session stops as pytest's own Ctrl-C stops it."""
    import signal

    if len(distribution.SIGNALS) == noted:
        return
    name = signal.Signals(distribution.SIGNALS[-1]).name
    message = (f"interrupted by {name} while it ran (the signal reached the compilers and subprocesses it started): "
               "no verdict recorded; run the same command to run it again")
    if not distribution.is_worker(item.node.config):
        raise KeyboardInterrupt(message) from None
    item.node.session.shouldstop = f"stopped by {name}"
    raise pytest.skip.Exception(message) from None


def _result(item) -> GateResult:
    import torch

    try:
        with failing_in_one_line():
            return _run(item)
    except torch.OutOfMemoryError as error:
        reason = str(error).strip().splitlines()[0]
    except Preempted as preempted:
        # Not a KeyboardInterrupt out of the item, which xdist takes for a crash of its worker: the item is skipped
        # with the line that says where it stopped, and the session stops after it (a worker through shouldstop; one
        # process in pytest_runtest_protocol, as pytest's banner of a shouldstop would say it twice).
        item.session.ledger.preempted[item.node.nodeid] = str(preempted)
        if distribution.is_worker(item.node.config):
            item.node.session.shouldstop = str(preempted)
        raise pytest.skip.Exception(str(preempted)) from None
    # Past the except block the error and its traceback are gone, and with them the frames that held the item's
    # tensors: the next item starts on a free GPU instead of running out of memory in turn.
    torch.cuda.empty_cache()
    _fail(f"the {item.kind} gate ran out of GPU memory on {item.session.device}: {reason} Free the GPU of other "
         f"processes, or run fewer xdist workers per GPU ({WORKERS_PER_GPU})")


@contextlib.contextmanager
def failing_in_one_line():
    """Bad input a person must fix, whose message says how, fails the test in that message: a gate item, and the
    fixtures a team's own tests call (``h3_generation``, ``h3_bounds``)."""
    try:
        yield
    except (ResumeError, FileFormatError, registry.ItemError) as error:
        _fail(str(error))


def _fail(message: str) -> NoReturn:
    """Fail the item in ``message`` alone: pytest would otherwise print the error being handled (and the one that
    caused it) above it, the same words two or three times."""
    raise pytest.fail.Exception(message, pytrace=False) from None


def _run(item) -> GateResult:
    gate = registry.REGISTRY[item.kind]
    gate_run = item.gate_run()
    if item.session.freezing:
        return _freeze(item, gate, gate_run)
    if gate.name not in registry.required():
        return _check(item, gate, gate_run)
    session = item.session
    record(session, gate.name, item.node.nodeid, passes.RUNNING)
    try:
        result = _check(item, gate, gate_run)
    except BaseException as error:
        outcome = passes.DID_NOT_RUN if isinstance(error, pytest.skip.Exception) else passes.CRASHED
        with contextlib.suppress(Exception):  # the error itself is what the item reports
            record(session, gate.name, item.node.nodeid, outcome, one_line(error))
        raise
    missing = [check for check in result.checks if check.kind == "missing"]
    if missing:
        record(session, gate.name, item.node.nodeid, passes.MISSING_BOUNDS, missing[0].detail["reason"])
    elif result.passed:
        record(session, gate.name, item.node.nodeid, passes.PASSED, bounds_sha256=result.provenance.bounds_sha256)
    else:
        record(session, gate.name, item.node.nodeid, passes.FAILED, result.summary(),
               result.provenance.bounds_sha256 or "")
    return result


def _freeze(item, gate: registry.Gate, gate_run: registry.GateRun) -> GateResult:
    """Freeze the item's bounds file; items that share one (the seeds of a generation contract) freeze it once."""
    if gate.frozen_nothing:
        pytest.skip(gate.frozen_nothing)
    module = gate.module
    path = module.bounds_file(gate_run)
    if path in item.session.frozen_here:
        return item.frozen(module.load_bounds(gate_run))
    try:
        frozen = module.freeze_item(gate_run)
    except bounds_mod.BoundsError as error:  # a refusal that says what to do: its line, not a traceback
        _fail(f"the {gate.name} gate did not freeze: {error}")
    item.session.frozen_here.add(path)
    item.session.summary.append(f"froze {frozen.path} ({len(frozen.bounds)} bounds, locked)")
    return item.frozen(frozen)


def _check(item, gate: registry.Gate, gate_run: registry.GateRun) -> GateResult:
    module = gate.module
    try:
        path = module.bounds_file(gate_run)
        frozen = None
        if path is not None:
            if not path.is_file():  # before a model is built or an input captured
                return item.missing_bounds(bounds_mod.BoundsError(f"no frozen {gate.name} bounds at {path}"))
            frozen = module.load_bounds(gate_run)
        if gate.requires:
            _wait_for(item, gate.requires, gate_run)
        return module.check_item(gate_run, frozen)
    except bounds_mod.BoundsError as error:
        return item.missing_bounds(error)
    except CandidateError as error:  # NaN, a crash or a broken op contract: the candidate's verdict, not a crash
        return GateResult(gate.name, item.params, [Check.failed("candidate", "error", str(error))])
    except registry.NotClaimed as error:
        item.node.stash[NOT_CLAIMED] = str(error)
        pytest.skip(str(error))


def _wait_for(item, required: str, gate_run: registry.GateRun) -> None:
    """Under xdist the required gate may still run on another worker (in one process it ran before: the registry's
    order); every item of it records its outcome under this run's id, so this ends when it ends, passed or not."""
    session = item.session
    if gate_run.required_override or not session.gates_scheduled.get(required) or \
            not distribution.is_worker(item.node.config):
        return
    passes.wait(session.out, required, session.model, session.candidate.identity(), session.run_id,
                     gate_run.stream)


def record(session, gate: str, nodeid: str, outcome: str, reason: str = "", bounds_sha256: str = "") -> None:
    """Record an item's outcome of a required gate for the session's model and candidate, under this run's id."""
    passes.record(
        session.out, gate, session.model_ref(), session.candidate.identity(), outcome, reason=reason,
        bounds_sha256=bounds_sha256, run=session.run_id,
    )
    if outcome != passes.RUNNING:
        session.required_recorded.add(nodeid)
