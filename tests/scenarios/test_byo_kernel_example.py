"""The guide's worked example (``examples/byo-kernel``): a distribution of its own whose entry point offers a kernel
as a candidate, qualified by the kernel gate on what it claims.

It is installed the way pip leaves a package, without pip: its ``src`` on ``sys.path`` and a ``.dist-info`` folder
written from its own ``pyproject.toml`` (name, version, entry points). ``importlib.metadata`` then finds its entry
point and distribution as it would after ``pip install``, so the test covers the declaration a user writes, not a
stand-in for it, in a fraction of a second instead of a virtual environment's build."""

import json
import re
import sys
import tomllib

import pytest
import torch
from diffusers.models.normalization import RMSNorm

from conftest import ROOT
from h3gate import candidates
from h3gate.cli import main

EXAMPLE = ROOT / "examples" / "byo-kernel"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = tmp_path / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "top_level.txt").write_text("h3_example_rmsnorm\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
        for group, entries in project["entry-points"].items()
    ))
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.syspath_prepend(str(tmp_path))
    return project


def test_the_entry_point_offers_the_candidate_with_its_declarations(installed, capsys):
    assert main(["candidates"]) == 0
    assert ("example-rmsnorm\n  ops: rms_norm_modulate (at the default options)\n  supports: dtypes=bfloat16\n"
            "  option modulate_in_float32 (bool, default False): apply the AdaLN scale and shift in float32, then round\n  option kernel (str, "
            "default 'stand-in'): the RMSNorm kernel: stand-in or liger (Liger-Kernel, on a GPU)\n") in capsys.readouterr().out


def test_its_identity_pins_the_distribution_and_its_source(installed):
    identity = candidates.load("example-rmsnorm:modulate_in_float32=yes").identity()
    assert identity["replaced_ops"] == ["rms_norm_modulate"] and identity["options"] == {"modulate_in_float32": True, "kernel": "stand-in"}
    assert identity["packages"] == [{
        "package": "h3_example_rmsnorm", "distribution": installed["name"], "version": installed["version"],
        "source_sha256": candidates.source_digest(EXAMPLE / "src" / "h3_example_rmsnorm"),
    }]


LIGER_STAND_IN = '''
import torch


class LigerRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps, offset=0.0, casting_mode="llama", in_place=True):
        assert (offset, casting_mode, in_place) == (0.0, "llama", False)
        x32 = X.float()
        return ((x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(X.dtype) * W).to(X.dtype)
'''


def test_the_liger_kernel_is_called_as_diffusers_norms_and_pinned_beside_the_example(installed, tmp_path, monkeypatch):
    """Liger-Kernel's module layout and signature (liger_kernel 0.8.5), forward only: the real package's kernels
    need a GPU; its identity must name both packages, the adapter's and the kernel library's."""
    package = tmp_path / "liger_kernel"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "rms_norm.py").write_text(LIGER_STAND_IN)
    try:
        candidate = candidates.load("example-rmsnorm:kernel=liger")
        assert [p["package"] for p in candidate.identity()["packages"]] == ["h3_example_rmsnorm", "liger_kernel"]
        norm = RMSNorm(8, eps=1e-6).to(torch.bfloat16).requires_grad_(False)
        norm.weight.normal_()
        x = torch.randn(2, 5, 8, dtype=torch.bfloat16)
        assert torch.equal(candidate.replaced["rms_norm_modulate"](x, norm.weight, norm.eps), norm(x))
    finally:
        for name in [name for name in sys.modules if name.partition(".")[0] == "liger_kernel"]:
            del sys.modules[name]


@pytest.mark.parametrize("spec, message", [
    ("example-rmsnorm:kernel=cuda", "option kernel='cuda': choose one of stand-in, liger"),
    ("example-rmsnorm:kernel=liger", "kernel=liger needs Liger-Kernel: pip install 'h3-example-rmsnorm[liger]'"),
])
def test_a_kernel_it_cannot_run_is_refused_before_any_gate(installed, monkeypatch, spec, message):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed, whatever this machine has
    with pytest.raises(candidates.CandidateError, match=re.escape(message)):
        candidates.load(spec)


KERNEL_GATE = '''
import pytest

from h3gate.gates.kernel import DTYPES, OPS


@pytest.mark.h3_gate("kernel", ops=list(OPS), dtypes=list(DTYPES))
def test_kernel(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
'''


def test_the_kernel_gate_qualifies_what_it_claims_and_names_the_rest(installed, pytester):
    (pytester.path / "thresholds").mkdir()
    pytester.makepyfile(test_example_kernels=KERNEL_GATE)
    run = pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=example-rmsnorm",
                             "--h3-kernel-examples=2", "-m", "gate", "-rs", "test_example_kernels.py")
    run.assert_outcomes(passed=1, skipped=13)
    run.stdout.fnmatch_lines(["*not claimed: candidate example-rmsnorm supports rms_norm_modulate in bfloat16 only*"])
    (result,) = json.loads((pytester.path / "h3-out" / "results.json").read_text())["results"].values()
    assert result["params"] == {"op": "rms_norm_modulate", "dtype": "bfloat16"} and result["passed"]
