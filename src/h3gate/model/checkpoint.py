"""Checkpoint folders in the published MiniMax-H3 layout: read through diffusers' and transformers' own loaders, and
refused with one line naming the file when they cannot serve a gate (:mod:`h3gate.model.checkpoint_writer` writes them).

The layout, and where each fact comes from (diffusers 0.42.1, transformers 5.24):

- ``model_index.json`` at the root names the modular pipeline, ``"_class_name": "MiniMaxH3ModularPipeline"``: the
  MiniMaxAI/MiniMax-H3 repository's entry is a ``model_index.json`` whose class is a modular pipeline
  (``diffusers/commands/run.py``, ``_load_pipeline``), with one ``[library, class]`` pair per component and the
  pipeline's config values, here the canvas. Beside it ``modular_model_index.json``, which
  ``MiniMaxH3ModularPipeline.save_pretrained`` writes and ``ModularPipeline.from_pretrained`` reads first
  (``diffusers/modular_pipelines/modular_pipeline.py``): it names the blocks class and each component's loading
  spec, the component's files being in the subfolder of its name.
- The components are those the blocks load ``from_pretrained`` (the ``ComponentSpec``s of
  ``diffusers/modular_pipelines/minimax_h3/*.py``, read here from ``MiniMaxH3Blocks``): ``transformer`` (t2va,
  fl2va), ``transformer_ref`` (ref2va; "one repository holds both partitions", ``MiniMaxH3ModularPipeline``'s
  docstring), ``vae``, ``audio_vae``, ``text_encoder``, ``tokenizer``, ``processor``, ``scheduler`` and
  ``audio_scheduler``. The H3 audio decode step declares no vocoder (``minimax_h3/decoders.py``; the vocoder module
  serves MiniMax-Music3).
- Precision (:data:`SAVED_DTYPES`): the transformers are mixed, bf16 with their ``_keep_in_fp32_modules`` in float32
  ("MiniMax-H3 ships a mixed-precision checkpoint", ``diffusers/models/transformers/transformer_minimax_h3.py``);
  both VAEs are float32 ("The released checkpoint is float32", ``diffusers/models/autoencoders/
  autoencoder_kl_minimax_h3.py`` and ``autoencoder_kl_minimax_h3_audio.py``); the Qwen3-VL text encoder is bf16, the
  dtype the modular pipeline's docstring loads the whole pipeline in (``pipe.load_components(dtype=torch.bfloat16)``).
- Weights are safetensors as each class's ``save_pretrained`` writes them (diffusers
  ``diffusion_pytorch_model.safetensors``, transformers ``model.safetensors``; sharded past the shard size, with an
  ``*.safetensors.index.json``).

Two differences from the published folder, both forced by this environment: the processor saves no video processor
(transformers' video processors need torchvision, absent beside this torch build; the t2va and fl2va workflows
process images only), and the tokenizer is the presets' byte-level one.

A folder holding only a transformer (its ``config.json`` at the root, or in ``transformer/``) serves the model and
block gates; the generation gate needs the whole pipeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from diffusers import MiniMaxH3Transformer3DModel, ModelMixin
from diffusers.modular_pipelines import MiniMaxH3Blocks
from safetensors import SafetensorError, safe_open
from transformers import PreTrainedModel

from h3gate.files import file_digests
from h3gate.generation.components import ImageOnlyQwen3VLProcessor
from h3gate.model import spec
from h3gate.model.identity import Model, ModelError, model_identity, plain_config

INDEX = "model_index.json"
MODULAR_INDEX = "modular_model_index.json"
PUBLISHED_REPOSITORY = "MiniMaxAI/MiniMax-H3"
PIPELINE_CLASS = "MiniMaxH3ModularPipeline"
TRANSFORMER_CLASS = spec.TRANSFORMER_CLASS
TRANSFORMERS = ("transformer", "transformer_ref")
SAVED_DTYPES = {
    "transformer": torch.bfloat16,
    "transformer_ref": torch.bfloat16,
    "vae": torch.float32,
    "audio_vae": torch.float32,
    "text_encoder": torch.bfloat16,
}
"""The dtype each model component is saved and loaded at (module docstring); the transformers keep their float32
modules whatever the dtype."""


class CheckpointError(ModelError):
    """A checkpoint folder that cannot serve: one line naming the file and what is wrong with it."""


def component_classes() -> dict[str, type]:
    """Every component the MiniMax-H3 blocks load from a checkpoint, by name, with its class."""
    pipe = MiniMaxH3Blocks().init_pipeline()
    return {name: pipe.get_component_spec(name).type_hint for name in pipe.pretrained_component_names}


def needed_by(name: str) -> str:
    """Which gates need the component ``name``."""
    if name == "transformer":
        return "every gate needs it"
    if name == "transformer_ref":
        return "only the ref2va workflow needs it, which no gate runs"
    return "the generation gate needs it; the model and block gates need only the transformer"


def read_index(root: Path) -> dict | None:
    """The folder's ``model_index.json`` (None for a transformer-only folder), checked to name MiniMax-H3."""
    path = root / INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error}); the checkpoint is damaged") from error
    if not isinstance(index, dict) or index.get("_class_name") != PIPELINE_CLASS:
        found = index.get("_class_name") if isinstance(index, dict) else None
        raise CheckpointError(f"{path}: names a {found!r}, not a {PIPELINE_CLASS}: {root} is not a MiniMax-H3 checkpoint")
    return index


