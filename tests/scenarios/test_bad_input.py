"""Bad input a careless user gives: each is refused with one line naming the input and the fix, never a traceback,
and never a run that reports success without having qualified anything."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, THRESHOLDS
from h3gate import bench, bounds
from h3gate.cli import main
from h3gate.files import FileFormatError
from pytest_h3 import distribution

GATE = """
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    raise AssertionError("a gate item ran although the settings were bad")
"""


def h3gate(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "h3gate.cli", *map(str, args)], capture_output=True, text=True)


def one_line_refusal(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def refusal(capsys, code: int, *args) -> str:
    """:func:`one_line_refusal` of ``h3gate args`` run in this process, which pays the imports once (a traceback
    fails the test); nothing is printed on stdout."""
    assert main(list(map(str, args))) == code
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, out + err
    return err


def test_identity_of_a_model_that_does_not_exist(tmp_path):
    err = one_line_refusal(h3gate("identity", "--model", tmp_path / "absent"), 2)
    assert err.startswith("h3gate identity: ") and "absent" in err


def test_keygen_into_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    err = one_line_refusal(h3gate("keygen", tmp_path / "file"), 2)
    assert f"{tmp_path / 'file'} is a file, not a folder" in err


def test_merge_into_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "shard.json").write_text("{}")
    err = one_line_refusal(h3gate("merge", tmp_path / "shard.json", "-o", tmp_path / "file"), 2)
    assert "is a file, not a folder" in err and "space" not in err


def test_verify_against_a_thresholds_folder_that_does_not_exist(tmp_path):
    (tmp_path / "evidence.json").write_text("{}")
    err = one_line_refusal(h3gate("verify", tmp_path, "--allow-unsigned", "--thresholds", tmp_path / "absent"), 2)
    assert "--thresholds" in err and "does not exist" in err


def test_a_bounds_file_with_an_infinite_bound_is_refused(tmp_path):
    source = bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "model")
    data = json.loads(source.read_text())
    tap = next(iter(data["bounds"]))
    data["bounds"][tap] = float("inf")
    path = tmp_path / source.name
    path.write_text(json.dumps(data))  # Infinity, as Python's json writes it
    with pytest.raises(FileFormatError, match=f"bound of {tap} must be a positive finite number, found inf"):
        bounds.load(path, "model", data["model_identity"], "cpu")


@pytest.fixture
def project(pytester):
    pytester.makepyfile(test_gate=GATE)
    (pytester.path / "thresholds").mkdir()
    return pytester


def test_a_model_that_is_neither_embedded_nor_a_folder(project, tmp_path):
    result = project.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", f"--h3-model={tmp_path / 'absent'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and f"--h3-model={tmp_path / 'absent'} is neither an embedded model" in errors[0]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_more_xdist_workers_than_gpus_is_refused_before_any_worker_starts(project):
    project._monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU, whatever the machine has
    # As where this test itself runs on xdist worker gw1 of a GPU run: the session it starts is no worker of that run.
    project._monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    project._monkeypatch.setenv(distribution.CALLER_GPUS, "4,6")
    project._monkeypatch.setenv(distribution.CALLER_PID, str(os.getppid()))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-m", "gate", "--h3-device=cuda", "-n", "4")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert "-n 4 with --h3-device=cuda: the caller sees 1 GPU(s) (0) and gives each 1 worker(s)" in output
    assert "[gw" not in output and "Traceback" not in output and "INTERNALERROR" not in output


@pytest.mark.parametrize("workers, per_gpu, refused", [(4, 2, False), (5, 2, True), (2, 1, False), (3, 1, True)])
def test_workers_per_gpu_bound_the_workers(monkeypatch, workers, per_gpu, refused):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    if refused:
        with pytest.raises(pytest.UsageError, match=f"run with -n {2 * per_gpu} or -n auto"):
            distribution.check_workers("cuda", per_gpu, workers)
    else:
        distribution.check_workers("cuda", per_gpu, workers)
    distribution.check_workers("cpu", 1, 64)  # a CPU run needs no GPU per worker


def test_make_test_never_writes_where_make_gate_does():
    done = subprocess.run(["make", "-n", "test", "OUT=gate-out"], cwd=ROOT, capture_output=True, text=True)
    command = next(line for line in done.stdout.splitlines() if "-m pytest tests" in line)
    assert '--h3-out="$(mktemp -d' in command and "gate-out" not in command


def test_variants_of_a_device_that_is_none(capsys):
    err = refusal(capsys, 2, "variants", "--device", "bogus")
    assert "--device bogus: not a device; use cpu, cuda or cuda:N" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
@pytest.mark.parametrize("command", [("paths", "--model", "release", "--device", "cuda"), ("bench", "--device", "cuda:1"),
                                     ("power", "--device", "cuda")])
def test_a_cuda_device_on_a_machine_without_one(capsys, command):
    err = refusal(capsys, 2, *command)
    assert f"--device {command[-1]}: no CUDA device is visible here" in err and "give --device cpu" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [("bench", "--candidate", "bogus", "--no-block"), ("power", "--base", "bogus")])
def test_an_unknown_candidate(capsys, command):
    err = refusal(capsys, 2, *command)
    assert "unknown candidate 'bogus'; available: " in err and "provider" in err


def test_bench_refuses_an_unknown_op_before_timing_any(capsys):
    err = refusal(capsys, 2, "bench", "--device", "cpu", "--ops", "swiglu,bogus", "--no-block")
    assert "--ops: unknown ops bogus; choose among linear, " in err  # one line: nothing was timed


def test_bench_refuses_no_rounds_before_timing_any(capsys):
    err = refusal(capsys, 2, "bench", "--device", "cpu", "--ops", "swiglu", "--no-block", "--rounds", "0")
    assert "--rounds 0: every time is the median of at least one round; pass --rounds 1 or more" in err
    assert "timing" not in err


def test_bench_refuses_a_release_step_the_gpu_cannot_hold_before_timing_any(monkeypatch, capsys):
    from h3gate.cli import common

    monkeypatch.setattr(common, "device", lambda name: name)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (44 * 2**30, 48 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a 48 GB GPU")
    err = refusal(capsys, 2, "bench", "--device", "cuda", "--step-layers", "50")
    assert ("--step-layers 50: the release transformer's 50 blocks and their call take 68.1 GiB, and a 48 GB GPU has "
            "44.0 GiB free; pass --step-layers 29 or fewer") in err, err
    bench.check_step("release", "cuda", 29)  # the advice holds
    with pytest.raises(ValueError, match="--step-layers 30: "):
        bench.check_step("release", "cuda", 30)


@pytest.mark.parametrize("size", ["lots", "0", "infGB"])
def test_checkpoint_make_refuses_a_shard_size_before_building(tmp_path, capsys, size):
    err = refusal(capsys, 2, "checkpoint", "make", "--preset", "tiny", "--max-shard-size", size, tmp_path / "ck")
    assert f"--max-shard-size {size}: not a positive size" in err and "5GB" in err
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_make_under_a_file(tmp_path, capsys):
    from h3gate.model.checkpoint import CheckpointError
    from h3gate.model.checkpoint_writer import make

    (tmp_path / "out.txt").write_text("")
    err = refusal(capsys, 2, "checkpoint", "make", "--preset", "tiny", tmp_path / "out.txt" / "ck")
    assert f"{tmp_path / 'out.txt'} is a file, not a folder" in err
    with pytest.raises(CheckpointError, match="cannot create its parent folder .*give DIR under a folder you can"):
        make("tiny", tmp_path / "out.txt" / "ck", ["transformer"])


def test_identity_of_a_checkpoint_whose_config_builds_no_transformer(tmp_path, capsys):
    from h3gate.model.checkpoint_writer import make

    config = make("tiny", tmp_path / "ck", ["transformer"]) / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "attention_head_dim": -3}))
    err = refusal(capsys, 2, "identity", "--model", tmp_path / "ck")
    assert f"{config}: not a valid MiniMaxH3Transformer3DModel config" in err and "copy the checkpoint again" in err


@pytest.fixture
def thresholds(tmp_path):
    """A copy of the repository's thresholds folder, lock included."""
    shutil.copytree(THRESHOLDS, tmp_path / "thresholds", ignore=shutil.ignore_patterns("*.flock"))
    return tmp_path / "thresholds"


