"""A candidate whose result varies from call to call fails the kernel gate with the failing call's checks: hypothesis
replays a failing example, and one that passes on the replay is reported as flaky, which must not crash the item."""

from h3gate.candidates import ProviderCandidate
from h3gate.gates import kernel as kernel_gate
from h3gate.verdict import Check


def test_a_failure_that_does_not_reproduce_is_the_candidate_s_verdict(monkeypatch):
    evaluate, calls = kernel_gate.evaluate, []

    def once_racy(spec, fn, dims, dtype, device, seed):
        calls.append(seed)
        checks = evaluate(spec, fn, dims, dtype, device, seed)
        if seed != 0 and calls.count(seed) == 1 and len([s for s in calls if s != 0]) == 1:  # the first drawn example
            return checks + [Check.failed("swiglu.grad_h", "determinism", "two runs on the same inputs differ bitwise",
                                          output="grad_h", dtype="bfloat16")]
        return checks

    monkeypatch.setattr(kernel_gate, "evaluate", once_racy)
    result = kernel_gate.check(ProviderCandidate(), "swiglu", "cpu", dtypes=("bfloat16",), max_examples=3)
    failed = [c for c in result.checks if not c.passed]
    assert [(c.kind, c.name) for c in failed] == [("determinism", "swiglu.grad_h")]
    assert len([s for s in calls if s != 0]) > 1  # hypothesis ran the failing example again and it passed
