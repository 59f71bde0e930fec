"""Every launch of h3_triton says its path (kernel, tiling, specialisation), and planning a call gives the paths the
same call launches when it runs, without running a kernel."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import h3_triton
from h3_triton import paths
from h3_triton.backend import LAUNCH_PATHS
from h3gate import op_calls
from h3gate.candidates import launch_paths

PACKAGE = Path(h3_triton.__file__).parent


def test_every_launch_passes_the_path_hook():
    """A kernel launched as ``kernel[grid](...)`` anywhere but the hook itself, the launcher and the launch would take
    a path no report sees."""
    direct = re.compile(r"\b\w+\[[^\]\n]+\]\(")
    found = [f"{path.name}: {line.strip()}" for path in sorted(PACKAGE.glob("*.py"))
             if path.name not in ("paths.py", "tuning.py", "launch.py")
             for line in path.read_text().splitlines() if direct.search(line) and not line.lstrip().startswith("#")]
    assert not found, found


def test_nothing_is_noted_unless_asked():
    x = torch.randn(1, 5, 64, dtype=torch.bfloat16)
    h3_triton.backend.KERNEL_OPS["swiglu"](x)
    assert paths._sink is None
    with paths.recording() as launched:
        with pytest.raises(RuntimeError, match="do not nest"):
            with paths.planning():
                pass
    assert launched == []


def _tiny_calls():
    """One call of every op and grad mode of the tiny model, at its own shapes."""
    seen, out = set(), []
    for call in op_calls.model_calls("tiny", None):
        if (call.op, call.mode) not in seen:
            seen.add((call.op, call.mode))
            out.append(call)
    return out


@pytest.mark.parametrize("call", _tiny_calls(), ids=launch_paths.call_label)
def test_planning_a_call_gives_the_paths_running_it_launches(call):
    planned, left = launch_paths.planned(LAUNCH_PATHS, call, "cpu")
    args = launch_paths.call_args(call, "cpu")
    with torch.no_grad():  # values for a real run (AdaLN row indices stay 0, a valid table row)
        for value in args.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                value.normal_()
    with paths.recording() as launched:
        with launch_paths._MODES[call.mode]():
            out = LAUNCH_PATHS.ops[call.op](**args)
        if call.mode == op_calls.AUTOGRAD:
            out.float().sum().backward()
    assert tuple(dict.fromkeys(map(str, launched))) == planned and planned
    assert left == ()  # the tiny model's attention has head_dim 32: no Hopper kernel anywhere


def test_planning_runs_no_kernel(monkeypatch):
    class Refused:
        fn = h3_triton.elementwise._swiglu_forward_kernel.fn

        def __getitem__(self, grid):
            raise AssertionError("planning launched a kernel")

    monkeypatch.setattr(h3_triton.elementwise, "_swiglu_forward_kernel", Refused())
    with paths.planning() as launched:
        h3_triton.backend.KERNEL_OPS["swiglu"](torch.empty(1, 38733, 28672, dtype=torch.bfloat16))  # release size
    assert [str(p) for p in launched] == [
        "elementwise._swiglu_forward_kernel[dtypes=bfloat16 BLOCK_S=4 BLOCK_F=1024 num_warps=8]"]


def test_the_release_attention_on_cpu_leaves_out_the_hopper_kernels_and_says_why():
    calls = [c for c in op_calls.model_calls("release", None) if c.op == "attention" and c.mode == op_calls.AUTOGRAD]
    call = max(calls, key=lambda c: c.arg("q").shape[1])
    planned, left = launch_paths.planned(LAUNCH_PATHS, call, "cpu")
    assert "attention._fwd_kernel[dtypes=bfloat16+float32 HEAD_DIM=128 DESCRIBED=True BLOCK_M=128 BLOCK_N=128 " \
           "keys=full+partial]" in planned
    assert [path for path, _ in left] == ["attention_hopper._forward_kernel[dtypes=bfloat16 HEAD_DIM=128]",
                                          "attention_hopper._backward_kernel[dtypes=bfloat16 HEAD_DIM=128]"]
    assert all("interpreter cannot run Gluon" in why for _, why in left)


def test_release_paths_name_split_k_and_wide_rows():
    """The specialisations the release model's widths and lengths select, which the tiny model never does."""
    planned = {path for call in op_calls.model_calls("release", None)
               for path in launch_paths.planned(LAUNCH_PATHS, call, "cpu")[0]}
    assert any(p.startswith("gemm._gemm_kernel[") and "split_k=True" in p for p in planned)
    assert any(p.startswith("gemm._chunk_sum_kernel[") for p in planned)
    assert any(p.startswith("norm._forward_kernel[") and "chunked=True" in p for p in planned)
    assert any(p.startswith("rope._forward_kernel[") and "BLOCK_H=64" in p for p in planned)  # 56 heads


def test_h3gate_paths_lists_every_release_path_on_cpu_with_the_example_reaching_it(capsys):
    from h3gate.cli import main

    assert main(["paths", "--model", "release", "--suite", "tiny", "--device", "cpu", "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(", 0 unreached")
    assert "- attention._fwd_kernel[dtypes=bfloat16+float32 HEAD_DIM=128 DESCRIBED=True BLOCK_M=128 BLOCK_N=128 " \
           "keys=full+partial]: reached by attention[rows=300,heads=3,head_dim=128,batch=2,peak=2.0, bfloat16]" in out
    assert "- attention_hopper._backward_kernel[dtypes=bfloat16 HEAD_DIM=128]: left out: Gluon kernels" in out
    assert main(["paths", "--model", "release", "--candidate", "provider"]) == 2  # it declares no launch paths


_PLAN_WITHOUT_INTERPRETER = """
import torch
from h3_triton import gemm, paths
temb = torch.empty(3, 64, requires_grad=True)
weight = torch.empty(9000, 64, dtype=torch.bfloat16, requires_grad=True)  # over two chunks of rows: the chunk sums
bias = torch.empty(9000, dtype=torch.bfloat16, requires_grad=True)
with paths.planning() as launched:
    gemm.silu_linear(temb, weight, bias).backward(torch.empty(3, 9000, dtype=torch.bfloat16))
print(*launched, sep="\\n")
"""


def test_planning_on_a_cpu_without_the_interpreter():
    """``benchmarks/host_profile.py --plan --device cpu`` plans on any machine: no host code on the way asks for a
    GPU's stream (the few-rows backward keeps its chunk sums per device and stream)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", _PLAN_WITHOUT_INTERPRETER], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    backward = done.stdout.splitlines()[-1]
    assert backward.startswith("gemm._few_rows_backward_kernel[") and "split_k=True" in backward, done.stdout
