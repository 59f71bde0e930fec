"""The model gate: the whole transformer, forward and backward, against frozen ensemble bounds."""

import pytest


@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
