"""Spreading the gates: xdist workers and --h3-shard shards give the same evidence as one process (timings aside)."""

import base64
import json
import os
import shutil
import types

import pytest

from conftest import ROOT, THRESHOLDS
from h3gate import suite
from h3gate.bounds import lock_files
from h3gate.evidence.merge import merge
from pytest_h3 import distribution

SUITE = suite.text("test_gates.py", [42, 43, 44], [42])  # h3gate init's gate suite; its model and block gates run here
MODEL_AND_BLOCKS = ("-k", "test_model or test_block")


@pytest.fixture
def project(pytester):
    """The committed tiny CPU bounds (model and blocks, with the blocks' captures) and contract in a fresh project,
    re-locked there."""
    target = pytester.path / "thresholds" / "tiny"
    (target / "cpu").mkdir(parents=True)
    files = [shutil.copy(THRESHOLDS / "tiny" / "model-contract.json", target)]
    for name in ("model-bounds.json", "block0-bounds.json", "block0-capture.safetensors", "block1-bounds.json",
                 "block1-capture.safetensors"):
        files.append(shutil.copy(THRESHOLDS / "tiny" / "cpu" / name, target / "cpu"))
    lock_files(pytester.path / "thresholds", files)
    pytester.makepyfile(test_gates=SUITE)
    return pytester


def _run(project, out, *args):
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu",
                                          f"--h3-out={out}", *MODEL_AND_BLOCKS, *args)
    return result


def _content(path):
    """The statement's test results with everything run-dependent (timings, environment, artifact digests) set aside."""
    statement = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("timings", "environment", "artifacts", "device")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(statement["predicate"]["h3"]["tests"]), statement["predicate"]["passedTests"], statement["predicate"]["failedTests"]


def _workers(path) -> set[str]:
    """The xdist workers the evidence says its gate items ran on."""
    statement = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))
    tests = statement["predicate"]["h3"]["tests"].values()
    return {test["result"]["context"]["device"]["worker"] for test in tests if test["result"] is not None}


