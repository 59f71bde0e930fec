"""The Gluon attention kernels of Hopper GPUs, compiled for an H200 with the Triton it runs them with (3.6, which
``make setup`` installs beside the suite's own: ``sm90.H200_TRITON``; only its compiler is used, no GPU).

The interpreter runs no Gluon, so this is where the CPU suite sees the code a Hopper GPU runs: that it compiles at
the release shape's specialisation, that ptxas keeps each loop's asynchronous products in flight (it serialises
them, waiting for every group a loop commits, where it cannot prove an asynchronous product safe: a several-fold
slowdown that no result shows), that they fit an SM's shared memory, and that the forward spills nothing.
``benchmarks/attention_sass.py`` compiles and reads the SASS; its ``lag-pv`` schedule is one ptxas serialises, so
the check is seen to flag a real case.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from sm90 import H200_TRITON_VERSION, h200_triton_path


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> dict[str, dict]:
    """``attention_sass.py --json`` by kernel name, compiled in a process of its own with the H200's Triton."""
    path = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))
    env = h200_triton_path(dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="0",
                                TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton-3.6-cache"))))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_sass.py"), "--json"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {record["kernel"]: record for record in map(json.loads, done.stdout.splitlines())}
    assert {record["triton"] for record in found.values()} == {H200_TRITON_VERSION}
    return found


def serialised(loops: list[list[int]]) -> bool:
    """Whether some loop that issues products waits for every group it commits: (HGMMA, groups, waits for all)."""
    return any(hgmma and waits >= groups for hgmma, groups, waits in loops)


HOPPER_KERNELS = ["attention_hopper._forward_kernel", "attention_hopper._backward_kernel"]


@pytest.mark.parametrize("kernel", HOPPER_KERNELS)
def test_the_hopper_kernels_keep_their_products_in_flight(kernels, kernel):
    loops = kernels[kernel]["loops"]
    assert any(hgmma for hgmma, _, _ in loops), f"{kernel}: no loop issues HGMMA"
    assert not serialised(loops), f"{kernel}: ptxas serialised a loop's products: {loops}"


@pytest.mark.parametrize("kernel", HOPPER_KERNELS)
def test_the_hopper_kernels_fit_an_sms_shared_memory(kernels, kernel):
    """227 KiB a block on an H200; the forward's ring of three key and value stages takes 224 KiB of it, so a
    barrier or a stage more is refused at launch, on the GPU only."""
    assert kernels[kernel]["shared"] <= 227 * 1024


def test_the_hopper_forward_spills_nothing(kernels):
    forward = kernels["attention_hopper._forward_kernel"]
    assert (forward["spill_stores"], forward["spill_loads"]) == (0, 0)


def test_a_schedule_that_ptxas_serialises_is_flagged(kernels):
    """``lag-pv`` waits for each P V one tile later, with the accumulator carried in flight through the loop: ptxas
    commits and waits for each of its 16 products alone; ``lockstep``, the same kernel waiting at once, keeps them
    in two groups."""
    assert serialised(kernels["attention_fwd_gluon.py --schedule lag-pv"]["loops"])
    assert not serialised(kernels["attention_fwd_gluon.py --schedule lockstep"]["loops"])


def test_the_backward_variants_of_the_benchmark_change_one_line_of_the_shipped_kernel(monkeypatch):
    """``attention_bwd_gluon.py --unordered`` times what the ordered dQ adds cost: its kernel must be the shipped one
    with the dQ writers' wait for their turn taken out, and nothing else; ``--worker-registers``' kernels the shipped
    one with the second consumer's registers changed, and nothing else."""
    import inspect

    from h3_triton import attention_hopper

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("attention_bwd_gluon", ROOT / "benchmarks" / "attention_bwd_gluon.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    variant = bench.variant_hopper("--unordered", bench._TURN_WAIT, "", "attention_hopper_unordered")
    shipped = inspect.getsource(attention_hopper._dq_writer.fn)
    assert "_acquire(" in shipped and "_acquire(" not in inspect.getsource(variant._dq_writer.fn)
    assert inspect.getsource(variant).replace(bench._TURN_WAIT, "") == \
        inspect.getsource(attention_hopper).replace(bench._TURN_WAIT, "")
    wider = inspect.getsource(bench.worker_registers_hopper(248))
    assert "[248, 24, 24, 24])" in wider and "[240, 24, 24, 24])" in bench._PARTITIONS
    assert wider.replace("[248, 24, 24, 24])", "[240, 24, 24, 24])") == inspect.getsource(attention_hopper)
