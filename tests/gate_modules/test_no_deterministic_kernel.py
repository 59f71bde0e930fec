"""A backend without a deterministic kernel (cuDNN's SDPA, and any third-party kernel like it) gets a verdict naming
that from every gate that compares two runs bitwise, never a crash; a provider variant like it is judged by its
numerics in the power table (README: Repeatability). The stand-in raises under torch's deterministic algorithms as
cuDNN's SDPA does on CUDA."""

import dataclasses

import pytest
import torch

from broken import NoDeterministicKernel, RaisesOnce
from conftest import THRESHOLDS
from h3gate import bounds, numerics, op_registry
from h3gate.candidates import ProviderCandidate
from h3gate.gates import block as block_gate, kernel as kernel_gate, model as model_gate, power

REASON = "no deterministic kernel: under torch.use_deterministic_algorithms(True) the candidate raised RuntimeError: " \
         "No available kernel. Aborting execution.; it runs without them"


def test_the_model_gate_names_it_and_still_judges_the_numerics(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, NoDeterministicKernel(), tiny_contract, tiny_model_bounds, "cpu")
    assert [c.name for c in result.failures] == [model_gate.REPEATED]
    assert REASON in result.summary() and "README: Repeatability" in result.summary()
    numbers = [c for c in result.checks if c.kind == "relative_l2"]
    assert numbers and all(c.passed for c in numbers), "the provider's arithmetic: its numerics pass"


def test_a_variant_without_one_is_judged_by_its_numerics_alone(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, NoDeterministicKernel(), tiny_contract, tiny_model_bounds, "cpu", repeat=False)
    assert result.passed, result.report()
    assert model_gate.REPEATED not in {c.name for c in result.checks}
    assert result.context["repeatability"].startswith("not run: a provider variant with no deterministic kernel")


def test_a_crash_without_determinism_stays_the_candidates_error(tiny, tiny_contract, tiny_model_bounds):
    class Crashing(NoDeterministicKernel):
        name = "crashing"
        ops = dataclasses.replace(NoDeterministicKernel.ops, attention=lambda *args: 1 / 0)

    with pytest.raises(Exception, match="candidate crashing failed in the whole-model run: ZeroDivisionError"):
        model_gate.check(tiny, Crashing(), tiny_contract, tiny_model_bounds, "cpu")


def test_the_block_gate_names_it(tiny, tiny_contract, tmp_path):
    frozen = bounds.load(bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "block0"), "block", tiny.identity, "cpu")
    result = block_gate.check(tiny, NoDeterministicKernel(), tiny_contract, frozen, "cpu", 0, tmp_path)
    assert [c.name for c in result.failures] == ["candidate[replayed twice]"]
    assert REASON in result.summary()


def test_the_kernel_gate_names_it():
    def attention(q, k, v):
        if torch.are_deterministic_algorithms_enabled():
            raise RuntimeError("No available kernel. Aborting execution.")
        return op_registry.attention(q, k, v)

    candidate = ProviderCandidate().with_kernel_ops({"attention": attention})
    result = kernel_gate.check(candidate, "attention", "cpu", dtypes=("bfloat16",), max_examples=1, shrink=False)
    assert not result.passed and {c.kind for c in result.failures} == {"determinism"}
    assert REASON in result.summary()


def test_the_power_gate_runs_a_variant_without_one_once(tiny, monkeypatch, tmp_path):
    """A variant whose mode has no deterministic kernel meets the model gate with ``repeat`` off; one that has, on."""
    monkeypatch.setattr(numerics, "_CPU_VARIANTS", tuple(
        dataclasses.replace(mode, deterministic=mode.name != "sdpa-math") for mode in numerics._CPU_VARIANTS))
    seen = {}
    check = model_gate.check_item

    def spied(run, frozen):
        seen[run.candidate.name] = run.repeat
        return check(run, frozen)

    monkeypatch.setattr(model_gate, "check_item", spied)
    report = power.measure(tiny, "cpu", THRESHOLDS, tmp_path, ProviderCandidate(), mutants=(), gates=("model",),
                           variants=["sdpa-math", "threads-1"])
    assert seen == {"variant:sdpa-math": False, "variant:threads-1": True}
    assert report.passed, report.table()



def test_the_kernel_gate_tells_a_one_off_crash_from_a_missing_kernel():
    """A call that raised once under torch's deterministic algorithms and not again (a compiler killed mid-build,
    say) is the op's error, not a backend without a deterministic kernel."""
    calls = []

    def attention(q, k, v):
        calls.append(torch.are_deterministic_algorithms_enabled())
        if len(calls) == 1:
            raise RuntimeError("PTXAS error: `ptxas` failed with error code -15")
        return op_registry.attention(q, k, v)

    candidate = ProviderCandidate().with_kernel_ops({"attention": attention})
    result = kernel_gate.check(candidate, "attention", "cpu", dtypes=("bfloat16",), max_examples=1, shrink=False)
    assert [c.kind for c in result.failures] == ["error"], result.report()
    reason = result.failures[0].detail["reason"]
    assert "raised RuntimeError: PTXAS error" in reason and "once: the same run ran the next time" in reason
    assert "no deterministic kernel" not in result.report()


ONCE = "the candidate raised RuntimeError: PTXAS error: `ptxas` failed with error code -15; once: the same run ran the " \
       "next time, under torch's deterministic algorithms too"


def test_the_model_gate_tells_a_one_off_crash_from_a_missing_kernel(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, RaisesOnce(), tiny_contract, tiny_model_bounds, "cpu")
    assert [(c.name, c.kind) for c in result.failures] == [(model_gate.REPEATED, "error")], result.report()
    assert ONCE in result.summary() and "no deterministic kernel" not in result.report()


def test_the_block_gate_tells_a_one_off_crash_from_a_missing_kernel(tiny, tiny_contract, tmp_path):
    frozen = bounds.load(bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "block0"), "block", tiny.identity, "cpu")
    result = block_gate.check(tiny, RaisesOnce(), tiny_contract, frozen, "cpu", 0, tmp_path)
    assert [(c.name, c.kind) for c in result.failures] == [("candidate[replayed twice]", "error")], result.report()
    assert ONCE in result.summary() and "no deterministic kernel" not in result.report()
