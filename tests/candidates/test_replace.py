"""A candidate from a partial op table: the provider everywhere else, typed options, identity that pins its code."""

from pathlib import Path

import pytest
import torch.nn.functional as F

from h3gate import candidates, op_registry
from h3gate.candidates import CandidateError, Option, ReplacedCandidate, replace
from h3gate.cli import main


def swiglu(h, *, slope=1.0):
    a, gate = h.chunk(2, dim=-1)
    return a * F.silu(gate * slope)


def _swiglu_ops(slope):
    return {"swiglu": lambda h: swiglu(h, slope=slope)}


SWIGLU = replace("my-swiglu", _swiglu_ops, supports={"dtypes": ["bfloat16"]},
                 options={"slope": Option(float, 1.0, "gate slope of the kernel")})


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(candidates, "_registered", {"my-swiglu": SWIGLU})


def test_every_op_it_does_not_replace_is_the_providers(registered):
    candidate = candidates.load("my-swiglu:slope=2")
    assert isinstance(candidate, ReplacedCandidate)
    ops = candidate.kernel_ops()
    provider = op_registry.provider_ops()
    assert all(ops[name] is provider[name] for name in provider if name != "swiglu")
    assert ops["swiglu"] is not provider["swiglu"]
    assert candidate.options == {"slope": 2.0}


def test_options_are_typed_and_checked(registered):
    with pytest.raises(CandidateError, match=r"option slope='steep' is not a float: gate slope of the kernel"):
        candidates.load("my-swiglu:slope=steep")
    with pytest.raises(CandidateError, match=r"takes no option\(s\) \['block'\].*its options: slope"):
        candidates.load("my-swiglu:block=64")


def test_claims_only_the_replaced_ops_at_the_declared_dtypes(registered):
    candidate = candidates.load("my-swiglu")
    assert candidate.unclaimed("swiglu", "bfloat16") is None
    assert "supports swiglu in bfloat16 only" in candidate.unclaimed("swiglu", "float32")
    assert "does not replace attention" in candidate.unclaimed("attention", "bfloat16")
    assert candidates.ProviderCandidate().unclaimed("attention", "float32") is None


def test_identity_pins_the_package_of_every_installed_function():
    from_distribution = replace("registry-swiglu", {"swiglu": op_registry.swiglu})()
    (package,) = from_distribution.identity()["packages"]
    assert package["distribution"] == "pytest-h3" and package["version"]
    assert package["package"] == "h3gate" and package["source_sha256"] == candidates.source_digest(
        Path(op_registry.__file__).parent)
    here = replace("local", {"swiglu": swiglu})().identity()
    assert here["replaced_ops"] == ["swiglu"]
    (package,) = here["packages"]
    assert package["distribution"] is None and package["source_sha256"] == candidates.source_digest(__file__)


@pytest.mark.parametrize(
    "ops, supports, message",
    [
        ({"softmax": swiglu}, {}, r"replaces unknown op\(s\) \['softmax'\]; ops: linear"),
        ({}, {}, r"replaces unknown op\(s\) none"),
        ({"swiglu": swiglu}, {"heads": [1]}, r"unknown support key\(s\) \['heads'\]; keys: dtypes, head_dim"),
        ({"swiglu": swiglu}, {"head_dim": [0]}, r"supports head_dim \[0\]: give a list of head sizes"),
        ({"swiglu": swiglu}, {"dtypes": ["bf16"]}, r"supports dtypes \['bf16'\]: give a list of torch dtype names"),
    ],
)
def test_a_bad_table_is_refused_where_it_is_declared(ops, supports, message):
    with pytest.raises(CandidateError, match=message):
        replace("bad", ops, supports=supports)


def test_cli_lists_ops_supports_and_options(registered, capsys):
    assert main(["candidates"]) == 0
    out = capsys.readouterr().out
    assert "my-swiglu\n  ops: swiglu (at the default options)\n  supports: dtypes=bfloat16\n" in out
    assert "  option slope (float, default 1.0): gate slope of the kernel" in out
    assert "h3_triton\n  Triton kernels for every op of the MiniMax-H3 block; provider_groups (a+b) run as the provider." \
        "\n  supports: dtypes=bfloat16+float32; head_dim=32+64+128\n  option provider_groups (default '')\n" in out
    assert "mutant\n  mutant:<name>: the base candidate with one op replaced by its mutant." in out
    assert "provider\n  The provider itself: the block program over the provider's ops" in out
