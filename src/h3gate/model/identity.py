"""A model as the gates see it: the transformer at checkpoint precision, its config and its *identity*, a digest of
config and weights that bounds, contracts and evidence are keyed by. The factory (:mod:`h3gate.model.factory`) and
the checkpoint reader (:mod:`h3gate.model.checkpoint`) both make one."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field

import torch
from diffusers import MiniMaxH3Transformer3DModel


class ModelError(ValueError):
    """A model source that cannot be used: names the source and what is wrong with it."""


@dataclass
class Model:
    """A transformer at checkpoint precision with its identity."""

    name: str  # preset name or checkpoint folder name; names the thresholds/ folder
    source: str  # "preset:<name>:seed=<n>" or the checkpoint path
    transformer: MiniMaxH3Transformer3DModel
    identity: str  # sha256 hex of config + weights
    config: dict = field(default_factory=dict)

    def golden_transformer(self) -> MiniMaxH3Transformer3DModel:
        """A float32 copy of the checkpoint weights: the golden run's model."""
        return copy.deepcopy(self.transformer).float()


def tensor_digest(state: dict) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: equal digests, equal weights."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def model_identity(config: dict, weights_digest: str) -> str:
    """The identity of a transformer config and a digest of its weights."""
    canonical = json.dumps({"config": config, "weights": weights_digest}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def plain_config(transformer) -> dict:
    """The transformer's config as plain JSON values, without diffusers' private keys."""
    return json.loads(json.dumps({k: v for k, v in transformer.config.items() if not k.startswith("_")}, default=list))
