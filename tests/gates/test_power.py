"""Gate power: every gate must catch the mutants meant for it and accept every provider variant; one item per gate
measured and kind of subject (mutants, variants), so xdist spreads them."""

import pytest


@pytest.mark.h3_gate("power", gates="all", subjects="all")
def test_power(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report() + "\n" + result.metrics.get("power_table", "")  # none where it could not measure
