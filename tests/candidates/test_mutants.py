"""The mutant catalogue: each mutant differs from its base, the gates meant for it catch it, the block gate's
attribution names its op group; and over the product's own kernels the model gate fails three of them."""

import pytest
import torch

from h3gate import op_registry
from h3gate.candidates import CandidateError, ProviderCandidate, load
from h3gate.candidates.mutants import MUTANTS, MutantCandidate, _EditGradient
from h3gate.gates import block as block_gate, kernel as kernel_gate, model as model_gate
from mutant_triggers import TRIGGERS  # mutants only the shipped model's examples reach: tested there

GROUP_OF_OP = {op.name: op.group for op in op_registry.OPS}


@pytest.fixture(scope="module")
def tiny_block0(tiny, tiny_contract):
    from conftest import THRESHOLDS
    from h3gate import bounds

    return bounds.load(bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "block0"), "block", tiny.identity, "cpu")


def test_every_mutant_names_its_gates_and_documents_its_bug():
    assert len(MUTANTS) >= 12
    for mutant in MUTANTS.values():
        assert mutant.caught_by and set(mutant.caught_by) <= {"kernel", "block", "model", "generation"}
        assert mutant.description, f"{mutant.name} needs a docstring saying what the bug is"
        assert "kernel" in mutant.caught_by, "every bug of one op is the kernel gate's to catch first"


def test_mutants_are_candidates_by_name():
    candidate = load("mutant:dropped-key-tile")
    assert candidate.name == "mutant:dropped-key-tile" and candidate.identity()["base"] == "h3_triton"
    with pytest.raises(ValueError, match="unknown mutant 'nope'"):
        load("mutant:nope")


@pytest.mark.parametrize("name", [n for n, m in MUTANTS.items() if "block" in m.caught_by])
def test_block_attribution_points_at_the_broken_group(name, tiny, tiny_contract, tiny_block0, tmp_path):
    mutant = MutantCandidate(name, ProviderCandidate())
    result = block_gate.check(tiny, mutant, tiny_contract, tiny_block0, "cpu", 0, tmp_path)
    assert not result.passed
    attribution = result.metrics["attribution"]
    assert attribution["attributed_group"] == GROUP_OF_OP[mutant.mutant.op], attribution["worst_ratio"]
    (consistency,) = [c for c in result.checks if c.kind == "self_consistency"]
    assert consistency.passed, "with every group as the provider the hybrid is bitwise the provider"


# Over h3_triton itself (under Triton's interpreter): three realistic kernel bugs the model gate must reject,
# and the kernel gate too.
PRODUCT_MUTANTS = ("dropped-key-tile", "rope-wrong-half", "wrong-modality-row")


def _model_gate_rejects(tiny, candidate, contract, frozen) -> bool:
    """A failed verdict, or the refusal of non-finite output (a NaN is rejected before any bound)."""
    try:
        return not model_gate.check(tiny, candidate, contract, frozen, "cpu").passed
    except CandidateError as error:
        return "non-finite" in str(error)


@pytest.mark.parametrize("name", PRODUCT_MUTANTS)
def test_model_and_kernel_gates_reject_broken_h3_triton(name, tiny, tiny_contract, tiny_model_bounds):
    mutant = MutantCandidate(name, "h3_triton")
    assert _model_gate_rejects(tiny, mutant, tiny_contract, tiny_model_bounds)
    kernel = kernel_gate.check(mutant, mutant.mutant.op, "cpu", max_examples=2, shrink=False)
    assert not kernel.passed, kernel.summary()


