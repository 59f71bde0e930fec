"""Gate power: every gate must catch the mutants meant for it and accept every provider variant."""

import pytest


@pytest.mark.h3_gate("power")
def test_power(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report() + "\n" + result.metrics["power_table"]
