"""The model gate through the engine: the provider passes; broken candidates, missing taps and zeroed gradients fail."""

import math

import pytest

from broken import BROKEN, ZeroedWeightGradient
from h3gate.candidates import ProviderCandidate
from h3gate.gates import model as model_gate
from h3gate.verdict import Check


def test_provider_passes_its_own_bounds(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, ProviderCandidate(), tiny_contract, tiny_model_bounds, "cpu")
    assert result.passed, result.report()
    assert {c.name for c in result.checks} == set(tiny_model_bounds.bounds) | {"candidate[run twice]"}
    assert result.summary().startswith("model gate passed")


@pytest.mark.parametrize("broken", BROKEN, ids=lambda cls: cls.name)
def test_broken_candidate_fails(broken, tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, broken(), tiny_contract, tiny_model_bounds, "cpu")
    assert not result.passed
    first_line = result.report().splitlines()[0]
    worst = result.failures[0]
    assert "FAILED" in first_line and worst.name in first_line
    assert tiny_model_bounds.path and result.provenance.bounds_sha256[:12] in first_line
    if worst.kind == "relative_l2":
        assert f"bound {worst.bound:.4g}" in first_line and "margin -" in first_line


def test_zeroed_gradient_fails_even_under_a_huge_bound(tiny, tiny_contract, tiny_model_bounds):
    loose = tiny_model_bounds.__class__(**{**tiny_model_bounds.__dict__, "bounds": dict.fromkeys(tiny_model_bounds.bounds, 10.0)})
    result = model_gate.check(tiny, ZeroedWeightGradient(), tiny_contract, loose, "cpu")
    zero = [c for c in result.failures if c.kind == "zero_gradient"]
    assert [c.name for c in zero] == [f"parameter.{ZeroedWeightGradient.parameter}.grad"]
    assert all(c.passed for c in result.checks if c.kind == "relative_l2"), "the loose bound passes every tap"


def test_tap_inventory_must_equal_the_bounds(tiny, tiny_contract, tiny_model_bounds):
    reduced = dict(tiny_model_bounds.bounds)
    missing = reduced.pop("outputs.audio")
    reduced["nodes.not_a_module"] = missing
    reduced["parameter.not_a_parameter.grad"] = missing
    narrowed = tiny_model_bounds.__class__(**{**tiny_model_bounds.__dict__, "bounds": reduced})
    result = model_gate.check(tiny, ProviderCandidate(), tiny_contract, narrowed, "cpu")
    inventory = {c.name: c.detail["reason"] for c in result.failures if c.kind == "inventory"}
    assert inventory == {
        "nodes.not_a_module": "tap has a bound but was not recorded",
        "parameter.not_a_parameter.grad": "tap has a bound but was not recorded: no gradient reached it, as when an op "
                                          "detaches its output from autograd; the kernel gate's items name such an op",
        "outputs.audio": "tap was recorded but has no bound",
    }


def test_check_line_and_margin():
    check = Check("outputs.video", "relative_l2", 0.03, 0.02, False)
    assert math.isclose(check.margin, -0.01)
    assert check.line() == "outputs.video: relative_l2 0.03 > bound 0.02 (margin -0.01)"


def test_a_check_failed_for_a_reason_ranks_as_a_failure_and_says_why():
    check = Check.failed("same_start", "same_start", "noise differs", step=3)
    assert (check.value, check.bound, check.passed) == (1.0, 0.0, False)
    assert check.detail == {"step": 3, "reason": "noise differs"} and check.ratio == math.inf
    assert check.line() == "same_start: same_start: noise differs"
    assert Check.failed("out", "non_finite", "2 NaN/Inf", value=2.0).value == 2.0


def test_an_op_detached_from_autograd_fails_saying_what_zeroes_the_gradients(tiny, tiny_contract, tiny_model_bounds):
    from h3gate import op_registry

    detached = ProviderCandidate().with_kernel_ops({"swiglu": lambda h: op_registry.swiglu(h).detach()})
    result = model_gate.check(tiny, detached, tiny_contract, tiny_model_bounds, "cpu")
    lost = [c for c in result.failures if c.kind in ("zero_gradient", "inventory")]
    assert lost, result.report()
    assert all("detach" in c.detail["reason"] for c in lost), result.report()
