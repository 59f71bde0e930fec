"""The gate registry: every registered gate implements the protocol, and a new gate kind is one module plus one
registry line (a toy gate, added here from a conftest, freezes and checks through the plugin like the built-ins)."""

import json

import pytest

from h3gate import gates as registry, status, suite
from seeded_gates import seeded_gate

TOY_GATE = '''
"""A toy gate: the candidate's SwiGLU in bfloat16 against float64, bounded by 1.5 x the provider's error."""

import torch

from h3gate import bounds as bounds_mod
from h3gate.candidates import ProviderCandidate
from h3gate.verdict import Check, GateResult

GATE = "toy"


def _error(fn, seed):
    h = torch.randn(64, 128, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    a, gate = h.chunk(2, dim=-1)
    exact = a * torch.nn.functional.silu(gate)
    return float((fn(h.bfloat16()).double() - exact).norm() / exact.norm())


def items(run):
    return [{"seed": 1}, {"seed": 2}]


def bounds_file(run):
    return bounds_mod.bounds_path(run.thresholds, run.model_name, run.device_class, GATE)


def load_bounds(run):
    return bounds_mod.load(bounds_file(run), GATE, run.model.identity, run.device_class)


def freeze_item(run):
    swiglu = ProviderCandidate().kernel_ops()["swiglu"]
    errors = {"provider": {f"seed{item['seed']}": _error(swiglu, item["seed"]) for item in items(run)}}
    frozen = bounds_mod.frozen_by_ensemble(GATE, run.model, run.device_class, errors, {})
    bounds_mod.save(frozen, bounds_file(run), run.thresholds, run.force_reason)
    return frozen


def check_item(run, frozen):
    tap = f"seed{run.params['seed']}"
    value = _error(run.candidate.kernel_ops()["swiglu"], run.params["seed"])
    return GateResult(GATE, run.params, [Check(tap, "relative_l2", value, frozen.bounds[tap], value <= frozen.bounds[tap])])
'''

CONFTEST = '''
from h3gate.gates import SEEDS, Frozen, Gate, register

register(Gate("toy", (SEEDS,), module_name="toy_gate", frozen=(Frozen("{model}/{device}/toy-bounds.json", "bounds", "test_toy.py::test_toy"),)))
'''

TOY_TEST = '''
import pytest


@pytest.mark.h3_gate("toy", seeds=[1, 2])
def test_toy(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
'''

# A bug a kernel ships: SwiGLU's gate on the wrong half.
SWAPPED = '''
import torch.nn.functional as F

from h3gate.candidates import ProviderCandidate, register


class Swapped(ProviderCandidate):
    name = "swapped"

    def kernel_ops(self):
        def swiglu(h):
            a, gate = h.chunk(2, dim=-1)
            return gate * F.silu(a)

        return {**super().kernel_ops(), "swiglu": swiglu}


register("swapped", Swapped)
'''


def test_every_registered_gate_implements_the_protocol():
    for gate in registry.REGISTRY.values():
        module = gate.module
        assert module.GATE == gate.name
        protocol = registry.GateModule if gate.frozen_nothing else registry.FreezingGateModule
        assert isinstance(module, protocol), f"{gate.name} does not implement {protocol.__name__}"
        for param in gate.lists:
            if param.choices == "module":
                assert module.LIST_CHOICES[param.marker], (gate.name, param.marker)
        assert gate.requires is None or registry.kinds().index(gate.requires) < registry.kinds().index(gate.name)


def test_registering_twice_or_out_of_order_is_refused():
    with pytest.raises(ValueError, match="'model' is registered already"):
        registry.register(registry.Gate("model", requires="kernel"))
    assert registry.register(registry.REGISTRY["model"]) is registry.REGISTRY["model"]  # a conftest imported twice
    with pytest.raises(ValueError, match="requires 'nothing', which is not registered before it"):
        registry.register(registry.Gate("late", requires="nothing"))
    assert "late" not in registry.REGISTRY


