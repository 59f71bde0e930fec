"""Every tiling the autotuner may pick is correct, not only the one a run happened to choose.

Each config of each tuned launcher is forced in turn and the op that launches it is checked by the kernel
gate's own rule (error against float64 vs torch's, bitwise repeatability, NaN padding) at the op's explicit
example shape, which is ragged against every tile size; the test also asserts that the forced launcher ran.
Where the first example does not reach a launcher, the test names another (:data:`DIMS`). On a GPU every config
runs (warps and stages change the generated code); under the interpreter only the tile sizes matter, so configs
that share them run once.
"""

import os
import subprocess
import sys

import pytest
import torch
import triton

from h3_triton import attention, gemm
from h3_triton.backend import KERNEL_OPS
from h3_triton.interpret import INTERPRET
from h3_triton.tuning import LAUNCHERS
from h3gate.gates.kernel import OP_SPECS, evaluate
from kernel_checks import CountingLaunches

DEVICE = "cpu" if INTERPRET else "cuda"
USERS = {
    "attention": (attention._fwd, attention._delta, attention._dkdv, attention._dkdv_described, attention._dq),
    "linear": (gemm._TILED, gemm._DESCRIBED, gemm._SKINNY, gemm._OUTER, gemm._FEW_ROWS_BACKWARD),
    "silu_linear": (gemm._TILED, gemm._SKINNY, gemm._OUTER, gemm._FEW_ROWS_BACKWARD),
}
# Where an op's first example does not reach a launcher: 190 bfloat16 values are 380 bytes, not a multiple of
# 16, so x and the weight take the pointer kernel; the skinny one computes linear's bias gradient; the few-rows
# backward and the outer one run over at most 16 rows; silu_linear's weight gradient over more rows is tiled.
DIMS = {
    ("linear", gemm._TILED): {**OP_SPECS["linear"].examples[0], "k": 190},
    ("linear", gemm._SKINNY): OP_SPECS["linear"].examples[1],
    ("linear", gemm._OUTER): {**OP_SPECS["linear"].examples[1], "rows": 5},
    ("linear", gemm._FEW_ROWS_BACKWARD): {**OP_SPECS["linear"].examples[1], "rows": 5},
    ("silu_linear", gemm._TILED): {**OP_SPECS["silu_linear"].examples[0], "t": 40},
}
# The outer-product kernel computes the weight and bias gradients over few rows when the input needs no gradient;
# the gate's examples need every gradient (the few-rows backward), so its sweep runs them as that case would.
PRODUCTS_APART = (gemm._OUTER,)
# Launchers that bfloat16 inputs reach only when tensor descriptors cannot read them (heads off 16-byte
# boundaries); the examples are contiguous, so their sweep refuses descriptors as such a layout would.
POINTER_PATHS = (attention._dkdv,)
DTYPES = {2: torch.bfloat16, 4: torch.float32}


def _label(config) -> str:
    tiles = "_".join(f"{k.removeprefix('BLOCK_')}{v}" for k, v in config.kwargs.items() if k.startswith("BLOCK_"))
    return f"{tiles}_w{config.num_warps}_s{config.num_stages}"


def _cases():
    for op, launchers in USERS.items():
        for launcher in launchers:
            for size, configs in launcher.tilings.items():
                seen = set()
                for config in configs:
                    tiles = tuple(sorted(config.kwargs.items()))
                    if INTERPRET and tiles in seen:
                        continue
                    seen.add(tiles)
                    dtype = DTYPES[size]
                    yield pytest.param(op, launcher, dtype, config,
                                       id=f"{op}-{launcher.name}-{str(dtype)[6:]}-{_label(config)}")


def test_every_launcher_is_swept():
    assert {id(launcher) for launchers in USERS.values() for launcher in launchers} == {id(x) for x in LAUNCHERS}


