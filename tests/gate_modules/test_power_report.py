"""The power report's verdict, apart from the gates it runs (``tests/gates/test_power.py`` runs them all)."""

from h3gate.candidates import ProviderCandidate
from h3gate.gates import power


def _report(**kernel_items) -> power.Report:
    caught = power.Row("mutant:adaln-silu-grad-missing", "mutant", "kernel", True, True, "FAILED")
    return power.Report(rows=[caught], kernel_items=kernel_items)


def test_a_kernel_item_that_rejects_none_of_its_ops_mutants_fails_the_power_gate():
    """A mutant counts as caught when any item of its op fails, so an item that can never fail hides behind its
    sibling dtype: the report names it and fails."""
    blind = _report(**{"silu_linear bfloat16": 2, "silu_linear float32": 0})
    assert not blind.passed and blind.blind_kernel_items == ["silu_linear float32"]
    result = power.as_result(blind, ProviderCandidate())
    assert [check.name for check in result.failures] == ["kernel silu_linear float32"]
    assert result.to_json()["metrics"]["blind_kernel_items"] == ["silu_linear float32"]

    seeing = _report(**{"silu_linear bfloat16": 2, "silu_linear float32": 1})
    assert seeing.passed and power.as_result(seeing, ProviderCandidate()).passed
