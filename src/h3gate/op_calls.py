"""The op calls of a model: every distinct call of a standalone op in a forward, a backward and a generation step.

The kernel gate draws generic shapes; the model that ships calls its ops at shapes, strides, dtypes and grad modes
of its own (56 heads of 128, rows of 5,376, reductions over 38,733 rows, every generation step without autograd).
So the calls are traced from the model itself: its transformer built on the meta device (shapes without weights,
so the release model's calls come in seconds on any machine), run through the block program
(:mod:`h3gate.block_program`) with an op table that records each call in the standalone ops' signatures
(:mod:`h3gate.op_registry`) before computing it on meta tensors. A forward and a backward at the model contract
(as the model gate runs it) and a forward under ``torch.no_grad()`` (as the generation pipeline calls the
transformer at every step) give the calls; equal calls are one class.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from h3gate import op_registry
from h3gate.model.contract import ModelContract, load_model_contract, model_inputs
from h3gate.model.factory import transformer_skeleton
from h3gate.model.presets import RELEASE, RELEASE_CONFIG, TRANSFORMER_CONFIGS

AUTOGRAD = "autograd"  # a forward whose backward runs (the model and block gates, training)
NO_GRAD = "no_grad"  # a forward under torch.no_grad() (every generation step)
INFERENCE = "inference_mode"  # a forward under torch.inference_mode() (callers outside the pipeline)
MODES = (AUTOGRAD, NO_GRAD, INFERENCE)


@dataclass(frozen=True)
class Arg:
    """One tensor argument of a call: what a kernel sees of it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    grad: bool  # requires a gradient


@dataclass(frozen=True)
class Call:
    """One class of op calls: the op, its tensor arguments by name (None where the caller passed None) and the mode."""

    op: str
    args: tuple[tuple[str, Arg | None], ...]
    mode: str

    def arg(self, name: str) -> Arg | None:
        return dict(self.args)[name]


def _arg(value: torch.Tensor) -> Arg:
    return Arg(tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch."), value.requires_grad)


def _recorder(op: op_registry.Op, calls: dict) -> callable:
    signature = inspect.signature(op.provider)

    def record(*args):
        bound = signature.bind(*args).arguments
        tensors = tuple((name, _arg(value) if isinstance(value, torch.Tensor) else None)
                        for name, value in bound.items() if isinstance(value, torch.Tensor) or value is None)
        mode = AUTOGRAD if torch.is_grad_enabled() and any(a and a.grad for _, a in tensors) else NO_GRAD
        calls.setdefault(Call(op.name, tensors, mode), None)
        return op.provider(*args)

    return record


def trace(config: dict, contract: ModelContract) -> tuple[Call, ...]:
    """The distinct op calls of ``config``'s transformer at ``contract``: a forward and backward, then a no-grad
    forward, all on the meta device. Every block of a kind has the same shapes, so one of each is traced."""
    return _trace(json.dumps(config, sort_keys=True), contract)


@functools.lru_cache(maxsize=8)
def _trace(config_json: str, contract: ModelContract) -> tuple[Call, ...]:
    # Imported here (taps imports the block program): the kernel gate imports this module for its call types, and a
    # table of the block program out of step with the op registry must fail where it is built, not in that import.
    from h3gate import block_program
    from h3gate.taps import INPUTS_WITH_GRADIENTS

    config = json.loads(config_json)
    transformer = transformer_skeleton({**config, "num_layers": 1, "num_refiner_layers": min(1, config["num_refiner_layers"])})
    calls: dict[Call, None] = {}
    block_program.install(transformer, block_program.ops_from_kernels(
        {op.name: _recorder(op, calls) for op in op_registry.OPS}))
    inputs, _ = model_inputs(contract, config)
    inputs = {name: value.to("meta") for name, value in inputs.items()}
    leaves = {name: value.requires_grad_(name in INPUTS_WITH_GRADIENTS) for name, value in inputs.items()}
    out = transformer(**leaves)
    (out.sample.float().sum() + out.audio_sample.float().sum()).backward()
    with torch.no_grad():
        transformer(**inputs)
    return tuple(calls)


def model_config(model_name: str, load=None) -> dict:
    """The transformer config of an embedded preset or the release model by name, without building it; of a
    checkpoint, through ``load()`` (the gate run's model)."""
    if model_name in TRANSFORMER_CONFIGS:
        return TRANSFORMER_CONFIGS[model_name]
    if model_name == RELEASE:
        return RELEASE_CONFIG
    if load is None:
        raise ValueError(f"model {model_name!r} is no preset: its config comes from loading it")
    return load().config


def model_calls(model_name: str, thresholds: Path | None, load=None) -> tuple[Call, ...]:
    """The op calls of a model at its contract ``thresholds/<model>/model-contract.json``, or, where the folder has
    none (a repository that froze nothing for it: the kernel gate reads no frozen file), at the default contract
    ``h3gate contracts`` would write for it."""
    path = Path(thresholds) / model_name / "model-contract.json" if thresholds is not None else None
    if path is not None and path.is_file():
        return trace(model_config(model_name, load), load_model_contract(path))
    from h3gate.generation.default_contracts import defaults

    spec = model_name if model_name in TRANSFORMER_CONFIGS or model_name == RELEASE else load().source
    fields = dict(defaults(spec)["model-contract.json"])
    del fields["schema"]
    fields["keyframes"] = tuple(fields["keyframes"])
    return trace(model_config(model_name, load), ModelContract(**fields))

