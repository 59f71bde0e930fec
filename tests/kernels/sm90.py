"""Compiling kernels for an H200 (sm_90) on a machine without one: the interpreter accepts code the GPU compiler
rejects (types it infers differently, shared memory past the 227 KiB an SM has), so tests compile the kernels
they run under the interpreter for the real target too, with two compilers: the suite's Triton, and the one an
H200 runs them with (3.6: :data:`H200_TRITON`, which ``make setup`` installs beside the suite's; only its
compiler is used).

:func:`compile_for_h200` runs a script in a fresh process with ``TRITON_INTERPRET=0`` (this one may be an
interpreter process, whose triton cannot compile), once per compiler; the script calls ``compile_(kernel, consts,
tensors, warps, stages)``, which compiles with every pointer and stride marked divisible by 16, as at release
(without that mark the compiler neither vectorises nor pipelines the loads, and shared memory would be
underestimated), asserts the shared memory fits, and returns the compiled kernel.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

H200_TRITON = Path(sys.prefix) / "triton-3.6"
H200_TRITON_VERSION = "3.6.0"

_PRELUDE = """
import triton
print("triton", triton.__version__)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def compile_(kernel, consts, tensors, warps, stages):
    sig = {n: "constexpr" if n in consts else tensors.get(n, "fp32" if n.endswith(("scale", "eps")) else "i32")
           for n in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
               if n in tensors or n.startswith(("stride", "s_"))}
    src = ASTSource(kernel, sig, {(kernel.arg_names.index(n),): c for n, c in consts.items()}, aligned)
    done = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": warps, "num_stages": stages})
    assert done.metadata.shared <= 232448, (kernel.fn.__name__, consts, warps, stages, done.metadata.shared)
    return done
"""


def h200_triton_path(env: dict) -> dict:
    """``env`` with the H200's Triton first on ``PYTHONPATH`` (as it is where the suite's own Triton is the H200's,
    as on the GPU machine); fails the test where it is not installed."""
    if triton.__version__ == H200_TRITON_VERSION:
        return env
    if not (H200_TRITON / "triton").is_dir():
        pytest.fail(f"the H200's Triton {H200_TRITON_VERSION} is not installed in {H200_TRITON}: run `make setup`, "
                    "which installs it there", pytrace=False)
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(H200_TRITON), env.get("PYTHONPATH")]))}


def compile_for_h200(script: str) -> None:
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    _run(script, env, triton.__version__)
    if triton.__version__ != H200_TRITON_VERSION:
        _run(script, h200_triton_path(env), H200_TRITON_VERSION)


def _run(script: str, env: dict, version: str) -> None:
    done = subprocess.run([sys.executable, "-c", _PRELUDE + script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"with triton {version}: {done.stderr[-3000:]}"
    assert done.stdout.startswith(f"triton {version}\n"), done.stdout[:200]
