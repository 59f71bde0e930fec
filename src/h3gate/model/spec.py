"""What a ``--h3-model`` spec names, found without building the model: its thresholds folder name, its ``source``, its
transformer config and block count, and whether a folder is a MiniMax-H3 checkpoint at first sight.

Light on purpose (no torch): the plugin's option checks, its header and ``h3gate status`` read it before any model
is built.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from h3gate.model.presets import RELEASE, RELEASE_CONFIG, TRANSFORMER_CONFIGS, release_layers, release_name


def transformer_folder(root: Path) -> Path | None:
    """The folder holding a checkpoint's transformer config: ``transformer/`` of a pipeline folder, or the folder
    itself when it holds a transformer only; None when there is neither."""
    for folder in (root / "transformer", root):
        if (folder / "config.json").is_file():
            return folder
    return None


TRANSFORMER_CLASS = "MiniMaxH3Transformer3DModel"  # the ``_class_name`` diffusers writes into its config


def not_a_checkpoint(folder: Path) -> str | None:
    """Why a folder is no MiniMax-H3 checkpoint at first sight (no transformer config, or the config of another
    diffusers model, whose fields the gates would miss), or None; its weights are checked when the model loads."""
    from h3gate.files import FileFormatError, read_json

    found = transformer_folder(folder)
    if found is None:
        return (f"{folder} is a folder but not a MiniMax-H3 checkpoint: it holds neither transformer/config.json nor "
                "config.json; pass a checkpoint folder (h3gate checkpoint make writes one)")
    config = found / "config.json"
    try:
        fields = read_json(config, "transformer config")
    except FileFormatError as error:
        return f"{error}: the checkpoint is damaged; copy it again"
    if fields.get("_class_name") != TRANSFORMER_CLASS:
        return (f"{folder} is a folder but not a MiniMax-H3 checkpoint: {config} describes a "
                f"{fields.get('_class_name')!r}, not a {TRANSFORMER_CLASS}; pass a MiniMax-H3 checkpoint folder")
    layers = fields.get("num_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        return f"{config}: num_layers is {layers!r}, not a count of blocks: the checkpoint is damaged; copy it again"
    return None


def _checkpoint_config(spec: str) -> dict:
    folder = transformer_folder(Path(spec))
    problem = not_a_checkpoint(Path(spec)) if Path(spec).is_dir() else None
    if problem:
        raise ValueError(problem)
    if folder is None:
        raise ValueError(f"unknown model {spec!r}: use one of {', '.join(TRANSFORMER_CONFIGS)} or a checkpoint folder")
    path = folder / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a readable transformer config ({error})") from error


def model_name(spec: str) -> str:
    """The name a model's thresholds folder has: the preset's name (``release-layers<N>`` for the release model's
    leading ``$H3GATE_LAYERS`` blocks), or for a checkpoint folder its name and the first
    12 hex digits of a digest of its transformer (config and weight files), so two checkpoints of one name (two
    fine-tunes both called ``minimax-h3``) keep their thresholds apart. Weight digests are cached by path, size and
    mtime (:func:`h3gate.files.file_digests`): a checkpoint is hashed once."""
    if spec in TRANSFORMER_CONFIGS:
        return spec
    if spec == RELEASE:
        return release_name(release_layers())
    from h3gate.files import file_digests

    root = Path(spec).resolve()
    config = _checkpoint_config(str(root))
    folder = transformer_folder(root)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{folder} has a transformer config.json but no *.safetensors weight files")
    parts = [json.dumps(config, sort_keys=True)] + [f"{path.name}:{digest}"
                                                    for path, digest in zip(weights, file_digests(weights, sys.stderr))]
    return f"{root.name}-{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:12]}"


def model_source(spec: str, seed: int = 0) -> str:
    """What :func:`h3gate.model.factory.load_model` records as the model's ``source``, without loading it."""
    if spec == RELEASE:
        layers = release_layers()
        return f"preset:{spec}:seed={seed}" + ("" if layers == RELEASE_CONFIG["num_layers"] else f":layers={layers}")
    return f"preset:{spec}:seed={seed}" if spec in TRANSFORMER_CONFIGS else str(Path(spec).resolve())


def transformer_config(spec: str) -> dict:
    """The transformer config of a model without building it: a preset's, or a checkpoint's config.json."""
    if spec == RELEASE:
        return {**RELEASE_CONFIG, "num_layers": release_layers()}
    return TRANSFORMER_CONFIGS.get(spec) or _checkpoint_config(spec)


def num_layers(spec: str) -> int:
    config = transformer_config(spec)
    if not isinstance(config.get("num_layers"), int):
        raise ValueError(f"the transformer config of {spec!r} has no integer num_layers")
    return config["num_layers"]