@pytest.mark.parametrize("broken, reason", [
    ("tiny/absent-contract.json", "missing (generation contract expected)"),
    ("tiny/model-contract.json", "not valid JSON"),
    ("tiny/generation-contract.json", "not valid JSON"),
    ("LOCK.json", "not valid JSON"),
])
def test_lock_refuses_a_contract_or_lock_that_does_not_load(thresholds, capsys, broken, reason):
    """A truncated contract is never locked: the gate reading it would fail only later, under a valid lock."""
    path = thresholds / broken
    if path.exists():
        path.write_text(path.read_text()[:40])
    lock = (thresholds / "LOCK.json").read_text()
    valid = thresholds / "tiny" / "generation-preflight-contract.json"  # locked only with the others, never alone
    err = refusal(capsys, 2, "lock", "--thresholds", thresholds, valid, *([] if broken == "LOCK.json" else [path]))
    assert err.startswith(f"h3gate lock: {path}: {reason}")
    assert (thresholds / "LOCK.json").read_text() == lock


def test_contracts_refuse_an_unreadable_lock_or_a_file_before_writing_any(tmp_path, capsys):
    (tmp_path / "th").mkdir()
    (tmp_path / "th" / "LOCK.json").write_text('{"schema": "h3gate.lock/1", "fil')
    err = refusal(capsys, 2, "contracts", "--model", "tiny", "--thresholds", tmp_path / "th")
    assert f"{tmp_path / 'th' / 'LOCK.json'}: not valid JSON" in err
    assert [p.name for p in (tmp_path / "th").iterdir()] == ["LOCK.json"]
    (tmp_path / "file").write_text("")
    err = refusal(capsys, 2, "contracts", "--model", "tiny", "--thresholds", tmp_path / "file")
    assert f"--thresholds {tmp_path / 'file'}: {tmp_path / 'file'} is a file, not a folder: give a folder" in err


