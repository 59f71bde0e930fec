"""The block gate's ULP sweep: histograms of ULP distances to golden per tap, counted in chunks of the taps."""

import torch

from h3gate.gates import block as block_gate
from h3gate.taps import TapStore


def _store(**taps):
    store = TapStore()
    for name, tensor in taps.items():
        store.put(name, tensor)
    return store


def test_histogram_counts_each_distance_in_its_bin_across_chunks(monkeypatch):
    golden = torch.ones(10, 3, dtype=torch.float32)
    steps = torch.tensor([0, 1, 2, 3, 5, 100, 5000, 0, 1, 1]).repeat_interleave(3).view(10, 3)
    x = golden.bfloat16().view(torch.int16).add(steps.to(torch.int16)).view(torch.bfloat16)
    expected = [0] * (len(block_gate.ULP_BINS) - 1)
    for step in steps.flatten().tolist():  # bin i holds [ULP_BINS[i], ULP_BINS[i + 1])
        expected[max(i for i, edge in enumerate(block_gate.ULP_BINS[:-1]) if step >= edge)] += 1
    whole = block_gate._histogram(x, golden)
    monkeypatch.setattr(block_gate, "_ULP_CHUNK", 7)  # 30 elements in 5 chunks, the last one short
    assert block_gate._histogram(x, golden) == whole == expected


def test_sweep_pairs_candidate_and_provider_per_floating_tap():
    golden = _store(a=torch.ones(4), idx=torch.arange(4))
    provider = _store(a=torch.ones(4).bfloat16(), idx=torch.arange(4))
    candidate = _store(a=torch.full((4,), 1.0078125).bfloat16(), idx=torch.arange(4))  # one bf16 step above 1
    sweep = block_gate.ulp_sweep(*(block_gate.ulp_histograms(store, golden) for store in (candidate, provider)))
    assert list(sweep["taps"]) == ["a"] and sweep["taps"]["a"]["dtype"] == "bfloat16"
    assert sweep["taps"]["a"]["provider"][0] == 4 and sweep["taps"]["a"]["candidate"][1] == 4
    assert len(sweep["bins"]) == len(block_gate.ULP_BINS)
