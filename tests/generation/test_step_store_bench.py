"""benchmarks/step_store.py at tiny sizes: what it measures is what the store wrote (not how fast)."""

import importlib.util
import json
import sys

import pytest
import torch

from h3gate.files import sha256_file
from h3gate.generation.resume import FINISHED_FILE

from conftest import ROOT


@pytest.fixture(scope="module")
def step_store():
    spec = importlib.util.spec_from_file_location("step_store", ROOT / "benchmarks" / "step_store.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_io(step_store):
    return step_store.release_io("cpu", fraction=0.01)


def test_outputs_are_shaped_as_the_transformer_returns_them(tiny_io):
    inputs, (video, audio) = tiny_io
    assert video.shape == inputs["hidden_states"].shape and audio.shape == inputs["audio_hidden_states"].shape
    assert video.dtype == audio.dtype == torch.float32, "the output heads stay float32 at checkpoint precision"
    assert video.shape[-1] == 96 and audio.shape[-1] == 32, "release: 24 channels x 1x2x2 patches, 32 audio channels"


def test_every_step_file_lands_with_the_bytes_reported(step_store, tiny_io, tmp_path):
    inputs, outputs = tiny_io
    result = step_store.store_throughput(tmp_path / "store", inputs, outputs, "cpu", steps=3,
                                         step_bytes=step_store.step_file_bytes(outputs))
    sidecars = sorted((tmp_path / "store").glob("step-*.json"))
    assert [path.name for path in sidecars] == ["step-0000.json", "step-0001.json", "step-0002.json"]
    for path in sidecars:
        sidecar = json.loads(path.read_text())
        assert sha256_file(tmp_path / "store" / sidecar["file"]) == sidecar["file_sha256"]
    assert (tmp_path / "store" / FINISHED_FILE).is_file()
    assert result["bytes"] == sum(path.stat().st_size for path in (tmp_path / "store").glob("step-*.safetensors"))
    disk = step_store.disk_speed(tmp_path / "disk", result["bytes"] // 3, 2)
    assert disk["bytes"] == 2 * result["bytes"] // 3 and not any((tmp_path / "disk").iterdir())


def test_the_script_reports_every_phase_and_cleans_up(step_store, tmp_path, monkeypatch, capsys):
    report_path = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["step_store.py", "--device", "cpu", "--fraction", "0.01", "--steps", "2",
                                      "--rounds", "2", "--step-ms", "5", "--folder", str(tmp_path),
                                      "-o", str(report_path)])
    step_store.main()
    report = json.loads(report_path.read_text())
    assert [path.name for path in tmp_path.iterdir()] == ["report.json"], "the temporary folder is removed"
    step_bytes = report["io"]["step_file_bytes"]
    assert [row["bytes"] for row in report["throughput"]["store"]] == [2 * step_bytes] * 2
    assert [row["bytes"] for row in report["throughput"]["disk"]] == [2 * step_bytes] * 2
    assert report["stall"]["steps"] == 2 and report["machine"]["folder"].startswith(str(tmp_path))
    assert "| 3. stall: rest added by the Run |" in capsys.readouterr().out
