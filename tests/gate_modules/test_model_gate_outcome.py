"""The model gate always records its outcome, and generation items waiting for it (under xdist) end at once when
it did not pass: crashed, failed, missing bounds - never two hours of polling for a record nobody writes."""

import json
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from h3gate import bounds as bounds_mod
from h3gate.gates import generation as gate, model as model_gate, passes
from h3gate.generation import contract as generation_contract
from h3gate.model.contract import load_model_contract

from conftest import THRESHOLDS

CANDIDATE = {"name": "crashes"}


# The record and the wait -------------------------------------------------------------------------------


def test_wait_returns_the_outcome_as_soon_as_it_is_recorded(tiny, tmp_path):
    def later():
        time.sleep(0.3)
        passes.record(tmp_path, "model", tiny, CANDIDATE, passes.CRASHED, reason="RuntimeError: boom", run="A")

    writer = threading.Thread(target=later)
    started = time.monotonic()
    writer.start()
    record = passes.wait(tmp_path, "model", tiny, CANDIDATE, run="A", timeout=30, poll=0.05)
    writer.join()
    assert time.monotonic() - started < 5
    assert (record["outcome"], record["reason"], record["passed"]) == ("crashed", "RuntimeError: boom", False)
    with pytest.raises(passes.NotPassed, match="did not pass for candidate 'crashes': crashed: RuntimeError: boom"):
        passes.require_pass(tmp_path, "model", tiny, CANDIDATE)
    assert passes.require_pass(tmp_path, "model", tiny, CANDIDATE, override="ran elsewhere")["status"] == "overridden"
    assert [p.name for p in (tmp_path / "gate-passes" / "model").iterdir()] == [passes._path(tmp_path, "model", tiny, CANDIDATE).name]


def test_wait_counts_only_its_own_run_and_final_outcomes(tiny, tmp_path):
    passes.record(tmp_path, "model", tiny, CANDIDATE, passes.PASSED, run="an earlier run")
    assert passes.wait(tmp_path, "model", tiny, CANDIDATE, run="this run", timeout=0.2, poll=0.05) is None
    passes.record(tmp_path, "model", tiny, CANDIDATE, passes.RUNNING, run="this run")  # this process: alive
    assert passes.wait(tmp_path, "model", tiny, CANDIDATE, run="this run", timeout=0.2, poll=0.05) is None
    assert passes.wait(tmp_path, "model", tiny, CANDIDATE, timeout=0.2, poll=0.05) is None


