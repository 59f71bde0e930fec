"""The generation gate: the whole pipeline per seed, candidate against provider, under fixed and calibrated bounds."""

import pytest


@pytest.mark.h3_gate("generation", seeds=[42, 43, 44])
def test_generation(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
