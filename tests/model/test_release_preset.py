"""The release preset: diffusers' release config, built on a GPU only, apart from the presets the CPU suite iterates."""

import inspect

import pytest
import torch
from diffusers import MiniMaxH3Transformer3DModel

from h3gate import commands, status
from h3gate.model import spec
from h3gate.model.factory import _materialised, keeps_fp32, load_model
from h3gate.model.identity import ModelError
from h3gate.model.presets import (
    LAYERS_VARIABLE,
    PRESETS,
    RELEASE,
    RELEASE_CONFIG,
    TRANSFORMER_CONFIGS,
    release_layers,
    release_name,
)


def test_release_config_is_diffusers_default():
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(MiniMaxH3Transformer3DModel.__init__).parameters.items()
        if name in RELEASE_CONFIG
    }
    assert defaults == RELEASE_CONFIG
    assert RELEASE not in PRESETS and RELEASE not in TRANSFORMER_CONFIGS


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_release_without_cuda_is_one_clear_error():
    with pytest.raises(ModelError, match="CUDA GPU with about 70 GiB"):
        load_model(RELEASE)


def test_layers_come_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.delenv(LAYERS_VARIABLE, raising=False)
    assert release_layers() == 50 and release_name(50) == "release"
    monkeypatch.setenv(LAYERS_VARIABLE, "4")
    assert release_layers() == 4 and release_layers(2) == 2 and release_name(4) == "release-layers4"
    assert spec.model_name(RELEASE) == "release-layers4" and spec.num_layers(RELEASE) == 4
    assert spec.model_source(RELEASE, 3) == "preset:release:seed=3:layers=4"
    assert spec.transformer_config(RELEASE) == {**RELEASE_CONFIG, "num_layers": 4}
    assert status.default_device(RELEASE) == "cuda"
    assert commands.freeze_command(["tests/gates/test_model.py"], RELEASE, "cuda").startswith(
        "H3GATE_LAYERS=4 pytest tests/gates/test_model.py --h3-freeze --h3-model=release --h3-device=cuda")
    for bad in ("0", "51", "four"):
        monkeypatch.setenv(LAYERS_VARIABLE, bad)
        with pytest.raises(ValueError, match=LAYERS_VARIABLE):
            release_layers()
        with pytest.raises(ModelError, match=LAYERS_VARIABLE):
            load_model(RELEASE)


def test_materialised_model_is_seeded_per_parameter_at_checkpoint_precision():
    config = dict(TRANSFORMER_CONFIGS["tiny"], num_layers=3)
    full = _materialised(config, 7, "cpu")
    leading = dict(_materialised({**config, "num_layers": 1}, 7, "cpu").named_parameters())
    for name, param in full.named_parameters():
        assert param.dtype == (torch.float32 if keeps_fp32(name) else torch.bfloat16), name
        assert param.device.type == "cpu" and torch.isfinite(param).all(), name
        if name in leading:
            assert torch.equal(param, leading[name]), f"{name}: a partial model holds the full one's leading blocks"
    assert not any(name.startswith("transformer_blocks.1.") for name in leading)
    fresh = type(full.rope)(config["rope_freq_dim"])
    assert torch.equal(full.rope.inv_freq, fresh.inv_freq)
    norm_q = full.transformer_blocks[0].attn.norm_q.weight.float()
    assert 1.5 <= norm_q.min() and norm_q.max() <= 3.0, "the embedded init scheme: peaky attention"
    other = _materialised(config, 8, "cpu")
    assert not torch.equal(full.proj_in.weight, other.proj_in.weight)


def test_release_components_fit_the_release_transformer_and_are_built_on_cuda_only():
    from diffusers import AutoencoderKLMiniMaxH3

    from h3gate.generation.components import RELEASE_COMPONENTS, build_components

    vae_defaults = inspect.signature(AutoencoderKLMiniMaxH3.__init__).parameters
    assert vae_defaults["latent_channels"].default == RELEASE_CONFIG["in_channels"]
    assert len(RELEASE_COMPONENTS["audio_vae"]["latents_mean"]) == RELEASE_CONFIG["audio_in_channels"]
    text = RELEASE_COMPONENTS["text_encoder"]
    assert text["text_config"]["hidden_size"] == text["vision_config"]["out_hidden_size"] == RELEASE_CONFIG["text_dim"]
    assert text["text_config"]["num_hidden_layers"] == 51, "the pipeline reads hidden state 50"
    with pytest.raises(ValueError, match="built on a CUDA device, not 'cpu': run with --h3-device=cuda"):
        build_components(RELEASE, 0, "cpu")


def test_the_release_contracts_cost_is_the_flops_the_h200_measured():
    """The predicted cost of a release pass: 38,733 rows, and a block forward of about 73 TFLOP, which the H200 ran in
    134 ms at 533 TFLOP/s (README, "Speed of h3_triton"; H3_FACTS): the count holds within a few percent."""
    from conftest import THRESHOLDS
    from h3gate.model.contract import load_model_contract, packed_rows, pass_flops

    contract = load_model_contract(THRESHOLDS / "release" / "model-contract.json")
    config = spec.transformer_config(RELEASE)
    assert sum(packed_rows(contract, config).values()) == 38_733
    block_forward = pass_flops(contract, {**config, "num_layers": 1}) / 3.2  # forward and backward: ~3.2 forwards
    assert block_forward == pytest.approx(0.1339 * 533e12, rel=0.06)