def transformer_folder(path: str | os.PathLike) -> Path:
    """The folder holding the transformer (``transformer/`` of a pipeline folder, or a transformer-only folder),
    checked to be a MiniMax-H3 transformer with weights."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a folder; pass a diffusers MiniMax-H3 checkpoint folder")
    index = read_index(root)
    folder = spec.transformer_folder(root)
    if folder is None and index is not None:
        _missing(root, "transformer")
    problem = spec.not_a_checkpoint(root)
    if problem:
        raise CheckpointError(problem)
    return folder


def _missing(root: Path, name: str):
    raise CheckpointError(f"{root / name}: missing component {name!r} of the MiniMax-H3 pipeline; {needed_by(name)}")


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder; every shard an index lists must be present."""
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError) as error:
            raise CheckpointError(f"{index}: not a readable weight index ({error}); the checkpoint is damaged") from error
        for shard in sorted(shards):
            if not (folder / shard).is_file():
                raise CheckpointError(f"{folder / shard}: missing (listed in {index.name}); copy the checkpoint again")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: has a config.json but no *.safetensors weight files")
    return files


def _stored_shapes(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Every tensor's file and shape, from the safetensors headers alone (no weight is read)."""
    shapes = {}
    for path in files:
        try:
            with safe_open(path, "pt") as handle:
                for key in handle.keys():
                    shapes[key] = (path, tuple(handle.get_slice(key).get_shape()))
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{path}: not a readable safetensors file ({error}): truncated or corrupt; copy it again") from error
    return shapes


def _expected_shapes(folder: Path, cls: type) -> dict[str, tuple[int, ...]]:
    """The parameters and buffers the class builds from the folder's config, built on the meta device (no memory)."""
    try:
        with torch.device("meta"):
            if issubclass(cls, ModelMixin):
                model = cls.from_config(cls.load_config(folder))
            else:
                model = cls._from_config(cls.config_class.from_pretrained(folder))
    except (OSError, ValueError, TypeError, LookupError, ArithmeticError, RuntimeError) as error:  # a negative size
        raise CheckpointError(f"{folder / 'config.json'}: not a valid {cls.__name__} config ({error}); restore it or "
                              "copy the checkpoint again".replace("\n", " ")) from error
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def check_weights(folder: Path, cls: type) -> None:
    """Refuse weights that are unreadable or that the config in the same folder does not describe, before loading."""
    stored = _stored_shapes(_weight_files(folder))
    expected = _expected_shapes(folder, cls)
    differences = [f"{key} is {stored[key][1]} in the weights, {shape} by the config"
                   for key, shape in expected.items() if key in stored and stored[key][1] != shape]
    differences += [f"{key} is missing from the weights" for key in expected if key not in stored]
    differences += [f"{key} is in the weights, not in the model the config builds" for key in stored if key not in expected]
    if differences:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        files = ", ".join(sorted({path.name for path, _ in stored.values()}))
        raise CheckpointError(f"{folder / 'config.json'}: does not match its weights {files}: {differences[0]}{more}")


def _load(root: Path, name: str, cls: type):
    folder = root / name
    if not folder.is_dir():
        _missing(root, name)
    if issubclass(cls, (ModelMixin, PreTrainedModel)):
        check_weights(folder, cls)
        dtype = {"torch_dtype": SAVED_DTYPES[name]} if issubclass(cls, ModelMixin) else {"dtype": SAVED_DTYPES[name]}
        return cls.from_pretrained(folder, local_files_only=True, **dtype).eval()
    if name == "processor":
        cls = ImageOnlyQwen3VLProcessor
    try:
        return cls.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"{folder}: cannot be loaded as a {cls.__name__} ({error})".replace("\n", " ")) from error


