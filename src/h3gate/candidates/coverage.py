"""Coverage of replaced ops: how many calls each op of a :func:`h3gate.candidates.replace` candidate served and how
many it handed back to the provider by returning ``NotImplemented``.

A kernel that declines every shape the model has is installed but never runs: the provider's op computes in its
place and every numerical check passes as the provider does. So the gates that run the model or blocks count the
calls of each replaced op per item, record the counts in the result's ``context["coverage"]`` and fail an op that
served none. The counting wrapper returns the kernel's (or the provider's) own result: it changes no bits.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

from h3gate.verdict import Check, GateResult


def _zero(ops) -> dict[str, dict[str, int]]:
    return {op: {"served": 0, "fell_back": 0} for op in sorted(ops)}


class Coverage:
    """Call counts of the replaced ops ``ops`` (op -> served, fell_back), filled by :meth:`counted` wrappers."""

    def __init__(self, ops):
        self.counts = _zero(ops)

    def counted(self, op: str, kernel: Callable, provider: Callable) -> Callable:
        """``kernel`` counted; where it returns ``NotImplemented`` the ``provider``'s op runs on the same arguments."""
        counts = self.counts[op]

        @functools.wraps(kernel)
        def run(*args, **kwargs):
            result = kernel(*args, **kwargs)
            if result is NotImplemented:
                counts["fell_back"] += 1
                return provider(*args, **kwargs)
            counts["served"] += 1
            return result

        return run

    def take(self) -> dict[str, dict[str, int]]:
        """The counts since the last take (a copy), the counters back at zero."""
        taken = {op: dict(count) for op, count in self.counts.items()}
        for count in self.counts.values():
            count.update(served=0, fell_back=0)
        return taken


def total(*counts: dict) -> dict[str, dict[str, int]]:
    """Several count tables (runs of one item) summed op by op."""
    summed = _zero({op for table in counts for op in table})
    for table in counts:
        for op, count in table.items():
            for key in ("served", "fell_back"):
                summed[op][key] += count[key]
    return summed


@contextlib.contextmanager
def counting(candidate):
    """The calls of ``candidate``'s replaced ops made in the body: a dict filled on exit (op -> served, fell_back),
    left empty for a candidate that replaces no ops."""
    coverage: Coverage | None = getattr(candidate, "coverage", None)
    counts: dict = {}
    if coverage is not None:
        coverage.take()  # calls of an earlier item are not this one's
    yield counts
    if coverage is not None:
        counts.update(coverage.take())


def judged(result: GateResult, counts: dict) -> GateResult:
    """``result`` with ``counts`` in its context and a ``coverage.<op>`` check per replaced op: it fails when the op
    served none of its calls. An item that made no call at all (nothing of the candidate ran) checks nothing."""
    if not counts:
        return result
    result.context["coverage"] = counts
    if not any(count["served"] + count["fell_back"] for count in counts.values()):
        return result
    for op, count in counts.items():
        served, fell_back = count["served"], count["fell_back"]
        reason = (f"kernel {'ran' if served else 'never ran'}: {op} served {served} of {served + fell_back} calls "
                  f"({fell_back} fell back to the provider)")
        result.checks.append(Check(f"coverage.{op}", "coverage", float(not served), 0.0, served > 0,
                                   {**count, "reason": reason}))
    return result
