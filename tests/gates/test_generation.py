"""The generation gate: the whole pipeline per seed, candidate against provider, under fixed and calibrated bounds."""

import pytest


@pytest.mark.h3_gate("generation", seeds=[42, 43, 44])
def test_generation(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()


@pytest.mark.h3_gate("generation", seeds=[42], contract="generation-preflight")
def test_generation_preflight(h3_gate):
    """The preflight contract: the same canvas in a few steps, minutes where the full contract takes hours at release
    size; its bounds are also the power gate's for the generation gate."""
    result = h3_gate.run()
    assert result.passed, result.report()