def test_contracts_that_cannot_be_locked_are_put_back(thresholds, monkeypatch):
    """A contract written but not locked would be refused by its gate, and would block the rerun (it exists)."""
    from h3gate.files import WriteError
    from h3gate.generation import default_contracts as contract_defaults

    def full_disk(*args):
        raise WriteError(28, "no room")

    contract = thresholds / "edge" / "model-contract.json"
    contract.write_text(contract.read_text() + "\n")  # other bytes than the defaults', to be put back
    bounds.lock_files(thresholds, [contract])
    before = contract.read_bytes()
    monkeypatch.setattr(bounds, "lock_files", full_disk)
    with pytest.raises(WriteError):  # edge has a model contract, replaced, and no generation contracts, written
        contract_defaults.write("edge", thresholds, "a reason")
    assert [p.name for p in (thresholds / "edge").glob("*-contract.json")] == ["model-contract.json"]
    assert contract.read_bytes() == before
    bounds.verify_lock(thresholds)


def test_report_into_a_file_and_its_documented_exit_codes(tmp_path, capsys):
    (tmp_path / "evidence.json").write_text("{}")
    (tmp_path / "file").write_text("")
    err = refusal(capsys, 2, "report", tmp_path / "evidence.json", "-o", tmp_path / "file" / "r.md")
    assert f"-o {tmp_path / 'file' / 'r.md'}: {tmp_path / 'file'} is a file, not a folder: give a folder" in err
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    help_text = capsys.readouterr().out
    assert all(f"\n  {code} " in help_text for code in (0, 2, 9))


@pytest.mark.parametrize("command", ["status", "contracts"])
def test_a_model_folder_that_is_no_checkpoint(tmp_path, capsys, command):
    err = refusal(capsys, 2, command, "--model", tmp_path, "--thresholds", tmp_path / "th")
    assert f"{tmp_path} is a folder but not a MiniMax-H3 checkpoint: it holds neither transformer/config.json" in err


def test_capture_of_a_path_outside_a_thresholds_folder(capsys):
    err = refusal(capsys, 2, "capture", "/nonexistent/dir/block0-capture.safetensors")
    assert "has no block0-bounds.json beside it" in err and "path under thresholds/<model>/<device class>/" in err
