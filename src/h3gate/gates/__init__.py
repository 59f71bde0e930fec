"""The gate registry: every gate kind, cheap before expensive (the order gate items run in: a generation waits
for the model gate's verdict), the files each reads from the thresholds folder (:class:`Frozen`), and the protocol a
gate module implements (:class:`GateModule`, and :class:`FreezingGateModule` for a gate with bounds to freeze; a test
holds every registered module to it).

Adding a gate kind is one such module and one line in :data:`REGISTRY` (or :func:`register` from outside). The
plugin's runner, the power gate, the CLI and ``h3gate status`` iterate the registry. Importing this package imports
no gate module (they import torch): a test session that runs no gate pays nothing for it.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class GateModule(Protocol):
    """A gate module (``h3gate.gates.<name>``, or any module a :class:`Gate` entry names)."""

    GATE: str  # its name

    def items(self, run: "GateRun") -> list[dict]:
        """Every item of the gate on ``run.model`` (what ``blocks="all"`` means; the power gate runs them all)."""

    def bounds_file(self, run: "GateRun") -> Path | None:
        """The frozen bounds file an item reads (None: the gate freezes nothing)."""

    def check_item(self, run: "GateRun", bounds) -> Any:
        """Qualify ``run.candidate`` against ``bounds`` (None where the gate has no file): a GateResult;
        :class:`ItemError` for params that do not fit the frozen files; :class:`NotClaimed` for an item the candidate
        does not claim (an op it leaves to the provider, a dtype it does not support)."""


@runtime_checkable
class FreezingGateModule(GateModule, Protocol):
    """A gate module with bounds to freeze (its entry gives no ``frozen_nothing`` reason)."""

    def load_bounds(self, run: "GateRun") -> Any:
        """The bounds of ``run``'s item, checked against the model, device class and contract they were frozen for,
        or :class:`h3gate.bounds.BoundsError`."""

    def freeze_item(self, run: "GateRun") -> Any:
        """Measure the provider configurations and freeze the bounds file of ``run``'s item (written and locked)."""


class ItemError(ValueError):
    """An item whose params do not fit the frozen files it reads (a seed that is not its contract's): a usage
    error of the test that made it."""


class NotClaimed(Exception):
    """An item outside what the candidate claims: recorded as ``not_claimed``, neither a pass nor a gap
    (:mod:`h3gate.evidence.profiles`), so a candidate that replaces one op is judged on that op."""


@dataclass(frozen=True)
class ListParam:
    """A list parameter of the ``h3_gate`` marker: ``seeds=[42, 43]`` makes items ``[seed42]``, ``[seed43]``."""

    marker: str  # the marker's keyword: seeds
    param: str  # the key of each item's value: seed
    prefix: str  # the test id's prefix: seed42
    element: type  # int or str
    choices: str = ""  # "layers": the model's blocks; "module": the gate module's LIST_CHOICES; "": any value


SEEDS = ListParam("seeds", "seed", "seed", int)  # checked against the item's contract when it runs
BLOCKS = ListParam("blocks", "block", "block", int, "layers")  # also "all": every block of the model
OPS = ListParam("ops", "op", "", str, "module")
DTYPES = ListParam("dtypes", "dtype", "", str, "module")
MEASURED = ListParam("gates", "measured", "", str, "module")  # the power gate: one item per gate it measures
SUBJECTS = ListParam("subjects", "subjects", "", str, "module")  # and per kind of subject: mutants, variants


@dataclass(frozen=True)
class Frozen:
    """One file a gate reads from the thresholds folder: its path under the folder (``{model}``, ``{device}`` (the
    device class) and, for a file per block, ``{block}`` filled in), its kind (``contract``: written by ``h3gate
    contracts`` and locked; ``bounds``: frozen; ``capture``: frozen with its block's bounds), and for bounds and
    captures the gate-suite item whose freeze makes it (``{block}`` filled in too), as ``<file>::<test>`` of a folder
    suite (:func:`h3gate.suite.targets` names it in the repository's own suite). ``h3gate status`` lists exactly
    these, under the gate that declares them."""

    path: str
    kind: str
    item: str = ""

    def files(self, model: str, device_class: str, layers: int) -> list[tuple[str, str]]:
        """(path, item) of each file it names on a model of ``layers`` blocks."""
        blocks = range(layers) if "{block}" in self.path else [None]
        return [(self.path.format(model=model, device=device_class, block=block), self.item.format(block=block))
                for block in blocks]


@dataclass(frozen=True)
class Gate:
    """One registered gate kind: what the plugin and ``h3gate status`` need before importing its module."""

    name: str
    lists: tuple[ListParam, ...] = ()  # several multiply: the kernel gate's ops x dtypes
    requires: str | None = None  # a gate whose pass a check needs (and waits for under xdist)
    frozen_nothing: str | None = None  # why freezing skips this gate, when it has nothing to freeze
    module_name: str = ""
    measured_by_test: bool = False  # its measure is the test's own function: the power gate cannot run it
    frozen: tuple[Frozen, ...] = ()  # the files it reads from the thresholds folder, each listed by one gate only

    @property
    def module(self):
        return importlib.import_module(self.module_name or f"h3gate.gates.{self.name}")

    def choices(self, param: ListParam, config: Callable[[], dict]) -> tuple | None:
        """The values a list parameter may take on the model whose transformer config ``config()`` gives (asked only
        for the blocks; ``blocks="all"`` is all of them), or None where any value of its type is taken."""
        if param.choices == "layers":
            return tuple(range(config()["num_layers"]))
        if param.choices != "module":
            return None
        choices = self.module.LIST_CHOICES[param.marker]
        return tuple(choices() if callable(choices) else choices)


