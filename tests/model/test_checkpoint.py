"""Checkpoint folders: written in the published layout, read back through the libraries' loaders, bad ones refused in
one line naming the file, and a tiny folder through the model and block gates."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from conftest import THRESHOLDS
from h3gate import status
from h3gate.cli import main
from h3gate.generation.components import build_components
from h3gate.model.checkpoint import CheckpointError, load_checkpoint, load_components
from h3gate.model.checkpoint_writer import make
from h3gate.model.spec import model_name

ROOT = THRESHOLDS.parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make("tiny", tmp_path_factory.mktemp("made") / "minimax-h3")


@pytest.fixture
def copy(folder, tmp_path):
    """A copy of the made folder to damage."""
    return shutil.copytree(folder, tmp_path / "minimax-h3")


def _dtypes(path):
    with safe_open(path, "pt") as handle:
        return {handle.get_slice(key).get_dtype() for key in handle.keys()}


def test_make_writes_every_component_in_the_published_layout_and_dtypes(folder):
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "MiniMaxH3ModularPipeline"
    names = {"transformer", "transformer_ref", "vae", "audio_vae", "text_encoder", "tokenizer", "processor",
             "scheduler", "audio_scheduler"}
    assert names <= set(index) and all((folder / name).is_dir() for name in names)
    assert _dtypes(folder / "transformer" / "diffusion_pytorch_model.safetensors") == {"BF16", "F32"}
    assert _dtypes(folder / "vae" / "diffusion_pytorch_model.safetensors") == {"F32"}
    assert _dtypes(folder / "audio_vae" / "diffusion_pytorch_model.safetensors") == {"F32"}
    assert _dtypes(folder / "text_encoder" / "model.safetensors") == {"BF16"}
    assert json.loads((folder / "processor" / "processor_config.json").read_text())["processor_class"] == "Qwen3VLProcessor"
    assert not list(folder.parent.glob(".*partial")), "the partial folder is renamed into place"


def test_diffusers_own_modular_pipeline_reads_the_folder(folder):
    from diffusers.modular_pipelines import MiniMaxH3ModularPipeline

    pipe = MiniMaxH3ModularPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.load_components(names=["vae", "scheduler"])
    assert pipe.config.canvas_short_edge == 32 and pipe.vae.config.latent_channels == 4


def test_loads_back_what_was_written(folder, tiny):
    model = load_checkpoint(folder)
    for (name, a), (_, b) in zip(tiny.transformer.named_parameters(), model.transformer.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    built, loaded = build_components("tiny", 0), load_components(folder)
    for name in ("vae", "audio_vae"):
        for key, value in built[name].state_dict().items():
            assert torch.equal(value, loaded[name].state_dict()[key]), f"{name}.{key}"
    assert loaded["text_encoder"].dtype == torch.bfloat16
    assert loaded["tokenizer"].get_vocab() == built["tokenizer"].get_vocab()
    assert loaded["canvas_short_edge"] == 32


def test_identity_covers_every_component_file(copy, folder):
    before = load_checkpoint(copy).identity
    (copy / "scheduler" / "scheduler_config.json").write_text(
        (copy / "scheduler" / "scheduler_config.json").read_text().replace("12.0", "11.0"))
    assert load_checkpoint(copy).identity != before


def test_checkpoints_of_one_name_keep_their_thresholds_apart(folder, tmp_path):
    other = make("tiny", tmp_path / "minimax-h3", ["transformer"], seed=1)
    assert folder.name == other.name
    assert model_name(str(folder)) != model_name(str(other))
    assert model_name(str(folder)).startswith("minimax-h3-")
    assert load_checkpoint(folder).name == model_name(str(folder))


def _one_line(call) -> str:
    with pytest.raises(CheckpointError) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_not_minimax_h3(copy):
    index = json.loads((copy / "model_index.json").read_text())
    (copy / "model_index.json").write_text(json.dumps({**index, "_class_name": "WanPipeline"}))
    assert _one_line(lambda: load_checkpoint(copy)) == (
        f"{copy / 'model_index.json'}: names a 'WanPipeline', not a MiniMaxH3ModularPipeline: {copy} is not a MiniMax-H3 "
        "checkpoint")


def test_missing_component_says_which_gates_need_it(copy):
    shutil.rmtree(copy / "vae")
    load_checkpoint(copy)  # the model and block gates need only the transformer
    assert _one_line(lambda: load_components(copy)) == (
        f"{copy / 'vae'}: missing component 'vae' of the MiniMax-H3 pipeline; the generation gate needs it; the model "
        "and block gates need only the transformer")
    shutil.rmtree(copy / "transformer")
    assert "missing component 'transformer' of the MiniMax-H3 pipeline; every gate needs it" in _one_line(
        lambda: load_checkpoint(copy))


def test_transformer_only_folder_serves_the_model_gates_not_generation(folder, tmp_path):
    only = shutil.copytree(folder / "transformer", tmp_path / "only")
    assert load_checkpoint(only).transformer is not None
    assert "holds a transformer only" in _one_line(lambda: load_components(only))


def test_config_that_does_not_match_its_weights(copy):
    config = json.loads((copy / "transformer" / "config.json").read_text())
    (copy / "transformer" / "config.json").write_text(json.dumps({**config, "ffn_dim": 96}))
    message = _one_line(lambda: load_checkpoint(copy))
    assert message.startswith(f"{copy / 'transformer' / 'config.json'}: does not match its weights "
                              "diffusion_pytorch_model.safetensors: ")
    assert message.endswith("ff.net.0.proj.weight is (256, 64) in the weights, (192, 64) by the config (and 5 more)")


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_unreadable_safetensors(copy, damage):
    weights = copy / "text_encoder" / "model.safetensors"
    if damage == "truncated":
        os.truncate(weights, weights.stat().st_size - 100)
    else:
        weights.write_bytes(b"\0" * 64)
    message = _one_line(lambda: load_components(copy))
    assert message.startswith(f"{weights}: not a readable safetensors file (")
    assert message.endswith("truncated or corrupt; copy it again")


def test_plugin_refuses_a_bad_folder_as_a_usage_error(copy, pytester):
    (copy / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"\0" * 64)
    pytester.makepyfile(test_gate="""
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    h3_gate.run()
""")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--h3-model={copy}", "--h3-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--h3-model: {copy}/transformer/diffusion_pytorch_model.safetensors: not a readable "
                                 "safetensors file*truncated or corrupt; copy it again"])


def test_cli_makes_a_folder_and_refuses_an_existing_one(tmp_path, capsys):
    assert main(["checkpoint", "make", "--preset", "tiny", str(tmp_path / "ck"), "--components", "transformer"]) == 0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["model_index.json", "modular_model_index.json",
                                                                     "transformer"]
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"next, write and lock its contracts: h3gate contracts --model={tmp_path / 'ck'}"
    assert main(["checkpoint", "make", "--preset", "tiny", str(tmp_path / "ck")]) == 2
    assert "exists; a checkpoint is written into a new folder" in capsys.readouterr().err


def test_a_made_tiny_folder_passes_the_model_and_block_gates(folder, tmp_path):
    """Freeze into a fresh thresholds folder (the tiny model contract, locked), then check the provider."""
    thresholds = tmp_path / "thresholds"
    name = model_name(str(folder))
    (thresholds / name).mkdir(parents=True)
    shutil.copy(THRESHOLDS / "tiny" / "model-contract.json", thresholds / name)
    assert main(["lock", str(thresholds / name / "model-contract.json"), f"--thresholds={thresholds}"]) == 0
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gate",
               "tests/gates/test_model.py", "tests/gates/test_block.py", f"--h3-model={folder}", "--h3-device=cpu",
               f"--h3-thresholds={thresholds}", f"--h3-out={tmp_path / 'out'}", "--h3-candidate=provider"]
    for extra in (["--h3-freeze"], []):
        run = subprocess.run(command + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "3 passed" in run.stdout


def test_contracts_command_writes_and_locks_the_defaults_then_status_lists_only_bounds(folder, tmp_path, capsys):
    thresholds = tmp_path / "thresholds"
    assert main(["contracts", "--model", str(folder), f"--thresholds={thresholds}", "--device=cpu"]) == 0
    out = capsys.readouterr().out
    name = model_name(str(folder))
    assert json.loads((thresholds / name / "model-contract.json").read_text()) == json.loads(
        (THRESHOLDS / "tiny" / "model-contract.json").read_text()), "the tiny canvas: 32x32 over the 16x VAE"
    # No gate suite is recorded in this thresholds folder: one command freezes every gate test of the repository.
    assert f"\n  pytest -m gate --h3-freeze --h3-model={folder} --h3-device=cpu --h3-thresholds={thresholds}\n" in out
    report = status.status(thresholds, str(folder), "cpu")
    assert {row.file.rsplit("-", 1)[-1] for row in report.rows if row.state != status.PRESENT} == {
        "bounds.json", "capture.safetensors"}
    assert main(["contracts", "--model", str(folder), f"--thresholds={thresholds}"]) == 2
    assert "model-contract.json exists: contracts are not overwritten" in capsys.readouterr().err
    assert main(["contracts", "--model", str(folder), f"--thresholds={thresholds}", "--replace=same defaults"]) == 0


def test_the_release_contracts_are_the_defaults_at_the_release_canvas():
    from h3gate.bounds import verify_lock
    from h3gate.generation import contract as generation_contract
    from h3gate.generation.default_contracts import defaults

    for name, content in defaults("release").items():
        assert json.loads((THRESHOLDS / "release" / name).read_text()) == content, name
    full = generation_contract.load(THRESHOLDS / "release" / "generation-contract.json")
    preflight = generation_contract.load(THRESHOLDS / "release" / "generation-preflight-contract.json")
    assert (full.workflows, full.num_frames, full.height, full.width, full.num_inference_steps, full.seeds) == (
        ("t2va", "fl2va"), 124, 768, 1344, 49, (42, 43, 44))
    assert (preflight.height, preflight.width, preflight.num_inference_steps) == (768, 1344, 4)
    model = json.loads((THRESHOLDS / "release" / "model-contract.json").read_text())
    assert (model["latent_frames"], model["latent_height"], model["latent_width"]) == (37, 48, 84)
    assert {"release/model-contract.json", "release/generation-contract.json"} <= set(verify_lock(THRESHOLDS))


def test_the_tiny_contracts_are_the_defaults_of_the_tiny_preset():
    from h3gate.generation.default_contracts import defaults

    for name, content in defaults("tiny").items():
        assert json.loads((THRESHOLDS / "tiny" / name).read_text()) == content, name


def test_a_test_sized_transformer_alone_gets_a_canvas_and_steps_that_fit_it(folder, tmp_path, capsys):
    """Without VAEs to give a canvas, a narrow transformer's contracts are the tiny preset's size, not the release
    canvas's 37 x 48 x 84 latents and 49 steps; --canvas sets the model contract's latents."""
    from h3gate.generation.default_contracts import defaults

    only = shutil.copytree(folder / "transformer", tmp_path / "only")
    contracts = defaults(str(only))
    model = contracts["model-contract.json"]
    assert (model["latent_frames"], model["latent_height"], model["latent_width"]) == (37, 2, 2)
    assert (contracts["generation-contract.json"]["num_inference_steps"],
            contracts["generation-contract.json"]["workflow"]) == (8, "fl2va")
    thresholds = tmp_path / "thresholds"
    assert main(["contracts", "--model", str(only), f"--thresholds={thresholds}", "--canvas=3x8x10"]) == 0
    assert "the model contract packs 509 rows a sample (text 15, audio 414, video 80); a forward and backward of this " \
        "transformer there is about " in capsys.readouterr().out, "its cost, said before the first freeze"
    written = json.loads((thresholds / status.model_name(str(only)) / "model-contract.json").read_text())
    assert (written["latent_frames"], written["latent_height"], written["latent_width"]) == (3, 8, 10)
    assert main(["contracts", "--model", str(only), f"--thresholds={tmp_path / 'other'}", "--canvas=3x8"]) == 2
    assert "--canvas 3x8: give latent frames, height and width as FxHxW" in capsys.readouterr().err


def test_a_made_tiny_folder_passes_the_generation_gate_on_both_workflows(folder, tmp_path):
    """Default contracts, the preflight contract made to generate both workflows, then the model gate and the
    preflight generation (t2va and fl2va, seed 42) frozen and checked; the prompt and keyframe encodings are made once
    and reused."""
    thresholds, out = tmp_path / "thresholds", tmp_path / "out"
    assert main(["contracts", "--model", str(folder), f"--thresholds={thresholds}", "--device=cpu"]) == 0
    preflight = thresholds / status.model_name(str(folder)) / "generation-preflight-contract.json"
    preflight.write_text(json.dumps({**json.loads(preflight.read_text()), "workflow": ["t2va", "fl2va"]}))
    assert main(["lock", str(preflight), f"--thresholds={thresholds}"]) == 0
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gate",
               "tests/gates/test_model.py", "tests/gates/test_generation.py::test_generation_preflight",
               f"--h3-model={folder}", "--h3-device=cpu", f"--h3-thresholds={thresholds}", f"--h3-out={out}",
               "--h3-candidate=provider"]
    for extra in (["--h3-freeze", "--h3-variants=sdpa-math"], []):  # the CPU variant that changes the arithmetic
        run = subprocess.run(command + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout
    encodings = sorted(p.name for p in out.glob(f"generation/*/generation-preflight/encodings/*"))
    assert [name.split("-")[0] for name in encodings] == ["fl2va", "fl2va", "t2va", "t2va"]
    assert {name.rsplit(".", 1)[1] for name in encodings} == {"json", "safetensors"}
