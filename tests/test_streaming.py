"""The streamed whole-model run gives the in-memory run's errors, bitwise, on the embedded presets.

On a CPU each op of the streamed run sees the same operands in the same order as in the whole-model run (a block
recomputed from its saved input repeats its forward; the timestep embedding's gradient is summed in autograd's
order), so every metric of every tap is equal, not merely close. The candidate side is the provider program and
a mutant of it, so a candidate installed per step is covered too.
"""

import runpy

import pytest
import torch

from h3gate import numerics
from h3gate.candidates import CandidateError, ProviderCandidate
from h3gate.candidates.mutants import MutantCandidate
from h3gate.measure import errors_against, run_taps
from h3gate.model.contract import load_model_contract, model_inputs
from h3gate.model.factory import build_preset
from h3gate.streaming import stream_errors
from conftest import ROOT, THRESHOLDS


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_streamed_errors_equal_the_in_memory_ones(preset, tiny, one_thread):
    model = tiny if preset == "tiny" else build_preset(preset)
    inputs, upstream = model_inputs(load_model_contract(THRESHOLDS / preset / "model-contract.json"), model.config)
    runs = {
        "provider": (numerics.PROVIDER, None),
        "mutant": (numerics.PROVIDER, MutantCandidate("rope-wrong-half", base="provider")),
    }
    if preset == "tiny":
        runs["self-check"] = (numerics.PROVIDER, ProviderCandidate())
    golden = run_taps(model, "cpu", numerics.GOLDEN, inputs, upstream)
    expected = {
        name: errors_against(run_taps(model, "cpu", mode, inputs, upstream, candidate=candidate), golden)
        for name, (mode, candidate) in runs.items()
    }
    timings = {}
    streamed = stream_errors(model, "cpu", numerics.GOLDEN, runs, inputs, upstream, timings=timings)
    for name in runs:
        assert set(streamed[name]) == set(golden), name
        assert streamed[name] == expected[name], name
    blocks = model.config["num_layers"]
    assert len(timings) == 4 + 2 * blocks and "backward.block0" in timings and "compare" in timings
    assert streamed["mutant"]["outputs.video"]["relative_l2"] > streamed["provider"]["outputs.video"]["relative_l2"]


class _NonFinite(ProviderCandidate):
    """The provider, with NaN in the second block's output."""

    name = "nan-block"

    def install(self, transformer):
        handle = super().install(transformer)
        hook = transformer.transformer_blocks[1].register_forward_hook(lambda _m, _a, output: output * float("nan"))

        class Both:
            def remove(self):
                hook.remove()
                handle.remove()

        return Both()


def test_non_finite_candidate_values_name_the_tap(tiny, tiny_contract):
    inputs, upstream = model_inputs(tiny_contract, tiny.config)
    with pytest.raises(CandidateError, match=r"nan-block produced non-finite values in nodes\.transformer_blocks\.1 "):
        stream_errors(tiny, "cpu", numerics.GOLDEN, {"nan": (numerics.PROVIDER, _NonFinite())}, inputs, upstream)
    assert not tiny.transformer.transformer_blocks[1]._forward_hooks, "the candidate is removed after the error"


def test_saved_inputs_on_the_device_give_the_same_errors(tiny, tiny_contract):
    inputs, upstream = model_inputs(tiny_contract, tiny.config)
    runs = {"provider": (numerics.PROVIDER, None)}
    on_host = stream_errors(tiny, "cpu", numerics.GOLDEN, runs, inputs, upstream, saved_on="host")
    assert stream_errors(tiny, "cpu", numerics.GOLDEN, runs, inputs, upstream, saved_on="device") == on_host
    with pytest.raises(ValueError, match="saved_on"):
        stream_errors(tiny, "cpu", numerics.GOLDEN, runs, inputs, upstream, saved_on="disk")
    with pytest.raises(ValueError, match="golden mode"):
        stream_errors(tiny, "cpu", numerics.GOLDEN, {"x": (numerics.GOLDEN, ProviderCandidate())}, inputs, upstream)


def test_release_bench_smoke_runs_on_tiny(tmp_path, one_thread, capsys):
    bench = runpy.run_path(str(ROOT / "benchmarks" / "release_model_gate.py"))
    log = bench["main"](["--model", "tiny", "--device", "cpu", "--candidate", "provider", "--out", str(tmp_path / "log.json")])
    check = log["steps"]["check"]
    assert check["errors"]["provider"] == check["errors"]["candidate"], "the provider program is bitwise the provider"
    assert check["projection"]["blocks"] == 50 and check["projection"]["seconds"] > check["seconds"]
    assert (tmp_path / "log.json").is_file() and "check at 50 blocks" in capsys.readouterr().out