REGISTRY: dict[str, Gate] = {}


def register(gate: Gate) -> Gate:
    """Add a gate kind (it runs after those registered before it); its module is imported when an item runs. The
    same entry again is a no-op (a conftest imported twice); another gate under a taken name is an error."""
    if REGISTRY.get(gate.name) == gate:
        return gate
    if gate.name in REGISTRY:
        raise ValueError(f"gate kind {gate.name!r} is registered already")
    if gate.requires is not None and gate.requires not in REGISTRY:
        raise ValueError(f"gate {gate.name!r} requires {gate.requires!r}, which is not registered before it")
    REGISTRY[gate.name] = gate
    return gate


# The suite items that freeze each file, as ``<file>::<test>`` of a folder suite (:mod:`h3gate.suite`).
_BLOCK_ITEM = "test_block.py::test_block[block{block}]"
register(Gate("kernel", (OPS, DTYPES), frozen_nothing="the kernel gate has no bounds to freeze: its rule compares "
              "with torch in the same run"))
register(Gate("block", (BLOCKS,), frozen=(Frozen("{model}/{device}/block{block}-bounds.json", "bounds", _BLOCK_ITEM),
                                          Frozen("{model}/{device}/block{block}-capture.safetensors", "capture",
                                                 _BLOCK_ITEM))))
register(Gate("model", frozen=(Frozen("{model}/model-contract.json", "contract"),  # the block gate reads it too
                               Frozen("{model}/{device}/model-bounds.json", "bounds", "test_model.py::test_model"))))
_PREFLIGHT_ITEM = "test_generation.py::test_generation_preflight"
_GENERATION_ITEM = "test_generation.py::test_generation"
register(Gate("generation", (SEEDS,), requires="model", frozen=(
    Frozen("{model}/generation-preflight-contract.json", "contract"),
    Frozen("{model}/{device}/generation-preflight-bounds.json", "bounds", _PREFLIGHT_ITEM),
    Frozen("{model}/generation-contract.json", "contract"),
    Frozen("{model}/{device}/generation-bounds.json", "bounds", _GENERATION_ITEM))))
register(Gate("threshold", measured_by_test=True))
register(Gate("power", (MEASURED, SUBJECTS), frozen_nothing="the power measurement freezes nothing: it uses the bounds the other gates froze"))


def kinds() -> tuple[str, ...]:
    return tuple(REGISTRY)



def required() -> set[str]:
    """The gates other gates wait for: their items record every outcome (:mod:`h3gate.gates.passes`)."""
    return {gate.requires for gate in REGISTRY.values() if gate.requires}


def waiting() -> set[str]:
    """The gates that wait for another gate's verdict before they run."""
    return {gate.name for gate in REGISTRY.values() if gate.requires}


class _NoBar:
    def step(self, phase: str) -> None:
        pass


@contextlib.contextmanager
def no_progress(total):
    yield _NoBar()


@dataclass
class GateRun:
    """What one gate item works with: the model (built on first use: a missing bounds file fails before it is),
    the candidate (None while freezing), the device, the frozen files, the output folder, the item's params,
    the marker's options and the session's settings."""

    model_name: str
    load_model: Callable[[], Any]
    device: str
    thresholds: Path
    out: Path
    candidate: Any = None
    params: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # the marker's keywords other than list params (contract=...)
    variant_names: list[str] | None = None  # freezing: the provider variants to calibrate from (None: all)
    force_reason: str | None = None  # freezing: overwrite existing bounds, recorded in them
    kernel_examples: int = 8
    kernel_shrink: bool = True  # shrink a failing kernel shape to a minimal one (power does not need it)
    diagnostics: bool = True  # block gate: attribution, self-consistency and the ULP sweep
    verify_last_step: bool = False
    required_override: str | None = None  # run without the required gate's pass; the reason is recorded
    repeat: bool = True  # model gate: two candidate runs compared bitwise (off: a variant with no deterministic kernel)
    progress: Callable = no_progress  # progress(total or None) -> context manager with .step(phase)
    stream: Any = None  # a text stream for bars the engine draws itself (tqdm), or None
    model_spec: str | None = None  # the model as given (a preset's name or a checkpoint folder); None: model_name
    _model: Any = field(default=None, repr=False)

    def contracts_command(self) -> str:
        """The command that writes and locks the model's default contracts into this run's thresholds folder."""
        from h3gate.commands import contracts_command

        return contracts_command(self.model_spec or self.model_name, self.thresholds)

    @property
    def model(self):
        if self._model is None:
            self._model = self.load_model()
        return self._model

    @property
    def device_class(self) -> str:
        from h3gate.bounds import device_class

        return device_class(self.device)

    def with_params(self, **params) -> "GateRun":
        """The same run for another item of the gate (the model is shared)."""
        from dataclasses import replace

        return replace(self, params=params)