def test_forcing_reaches_the_launch(monkeypatch):
    """The sweep is only worth something if the forced tiling is the one launched."""
    launched = []
    grid = attention._grid
    monkeypatch.setattr(
        attention, "_grid", lambda B, H, S, block: lambda meta: launched.append(meta[block]) or grid(B, H, S, block)(meta)
    )
    q = torch.randn(1, 40, 1, 32, device=DEVICE)
    with attention._fwd.forcing(triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)):
        out = attention.attention(q, q, q)
    assert launched == [16]
    expected = torch.nn.functional.scaled_dot_product_attention(*(q.transpose(1, 2),) * 3).transpose(1, 2)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("op, launcher, dtype, config", list(_cases()))
def test_tiling(op, launcher, dtype, config, monkeypatch):
    spec = OP_SPECS[op]
    name, counting = launcher.name, CountingLaunches(launcher.kernel)
    monkeypatch.setattr(launcher, "kernel", counting)
    dims = DIMS.get((op, launcher), spec.examples[0])
    if launcher in POINTER_PATHS:
        monkeypatch.setattr(attention, "aligned", lambda t, strides: False)
    if launcher in PRODUCTS_APART:
        monkeypatch.setattr(gemm, "_few_rows_backward", lambda *args: False)
    with launcher.forcing(config):
        checks = evaluate(spec, KERNEL_OPS[op], dims, dtype, DEVICE, seed=0)
    failed = [c.line() for c in checks if not c.passed]
    assert checks and not failed, "\n".join(failed)
    assert counting.launches, f"{name} never ran for {op}; the sweep would not have tested {config}"


@pytest.mark.parametrize("value, ok", [("0", True), ("1", True), ("false", False), ("", False)])
def test_autotune_setting_is_zero_or_one(value, ok):
    """A misspelt setting must not silently keep autotuning."""
    env = {**os.environ, "H3_TRITON_AUTOTUNE": value}
    run = subprocess.run([sys.executable, "-c", "import h3_triton.tuning as t; print(t.AUTOTUNE)"], env=env,
                         capture_output=True, text=True)
    if ok:
        assert run.returncode == 0 and run.stdout.strip() == str(value == "1"), run.stderr
    else:
        assert run.returncode != 0 and "set it to 0" in run.stderr


def test_autotune_is_off_unless_asked():
    """Out of the box every kernel runs its first tiling: no bits that follow a machine's timings, no tuning runs."""
    env = {k: v for k, v in os.environ.items() if k != "H3_TRITON_AUTOTUNE"}
    run = subprocess.run([sys.executable, "-c", "import h3_triton.tuning as t; print(t.AUTOTUNE)"], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr


def test_kernel_gate_edge_lengths_reach_every_tile_edge():
    """The gate's edge examples leave a last tile of one row, three rows and all but one row for every tile size
    our kernels run here (tuned configs on a GPU, the interpreter's tiles under it, and the row tiles of the
    whole-row kernels at the edge widths)."""
    from h3_triton.rowreduce import full_row_tiling
    from h3gate.gates.kernel import GPU_LIMITS, INTERPRETER_LIMITS, edge_lengths

    limits = INTERPRETER_LIMITS if INTERPRET else GPU_LIMITS
    if INTERPRET:
        sizes = {v for launcher in LAUNCHERS for k, v in launcher.interpreter.items() if k.startswith("BLOCK_")}
    else:
        sizes = {v for launcher in LAUNCHERS for tilings in launcher.tilings.values() for config in tilings
                 for k, v in config.kwargs.items() if k.startswith("BLOCK_")}
    sizes |= {full_row_tiling(w, "edge").rows for w in edge_lengths(limits.max_width, limits.largest_tile)}
    assert all(s & (s - 1) == 0 and s <= limits.largest_tile for s in sizes), sorted(sizes)
    assert limits.largest_tile in sizes, "the largest tile is one in use"
    lengths = edge_lengths(limits.max_rows, limits.largest_tile)
    for tile in sizes:
        assert [n % tile for n in lengths] == [1 % tile, 3 % tile, tile - 1], (tile, lengths)