def test_a_running_record_of_a_process_that_ended_is_a_crash(tiny, tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    passes.record(tmp_path, "model", tiny, CANDIDATE, passes.RUNNING, run="R")
    path = passes._path(tmp_path, "model", tiny, CANDIDATE)
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": int(gone.stdout)}))
    started = time.monotonic()
    record = passes.wait(tmp_path, "model", tiny, CANDIDATE, run="R", timeout=30, poll=0.05)
    assert time.monotonic() - started < 5
    assert record["outcome"] == "crashed" and "ended without a verdict" in record["reason"]


def test_missing_bounds_and_unknown_outcomes(tiny, tmp_path):
    command = "pytest tests/gates/test_model.py --h3-freeze --h3-model=tiny --h3-device=cpu"
    ref = passes.ModelRef(tiny.source)  # the model gate failed before building the model: no identity yet
    passes.record(tmp_path, "model", ref, CANDIDATE, passes.MISSING_BOUNDS, reason=f"no frozen model bounds; freeze them with: {command}")
    with pytest.raises(passes.NotPassed, match=f"missing bounds: no frozen model bounds; freeze them with: {command}"):
        passes.require_pass(tmp_path, "model", tiny, CANDIDATE)
    with pytest.raises(ValueError, match="unknown model gate outcome"):
        passes.record(tmp_path, "model", tiny, CANDIDATE, "maybe")


def test_a_pass_counts_only_for_the_model_identity_it_was_recorded_for(tiny, tmp_path):
    passes.record(tmp_path, "model", passes.ModelRef(tiny.source, "another identity"), CANDIDATE, passes.PASSED)
    with pytest.raises(passes.NotPassed, match="run the model gate first .* override reason "
                                               r"\(--h3-skip-model-gate=REASON\)"):
        passes.require_pass(tmp_path, "model", tiny, CANDIDATE)
    passes.record(tmp_path, "model", tiny, CANDIDATE, passes.PASSED, bounds_sha256="abc")
    assert passes.require_pass(tmp_path, "model", tiny, CANDIDATE)["bounds_sha256"] == "abc"


# Under xdist ----------------------------------------------------------------------------------------------

CONFTEST = """
from h3gate.candidates import ProviderCandidate, register


class Crashes(ProviderCandidate):
    name = "crashes"

    def install(self, transformer):
        raise RuntimeError("boom: the kernel launch failed")


register("crashes", Crashes)
"""

GATES = """
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()

@pytest.mark.h3_gate("generation", seeds=[42, 43], contract="generation-preflight")
def test_generation(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
"""


@pytest.fixture(scope="module")
def frozen_thresholds(tiny, tmp_path_factory):
    """The tiny model's model bounds and two-seed preflight generation bounds, frozen from one variant (seconds)."""
    root = tmp_path_factory.mktemp("frozen")
    thresholds = root / "thresholds"
    (thresholds / "tiny").mkdir(parents=True)
    model_contract = thresholds / "tiny" / "model-contract.json"
    model_contract.write_bytes((THRESHOLDS / "tiny" / "model-contract.json").read_bytes())
    preflight = thresholds / "tiny" / "generation-preflight-contract.json"
    data = json.loads((THRESHOLDS / "tiny" / preflight.name).read_text())
    preflight.write_text(json.dumps({**data, "seeds": [42, 43]}, indent=1))
    bounds_mod.lock_files(thresholds, [model_contract, preflight])
    model_gate.freeze(tiny, load_model_contract(model_contract), "cpu", thresholds, ["sdpa-math"])
    gate.freeze(tiny, generation_contract.load(preflight), "cpu", thresholds, ["sdpa-math"], out_dir=root / "out")
    return thresholds


def _copy(source, target, leave_out=()):
    for path in source.rglob("*"):
        if path.is_file() and path.name not in leave_out:
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(source)).write_bytes(path.read_bytes())
    if leave_out:  # a file left out leaves the lock too, as if it had never been frozen
        lock = json.loads((target / "LOCK.json").read_text())
        lock["files"] = {k: v for k, v in lock["files"].items() if k.rsplit("/", 1)[-1] not in leave_out}
        (target / "LOCK.json").write_text(json.dumps(lock))


@pytest.mark.parametrize(
    "candidate, leave_out, outcome",
    [
        ("crashes", (), "failed: model gate FAILED 1/1 checks; worst candidate: error: candidate crashes failed in the "
                        "whole-model run: RuntimeError: boom: the kernel launch failed"),
        ("provider", ("model-bounds.json",), "missing bounds: no frozen model bounds at *model-bounds.json; "
         "freeze them with: pytest test_gates.py::test_model --h3-freeze --h3-model=tiny --h3-device=cpu"),
    ],
    ids=["model-gate-crashes", "no-model-bounds"],
)
def test_generation_items_end_at_once_when_the_model_gate_does_not_pass(pytester, frozen_thresholds, candidate, leave_out, outcome):
    _copy(frozen_thresholds, pytester.path / "thresholds", leave_out)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_gates=GATES)
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", f"--h3-candidate={candidate}", "--h3-device=cpu", "--junitxml=junit.xml",
        timeout=600,
    )
    elapsed = time.monotonic() - started
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([f"*the model gate did not pass for candidate '{candidate}': {outcome}*"] * 2)
    cases = {case.get("name"): float(case.get("time")) for case in ET.parse(pytester.path / "junit.xml").iter("testcase")}
    generation = {name: seconds for name, seconds in cases.items() if name.startswith("test_generation")}
    assert len(generation) == 2 and all(seconds < 30 for seconds in generation.values()), cases
    assert elapsed < 300, f"the run took {elapsed:.0f} s"
