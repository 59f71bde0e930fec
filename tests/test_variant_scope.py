"""Where provider variants and repeatability checks take effect: only where they can run and only on what they vary.

Found on an H200: flash and cuDNN SDPA take half precision only (the kernel gate's float32 items and the video VAE's
float32 attention have no kernel there), cuDNN has none for a one-row sequence, and the provider's own CUDA backwards
add with atomics, so two runs compared bitwise must run under torch's deterministic algorithms.
"""

import torch

from conftest import THRESHOLDS
from h3gate import numerics, op_registry
from h3gate.candidates import ProgramCandidate
from h3gate.gates import kernel as kernel_gate, power
from h3gate.model.contract import load_model_contract, model_inputs


def test_backends_of_half_precision_meet_only_what_they_take():
    cuda = {mode.name: mode for mode in numerics.variants("cuda")}
    assert cuda["sdpa-flash"].takes("bfloat16") and not cuda["sdpa-flash"].takes("float32")
    assert not cuda["sdpa-cudnn"].takes("float32") and not cuda["sdpa-cudnn"].every_shape
    assert all(mode.takes("float32") and mode.every_shape for mode in numerics.variants("cpu"))
    assert not cuda["compiled"].sets_switches and cuda["blas-cublaslt"].sets_switches


def test_a_variant_candidate_sets_its_switches_inside_the_transformers_ops_only(tiny, monkeypatch):
    seen = []
    provider_attention = power.PROVIDER_OPS.attention

    def attention(*args, **kwargs):
        seen.append(numerics.snapshot()["attention_backend"])
        return provider_attention(*args, **kwargs)

    monkeypatch.setattr(power, "PROVIDER_OPS", power.PROVIDER_OPS.__class__(
        **{**power.PROVIDER_OPS.__dict__, "attention": attention}))
    defaults = numerics.snapshot()
    inputs, _ = model_inputs(load_model_contract(THRESHOLDS / "tiny" / "model-contract.json"), tiny.config)
    with power.VariantCandidate("sdpa-math", "cpu").installed(tiny.transformer), torch.no_grad():
        assert numerics.snapshot() == defaults, "outside the transformer's ops (a VAE, the text encoder): defaults"
        tiny.transformer(**inputs)
    assert seen and {str(backend) for backend in seen} == {"_native_math"}
    assert numerics.snapshot() == defaults


def test_the_kernel_gates_bitwise_comparison_runs_deterministically():
    seen = []

    def swiglu(h):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return op_registry.provider_ops()["swiglu"](h)

    candidate = ProgramCandidate({**op_registry.provider_ops(), "swiglu": swiglu}, name="spy")
    result = kernel_gate.check(candidate, "swiglu", "cpu", dtypes=("bfloat16",), max_examples=2)
    assert result.passed, result.report()
    assert seen and all(seen), "the candidate's runs compared bitwise ran without deterministic algorithms"
    assert not torch.are_deterministic_algorithms_enabled()
