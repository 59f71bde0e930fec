"""The kernel gate sees the model that ships: its op calls traced shape-only, narrowed on the CPU with the dims that
select a path kept, its long reductions, its layouts, ranges and grad modes; and the mutants only those reach."""

import pytest
import torch

from conftest import THRESHOLDS
from mutant_triggers import TRIGGERS
from h3gate import op_calls
from h3gate.candidates import ProviderCandidate
from h3gate.candidates.mutants import MutantCandidate
from h3gate.gates import kernel as kernel_gate


@pytest.fixture(scope="module")
def shipped():
    return op_calls.model_calls("tiny", THRESHOLDS) + op_calls.model_calls("release", THRESHOLDS)


def test_release_calls_come_shape_only_with_every_grad_mode():
    calls = op_calls.model_calls("release", THRESHOLDS)
    assert {c.op for c in calls} == set(kernel_gate.OPS)
    assert {c.mode for c in calls} == {op_calls.AUTOGRAD, op_calls.NO_GRAD}
    assert {c.op for c in calls if c.mode == op_calls.NO_GRAD} == set(kernel_gate.OPS)  # the generation step
    attention = [c.arg("q") for c in calls if c.op == "attention"]
    assert {(q.shape[2], q.shape[3]) for q in attention} == {(56, 128)} and max(q.shape[1] for q in attention) == 38733
    assert max(c.arg("weight").shape[0] for c in calls if c.op == "silu_linear") == 96768


@pytest.mark.parametrize("model", ["tiny", "release"])
def test_a_repository_without_the_model_s_contract_traces_the_default_one(model, tmp_path):
    """The kernel gate reads no frozen file: in a repository that froze nothing for the model, its calls come at the
    contract h3gate contracts would write, which for the embedded models is the one this repository ships."""
    assert op_calls.model_calls(model, tmp_path) == op_calls.model_calls(model, THRESHOLDS)
    assert op_calls.model_calls(model, None) == op_calls.model_calls(model, THRESHOLDS)


def test_narrowing_keeps_residues_and_thresholds():
    assert kernel_gate.narrowed(38733, 16) == 29 and 29 % 16 == 38733 % 16
    assert kernel_gate.narrowed(96768, 64, (8192,)) == 8256  # still split K: past two chunks of 4,096
    assert kernel_gate.narrowed(56, 2, (2,)) == 4
    assert kernel_gate.narrowed(31, 16) == 31


def test_interpreter_examples_keep_the_release_widths_heads_and_lengths(shipped):
    def examples(op):
        return kernel_gate.model_examples(kernel_gate.OP_SPECS[op], shipped, "bfloat16", narrow=True)

    assert max(e["c"] for e in examples("rms_norm_modulate")) == 5376
    assert max(e["f"] for e in examples("swiglu")) == 14336
    assert {(e["heads"], e["head_dim"]) for e in examples("qk_norm_rope")} >= {(56, 128)}
    assert max(e.get("rows", 0) for op in kernel_gate.OPS for e in examples(op)) <= 32
    modes = {e["mode"] for op in kernel_gate.OPS for e in examples(op)}
    assert modes == set(op_calls.MODES)
    long = kernel_gate.long_examples(kernel_gate.OP_SPECS["linear"], shipped, "bfloat16")
    assert [(e["rows"], e["k"], e["n"]) for e in long] == [(38733, 24, 24), (24, 14336, 24), (24, 24, 28672)]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_device_reaches_the_release_widths_with_a_small_model(device):
    """A GPU run of tiny keeps tiny's calls whole and narrows the release model's (no GPU holds the release's
    attention reference in float64): the rows wider than 2,048 and the reductions over 38,733 rows are reached on
    every device, not only by a CPU run."""
    run = type("Run", (), {"model_name": "tiny", "thresholds": THRESHOLDS, "device": device, "model": None})()
    calls, shrunk = kernel_gate.shipped_calls(run)
    tiny, release = op_calls.model_calls("tiny", THRESHOLDS), op_calls.model_calls("release", THRESHOLDS)
    assert (calls, shrunk) == ((tiny, release) if device == "cuda" else (tiny + release, ()))
    spec = kernel_gate.OP_SPECS["rms_norm_modulate"]
    shaped = kernel_gate.model_examples(spec, calls, "bfloat16", narrow=device == "cpu", shrunk=shrunk)
    wide = [e for e in shaped if e["c"] == 5376]
    assert wide and max(e["rows"] for e in wide) <= 32
    tiny_rows = {d["rows"] for d in kernel_gate.model_examples(spec, tiny, "bfloat16", narrow=False)}
    assert device == "cpu" or tiny_rows <= {e["rows"] for e in shaped}  # tiny's own calls whole on a GPU
    long = kernel_gate.long_examples(kernel_gate.OP_SPECS["linear"], calls if device == "cpu" else shrunk, "bfloat16")
    assert max(e["rows"] for e in long) == 38733


def test_each_path_class_of_the_release_model_runs_once(shipped):
    release = op_calls.model_calls("release", THRESHOLDS)
    for spec in kernel_gate.OP_SPECS.values():
        shaped = kernel_gate.model_examples(spec, shipped, "bfloat16", narrow=True)
        classes = [kernel_gate.path_class(d) for d in (*spec.examples, *shaped)]
        assert len(classes) == len(set(classes)), spec.op.name
        # The release's own calls; its inference-mode example repeats a no-grad call of its own, which need not be the
        # first of tiny's and the release's together.
        wanted = {kernel_gate.path_class(d) for d in kernel_gate.model_examples(spec, release, "bfloat16", narrow=True)
                  if d["mode"] != op_calls.INFERENCE}
        assert wanted <= set(classes), (spec.op.name, wanted - set(classes))


@pytest.mark.parametrize("name", TRIGGERS)
def test_the_shipped_model_s_triggers_catch_their_mutants(name, shipped):
    mutant = MutantCandidate(name, ProviderCandidate())
    result = kernel_gate.check(mutant, mutant.mutant.op, "cpu", dtypes=("bfloat16",), max_examples=1, shrink=False,
                               calls=shipped)
    failures = [c for c in result.checks if not c.passed]
    assert failures and all(TRIGGERS[name] in c.name or TRIGGERS[name] == c.kind for c in failures), \
        [c.line() for c in failures]


def test_a_second_call_s_output_is_its_own():
    spec = kernel_gate.OP_SPECS["swiglu"]
    dims = {**spec.examples[0], "mode": op_calls.INFERENCE}
    checks = kernel_gate.evaluate(spec, ProviderCandidate().kernel_ops()["swiglu"], dims, torch.bfloat16, "cpu", 0)
    fresh = [c for c in checks if c.kind == "output_fresh"]
    assert fresh and all(c.passed for c in checks), [c.line() for c in checks if not c.passed]
    reused = MutantCandidate("swiglu-output-reused", ProviderCandidate()).kernel_ops()["swiglu"]
    # Under inference mode first: a buffer allocated there must still serve the later calls with autograd.
    for example in (dims, spec.examples[0]):
        failed = [c for c in kernel_gate.evaluate(spec, reused, example, torch.bfloat16, "cpu", 0) if not c.passed]
        assert failed and {c.kind for c in failed} == {"output_fresh"}, [c.line() for c in failed]