def test_workers_and_shards_give_the_same_evidence(project, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")  # as where this test runs on a worker: its sessions inherit it
    _run(project, "single").assert_outcomes(passed=3)
    _run(project, "workers", "-n", "2").assert_outcomes(passed=3)
    assert _workers(project.path / "single" / "evidence.json") == {"main"}
    assert set() < _workers(project.path / "workers" / "evidence.json") <= {"gw0", "gw1"}
    shards = []
    for index in range(2):
        _run(project, f"shard{index}", f"--h3-shard={index}/2")
        shards.append(project.path / f"shard{index}" / "evidence.json")
    merged = merge(shards, project.path)  # the folder that holds every shard
    single = _content(project.path / "single" / "evidence.json")
    assert _content(project.path / "workers" / "evidence.json") == single
    assert _content(merged) == single
    assert sorted(single[1]) == ["test_gates.py::test_block[block0]", "test_gates.py::test_block[block1]", "test_gates.py::test_model"]


def test_shards_deal_gate_items_disjointly(pytester):
    class Item:
        def __init__(self, nodeid, gate):
            self.nodeid = nodeid
            self.gate = gate

        def get_closest_marker(self, name):
            return object() if self.gate else None

    items = [Item(f"t::g{i}", True) for i in range(5)] + [Item("t::plain", False)]
    kept = [distribution.shard(items, f"{i}/3")[0] for i in range(3)]
    gate_sets = [{item.nodeid for item in k if item.gate} for k in kept]
    assert set().union(*gate_sets) == {f"t::g{i}" for i in range(5)} and sum(map(len, gate_sets)) == 5
    assert all(any(item.nodeid == "t::plain" for item in k) for k in kept), "ordinary tests run in every shard"
    with pytest.raises(pytest.UsageError, match="expected I/N"):
        distribution.shard(items, "3/3")


def test_auto_is_a_cpu_run_exactly_where_no_nvidia_device_node_exists(monkeypatch, tmp_path):
    monkeypatch.setattr(distribution, "DEVICE_NODES", tmp_path)
    (tmp_path / "nvidiactl").touch()  # the control node alone: no GPU
    assert distribution.cpu_run("auto") and distribution.cpu_run("cpu")
    (tmp_path / "nvidia0").touch()
    assert not distribution.cpu_run("auto") and not distribution.cpu_run("cuda:0") and distribution.cpu_run("cpu")


def _a_gpu_machine(monkeypatch):
    """This machine as one with NVIDIA device nodes, where ``auto`` asks which GPUs the caller made visible, nothing
    published yet; this process plays its own workers, so a worker's parent is the controller it is."""
    monkeypatch.setattr(distribution, "cpu_run", lambda option: option == "cpu")
    monkeypatch.setattr(os, "getppid", os.getpid)
    for name in (distribution.CALLER_GPUS, distribution.CALLER_PID, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


def test_workers_pin_to_the_callers_gpus(monkeypatch):
    _a_gpu_machine(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    distribution.prepare("auto")
    assert distribution.auto_workers("auto") == 2
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    distribution.prepare("auto")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6", "the caller's list entry, not device_count modulo"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    with pytest.raises(pytest.UsageError, match="gw2 has no GPU of its own: the caller sees 2"):
        distribution.prepare("auto")


def test_a_pytest_started_from_a_worker_is_no_worker_of_its_parents_run(monkeypatch):
    """It inherits the worker's PYTEST_XDIST_WORKER and the controller's GPU list, but its parent is the worker."""
    _a_gpu_machine(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    distribution.prepare("auto")
    monkeypatch.setenv(distribution.CALLER_PID, str(os.getpid() + 1))  # published by another process
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert distribution.worker_index() is None
    distribution.prepare("auto")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0" and os.environ[distribution.CALLER_GPUS] == "0"
    assert os.environ[distribution.CALLER_PID] == str(os.getpid()), "it publishes its own list for its own workers"


def test_workers_share_gpus_in_blocks(monkeypatch):
    """With K workers per GPU, gw0..gwK-1 take the caller's first GPU, the next K its second."""
    _a_gpu_machine(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,6")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    distribution.prepare("auto", per_gpu=3)
    assert distribution.auto_workers("auto", per_gpu=3) == 6
    pinned = []
    for index in range(6):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        distribution.prepare("auto", per_gpu=3)
        pinned.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert pinned == ["3", "3", "3", "6", "6", "6"]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw6")
    with pytest.raises(pytest.UsageError, match="gives each 3 worker"):
        distribution.prepare("auto", per_gpu=3)


def test_one_process_runs_cheap_gates_first_and_xdist_workers_the_expensive_ones():
    from h3gate import gates
    from pytest_h3.plugin import _gate_order

    assert _gate_order(under_xdist=False) == list(gates.kinds())
    assert _gate_order(under_xdist=False)[:4] == ["kernel", "block", "model", "generation"]
    over_workers = _gate_order(under_xdist=True)
    assert sorted(over_workers) == sorted(gates.kinds())
    assert over_workers[0] == "model", "the generation gate waits for the model gate's verdict: it leads"
    assert over_workers.index("power") < over_workers.index("block") < over_workers.index("generation") \
        < over_workers.index("kernel"), "a gate that waits for a verdict never starts a worker's first run of items"
    compiling = _gate_order(under_xdist=True, compiled=True)
    assert compiling[:3] == ["model", "kernel", "power"], \
        "on a GPU the kernel items compile what the power items of the same ops load: they start together"
    assert compiling.index("block") < compiling.index("generation")


@pytest.mark.parametrize("device, env, workers, threads", [
    ("cpu", None, None, 1), ("cpu", None, "8", 1), ("cpu", "2", None, None), ("cuda", None, None, None),
    ("cuda", None, "2", 8), ("cuda", None, "32", 1), ("cuda", "3", "2", None)])
def test_a_session_computes_on_its_share_of_the_host(monkeypatch, device, env, workers, threads):
    """One thread on the CPU, torch's and numpy's BLAS, whatever the cores and workers (bits depend on the count); on
    a GPU an xdist worker's share of the host's cores (16 here), and all of them outside xdist; untouched under
    OMP_NUM_THREADS."""
    import torch

    from pytest_h3.session import H3Session

    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    config = types.SimpleNamespace() if workers is None else \
        types.SimpleNamespace(workerinput={"workerid": "gw1", "workercount": int(workers)})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    before = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):
        torch.set_num_threads(2)
        try:
            H3Session.share_host_threads(types.SimpleNamespace(device=device, config=config))
            assert torch.get_num_threads() == (threads or 2)
            assert blas_threads() <= {threads or 2}
        finally:
            torch.set_num_threads(before)


def test_power_on_the_cpu_computes_with_one_thread(monkeypatch):
    """`h3gate power --device cpu` computes the bits of the gate suite's power test: one thread, as a CPU session."""
    from h3gate import cli, numerics
    from h3gate.gates import power

    calls = []
    monkeypatch.setattr(numerics, "one_cpu_thread", lambda: calls.append("one thread"))

    def measure(*args, **kwargs):
        calls.append("measured")
        raise ValueError("measured no further")

    monkeypatch.setattr(power, "measure", measure)
    assert cli.main(["power", "--device", "cpu"]) == 2
    assert calls == ["one thread", "measured"]


def test_real_xdist_workers_on_a_gpu_machine_pin_the_callers_gpus_in_order(pytester, monkeypatch, tmp_path):
    """Real workers (execnet's children of the controller), on a machine made to look like one with GPUs, started
    from a test that may itself run on a worker: each takes its own entry of the caller's list, none is refused as a
    stranger to its run."""
    nodes, pinned = tmp_path / "dev", tmp_path / "pinned"
    nodes.mkdir()
    pinned.mkdir()
    (nodes / "nvidia0").touch()
    pytester.makepyfile(fake_gpus=f"""
        from pathlib import Path

        import torch

        from pytest_h3 import distribution

        distribution.DEVICE_NODES = Path({str(nodes)!r})
        torch.cuda.is_available = lambda: False  # the session itself then runs on the CPU
    """, test_pinned=f"""
        import os
        from pathlib import Path

        def test_pinned(worker_id):
            (Path({str(pinned)!r}) / worker_id).write_text(os.environ["CUDA_VISIBLE_DEVICES"])
    """)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,3")
    result = pytester.runpytest_subprocess("-p", "fake_gpus", "-p", "no:cacheprovider", "--h3-device=auto", "-n", "2",
                                           "--dist=each")
    result.assert_outcomes(passed=2)
    assert {path.name: path.read_text() for path in pinned.iterdir()} == {"gw0": "7", "gw1": "3"}


def test_a_worker_that_could_not_pin_its_gpu_is_refused(monkeypatch):
    """A worker whose parent is not the controller (a launcher forked it) must not share the first GPU silently."""
    _a_gpu_machine(monkeypatch)
    worker = types.SimpleNamespace(workerinput={"workerid": "gw1"})
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv(distribution.CALLER_PID, str(os.getpid()))  # this process plays the controller's child
    distribution.check_pinned(worker, "cuda")
    monkeypatch.setenv(distribution.CALLER_PID, str(os.getpid() + 1))
    with pytest.raises(pytest.UsageError, match="gw1 is not a child of the pytest that started it"):
        distribution.check_pinned(worker, "cuda")
    distribution.check_pinned(worker, "cpu")  # a CPU run pins nothing
    distribution.check_pinned(types.SimpleNamespace(), "cuda")  # no worker: nothing to pin


def test_a_test_leaves_the_environment_it_found(pytester):
    """What one test publishes in os.environ does not reach the next one on the same worker (this repository's
    conftest restores it), whatever either does."""
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile("""
        import os

        def test_publishes():
            os.environ["H3GATE_CALLER_GPUS"] = "4,6"
            os.environ["PATH"] = "changed"
            del os.environ["HOME"]

        def test_after():
            assert "H3GATE_CALLER_GPUS" not in os.environ
            assert os.environ["PATH"] != "changed" and "HOME" in os.environ
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist").assert_outcomes(passed=2)


def test_a_missing_path_under_xdist_is_named_not_run_as_an_empty_session(pytester):
    """Under xdist the controller collects nothing and the workers drop a path they cannot find: a mistyped path ran
    as "no tests ran" (exit 5) with no error line. The controller names it as pytest does without -n."""
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    missing = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "test_one.py", "tests/gatez")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["ERROR: file or directory not found: tests/gatez"])
    found = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "test_one.py::test_one")
    found.assert_outcomes(passed=1)


def test_a_node_id_that_matches_nothing_under_xdist_is_named_not_run_as_an_empty_session(pytester):
    """A node id of an existing file that names no test: each worker's collection stops on pytest's "not found"
    usage error, which xdist keeps to the worker, so the run printed only "no tests ran". The controller says it."""
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    missing = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "test_one.py::test_two")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["ERROR: not found: *test_one.py::test_two*"])
