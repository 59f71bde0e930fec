"""The op contract where the model runs: the first call of each op in every run of a candidate is held to the
provider's dtype, shape, device, owned memory and unchanged inputs (:mod:`h3gate.candidates.op_invariants`), so a kernel that
breaks it at the model's own shapes gets a verdict naming the op, not a crash in the next op."""

import json

import pytest
import torch

from h3gate import op_registry
from h3gate.candidates import CandidateError, ProviderCandidate, op_invariants, replace
from h3gate.gates import kernel as kernel_gate, model as model_gate


def in_place_residual(residual, gate, y, idx=None):
    """Adds into its input and returns it, as a Triton kernel writing its output over ``residual`` would."""
    result = op_registry.gated_residual(residual, gate, y, idx)
    residual.data.copy_(result.detach())
    return residual


def float32_swiglu(h):
    return op_registry.swiglu(h).float()


def aliased_swiglu(h):
    """Writes its result into the first half of ``h`` and returns that view (a kernel reusing its input buffer)."""
    result = op_registry.swiglu(h)
    out = h[..., : result.shape[-1]]
    out.data.copy_(result.detach())
    return out


@pytest.mark.parametrize("op, kernel, breach", [
    ("gated_residual", in_place_residual, r"gated_residual broke the op contract on its first call of the run: "
                                          r"changed its input\(s\) argument 0 in place"),
    ("swiglu", float32_swiglu, r"swiglu broke the op contract .*: dtype float32, provider's bfloat16 \(shape "),
    ("swiglu", aliased_swiglu, r"swiglu broke the op contract .*: (changed its input|shares storage with input)"),
])
def test_the_model_gate_names_an_op_that_breaks_its_contract(tiny, tiny_contract, tiny_model_bounds, op, kernel, breach):
    with pytest.raises(CandidateError, match=breach):
        model_gate.check(tiny, replace("breaks-contract", {op: kernel})(), tiny_contract, tiny_model_bounds, "cpu")


def test_a_kernel_keeping_the_contract_passes_it(tiny, tiny_contract, tiny_model_bounds):
    result = model_gate.check(tiny, replace("keeps-contract", {"swiglu": op_registry.swiglu})(), tiny_contract,
                              tiny_model_bounds, "cpu")
    assert result.passed, result.report()


def test_each_ops_first_call_alone_is_held_and_counted():
    """A held call runs the provider's op beside the kernel: :func:`op_invariants.calls_held` lets a caller
    measuring memory tell those calls apart."""
    def breach(op, problem):
        raise AssertionError(f"{op}: {problem}")

    checked = op_invariants.first_calls_checked({"swiglu": lambda h: op_registry.swiglu(h)},
                                                op_registry.provider_ops(), breach)
    h = torch.randn(2, 16)
    before = op_invariants.calls_held()
    checked["swiglu"](h)
    assert op_invariants.calls_held() == before + 1
    checked["swiglu"](h)
    assert op_invariants.calls_held() == before + 1


BROKEN = '''
from h3gate import candidates, op_registry


def float32_swiglu(h):
    return op_registry.swiglu(h).float()


candidates.register("float32-swiglu", candidates.replace("float32-swiglu", {"swiglu": float32_swiglu}))
'''

GATE = '''
import pytest
import torch


@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
'''


def test_through_pytest_a_breach_is_the_gates_failed_verdict(pytester):
    import shutil

    from conftest import THRESHOLDS

    shutil.copytree(THRESHOLDS, pytester.path / "thresholds")
    pytester.makeconftest(BROKEN)
    pytester.makepyfile(test_model_contract=GATE)
    run = pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=float32-swiglu", "-m", "gate")
    run.assert_outcomes(failed=1)
    run.stdout.fnmatch_lines(["*model gate FAILED 1/1 checks; worst candidate: error: candidate float32-swiglu: "
                              "swiglu broke the op contract*dtype float32*"])
    (result,) = json.loads((pytester.path / "h3-out" / "results.json").read_text())["results"].values()
    assert not result["passed"] and result["checks"][0]["kind"] == "error"


def even_rows_only(h):
    """A SwiGLU kernel for an even number of rows; the others it declines to the provider."""
    return op_registry.swiglu(h) if h.shape[-2] % 2 == 0 else NotImplemented


