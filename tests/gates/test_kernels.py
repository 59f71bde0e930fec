"""The kernel gate: every op of the candidate alone, forward and all gradients, over hypothesis-drawn shapes."""

import pytest

from h3gate.gates.kernel import OPS


@pytest.mark.h3_gate("kernel", ops=list(OPS))
def test_kernel(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