def test_a_toy_gate_is_one_module_and_one_registry_line(pytester, monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))  # the toy leaves with this test
    (pytester.path / "thresholds").mkdir()
    (pytester.path / "thresholds" / suite.RECORD).write_text(suite.record_text("."))  # the suite: the project's root
    pytester.makepyfile(toy_gate=TOY_GATE, conftest=CONFTEST + SWAPPED, test_toy=TOY_TEST)
    pytester.syspathinsert()
    args = ["-p", "no:cacheprovider", "--h3-device=cpu", "-m", "gate", "test_toy.py"]

    missing = pytester.runpytest(*args, "--h3-candidate=provider")
    missing.assert_outcomes(failed=2)
    missing.stdout.fnmatch_lines(["*no frozen toy bounds at *toy-bounds.json; freeze them with: pytest *test_toy*"])
    toy = [row for row in status.status(pytester.path / "thresholds", "tiny", "cpu").rows if row.gate == "toy"]
    assert [(row.file, row.state) for row in toy] == [("tiny/cpu/toy-bounds.json", status.MISSING)]
    assert toy[0].command.startswith("pytest test_toy.py::test_toy --h3-freeze --h3-model=tiny --h3-device=cpu")

    frozen = pytester.runpytest(*args, "--h3-freeze")
    frozen.assert_outcomes(passed=2)  # one file for both items: the second reports the first's freeze
    frozen.stdout.fnmatch_lines(["froze *thresholds/tiny/cpu/toy-bounds.json (2 bounds, locked)"])
    toy = [row for row in status.status(pytester.path / "thresholds", "tiny", "cpu").rows if row.gate == "toy"]
    assert [row.state for row in toy] == [status.PRESENT], "h3gate status lists the new gate's file, locked"
    bounds = json.loads((pytester.path / "thresholds" / "tiny" / "cpu" / "toy-bounds.json").read_text())
    assert set(bounds["bounds"]) == {"seed1", "seed2"}

    passed = pytester.runpytest(*args, "--h3-candidate=provider", "--junitxml=junit.xml")
    passed.assert_outcomes(passed=2)
    passed.stdout.fnmatch_lines(["evidence verdict: INCOMPLETE for profile ci (kernel: no test item of this gate ran *; "
                                 "block: no test item*; power: no test item*)"])
    assert 'name="h3_gate" value="toy"' in (pytester.path / "junit.xml").read_text()
    results = json.loads((pytester.path / "h3-out" / "results.json").read_text())["results"]
    assert sorted(result["gate"] for result in results.values()) == ["toy", "toy"]

    caught = pytester.runpytest(*args, "--h3-candidate=swapped", "--h3-out=swapped")  # its own evidence folder
    caught.assert_outcomes(failed=2)
    caught.stdout.fnmatch_lines(["E * where False = <toy gate [[]seed=1[]] FAILED 1/1 checks; worst seed1: *>.passed"])
    assert "GateResult(" not in caught.stdout.str(), "a failed assert shows the result's summary, not its fields"


OOM_GATE = seeded_gate("greedy", imports="import torch", state="HELD = []", body='''
    if run.params["seed"] == 1:
        HELD.append(torch.ones(4))  # what a traceback would keep alive
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.28 GiB. GPU 0 has 7.28 GiB free.\\nmore")
    return GateResult(GATE, run.params, [Check("x", "relative_l2", 0.0, 1.0, True)])''')


def test_a_gate_out_of_gpu_memory_fails_in_one_line_and_the_next_item_runs(pytester, monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    pytester.makepyfile(**OOM_GATE, test_greedy=TOY_TEST.replace('"toy"', '"greedy"'))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=provider", "-m", "gate")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*the greedy gate ran out of GPU memory on cpu: CUDA out of memory. Tried to allocate "
                                 "8.28 GiB. GPU 0 has 7.28 GiB free. Free the GPU of other processes, or run fewer "
                                 "xdist workers per GPU*"])
    assert "Traceback" not in result.stdout.str() and "check_item" not in result.stdout.str()


def test_evidence_that_cannot_be_written_fails_the_run_and_keeps_the_results(pytester, monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("h3gate.evidence.accumulate.add_session", disk_full)
    pytester.makepyfile(**OOM_GATE, test_greedy=TOY_TEST.replace('"toy", seeds=[1, 2]', '"greedy", seeds=[2]'))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=provider", "-m", "gate")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*evidence NOT written (OSError: [[]Errno 28[]] No space left on device); the results "
                                 "are kept in h3-out/results.json*", "*1 passed*"])
    results = json.loads((pytester.path / "h3-out" / "results.json").read_text())["results"]
    assert [result["passed"] for result in results.values()] == [True]


def test_the_toy_gates_size():
    """The whole of a new gate kind: its module and one registry line, which names the file it freezes."""
    assert len(TOY_GATE.strip().splitlines()) < 50
    registration = [line for line in CONFTEST.strip().splitlines() if line.startswith("register(")]
    assert len(registration) == 1 and registration[0].endswith("),)))") and "Frozen(" in registration[0]
