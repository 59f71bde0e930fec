"""The block gate: each block replayed alone, every internal tap, with op-group attribution and the ULP sweep."""

import pytest


@pytest.mark.h3_gate("block", blocks="all")
def test_block(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
