"""The block gate's host work: the capture written and hashed on a thread (a cached one mapped, hashed on a
thread), the upstream gradient drawn in chunks on threads, the ULP artifacts rendered on a thread of their own."""

import json
from types import SimpleNamespace

import pytest
import torch

from h3gate.bounds import BoundsError
from h3gate.files import sha256_file
from h3gate.gates import block as block_gate


def test_a_capture_read_back_is_what_was_written_and_its_digest_the_files(tiny, tiny_contract, tmp_path):
    captured, digest = block_gate.capture(tiny, tiny_contract, "cpu", 0, tmp_path)
    assert digest.result() == sha256_file(block_gate.capture_path(tmp_path, tiny, 0))
    again, digest_again = block_gate.capture(tiny, tiny_contract, "cpu", 0, tmp_path)
    assert digest_again.result() == digest.result() and again.keys() == captured.keys()
    assert all(torch.equal(again[name], captured[name]) for name in captured)


@pytest.mark.parametrize("cores", [1, 8])
def test_upstream_depends_on_shape_and_seed_only(monkeypatch, cores):
    monkeypatch.setattr(block_gate, "_NORMAL_CHUNK", 10)  # 21 elements: chunks of 10, 10 and 1
    monkeypatch.setattr(block_gate.os, "cpu_count", lambda: cores)
    drawn = block_gate.seeded_normal(torch.Size((3, 7)), 4)
    chunks = [torch.randn(n, generator=torch.Generator().manual_seed(4 + i)) for i, n in enumerate((10, 10, 1))]
    assert drawn.shape == (3, 7) and drawn.dtype == torch.float32
    assert torch.equal(drawn.view(-1), torch.cat(chunks))
    assert not torch.equal(drawn, block_gate.seeded_normal(torch.Size((3, 7)), 5))


def test_an_upstream_of_one_chunk_is_torch_randn():
    shape = (1, 300, 64)
    assert torch.equal(block_gate.seeded_normal(torch.Size(shape), 0),
                       torch.randn(shape, generator=torch.Generator().manual_seed(0)))


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


def test_a_check_refuses_a_capture_other_than_the_frozen_one(tiny, tiny_contract, tmp_path):
    frozen = SimpleNamespace(provenance={"capture_sha256": "0" * 64}, path=tmp_path / "block0.json", bounds={})
    with pytest.raises(BoundsError, match=r"sha256 [0-9a-f]{12}\) is not the one .*block0.json was frozen from"):
        block_gate.check(tiny, None, tiny_contract, frozen, "cpu", 0, tmp_path)
