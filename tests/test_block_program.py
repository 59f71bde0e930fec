"""The block program with the provider's ops is bitwise the diffusers model, and installs/removes cleanly."""

import pytest
import torch

from h3gate import numerics, taps
from h3gate.block_program import BLOCK_TAP_POINTS, OP_GROUPS, PROVIDER_OPS, install
from h3gate.contract import model_inputs


def _run(transformer, inputs, upstream, internal=()):
    store = taps.TapStore()
    taps.forward_backward(transformer, transformer, inputs, upstream, store, internal=internal)
    return store


@pytest.mark.parametrize("golden", [False, True], ids=["checkpoint-precision", "fp32"])
def test_provider_program_is_bitwise_diffusers(tiny, tiny_contract, golden):
    transformer = tiny.golden_transformer() if golden else tiny.transformer
    inputs, upstream = model_inputs(tiny_contract, tiny.config)
    mode = numerics.GOLDEN if golden else numerics.PROVIDER
    with numerics.activate(mode):
        plain = _run(transformer, inputs, upstream)
        handle = install(transformer, PROVIDER_OPS)
        try:
            programmed = _run(transformer, inputs, upstream)
        finally:
            handle.remove()
        again = _run(transformer, inputs, upstream)
    assert list(plain) == list(programmed)
    for name in plain:
        assert torch.equal(plain[name], programmed[name]), name
        assert torch.equal(plain[name], again[name]), f"{name} after removal"


def test_double_install_is_refused_and_removal_restores(tiny):
    transformer = tiny.transformer
    handle = install(transformer, PROVIDER_OPS)
    try:
        with pytest.raises(RuntimeError, match="already installed"):
            install(transformer, PROVIDER_OPS)
    finally:
        handle.remove()
    assert "forward" not in vars(transformer.transformer_blocks[0])
    assert "forward" not in vars(transformer.norm_out)


def test_internal_tap_points(tiny, tiny_contract):
    inputs, upstream = model_inputs(tiny_contract, tiny.config)
    handle = install(tiny.transformer, PROVIDER_OPS)
    try:
        store = _run(tiny.transformer, inputs, upstream, internal=[r"transformer_blocks\.0"])
    finally:
        handle.remove()
    for point in BLOCK_TAP_POINTS:
        assert f"nodes.transformer_blocks.0.{point}" in store
        assert f"nodes.transformer_blocks.0.{point}.grad" in store
    assert not any(f"nodes.transformer_blocks.1.{point}" in store for point in BLOCK_TAP_POINTS)


def test_unknown_op_group():
    with pytest.raises(ValueError, match="unknown op group"):
        PROVIDER_OPS.mixed(PROVIDER_OPS, ["softmax"])
    assert PROVIDER_OPS.mixed(PROVIDER_OPS, OP_GROUPS) == PROVIDER_OPS
