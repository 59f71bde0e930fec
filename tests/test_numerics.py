"""Numerics modes: names, what each sets, and that every switch is restored on exit, also after an error."""

import pytest
import torch
from diffusers.models.attention_dispatch import _AttentionBackendRegistry

from h3gate import numerics


def test_unknown_variant_lists_the_valid_ones():
    with pytest.raises(ValueError) as error:
        numerics.get("sdpa-cudnn", "cpu")
    message = str(error.value)
    assert "unknown numerics mode 'sdpa-cudnn' on cpu" in message
    for mode in ("golden", "provider", *(variant.name for variant in numerics.variants("cpu"))):
        assert mode in message


def test_cuda_variants_cover_every_sdpa_backend_and_cublaslt():
    names = {mode.name for mode in numerics.variants("cuda")}
    assert {"sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "blas-cublaslt"} <= names


def test_golden_sets_its_switches_and_restores_them():
    before = numerics.snapshot()
    with numerics.activate(numerics.GOLDEN):
        inside = numerics.snapshot()
        assert inside["attention_backend"] == "_native_math"
        assert inside["cuda.matmul.fp32_precision"] == "ieee" and inside["cudnn.conv.fp32_precision"] == "ieee"
        assert inside["mkldnn.matmul.fp32_precision"] == "ieee"
    assert numerics.snapshot() == before


@pytest.mark.parametrize("mode", [numerics.GOLDEN, *numerics.variants("cpu"), *numerics.variants("cuda")], ids=lambda m: m.name)
def test_every_switch_is_restored_after_an_exception(mode):
    # Start from a state no mode sets, so a restore to "a default" instead of "what was there" is caught.
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    _AttentionBackendRegistry.set_active_backend("_native_flash")
    try:
        before = numerics.snapshot()
        # On a CPU build of torch the cuBLASLt switch raises while the mode is applied: restore then too. Any
        # other error (a switch that fails to apply) is not the one this test raises, and fails it.
        with pytest.raises(RuntimeError, match="^boom$|not been compiled with cuBLASLt"):
            with numerics.activate(mode):
                torch.set_num_threads(1)  # the body changes state too
                raise RuntimeError("boom")
        assert numerics.snapshot() == before
    finally:
        torch.backends.cuda.matmul.fp32_precision = "none"
        _AttentionBackendRegistry.set_active_backend("native")


def test_variant_switches_apply_inside():
    with numerics.activate(numerics.get("threads-1", "cpu")):
        assert torch.get_num_threads() == 1
    with numerics.activate(numerics.get("sdpa-math", "cpu")):
        assert _AttentionBackendRegistry._active_backend == "_native_math"


def test_deterministic_restores_the_previous_setting():
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(RuntimeError, match="boom"):
        with numerics.deterministic():
            assert torch.are_deterministic_algorithms_enabled()
            raise RuntimeError("boom")
    assert not torch.are_deterministic_algorithms_enabled()
