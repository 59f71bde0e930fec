"""h3gate bench: every section runs and reports ratios; the release path builds on the meta device."""

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from h3gate import bench
from h3gate.candidates import ProviderCandidate
from h3gate.model import factory


def test_small_sections_report_ratios():
    sections = []
    report = bench.run(ProviderCandidate(), "small", "cpu", ops=["swiglu"], step_layers=1, progress=lambda m: None,
                       on_section=lambda r: sections.append(sorted(r)))
    assert [s for s in sections[-1] if s in ("ops", "block", "step")] == ["block", "ops", "step"]
    (row,) = report["ops"]
    assert row["op"] == "swiglu" and row["candidate_fwd_ms"] > 0 and row["ratio_fwd"] > 0
    assert report["block"]["seq"] == 466 and report["step"]["layers"] == 1
    peaks = [row["candidate_peak_mib"], row["provider_peak_mib"], report["step"]["candidate_peak_mib"]]
    assert peaks == [None] * 3, "peak memory is measured on CUDA only, and said to be missing elsewhere"
    assert "x = provider time / candidate time" in bench.table(report)


def test_candidate_and_provider_are_timed_in_turn_and_reported_by_their_median_round(monkeypatch):
    """A card's clock drift must reach both sides alike: every section times them alternately, round after round,
    and reports each one's median round, with every round kept."""
    calls = []

    def timer(who, times):
        times = iter(times)
        return lambda: calls.append(who) or next(times)

    timers = {"candidate": timer("candidate", [5.0, 1.0, 2.0]), "provider": timer("provider", [3.0, 9.0, 4.0])}
    medians, rounds = bench.alternating(timers, 3)
    assert calls == ["candidate", "provider"] * 3
    assert medians == {"candidate": 2.0, "provider": 4.0}
    assert rounds == {"candidate": [5.0, 1.0, 2.0], "provider": [3.0, 9.0, 4.0]}

    order = []
    monkeypatch.setattr(bench, "median_ms", lambda fn, device: order.append(fn) or 1.0)
    monkeypatch.setattr(bench, "once_ms", lambda fn, device: order.append(fn) or 1.0)
    report = bench.run(ProviderCandidate(), "small", "cpu", ops=["swiglu"], step_layers=1, progress=lambda m: None,
                       rounds=2)
    (row,) = report["ops"]
    assert report["rounds"] == 2 and set(row["rounds"]) == {"candidate_fwd_ms", "candidate_fwd_bwd_ms",
                                                            "provider_fwd_ms", "provider_fwd_bwd_ms"}
    assert all(values == [1.0, 1.0] for values in row["rounds"].values())
    assert report["block"]["rounds"]["provider_flash_fwd_bwd_ms"] == [1.0, 1.0]
    assert list(report["step"]["rounds"]) == ["provider_ms", "candidate_ms"]
    # ops 4 timers, block 6, step 2, each once a round: a round times every function before the next round starts
    assert len(order) == 2 * (4 + 6 + 2)
    assert order[:4] == order[4:8] and len(set(map(id, order[:4]))) == 4
    assert "medians of 2 rounds" in bench.table(report)
    with pytest.raises(ValueError, match="--rounds 0: "):
        bench.alternating(timers, 0)


def test_release_path_builds_on_meta(monkeypatch):
    narrow = dict(factory.RELEASE_CONFIG, num_attention_heads=2, attention_head_dim=32, hidden_size=64,
                  ffn_dim=128, text_dim=32, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=32, rope_freq_dim=4)
    monkeypatch.setattr(factory, "RELEASE_CONFIG", narrow)
    monkeypatch.setattr(bench, "RELEASE_CONTRACT", dict(text_tokens=5, latent_frames=7, latent_height=4, latent_width=6, audio_latents=9))
    transformer, config = bench.random_transformer("release", 1, "cpu")
    hidden, temb, indices, rotary = bench._block_inputs(transformer, bench._contract_inputs("release", config, "cpu"))
    assert hidden.shape == (1, 5 + 18 + 7 * 6, 64) and hidden.dtype == torch.bfloat16
    assert transformer.proj_out.weight.dtype == torch.float32 and torch.isfinite(hidden).all()


def test_output_gradients_are_seeded_and_named():
    out = torch.zeros(3, 5, dtype=torch.bfloat16)
    random = bench.output_grad(out, "random")
    assert random.dtype == torch.bfloat16 and random.shape == out.shape and random.std() > 0.5
    assert torch.equal(random, bench.output_grad(out, "random")), "seeded: candidate and provider get the same one"
    assert torch.equal(bench.output_grad(out, "ones"), torch.ones_like(out))
    report = bench.run(ProviderCandidate(), "small", "cpu", ops=["swiglu"], block=False, progress=lambda m: None,
                       grad_kind="ones")
    assert report["output_grad"] == "ones"
    with pytest.raises(ValueError, match="'zeros' is not one of"):
        bench.run(ProviderCandidate(), "small", "cpu", ops=["swiglu"], block=False, grad_kind="zeros")


def test_profile_script_runs_its_small_path():
    """benchmarks/profile_op.py is what Nsight Compute runs on the GPU machine: its CPU path is the same code."""
    script = ROOT / "benchmarks" / "profile_op.py"
    done = subprocess.run([sys.executable, str(script), "silu_linear", "--backward", "--provider", "--output-grad",
                           "ones", "--shape", "small", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "profiled silu_linear adaln 3x128->4608, provider, forward+backward" in done.stdout


def test_gemm_products_script_runs_its_small_path():
    """benchmarks/gemm_products.py times linear's products on the GPU machine: its CPU path is the same code, a
    tiling forced on the TMA kernel and the bits compared with the default tiling's."""
    script = ROOT / "benchmarks" / "gemm_products.py"
    done = subprocess.run([sys.executable, str(script), "--cases", "to_out", "--tilings", "64x64x4x2g4", "--rounds",
                           "1", "--shape", "small", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "linear to_out 467x256->256" and len(lines) == 7, done.stdout
    assert all(f" {label} {product}: " in line for line, (label, product) in zip(
        lines[1:], [(label, product) for label in ("default", "64x64x4x2g4") for product in ("forward", "dX", "dW")]))
    assert "DIFFER" not in done.stdout


def test_host_profile_plans_the_candidates_host_code_anywhere():
    """benchmarks/host_profile.py --plan times the candidate's own host code with no kernel launched; timing the
    enqueue itself needs a GPU, and asking for it elsewhere says how to get the planned reading instead."""
    script = ROOT / "benchmarks" / "host_profile.py"
    small = ["silu_linear", "--backward", "--shape", "small", "--device", "cpu", "--batches", "2", "--steps", "2"]
    done = subprocess.run([sys.executable, str(script), *small, "--plan", "--top", "3"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "silu_linear adaln 3x128->4608 forward+backward, h3_triton planned on cpu:" in done.stdout
    assert "ms of host code a call" in done.stdout and "Ordered by: internal time" in done.stdout
    refused = subprocess.run([sys.executable, str(script), *small], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "pass --device cuda, or --plan" in refused.stderr


def test_peak_memory_is_that_of_a_warm_call(monkeypatch):
    """A candidate's first call after it is installed also runs the op contract's check; the peak reported is a
    steady call's."""
    state = {"calls": 0, "peak": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: state.update(peak=0))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: state["peak"])

    def call():
        state["calls"] += 1
        state["peak"] = max(state["peak"], (100 if state["calls"] == 1 else 10) * 2**20)

    assert bench._peak_mib(call, "cuda") == 10 and state["calls"] == 2
