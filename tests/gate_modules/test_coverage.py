"""Coverage of replaced ops: a replaced op that declines every call (returns ``NotImplemented``) computes nothing
of its own, so it passes every numerical check as the provider does; the gates that run the model or blocks count
the calls each replaced op served and fail one that served none."""

import json

import pytest

from conftest import THRESHOLDS
from h3gate import bounds, op_registry
from h3gate.candidates import ProviderCandidate, replace
from h3gate.evidence.signing import open_envelope
from h3gate.gates import block as block_gate, model as model_gate
from test_generation_gate import Setup


def declines(h):
    return NotImplemented


def square_only(x, weight, bias=None):
    """A GEMM kernel that takes square weights only (attention's projections) and declines the rest."""
    return op_registry.linear(x, weight, bias) if weight.shape[0] == weight.shape[1] else NotImplemented


NEVER_RUNS = replace("never-runs", {"swiglu": declines})
EVERY_CALL = replace("every-call", {"swiglu": op_registry.swiglu})  # bitwise the provider's op: within every bound
SOME_CALLS = replace("some-calls", {"linear": square_only})


def square_only_and_off(x, weight, bias=None):
    """square_only with a 1 % error in what it serves: a block that fails, so the gate runs its hybrids."""
    out = square_only(x, weight, bias)
    return NotImplemented if out is NotImplemented else out * 1.01


SOME_CALLS_OFF = replace("some-calls-off", {"linear": square_only_and_off})


@pytest.fixture(scope="module")
def tiny_block0(tiny):
    return bounds.load(bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "block0"), "block", tiny.identity, "cpu")


def _coverage(result):
    return {c.name: c for c in result.checks if c.kind == "coverage"}


def test_a_kernel_that_never_runs_fails_the_model_gate(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, NEVER_RUNS(), tiny_contract, tiny_model_bounds, "cpu")
    calls = result.context["coverage"]["swiglu"]["fell_back"]
    assert calls > 0 and result.context["coverage"] == {"swiglu": {"served": 0, "fell_back": calls}}
    assert [c.name for c in result.failures] == ["coverage.swiglu"], "the provider's numbers: only coverage fails"
    assert f"coverage.swiglu: coverage: kernel never ran: swiglu served 0 of {calls} calls ({calls} fell back to the " \
           "provider)" in result.summary()
    assert result.metrics["candidate"] == result.metrics["provider"], "the fallback is the provider's op, bitwise"


def test_a_kernel_that_serves_every_call_passes_the_model_gate(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, EVERY_CALL(), tiny_contract, tiny_model_bounds, "cpu")
    assert result.passed, result.report()
    (count,) = result.context["coverage"].values()
    assert count["served"] > 0 and count["fell_back"] == 0
    assert _coverage(result)["coverage.swiglu"].detail["reason"] == \
           f"kernel ran: swiglu served {count['served']} of {count['served']} calls (0 fell back to the provider)"


def test_the_block_gate_counts_the_candidates_replay_alone(tiny, tiny_contract, tiny_block0, tmp_path):
    """Its repeatability replays and hybrids (attribution, run when a check fails) call the replaced op too; their
    calls are not the candidate's."""
    never = block_gate.check(tiny, NEVER_RUNS(), tiny_contract, tiny_block0, "cpu", 0, tmp_path)
    assert [c.name for c in never.failures] == ["coverage.swiglu"]
    assert "kernel never ran: swiglu served 0 of 1 calls (1 fell back to the provider)" in never.summary()
    for candidate, passes in ((SOME_CALLS(), True), (SOME_CALLS_OFF(), False)):
        for diagnostics in (True, False):  # one candidate, counted anew per item: the first one's hybrids are not carried
            some = block_gate.check(tiny, candidate, tiny_contract, tiny_block0, "cpu", 0, tmp_path,
                                    diagnostics=diagnostics)
            assert some.passed == passes, some.report()
            assert ("tables" in some.metrics["attribution"]) == (diagnostics and not passes)
            assert some.context["coverage"] == {"linear": {"served": 4, "fell_back": 2}}, "attention's 4 square, ff's 2 not"


def test_a_reused_generation_keeps_its_counts(tiny, tmp_path):
    """The counts are saved with each step: a rerun that reuses the finished generation computes nothing, and
    still fails the kernel that never ran."""
    setup = Setup(tmp_path, tiny)
    first = setup.check(NEVER_RUNS())
    again = setup.check(NEVER_RUNS())
    assert again.context["workflows"]["fl2va"]["candidate_run"]["reused"]
    for result in (first, again):
        assert [c.name for c in result.failures] == ["coverage.swiglu"], result.report()
        assert result.context["coverage"]["swiglu"]["served"] == 0 < result.context["coverage"]["swiglu"]["fell_back"]


def test_built_in_candidates_are_not_counted(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, ProviderCandidate(), tiny_contract, tiny_model_bounds, "cpu")
    assert "coverage" not in result.context and not _coverage(result)


CONFTEST = '''
from h3gate.candidates import register
from test_coverage import SOME_CALLS

register("some-calls", SOME_CALLS)
'''

TEST = '''
import pytest


@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    assert h3_gate.run().passed
'''


def test_the_counts_reach_the_results_and_the_evidence(pytester):
    pytester.makepyfile(conftest=CONFTEST, test_counted_model_gate=TEST)
    run = pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=some-calls",
                             f"--h3-thresholds={THRESHOLDS}", "-m", "gate", "test_counted_model_gate.py")
    run.assert_outcomes(passed=1)
    results = json.loads((pytester.path / "h3-out" / "results.json").read_text())
    statement = json.loads(open_envelope(pytester.path / "h3-out").payload)
    (test,) = statement["predicate"]["h3"]["tests"].values()
    (result,) = results["results"].values()
    assert test["result"] == result
    count = result["context"]["coverage"]["linear"]
    assert count["served"] > 0 and count["fell_back"] > 0, count
    (check,) = [c for c in result["checks"] if c["name"] == "coverage.linear"]
    assert check["passed"] and {key: check["detail"][key] for key in count} == count
