"""The model factory: seeded presets bitwise reproducible, checkpoint folders validated and loaded offline."""

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from h3gate import files
from h3gate.model.checkpoint import load_checkpoint
from h3gate.model.factory import build_preset, load_model
from h3gate.model.identity import ModelError


def test_preset_is_bitwise_identical_across_builds_and_processes(tiny):
    again = build_preset("tiny")
    for (name, a), (_, b) in zip(tiny.transformer.named_parameters(), again.transformer.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    script = "from h3gate.model.factory import build_preset; print(build_preset('tiny').identity)"
    other_process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert other_process.stdout.strip() == tiny.identity


def test_identity_follows_the_seed(tiny):
    assert build_preset("tiny", seed=1).identity != tiny.identity


def test_checkpoint_precision_matches_diffusers_rule(tiny):
    for name, param in tiny.transformer.named_parameters():
        top = name.split(".")[0]
        expected = torch.float32 if top in ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out") else torch.bfloat16
        assert param.dtype == expected, name
    golden = tiny.golden_transformer()
    assert all(p.dtype == torch.float32 for p in golden.parameters())
    for (name, a), (_, b) in zip(golden.named_parameters(), tiny.transformer.named_parameters()):
        assert torch.equal(a, b.float()), f"golden must be the exact upcast of {name}"


def test_initialisation_makes_attention_peaky(tiny):
    norm_q = tiny.transformer.transformer_blocks[0].attn.norm_q.weight.float()
    assert norm_q.min() >= 1.5 and norm_q.max() <= 3.0
    table = tiny.transformer.transformer_blocks[0].adaln_proj.linear.bias.float().view(3, 6, -1)
    assert not torch.allclose(table[0], table[2], atol=0.05), "modalities must be modulated differently"


def test_unknown_model_names_the_choices():
    with pytest.raises(ModelError, match="use one of tiny, edge, small"):
        load_model("huge")


def test_not_a_folder(tmp_path):
    with pytest.raises(ModelError, match="not a folder"):
        load_checkpoint(tmp_path / "absent")


def test_empty_folder_names_what_is_missing(tmp_path):
    with pytest.raises(ModelError, match="holds neither transformer/config.json nor config.json"):
        load_checkpoint(tmp_path)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel"}))
    with pytest.raises(ModelError, match="'WanTransformer3DModel', not a MiniMaxH3Transformer3DModel"):
        load_checkpoint(tmp_path)


def test_config_without_weights_is_refused(tiny, tmp_path):
    (tmp_path / "transformer").mkdir()
    config = {**tiny.config, "_class_name": "MiniMaxH3Transformer3DModel"}
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="no \\*.safetensors"):
        load_checkpoint(tmp_path)


def test_checkpoint_round_trip_and_digest_cache(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(files, "DIGEST_CACHE", tmp_path / "cache" / "digests.json")
    tiny.transformer.save_pretrained(tmp_path / "ckpt" / "transformer")
    loaded = load_checkpoint(tmp_path / "ckpt")
    for (name, a), (_, b) in zip(tiny.transformer.named_parameters(), loaded.transformer.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    cache = json.loads((tmp_path / "cache" / "digests.json").read_text())
    assert len(cache) == 2  # the weights and the config, each a file the identity covers
    # A second load reads the cached digest instead of hashing the weights again.
    monkeypatch.setattr(files.hashlib, "sha256", _forbid_weight_hashing(files.hashlib.sha256))
    assert load_checkpoint(tmp_path / "ckpt").identity == loaded.identity


def test_readers_at_once_hash_each_file_once_and_agree(tmp_path, monkeypatch):
    """xdist workers opening one checkpoint together wait for each other's digests instead of reading it again."""
    monkeypatch.setattr(files, "DIGEST_CACHE", tmp_path / "cache" / "digests.json")
    paths = [tmp_path / f"shard-{index}.safetensors" for index in range(3)]
    for index, path in enumerate(paths):
        path.write_bytes(bytes([index]) * (1 << 20))
    hashed, sha256_file = [], files.sha256_file

    def slow_counting_hash(path):
        hashed.append(path)
        time.sleep(0.2)  # long enough for every reader to arrive while it hashes
        return sha256_file(path)

    monkeypatch.setattr(files, "sha256_file", slow_counting_hash)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: files.file_digests(paths), range(4)))
    assert results == [[sha256_file(path) for path in paths]] * 4
    assert sorted(hashed) == sorted(paths)


def _forbid_weight_hashing(sha256):
    class Guard:
        def __init__(self, data=b""):
            self.inner = sha256(data)

        def update(self, data):
            if len(data) > 1 << 16:
                raise AssertionError("weights were hashed again despite the digest cache")
            self.inner.update(data)

        def hexdigest(self):
            return self.inner.hexdigest()

    return Guard
