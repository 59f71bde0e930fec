"""The op registry is the one list of ops: every op table agrees with it, and an op added to it without an entry in
a table stops that table's module from importing (or, where the table is derived, appears in it)."""

import json
import subprocess
import sys
from dataclasses import fields
from importlib.metadata import entry_points

import pytest

from h3_triton.backend import KERNEL_OPS
from h3gate import bench, block_program, candidates, op_registry
from h3gate.candidates.mutants import MUTANTS
from h3gate.gates import kernel as kernel_gate

NAMES = [op.name for op in op_registry.OPS]


def test_engine_tables_list_the_registry_ops_in_its_order():
    case_ops = list(dict.fromkeys(case.op for case in bench.cases(bench.SMALL, "cpu")))
    assert list(op_registry.provider_ops()) == NAMES
    assert list(kernel_gate.OP_SPECS) == list(kernel_gate.OPS) == NAMES
    assert [spec.op for spec in kernel_gate.OP_SPECS.values()] == list(op_registry.OPS)
    assert case_ops == NAMES
    assert [f.name for f in fields(block_program.Ops)] == NAMES
    assert block_program.OP_GROUPS == tuple(dict.fromkeys(op.group for op in op_registry.OPS))


def test_provider_table_is_the_registry_formulas():
    assert all(op_registry.provider_ops()[op.name] is op.provider for op in op_registry.OPS)
    assert block_program.PROVIDER_OPS.swiglu is op_registry.swiglu
    assert block_program.PROVIDER_OPS.gated_residual is op_registry.gated_residual


@pytest.mark.parametrize("group", block_program.OP_GROUPS)
def test_a_hybrid_of_one_group_swaps_exactly_the_ops_of_that_group(group):
    kernels = block_program.ops_from_kernels({op.name: lambda *args: None for op in op_registry.OPS})
    hybrid = kernels.mixed(block_program.PROVIDER_OPS, [group])
    swapped = [f.name for f in fields(block_program.Ops) if getattr(hybrid, f.name) is not getattr(kernels, f.name)]
    assert swapped == [op.name for op in op_registry.OPS if op.group == group]


def test_h3_triton_offers_every_op():
    assert list(KERNEL_OPS) == NAMES


@pytest.mark.parametrize("name", sorted(ep.name for ep in entry_points(group=candidates.GROUP)))
def test_installed_candidates_offer_only_registry_ops(name):
    spec = f"mutant:{next(iter(MUTANTS))}" if name == "mutant" else name  # a mutant needs its variant
    offered = set(candidates.load(spec).kernel_ops())
    assert offered <= set(NAMES), f"{name} offers ops the registry lacks: {sorted(offered - set(NAMES))}"
    if name in ("provider", "h3_triton", "mutant"):
        assert offered == set(NAMES)


# A fresh interpreter whose registry gained a toy op before anything read it, then imports each module in turn.
_WITH_TOY_OP = """
import importlib, json, sys
from h3gate import op_registry
op_registry.OPS += (op_registry.Op("toy", "toy", lambda x: x),)
outcome = {"provider_ops()": sorted(op_registry.provider_ops())}
for module in sys.argv[1:]:
    try:
        outcome[module] = sorted(getattr(importlib.import_module(module), "OPS", ()))
    except LookupError as error:
        outcome[module] = str(error)
print(json.dumps(outcome))
"""


def test_an_op_missing_from_a_table_fails_where_the_table_is_built():
    modules = ["h3gate.block_program", "h3gate.bench", "h3gate.gates.kernel"]
    run = subprocess.run([sys.executable, "-c", _WITH_TOY_OP, *modules], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    outcome = json.loads(run.stdout)
    assert "toy" in outcome["provider_ops()"], "the provider's table is derived from the registry"
    for module, table in [
        ("h3gate.block_program", "the block program's Ops fields"),
        ("h3gate.bench", "the benchmark's cases"),
        ("h3gate.gates.kernel", "the kernel gate's input draws"),
    ]:
        assert outcome[module].startswith(f"{table}: no entry for op(s) ['toy'];"), outcome[module]
