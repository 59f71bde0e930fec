"""Compiling kernels for an H200 (sm_90) on a machine without one: the interpreter accepts code the GPU compiler
rejects (types it infers differently, shared memory past the 227 KiB an SM has), so tests compile the kernels
they run under the interpreter for the real target too.

:func:`compile_for_h200` runs a script in a fresh process with ``TRITON_INTERPRET=0`` (this one may be an
interpreter process, whose triton cannot compile); the script calls ``compile_(kernel, consts, tensors, warps,
stages)``, which compiles with every pointer and stride marked divisible by 16, as at release (without that mark
the compiler neither vectorises nor pipelines the loads, and shared memory would be underestimated), asserts the
shared memory fits, and returns the compiled kernel.
"""

import os
import subprocess
import sys

_PRELUDE = """
import triton
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


def compile_for_h200(script: str) -> None:
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, "-c", _PRELUDE + script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
