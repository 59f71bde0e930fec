"""The kernel gate: every op of the candidate alone, forward and all gradients, over hypothesis-drawn shapes.

One item per op and dtype: a reviewer sees which precision of which op failed, and xdist spreads them.
"""

import pytest

from h3gate.gates.kernel import DTYPES, OPS


@pytest.mark.h3_gate("kernel", ops=list(OPS), dtypes=list(DTYPES))
def test_kernel(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
