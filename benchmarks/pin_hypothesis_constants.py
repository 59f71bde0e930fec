"""A pytest plugin (``-p pin_hypothesis_constants``, with this folder on PYTHONPATH) that keeps Hypothesis from mixing
the literals of the process's own modules into its draws.

Hypothesis draws a constant instead of a random value now and then (about one draw in twenty), from a pool it builds
from every literal of every local module in ``sys.modules`` (``hypothesis.internal.conjecture.providers
._get_local_constants``). The kernel gate's examples, derandomized as they are, therefore follow the engine's source
text and whatever the worker happened to import before the item (another gate's modules): a change that only moves
code changes which shapes the kernel gate draws. Pinned to no local constants, the draws follow the test and its
seed alone, so two checkouts' ``make gate`` runs can be compared for what the code does
(``benchmarks/compare_gate_evidence.py``). Global constants (Hypothesis' own list) are kept.
"""

from hypothesis.internal.conjecture import providers


def _no_local_constants():
    return providers.Constants()


providers._get_local_constants = _no_local_constants
