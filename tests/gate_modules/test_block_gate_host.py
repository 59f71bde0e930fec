"""The block gate's host work: the capture frozen beside its bounds, read back and checked on a thread, the
upstream gradient drawn in chunks on threads, the ULP artifacts rendered on a thread of their own."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load

from conftest import THRESHOLDS
from h3gate import bounds as bounds_mod
from h3gate import cli
from h3gate import seeded
from h3gate.bounds import BoundsError
from h3gate.files import sha256_file
from h3gate.gates import block as block_gate


def test_a_frozen_capture_is_read_back_as_written_and_checked_on_a_thread(tiny, tiny_contract, tmp_path):
    data = block_gate.capture(tiny, tiny_contract, "cpu", 0)
    path = tmp_path / "block0-capture.safetensors"
    path.write_bytes(data)
    captured, digest = block_gate.load_capture(path, sha256_file(path), 0)
    assert digest.result() == sha256_file(path)
    assert sorted(captured) == ["adaln_indices", "cos", "hidden_states", "sin", "temb"]
    assert torch.equal(captured["hidden_states"], load(data)["hidden_states"])


def test_a_freeze_that_fails_leaves_no_capture_behind(tiny, tiny_contract, tmp_path, monkeypatch):
    """A capture outside the lock makes the next session refuse the whole thresholds folder: it is written only
    with its bounds."""
    thresholds = tmp_path / "thresholds"
    (thresholds / "tiny").mkdir(parents=True)
    shutil.copy(THRESHOLDS / "tiny" / "model-contract.json", thresholds / "tiny")
    bounds_mod.lock_files(thresholds, [thresholds / "tiny" / "model-contract.json"])

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.28 GiB")

    monkeypatch.setattr(block_gate, "_errors", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        block_gate.freeze(tiny, tiny_contract, "cpu", 1, thresholds, ["sdpa-math"])
    assert not (thresholds / "tiny" / "cpu").exists() or not list((thresholds / "tiny" / "cpu").iterdir())
    bounds_mod.verify_lock(thresholds)


def test_the_capture_lives_beside_its_bounds_and_is_locked_with_them(tiny, tiny_contract, tmp_path):
    thresholds = tmp_path / "thresholds"
    (thresholds / "tiny").mkdir(parents=True)
    shutil.copy(THRESHOLDS / "tiny" / "model-contract.json", thresholds / "tiny")
    bounds_mod.lock_files(thresholds, [thresholds / "tiny" / "model-contract.json"])
    frozen = block_gate.freeze(tiny, tiny_contract, "cpu", 1, thresholds, ["sdpa-math"])
    capture = thresholds / "tiny" / "cpu" / "block1-capture.safetensors"
    assert block_gate.capture_path(frozen.path) == capture
    assert frozen.provenance["capture_sha256"] == sha256_file(capture)
    assert bounds_mod.verify_lock(thresholds)["tiny/cpu/block1-capture.safetensors"] == sha256_file(capture)
    capture.unlink()  # a release-size capture may live outside version control: the lock allows it to be absent
    bounds_mod.verify_lock(thresholds)
    with pytest.raises(BoundsError, match="frozen capture of block 1 is missing"):
        block_gate.check(tiny, None, tiny_contract, frozen, "cpu", 1, tmp_path)
    assert block_gate.recapture(capture, tiny, "cpu") == capture  # this machine froze it: the same bits
    bounds_mod.verify_lock(thresholds)
    capture.unlink()
    assert cli.main(["capture", str(capture)]) == 0 and bounds_mod.verify_lock(thresholds)
    assert cli.main(["capture", str(capture.with_name("block1-bounds.json"))]) == 2  # not a capture
    data = bytearray(capture.read_bytes())
    data[-1] ^= 1
    capture.write_bytes(bytes(data))
    with pytest.raises(BoundsError, match="does not match its digest"):
        bounds_mod.verify_lock(thresholds)


@pytest.mark.parametrize("cores", [1, 8])
def test_upstream_depends_on_shape_and_seed_only(monkeypatch, cores):
    monkeypatch.setattr(block_gate, "_NORMAL_CHUNK", 10)  # 21 elements: chunks of 10, 10 and 1
    monkeypatch.setattr(block_gate.os, "cpu_count", lambda: cores)
    drawn = block_gate.seeded_normal(torch.Size((3, 7)), 4)
    chunks = [seeded.normal((n,), torch.Generator().manual_seed(4 + i)) for i, n in enumerate((10, 10, 1))]
    assert drawn.shape == (3, 7) and drawn.dtype == torch.float32
    assert torch.equal(drawn.view(-1), torch.cat(chunks))
    assert not torch.equal(drawn, block_gate.seeded_normal(torch.Size((3, 7)), 5))


def test_background_work_returns_or_raises_what_it_did():
    assert block_gate.in_background(sum, [1, 2, 3]).result() == 6

    def fails():
        raise ValueError("rendering failed")

    with pytest.raises(ValueError, match="rendering failed"):
        block_gate.in_background(fails).result()


def test_ulp_artifacts_render_on_a_thread(tmp_path):
    bins = len(block_gate.ULP_BINS) - 1
    sweep = {"bins": [str(b) for b in block_gate.ULP_BINS],
             "taps": {"out": {"dtype": "bfloat16", "candidate": [3] + [0] * (bins - 1),
                              "provider": [0, 3] + [0] * (bins - 2)}}}
    paths = block_gate.in_background(block_gate.write_ulp_artifacts, sweep, tmp_path / "block" / "m-block0").result()
    assert json.loads(open(paths["ulp_json"]).read()) == sweep
    assert open(paths["ulp_png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "block").iterdir()) == ["m-block0-ulp.json", "m-block0-ulp.png"]


def test_a_check_refuses_bounds_that_name_no_frozen_capture(tiny, tiny_contract, tmp_path):
    frozen = SimpleNamespace(provenance={}, path=tmp_path / "block0-bounds.json", bounds={})
    with pytest.raises(BoundsError, match=r"block0-bounds.json names no frozen capture of block 0"):
        block_gate.check(tiny, None, tiny_contract, frozen, "cpu", 0, tmp_path)
