"""diffusers' attention backends as candidates: any installed backend of the dispatcher, qualified on attention."""

import pytest
import torch
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

from h3gate import candidates, gates as registry
from h3gate.candidates import CandidateError, attention_backends
from h3gate.gates import kernel

CPU_BACKENDS = ["native", "_native_math", "_native_flash"]


def test_the_native_backends_are_installed_everywhere():
    assert set(CPU_BACKENDS) <= set(attention_backends.installed())


def test_an_unknown_or_absent_backend_is_one_error_naming_the_installed_ones():
    with pytest.raises(CandidateError, match=r"attention backend 'nope' is not installed here; installed: .*_native_math"):
        candidates.load("attention-backend:name=nope")


def test_the_candidate_runs_attention_through_the_named_backend(monkeypatch):
    calls = []
    math = _AttentionBackendRegistry._backends[AttentionBackendName._NATIVE_MATH]

    def spy(**kwargs):
        calls.append(kwargs["query"].shape)
        return math(**kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, AttentionBackendName._NATIVE_MATH, spy)
    candidate = candidates.load("attention-backend:name=_native_math")
    q = torch.randn(1, 5, 2, 8)
    candidate.kernel_ops()["attention"](q, q, q)
    assert calls == [q.shape]
    identity = candidate.identity()
    assert identity["replaced_ops"] == ["attention"] and identity["options"] == {"name": "_native_math"}
    assert [(p["distribution"], bool(p["version"])) for p in identity["packages"]] == [("diffusers", True)]


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_the_kernel_gate_qualifies_each_cpu_backend_on_attention_only(name):
    run = registry.GateRun("tiny", None, "cpu", None, None, candidate=candidates.load(f"attention-backend:name={name}"),
                           params={"op": "attention", "dtype": "float32"}, kernel_examples=1, kernel_shrink=False)
    result = kernel.check_item(run, None)  # a verdict, whichever: the math backend may differ from the default's
    assert result.checks and {check.detail["dtype"] for check in result.checks} == {"float32"}
    assert result.provenance.candidate["options"] == {"name": name}
    assert result.passed or name != "native"  # native is the provider's own dispatch
    with pytest.raises(registry.NotClaimed, match="does not replace swiglu"):
        kernel.check_item(run.with_params(op="swiglu", dtype="float32"), None)


KERNEL_TEST = '''
import pytest


@pytest.mark.h3_gate("kernel", ops=["attention", "swiglu"], dtypes=["float32"])
def test_kernel(h3_gate):
    assert h3_gate.run().passed
'''


def test_a_backend_is_named_on_the_command_line(pytester):
    (pytester.path / "thresholds").mkdir()
    pytester.makepyfile(test_backend=KERNEL_TEST)
    args = ["-p", "no:cacheprovider", "--h3-device=cpu", "--h3-kernel-examples=1", "-m", "gate", "test_backend.py"]
    pytester.runpytest(*args, "--h3-candidate=attention-backend:name=native").assert_outcomes(passed=1, skipped=1)
    refused = pytester.runpytest(*args, "--h3-candidate=attention-backend:name=nope")
    refused.stderr.fnmatch_lines(["*--h3-candidate=attention-backend:name=nope: attention backend 'nope' is not installed here; installed: *native*"])
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