def _changes(mutant, base, dims, generator) -> bool:
    spec = kernel_gate.OP_SPECS[mutant.op]
    built = spec.build(dims, torch.float32, generator)
    args = {k: (v.float().requires_grad_(k in built["grads"]) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in built["args"].items()}
    broken = mutant.wrap(base[mutant.op])
    plain, bad = base[mutant.op](**args), broken(**args)
    plain_grads = torch.autograd.grad(plain.sum(), [args[n] for n in built["grads"]])
    bad_grads = torch.autograd.grad(bad.sum() if bad.isfinite().all() else bad.nan_to_num().sum(), [args[n] for n in built["grads"]], allow_unused=True)
    differs = not torch.equal(plain, bad) or any(b is None or not torch.equal(a, b) for a, b in zip(plain_grads, bad_grads))
    if mutant.name == "nondeterministic-table-grad":
        again = torch.autograd.grad(broken(**args).sum(), [args[n] for n in built["grads"]])
        differs = any(not torch.equal(a, b) for a, b in zip(bad_grads, again))
    return differs


def test_each_mutant_changes_its_op():
    """At the op's block layout example or its first edge example (shape-conditional mutants differ only there).
    Contract mutants compute their base's values and gradients: what they change, the contract checks show."""
    generator = torch.Generator().manual_seed(0)
    base = ProviderCandidate().kernel_ops()
    for mutant in (m for m in MUTANTS.values() if m.name not in CONTRACT_ONLY and m.name not in TRIGGERS
                   and m.name != "swiglu-output-reused"):
        spec = kernel_gate.OP_SPECS[mutant.op]
        shapes = (spec.examples[0], kernel_gate.edge_examples(spec, kernel_gate.INTERPRETER_LIMITS)[0])
        assert any(_changes(mutant, base, dims, generator) for dims in shapes), \
            f"{mutant.name} computes exactly what its base computes"


def test_kernel_gate_always_runs_the_tile_edges():
    """Besides its draws and the block layout, every search runs the edge examples: batch 2, odd widths, partial
    last tiles, the last AdaLN table row alone on its row."""
    spec = kernel_gate.OP_SPECS["gated_residual"]
    edges = kernel_gate.edge_examples(spec, kernel_gate.INTERPRETER_LIMITS)
    assert [e["rows"] for e in edges] == [129, 131, 255] and all(e["batch"] == 2 and e["c"] % 2 for e in edges)
    built = spec.build(edges[0], torch.float32, torch.Generator().manual_seed(0))
    idx = built["args"]["idx"]
    assert idx[-1] == edges[0]["table_rows"] - 1 and (idx[:-1] < idx[-1]).all()
    result = kernel_gate.check(ProviderCandidate(), "gated_residual", "cpu", dtypes=("float32",), max_examples=1)
    tiers = kernel_gate.tier_examples(spec)
    assert result.passed and result.metrics["examples"] == 1 + len(spec.examples) + len(edges) + len(tiers)
    gpu = kernel_gate.edge_examples(kernel_gate.OP_SPECS["linear"], kernel_gate.GPU_LIMITS)
    assert gpu[-1]["rows"] == gpu[-1]["k"] >= 8192, "long reductions run on the GPU"


def test_kernel_gate_gates_no_relative_error_of_a_reference_that_is_rounding_residue():
    """With one key, dq and dk are zero in exact arithmetic and ~1e-16 in float64: relative L2 against that residue
    reached 1e9 for h3_triton's float32 grad_q. Max abs at the op's scale decides; a real error there still fails."""
    spec = kernel_gate.OP_SPECS["attention"]
    dims = {"rows": 1, "heads": 2, "head_dim": 32, "batch": 2, "peak": 4.0}
    ops = load("h3_triton").kernel_ops()
    checks = kernel_gate.evaluate(spec, ops["attention"], dims, torch.float32, "cpu", seed=0)
    kinds = {(c.detail["output"], c.kind) for c in checks}
    assert ("grad_q", "relative_l2") not in kinds and ("grad_k", "relative_l2") not in kinds
    assert {("grad_q", "max_abs"), ("grad_v", "relative_l2"), ("out", "relative_l2")} <= kinds
    assert all(c.passed for c in checks), [c.line() for c in checks if not c.passed]

    def noisy(q, k, v):  # dq off by 1e-3 everywhere: about 1e-3 of the op's scale
        return ops["attention"](_EditGradient.apply(q, lambda g: g + 1e-3), k, v)

    (grad_q,) = [c for c in kernel_gate.evaluate(spec, noisy, dims, torch.float32, "cpu", seed=0)
                 if (c.detail["output"], c.kind) == ("grad_q", "max_abs")]
    assert not grad_q.passed, grad_q.line()


def test_kernel_gate_bias_passes_the_provider_and_catches_a_truncating_store():
    """A store that truncates is within 2 x torch's error + 2 ULP in relative L2 and max abs (half an ULP on average),
    but its error is one-sided; rounding to nearest, torch's own, is not."""
    provider = kernel_gate.check(ProviderCandidate(), "swiglu", "cpu", max_examples=2, shrink=False)
    assert provider.passed and any(c.kind == "bias" for c in provider.checks), provider.summary()
    spec = kernel_gate.OP_SPECS["swiglu"]
    dims = kernel_gate.edge_examples(spec, kernel_gate.INTERPRETER_LIMITS)[0]
    truncated = MUTANTS["swiglu-output-truncated"].wrap(ProviderCandidate().kernel_ops()["swiglu"])
    checks = kernel_gate.evaluate(spec, truncated, dims, torch.bfloat16, "cpu", seed=0)
    failed = {(c.detail["output"], c.kind) for c in checks if not c.passed}
    assert failed == {("out", "bias")}, [c.line() for c in checks]


# Mutants that only the kernel gate catches, with the check that does: bias (a truncating store) or an
# edge example (a shape the tiny model never runs).
KERNEL_ONLY = {
    "swiglu-output-truncated": "bias",
    "rms-output-truncated": "bias",
    "dq-truncated": "bias",
    "weight-grad-truncated": "bias",
    "key-tail-grad-dropped": "rows=129",
    "norm-weight-grad-first-batch": "batch=2",
    "last-row-neighbour-gate": "table_rows",
    "gate-grad-first-batch": "batch=2",
    "batch-keys-shared": "batch=2",
    "width-tail-zeroed": "f=65",
    "attention-output-truncated": "bias",
    "adaln-weight-grad-truncated": "bias",
}


def _kernel_gate_failures(name: str) -> list:
    """The failed checks of the kernel gate on a mutant of the provider that only the kernel gate is meant to catch."""
    mutant = MutantCandidate(name, ProviderCandidate())
    assert mutant.mutant.caught_by == ("kernel",)
    result = kernel_gate.check(mutant, mutant.mutant.op, "cpu", max_examples=2, shrink=False)
    return [c for c in result.checks if not c.passed]


@pytest.mark.parametrize("name", KERNEL_ONLY)
def test_kernel_gate_catches_bias_and_shape_conditional_mutants(name):
    failures = _kernel_gate_failures(name)
    assert failures and all(KERNEL_ONLY[name] == c.kind or KERNEL_ONLY[name] in c.name for c in failures), \
        [c.line() for c in failures]


def test_kernel_gate_of_one_dtype_says_so_and_checks_only_it():
    result = kernel_gate.check(ProviderCandidate(), "swiglu", "cpu", dtypes=("float32",), max_examples=1)
    assert result.params == {"op": "swiglu", "dtype": "float32"}
    assert {c.detail["dtype"] for c in result.checks} == {"float32"}
    with pytest.raises(ValueError, match="give one or more of bfloat16, float32"):
        kernel_gate.check(ProviderCandidate(), "swiglu", "cpu", dtypes=("float16",))


# Mutants whose values and gradients are their base's, with the contract checks that alone catch them.
CONTRACT_ONLY = {
    "residual-in-place": {"inputs_unchanged", "output_contract"},  # the residual overwritten, and returned
    "rms-output-float32": {"output_contract"},  # float32 where the provider's output is bfloat16
    "single-key-returns-v": {"output_contract"},  # the output aliases v
}


@pytest.mark.parametrize("name", CONTRACT_ONLY)
def test_kernel_gate_catches_op_contract_breaches(name):
    failures = _kernel_gate_failures(name)
    assert {c.kind for c in failures} == CONTRACT_ONLY[name], [c.line() for c in failures]
    # One line naming the op, the shape, the dtype, the output or input and what differed.
    line = failures[0].line()
    assert line.startswith(f"{MUTANTS[name].op}[") and "rows=" in line and "float" in line and "shape (" in line, line


@pytest.mark.parametrize("candidate", ["provider", "h3_triton"])
def test_op_contract_checks_pass_the_provider_and_h3_triton(candidate):
    """Every op at its first edge example (odd widths, batch 2) in bfloat16: a contract check per output and
    gradient, one on the inputs, and all pass."""
    ops = load(candidate).kernel_ops()
    for op, spec in kernel_gate.OP_SPECS.items():
        dims = kernel_gate.edge_examples(spec, kernel_gate.INTERPRETER_LIMITS)[0]
        checks = kernel_gate.evaluate(spec, ops[op], dims, torch.bfloat16, "cpu", seed=0)
        contract = [c for c in checks if c.kind in ("output_contract", "inputs_unchanged", "determinism")]
        assert {c.kind for c in contract} == {"output_contract", "inputs_unchanged", "determinism"}, op
        assert all(c.passed for c in contract), [c.line() for c in contract if not c.passed]