def test_the_kernel_gate_qualifies_the_shapes_a_kernel_takes_and_records_those_it_declines():
    from h3gate.gates import NotClaimed, kernel as kernel_gate

    result = kernel_gate.check(replace("even-rows", {"swiglu": even_rows_only})(), "swiglu", "cpu",
                               dtypes=("bfloat16",), max_examples=4, shrink=False)
    kinds = {check.kind for check in result.checks}
    assert result.passed and "declined" in kinds and "max_abs" in kinds, result.report()
    with pytest.raises(NotClaimed, match="swiglu declined every shape the kernel gate drew"):
        kernel_gate.check(replace("declines", {"swiglu": lambda h: NotImplemented})(), "swiglu", "cpu",
                          dtypes=("bfloat16",), max_examples=2, shrink=False)


def test_a_block_replayed_twice_must_repeat_its_errors_bitwise():
    from h3gate.verdict import repeatability

    assert repeatability("twice", {"a": 0.5, "b": 0.25}, {"a": 0.5, "b": 0.25}).passed
    varying = repeatability("twice", {"a": 0.5, "b": 0.25}, {"a": 0.5, "b": 0.25000000000000006})
    assert not varying.passed and varying.detail["reason"] == "1 taps differ between two identical runs: ['b']"
    assert not repeatability("twice", {"a": {"relative_l2": 0.5}}, {"a": {"relative_l2": 0.5000001}}).passed


class Alternating:
    """SwiGLU whose every other call rounds one element the other way: a kernel whose additions race (atomics)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, h):
        out = op_registry.swiglu(h)
        self.calls += 1
        if self.calls % 2:
            first = out.detach().view(-1)[0]
            step = torch.zeros_like(out)
            step.view(-1)[0] = torch.nextafter(first, torch.tensor(float("inf"), dtype=out.dtype)) - first
            out = out + step
        return out


def test_the_block_gate_fails_a_block_whose_two_replays_differ(tiny, tiny_contract, tmp_path):
    from conftest import THRESHOLDS
    from h3gate import bounds
    from h3gate.gates import block as block_gate

    frozen = bounds.load(bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "block0"), "block", tiny.identity, "cpu")
    result = block_gate.check(tiny, replace("racy", {"swiglu": Alternating()})(), tiny_contract, frozen, "cpu", 0,
                              tmp_path)
    (repeat,) = [check for check in result.checks if check.kind == "determinism"]
    assert not repeat.passed and "differ between two identical runs" in repeat.detail["reason"], result.report()
    steady = block_gate.check(tiny, replace("steady", {"swiglu": op_registry.swiglu})(), tiny_contract, frozen, "cpu",
                              0, tmp_path)
    assert steady.passed, steady.report()


def test_the_model_gate_fails_a_model_whose_two_runs_differ(tiny, tiny_contract, tiny_model_bounds):
    from h3gate.gates import model as model_gate

    result = model_gate.check(tiny, replace("racy", {"swiglu": Alternating()})(), tiny_contract, tiny_model_bounds, "cpu")
    (repeat,) = [check for check in result.checks if check.kind == "determinism"]
    assert repeat.name == "candidate[run twice]" and not repeat.passed, result.report()
    steady = model_gate.check(tiny, replace("steady", {"swiglu": op_registry.swiglu})(), tiny_contract,
                              tiny_model_bounds, "cpu")
    assert steady.passed, steady.report()


def test_a_kernel_op_that_breaks_its_caller_gets_a_verdict_naming_the_op():
    """An output detached from autograd (a kernel's Function that forgot its backward) is the op's verdict, not a
    RuntimeError of the item."""
    def attention(q, k, v):
        return op_registry.attention(q, k, v).detach()

    candidate = ProviderCandidate().with_kernel_ops({"attention": attention})
    result = kernel_gate.check(candidate, "attention", "cpu", dtypes=("bfloat16",), max_examples=1, shrink=False)
    assert {c.kind for c in result.failures} == {"error"}
    assert "the candidate's attention raised RuntimeError: element 0 of tensors does not require grad" in \
        result.summary() and "detached from autograd" in result.summary()
