"""The block program with the provider's ops is bitwise the diffusers model, and installs/removes cleanly."""

import pytest
import torch

from h3gate import block_program, numerics, taps
from h3gate.block_program import BLOCK_TAP_POINTS, OP_GROUPS, PROVIDER_OPS, install
from h3gate.compare import relative_l2
from h3gate.model.contract import model_inputs


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


def test_math_attention_goes_in_query_chunks_when_its_scores_would_not_fit(tiny, tiny_contract, monkeypatch):
    """A score budget of a few rows splits golden's math attention into chunks; output and every gradient stay
    those of the whole-matrix call (softmax is per row), up to float32 summation order."""
    transformer = tiny.golden_transformer()
    inputs, upstream = model_inputs(tiny_contract, tiny.config)
    calls = []
    dispatch = block_program.dispatch_attention_fn
    monkeypatch.setattr(block_program, "dispatch_attention_fn",
                        lambda q, *a, **kw: calls.append(q.shape[1]) or dispatch(q, *a, **kw))
    with numerics.activate(numerics.GOLDEN):
        handle = install(transformer, PROVIDER_OPS)
        try:
            whole = _run(transformer, inputs, upstream)
            whole_calls, calls[:] = list(calls), []
            row_bytes = transformer.config.num_attention_heads * max(whole_calls) * 4
            monkeypatch.setattr(block_program, "MATH_SCORES_BYTES", 7 * row_bytes)
            chunked = _run(transformer, inputs, upstream)
        finally:
            handle.remove()
    rows = max(whole_calls)  # the joint sequence; the refiner's few text rows stay one call
    blocks = whole_calls.count(rows)
    # Every chunk of every block runs twice: forward, and again in the backward (checkpointed).
    assert rows % 7 and calls.count(7) == 2 * blocks * (rows // 7) and calls.count(rows % 7) == 2 * blocks, calls
    assert list(whole) == list(chunked)
    for name in whole:  # measured: at most 1e-6, float32 sums in another order
        assert relative_l2(chunked[name], whole[name]) < 1e-5, name


def test_tap_store_keeps_taps_on_its_device(tmp_path):
    """The block gate's taps stay where its replay ran (a store on the meta device stands in for a GPU here)."""
    store = taps.TapStore(device="meta")
    store.put("x", torch.ones(3, 2).t())
    assert store["x"].device.type == "meta" and store["x"].is_contiguous() and store["x"].shape == (2, 3)
    host = taps.TapStore()
    host.put("x", torch.ones(2))
    assert host["x"].device.type == "cpu"
    with pytest.raises(ValueError, match="keeps its taps on the host"):
        taps.TapStore(tmp_path, device="meta")
