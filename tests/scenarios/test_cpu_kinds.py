"""The committed CPU bounds do not depend on the CPU kind that froze them.

Users run the gates on AVX2 laptops and AVX-512 or AMX servers, whose bf16 (and some fp32) kernels give other bits. So
the block, model and generation gates of the tiny model, and the edge preset's block and model gates, run here under
other ATen dispatch levels than this machine's own (``ATEN_CPU_CAPABILITY``, read when torch loads, so each level runs
in a subprocess of its own; oneDNN limited to AVX2 too) against the committed bounds and their frozen captures: weights, contract inputs and captures
must be bitwise those the bounds were frozen with, and the ensemble rule's margin must absorb the rest. The
generation gate runs its preflight contract: the same pipeline as the full one in one transformer call, gated on both
rules (the full contract gates on the fixed rule: its calibrated SSIM bound lies inside the provider's own spread
across CPU kinds, README "Gating rules").
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from h3gate.evidence.signing import open_envelope


# The gate items each model runs under another level: tiny's block, model and generation preflight; edge's (batch 2,
# widths that are not powers of two) block and model, the only gates it ships bounds for.
ITEMS = {
    "tiny": ["tests/gates/test_block.py::test_block[block0]", "tests/gates/test_block.py::test_block[block1]",
             "tests/gates/test_generation.py::test_generation_preflight[seed42]", "tests/gates/test_model.py::test_model"],
    "edge": ["tests/gates/test_block.py::test_block[block0]", "tests/gates/test_model.py::test_model"],
}


@pytest.mark.parametrize("model", ITEMS)
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_gates_pass_under_another_cpu_dispatch_level(capability, model, tmp_path):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "ONEDNN_MAX_CPU_ISA": "AVX2", "TRITON_INTERPRET": "1"}
    command = [
        sys.executable, "-m", "pytest", "-m", "gate", *sorted({item.split("::")[0] for item in ITEMS[model]}),
        "-k", "block or model or preflight", f"--h3-model={model}", "--h3-device=cpu", f"--h3-out={tmp_path}",
        "-p", "no:xdist", "-q",
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    statement = json.loads(open_envelope(tmp_path).payload)
    environments = list(statement["predicate"]["h3"]["environments"].values())
    assert [e["cpu_capability"] for e in environments] == [capability.upper()], "the level was not in effect"
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert sorted(results) == ITEMS[model]
    assert all(result["passed"] for result in results.values())


def test_the_compiled_variant_is_offered_only_at_atens_own_level():
    """Under a level forced by ATEN_CPU_CAPABILITY inductor's C++ code does not build (default) or computes NaN (avx2
    on an AVX-512 machine): power and freezes must not offer `compiled` there. At ATen's own level (here a vector one)
    it is offered."""
    import torch

    code = "from h3gate import numerics; print(','.join(mode.name for mode in numerics.variants('cpu')))"
    native = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}

    def offered(env):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    plain = "sdpa-math,sdpa-flash,threads-1"
    forced = {level: offered({**native, "ATEN_CPU_CAPABILITY": level}) for level in ("default", "avx2")}
    assert forced == {"default": plain, "avx2": plain}
    if "ATEN_CPU_CAPABILITY" not in os.environ and torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        assert offered(native) == plain + ",compiled"