def checkpoint_files(root: Path) -> list[Path]:
    """Every file of the checkpoint that its identity covers: all but hidden ones (partial writes, caches)."""
    return sorted(
        path for path in root.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    )


def load_checkpoint(path: str | os.PathLike) -> Model:
    """The transformer of a checkpoint folder at its own mixed precision, offline; its identity covers every file
    of the folder (digests cached by path, size and mtime)."""
    root = Path(path).resolve()
    folder = transformer_folder(root)
    check_weights(folder, MiniMaxH3Transformer3DModel)
    transformer = MiniMaxH3Transformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16, local_files_only=True)
    # Parameters loaded from an unaligned mmap take another GEMM path on CPU (H3_FACTS): own them.
    for param in transformer.parameters():
        param.data = param.data.clone()
    transformer.eval()
    config = plain_config(transformer)
    return Model(
        name=spec.model_name(str(root)),
        source=str(root),
        transformer=transformer,
        identity=model_identity(config, _files_digest(root, checkpoint_files(root))),
        config=config,
    )


def _files_digest(root: Path, files: list[Path]) -> str:
    named = "".join(f"{path.relative_to(root).as_posix()}:{digest}|"
                    for path, digest in zip(files, file_digests(files, progress=sys.stderr)))
    return hashlib.sha256(named.encode()).hexdigest()


def components_digest(path: str | os.PathLike) -> str:
    """The identity of every component but the transformers: a digest of their files (cached by path, size and
    mtime), so a release-size text encoder is hashed once, not read back from the device."""
    root = Path(path).resolve()
    return _files_digest(root, [p for p in checkpoint_files(root) if p.relative_to(root).parts[0] not in TRANSFORMERS])


def load_components(path: str | os.PathLike) -> dict[str, object]:
    """Every component of a checkpoint folder but the transformers, through each class's ``from_pretrained``, plus
    the pipeline's canvas configs from ``model_index.json``: what :func:`h3gate.generation.pipeline.make_pipeline` takes, as
    :func:`h3gate.generation.components.build_components` returns it for a preset."""
    root = Path(path).resolve()
    index = read_index(root)
    if index is None:
        raise CheckpointError(
            f"{root / INDEX}: missing: {root} holds a transformer only, which serves the model and block gates; the "
            "generation gate needs the whole pipeline (h3gate checkpoint make writes one)"
        )
    classes = component_classes()
    components = {name: _load(root, name, cls) for name, cls in classes.items() if name not in TRANSFORMERS}
    pipe = MiniMaxH3Blocks().init_pipeline()
    configs = {spec.name: index.get(spec.name, spec.default) for spec in pipe.blocks.expected_configs}
    return {**components, **configs}
