"""Bad input a careless user gives: each is refused with one line naming the input and the fix, never a traceback,
and never a run that reports success without having qualified anything."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, THRESHOLDS
from h3gate import bounds
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
