"""Taps: the named tensors of one forward+backward run, recorded off the device as they appear.

Names: ``nodes.<module path>`` (a module's output), ``nodes.<module path>.grad`` (the gradient reaching it),
``nodes.<module path>.<point>`` (a named point of the block program, for block-internal taps),
``parameter.<name>.grad`` and ``input_gradients.<input>``. Every tensor is copied to host memory when it
appears, or written to a safetensors file per tap when a directory is given, so a 50-block release model
never holds 50 blocks of activations on the GPU. One block's taps fit beside it, so the block gate keeps them
on the GPU (``device``) and compares them there: a release block's replay has 19 GB of them in bf16, and
copying them to host memory and comparing them there took about a minute per replay on an H200. safetensors is
the format because it is what diffusers checkpoints use and it loads without executing code.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import torch
from safetensors.torch import load_file, save_file

from h3gate.block_program import TAP_POINT

# Modules whose outputs the model gate taps (regular expressions matched against whole module paths).
MODEL_NODES = (
    r"time_proj",
    r"time_embedder",
    r"token_refiner",
    r"transformer_blocks\.\d+",
    r"norm_out",
    r"proj_out",
    r"audio_proj_out",
)
INPUTS_WITH_GRADIENTS = ("hidden_states", "audio_hidden_states", "encoder_hidden_states")


class TapStore(Mapping):
    """name -> tensor copied to ``device`` (host memory by default); spilled to ``directory`` (one safetensors
    file per tap) when one is given."""

    def __init__(self, directory: str | os.PathLike | None = None, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        if directory is not None and self.device.type != "cpu":
            raise ValueError(f"a tap store spilled to {directory} keeps its taps on the host, not on {self.device}")
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, torch.Tensor] = {}
        self._names: list[str] = []
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    @torch.compiler.disable  # recording is host I/O: compiled graphs break here instead of tracing (and guarding) it
    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._names:
            raise KeyError(f"tap {name!r} recorded twice in one run")
        kept = tensor.detach().to(self.device, copy=True).contiguous()
        self._names.append(name)
        if self.directory is None:
            self._memory[name] = kept
            return
        final = self.directory / f"{name}.safetensors"
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".partial")
        os.close(handle)
        save_file({"tensor": kept}, temporary)
        os.replace(temporary, final)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        if self.directory is None:
            return self._memory[name]
        return load_file(self.directory / f"{name}.safetensors")["tensor"]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _matching(transformer: torch.nn.Module, patterns: Iterable[str]) -> list[tuple[str, torch.nn.Module]]:
    patterns = tuple(patterns)
    return [(path, m) for path, m in transformer.named_modules() if path and any(re.fullmatch(p, path) for p in patterns)]


@contextlib.contextmanager
def recording(
    transformer: torch.nn.Module,
    store: TapStore,
    nodes: Iterable[str] = MODEL_NODES,
    internal: Iterable[str] = (),
):
    """Record node outputs (and the gradients that reach them) of ``transformer`` into ``store``.

    ``internal`` names module paths whose block-program points are recorded too.
    """
    handles = []
    internal_paths = {module: path for path, module in _matching(transformer, internal)}

    def keep(name: str, tensor: torch.Tensor) -> None:
        store.put(name, tensor)
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: store.put(f"{name}.grad", grad))

    for path, module in _matching(transformer, nodes):
        @torch.compiler.disable
        def hook(_module, _args, output, path=path):
            if not isinstance(output, torch.Tensor):
                raise TypeError(f"tap nodes.{path}: module output is {type(output).__name__}, not a tensor")
            keep(f"nodes.{path}", output)

        handles.append(module.register_forward_hook(hook))

    @torch.compiler.disable
    def point(module, name, tensor):
        path = internal_paths.get(module)
        if path is not None:
            keep(f"nodes.{path}.{name}", tensor)

    token = TAP_POINT.set(point if internal_paths else None)
    try:
        yield store
    finally:
        TAP_POINT.reset(token)
        for handle in handles:
            handle.remove()


def forward_backward(
    call: Callable,
    transformer: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    upstream: Mapping[str, torch.Tensor],
    store: TapStore,
    nodes: Iterable[str] = MODEL_NODES,
    internal: Iterable[str] = (),
) -> TapStore:
    """One forward and one backward of ``call`` (the transformer or its compiled form), every tap recorded.

    The backward starts from the fixed ``upstream`` gradients of the two outputs (``video``, ``audio``), so
    every run of a gate back-propagates the same cotangent.
    """
    arguments = call_arguments(inputs, next(transformer.parameters()).device)
    transformer.zero_grad(set_to_none=True)
    with recording(transformer, store, nodes, internal):
        output = call(**arguments)
        upstream_loss(output.sample, output.audio_sample, upstream, store).backward()
    for name in INPUTS_WITH_GRADIENTS:
        store.put(f"input_gradients.{name}", grad_or_zeros(arguments[name].grad, arguments[name]))
    for name, param in transformer.named_parameters():
        store.put(f"parameter.{name}.grad", grad_or_zeros(param.grad, param))
    transformer.zero_grad(set_to_none=True)
    return store


def call_arguments(inputs: Mapping[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The transformer's keyword inputs on ``device``; those of :data:`INPUTS_WITH_GRADIENTS` as fresh leaves that
    collect their gradient."""
    arguments = {}
    for name, value in inputs.items():
        value = value.to(device)
        if name in INPUTS_WITH_GRADIENTS:
            value = value.detach().clone().requires_grad_(True)
        arguments[name] = value
    return arguments


def upstream_loss(video: torch.Tensor, audio: torch.Tensor, upstream: Mapping[str, torch.Tensor], store) -> torch.Tensor:
    """The two outputs recorded (``outputs.video``, ``outputs.audio``) and the scalar whose backward sends the fixed
    ``upstream`` gradients into them."""
    store.put("outputs.video", video)
    store.put("outputs.audio", audio)
    return (video.float() * upstream["video"].to(video.device)).sum() + (
        audio.float() * upstream["audio"].to(audio.device)
    ).sum()


def grad_or_zeros(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A gradient that never arrived is an exactly-zero gradient, which the gates treat as such."""
    return grad if grad is not None else torch.zeros_like(like)
