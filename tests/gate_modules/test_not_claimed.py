"""The kernel gate qualifies exactly what a candidate claims: the ops it replaces, at the dtypes it supports. Items
outside that are "not claimed": skipped with that reason, named in the evidence, and neither a pass nor a gap."""

import json

import pytest

from h3gate import gates as registry, op_registry
from h3gate.candidates import replace
from h3gate.evidence import profiles
from h3gate.evidence.signing import open_envelope
from h3gate.evidence.verify import verify
from h3gate.gates import kernel

HALF_SWIGLU = replace("half-swiglu", {"swiglu": op_registry.provider_ops()["swiglu"]}, supports={"dtypes": ["bfloat16"]})


def _run(**params):
    return registry.GateRun("tiny", None, "cpu", None, None, candidate=HALF_SWIGLU(), params=params, kernel_examples=1,
                            kernel_shrink=False)


@pytest.mark.parametrize("params, reason", [
    ({"op": "attention", "dtype": "bfloat16"}, "does not replace attention"),
    ({"op": "swiglu", "dtype": "float32"}, "supports swiglu in bfloat16 only"),
])
def test_an_item_outside_the_claim_is_not_claimed(params, reason):
    with pytest.raises(registry.NotClaimed, match=f"not claimed: candidate half-swiglu {reason}"):
        kernel.check_item(_run(**params), None)


def test_an_item_of_several_dtypes_runs_the_claimed_ones_and_names_the_others():
    result = kernel.check_item(_run(op="swiglu"), None)
    assert result.passed and result.params == {"op": "swiglu"}
    assert {check.detail["dtype"] for check in result.checks} == {"bfloat16"}
    assert list(result.context["not_claimed"]) == ["float32"]


def _test(outcome, gate="kernel", passed=True):
    result = None if outcome != "passed" else {"passed": passed, "context": {}}
    return {"outcome": outcome, "gate": gate, "params": {}, "result": result}


def test_not_claimed_is_neither_a_pass_nor_a_gap():
    only_kernel = profiles.Profile("kernel-only", (profiles.Requirement("kernel"),))
    tests = {"k[swiglu]": _test("passed"), "k[attention]": _test("not_claimed")}
    tally = profiles.tally(tests, only_kernel)
    assert tally["verdict"] == profiles.PASSED and tally["passedTests"] == ["k[swiglu]"]
    assert tally["completeness"] == {"complete": True, "problems": [], "not_claimed": ["k[attention]"]}
    claimed_nothing = profiles.tally({"k[attention]": _test("not_claimed")}, only_kernel)
    assert claimed_nothing["verdict"] == profiles.INCOMPLETE
    assert claimed_nothing["completeness"]["problems"] == ["kernel: the candidate claims none of its items"]
    assert "not_claimed" not in profiles.tally({"k[swiglu]": _test("passed")}, only_kernel)["completeness"]


CONFTEST = '''
from h3gate import op_registry
from h3gate.candidates import register, replace

register("half-swiglu", replace("half-swiglu", {"swiglu": op_registry.provider_ops()["swiglu"]}, supports={"dtypes": ["bfloat16"]}))
'''

TEST = '''
import pytest


@pytest.mark.h3_gate("kernel", ops=["swiglu", "attention"], dtypes=["bfloat16", "float32"])
def test_kernel(h3_gate):
    assert h3_gate.run().passed
'''


def test_the_evidence_records_unclaimed_items_apart(pytester):
    (pytester.path / "thresholds").mkdir()
    pytester.makepyfile(conftest=CONFTEST, test_half=TEST)
    run = pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=half-swiglu",
                             "--h3-kernel-examples=1", "-rs", "-m", "gate", "test_half.py")
    run.assert_outcomes(passed=1, skipped=3)
    run.stdout.fnmatch_lines(["*not claimed: candidate half-swiglu does not replace attention*"])
    statement = json.loads(open_envelope(pytester.path / "h3-out").payload)
    tests = statement["predicate"]["h3"]["tests"]
    assert sorted(test["outcome"] for test in tests.values()) == ["not_claimed"] * 3 + ["passed"]
    assert len(statement["predicate"]["h3"]["completeness"]["not_claimed"]) == 3
    assert statement["predicate"]["passedTests"] == ["test_half.py::test_kernel[swiglu-bfloat16]"]
    only_kernel = profiles.Profile("kernel-only", (profiles.Requirement("kernel"),))
    verified = verify(pytester.path / "h3-out", thresholds=pytester.path / "thresholds", required=only_kernel)
    assert verified.result == profiles.PASSED
