"""The checkpoint writer: the files of the libraries' own ``save_pretrained``, written a shard at a time; the release
preset's weights drawn as the in-process release builders draw them; planned and refused for want of disk before
anything is built."""

import json

import pytest
import torch
from diffusers.modular_pipelines import MiniMaxH3Blocks
from safetensors.torch import load_file

from h3gate.cli import main
from h3gate.generation.components import build_components, text_encoder_skeleton
from h3gate.model import checkpoint_writer, factory as model_module
from h3gate.model.checkpoint import MODULAR_INDEX, CheckpointError, check_weights
from h3gate.model.checkpoint_writer import drawn_transformer, library_initialised, make, write_model
from h3gate.model.factory import build_preset
from h3gate.model.presets import TRANSFORMER_CONFIGS

SHARD = "40KB"  # small enough to shard every model of the tiny preset


def _files(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def _tensors(folder):
    tensors = {}
    for path in folder.glob("*.safetensors"):
        tensors.update(load_file(path))
    return tensors


def test_a_made_folder_is_byte_for_byte_what_the_libraries_save_pretrained_write(tmp_path):
    made = make("tiny", tmp_path / "made", max_shard_size=SHARD)
    built = build_components("tiny", 0)
    built["text_encoder"] = built["text_encoder"].to(torch.bfloat16)
    built["transformer"] = build_preset("tiny", 0).transformer
    built["transformer_ref"] = build_preset("tiny", 1).transformer
    pipe = MiniMaxH3Blocks().init_pipeline()
    names = set(pipe.pretrained_component_names)
    pipe.update_components(**{name: built[name] for name in names})
    pipe.register_to_config(**{key: value for key, value in built.items() if key not in names})
    pipe.save_pretrained(str(tmp_path / "reference"), max_shard_size=SHARD, overwrite_modular_index=True)
    checkpoint_writer._index_components(tmp_path / "reference" / MODULAR_INDEX, {})  # pointed at the published repo

    ours, theirs = _files(made), _files(tmp_path / "reference")
    assert set(ours) == set(theirs) | {"model_index.json"}
    assert [name for name in theirs if ours[name] != theirs[name]] == []
    for name in ("transformer/diffusion_pytorch_model.safetensors.index.json", "text_encoder/model.safetensors.index.json",
                 "vae/diffusion_pytorch_model.safetensors.index.json"):
        assert len(set(json.loads(ours[name])["weight_map"].values())) > 1, f"{name}: the test must shard"


def test_the_release_transformer_is_drawn_as_the_gpu_builder_draws_it_one_shard_at_a_time(tmp_path):
    config = TRANSFORMER_CONFIGS["tiny"]
    write_model(drawn_transformer(config, 7), tmp_path / "transformer", SHARD)
    whole = model_module._materialised(config, 7, "cpu")
    written = _tensors(tmp_path / "transformer")
    assert written.keys() == whole.state_dict().keys()
    for name, tensor in whole.state_dict().items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
    check_weights(tmp_path / "transformer", type(whole))  # its config describes its weights


def test_the_text_encoder_is_initialised_by_transformers_one_module_at_a_time(tmp_path):
    def written(size):
        folder = tmp_path / size
        write_model(library_initialised(text_encoder_skeleton("tiny"), 3, "text_encoder"), folder, size)
        return _tensors(folder)

    sharded, whole = written(SHARD), written("5GB")
    assert sharded.keys() == whole.keys() and all(torch.equal(sharded[key], whole[key]) for key in whole)
    norm = whole["model.language_model.layers.0.input_layernorm.weight"]
    assert torch.equal(norm, torch.ones_like(norm))  # transformers' init of an RMSNorm
    up = whole["model.language_model.layers.0.mlp.up_proj.weight"].float()
    assert abs(up.std().item() - 0.02) < 0.002 and abs(up.mean().item()) < 0.002  # normal(0, initializer_range)
    other = library_initialised(text_encoder_skeleton("tiny"), 4, "text_encoder").tensors([next(iter(whole))])
    assert not torch.equal(other[next(iter(whole))], whole[next(iter(whole))]), "the seed reaches every module"


def test_a_module_its_library_does_not_initialise_is_refused_not_written_as_garbage(tmp_path, monkeypatch):
    skeleton = text_encoder_skeleton("tiny")
    initialise = type(skeleton)._init_weights
    monkeypatch.setattr(type(skeleton), "_init_weights",
                        lambda self, module: None if "RMSNorm" in type(module).__name__ else initialise(self, module))
    with pytest.raises(CheckpointError, match=r"text_encoder: Qwen3VLTextRMSNorm '.*norm' is not initialised by "
                                              r"Qwen3VLForConditionalGeneration._init_weights; its weight would be garbage"):
        write_model(library_initialised(skeleton, 0, "text_encoder"), tmp_path / "text_encoder")


def test_the_release_preset_is_planned_without_building_and_refused_for_want_of_disk(tmp_path, monkeypatch, capsys):
    built, build_vae = [], checkpoint_writer.build_vae
    monkeypatch.setattr(checkpoint_writer, "build_vae", lambda *args: built.append(args) or build_vae(*args))
    monkeypatch.setattr(checkpoint_writer.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 80e9}))
    assert main(["checkpoint", "make", "--preset", "release", str(tmp_path / "release")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{tmp_path}: 80.0 GB free, and the release preset's transformer, transformer_ref, vae, audio_vae, text_encoder "
        "take 194.5 GB: write to a disk with more room, or fewer --components")
    assert [args[3] for args in built] == ["meta", "meta"], "the VAEs are planned on the meta device only"
    assert list(tmp_path.iterdir()) == [], "nothing is written"


def test_a_release_folder_may_keep_the_transformers_first_blocks(tmp_path, monkeypatch, capsys):
    planned = checkpoint_writer._weights("release", ["transformer"], 0, layers=2)["transformer"]
    assert planned.model.config.num_layers == 2 and len(planned.model.transformer_blocks) == 2
    assert 2.5e9 < planned.nbytes < 5e9  # two 1.3 GB blocks and the embeddings, not 66 GB
    whole = checkpoint_writer._weights("release", ["transformer"], 0)["transformer"].model.state_dict()
    assert all(whole[name].shape == tensor.shape for name, tensor in planned.model.state_dict().items())
    assert main(["checkpoint", "make", "--preset", "tiny", str(tmp_path / "t"), "--layers", "2"]) == 2
    assert "--layers 2: only the release preset's transformers are cut, to 1 to 50 blocks; 'tiny' is written whole" \
        in capsys.readouterr().err
    assert main(["checkpoint", "make", "--preset", "release", str(tmp_path / "r"), "--layers", "51"]) == 2
    assert list(tmp_path.iterdir()) == []
    made = []
    monkeypatch.setattr(checkpoint_writer, "make", lambda preset, folder, *args, layers, **kwargs: made.append(layers) or folder)
    assert main(["checkpoint", "make", "--preset", "release", str(tmp_path / "r"), "--layers", "2"]) == 0
    assert made == [2] and "the release preset's first 2 blocks as a MiniMax-H3 checkpoint folder" in capsys.readouterr().out
