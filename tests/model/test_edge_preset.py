"""The edge preset and its model contract: the shapes the tiny model never reaches (batch 2, widths that are not
powers of two, a last tile of one row) are in what the model and block gates run."""

import json

import pytest
import torch

from h3gate.files import FileFormatError
from h3gate.model.contract import load_model_contract, model_inputs
from h3gate.model.factory import build_preset
from h3gate.model.presets import TRANSFORMER_CONFIGS

from conftest import THRESHOLDS

TILES = (16, 32, 64, 128, 256)  # every tile size the kernels use on a GPU or under the interpreter


def _is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def test_the_edge_contract_reaches_the_kernels_edges():
    config = TRANSFORMER_CONFIGS["edge"]
    widths = (config["hidden_size"], config["num_attention_heads"] * config["attention_head_dim"], config["ffn_dim"])
    assert not any(_is_power_of_two(width) for width in widths), widths
    assert config["hidden_size"] != widths[1], "hidden differs from the attention width, as at release"
    contract = load_model_contract(THRESHOLDS / "edge" / "model-contract.json")
    inputs, upstream = model_inputs(contract, config)
    rows = inputs["token_tags"].numel()
    assert contract.batch == 2 and all(rows % tile == 1 for tile in TILES), rows
    for name in ("hidden_states", "audio_hidden_states", "encoder_hidden_states"):
        assert inputs[name].shape[0] == 2 and not torch.equal(inputs[name][0], inputs[name][1])
    assert all(gradient.shape[0] == 2 for gradient in upstream.values())


def test_each_sample_of_a_batch_is_computed_as_if_alone():
    """The batch gives the kernels two samples on one layout; the provider computes each as it would alone (on
    CPU bitwise), so batch handling, not different arithmetic, is what a batch-2 contract adds."""
    model = build_preset("edge")
    contract = load_model_contract(THRESHOLDS / "edge" / "model-contract.json")
    inputs, _ = model_inputs(contract, model.config)
    with torch.no_grad():
        both = model.transformer(**inputs, return_dict=False)
        alone = model.transformer(**{
            key: value[1:] if key in ("hidden_states", "audio_hidden_states", "encoder_hidden_states") else value
            for key, value in inputs.items()
        }, return_dict=False)
    for pair, single in zip(both, alone):
        assert torch.equal(pair[1:], single)


def test_batch_is_optional_and_written_only_where_it_is_not_one(tmp_path):
    tiny = json.loads((THRESHOLDS / "tiny" / "model-contract.json").read_text())
    assert "batch" not in tiny and "batch" not in load_model_contract(THRESHOLDS / "tiny" / "model-contract.json").to_json()
    edge = load_model_contract(THRESHOLDS / "edge" / "model-contract.json")
    assert edge.to_json()["batch"] == 2
    path = tmp_path / "model-contract.json"
    path.write_text(json.dumps({**tiny, "batch": 0}))
    with pytest.raises(FileFormatError, match="'batch' must be >= 1"):
        load_model_contract(path)
