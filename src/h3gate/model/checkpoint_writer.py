"""Writing a checkpoint folder in the published MiniMax-H3 layout (:mod:`h3gate.model.checkpoint` says where each fact of
the layout comes from), component by component and each model shard by shard, so no model is ever whole in memory:
the release preset's folder is about 190 GB (two 62 GiB transformers, a 47 GiB text encoder, 10 GiB of VAEs) and is
written with about one shard of host memory beside the VAEs.

The files are those of diffusers' and transformers' ``save_pretrained`` (diffusers 0.42.1 ``ModelMixin``,
transformers 5.24 ``PreTrainedModel``), made through the same libraries: huggingface_hub's
``split_torch_state_dict_into_shards`` plans the shards from names, shapes and dtypes (meta tensors are enough),
safetensors' ``save_file`` writes each shard with the metadata ``{"format": "pt"}``, the libraries save the configs,
and the shard index is written as they write it (transformers adds ``total_parameters``). A test holds a written
folder byte for byte equal to ``save_pretrained``'s. The other components (tokenizer, processor, schedulers) go
through the modular pipeline's ``save_pretrained``.

Shards are of huggingface_hub's default size (5 GB, the Hub's recommended size): the libraries' own defaults (10 GB
for diffusers, 50 GB for transformers) would hold that much in memory at once.

Where the weights come from:

- the embedded presets' models are built whole (they are small) and their tensors written as they are;
- the release transformers are drawn one parameter at a time with the presets' init
  (:func:`h3gate.model.factory.drawn_parameter`), the release text encoder one module at a time by transformers' own
  ``_init_weights``, each under a seed of its name. These use torch's own CPU draws, not the machine-independent ones
  of :mod:`h3gate.seeded` (several times slower at release size): a checkpoint folder is identified by
  its files' digests, never re-derived on another machine;
- the release VAEs (2.6 B float32 parameters) are built whole on the CPU by the presets' builder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import ModelMixin
from diffusers.modular_pipelines import MiniMaxH3Blocks
from huggingface_hub import split_torch_state_dict_into_shards
from huggingface_hub.serialization._base import parse_size_to_int  # what split_torch_state_dict_into_shards parses with
from safetensors.torch import save_file
from tqdm import tqdm

from h3gate.model.checkpoint import (
    INDEX,
    MODULAR_INDEX,
    PIPELINE_CLASS,
    PUBLISHED_REPOSITORY,
    SAVED_DTYPES,
    TRANSFORMERS,
    CheckpointError,
    component_classes,
)
from h3gate.files import write_json
from h3gate.model.factory import build_preset, drawn_parameter, transformer_skeleton
from h3gate.generation.components import (
    PRESETS,
    build_components,
    build_vae,
    component_rng,
    small_components,
    text_encoder_skeleton,
)
from h3gate.model.presets import RELEASE, RELEASE_CONFIG

MAX_SHARD_SIZE = "5GB"
_MODELS = (*TRANSFORMERS, "vae", "audio_vae", "text_encoder")


@dataclass
class ModelWeights:
    """A model component to write: ``model`` gives the config, the tensor names, shapes and saved dtypes (it may be
    on the meta device); ``tensors(names)`` gives those tensors on the CPU, materialised only when asked for."""

    model: torch.nn.Module
    tensors: Callable[[list[str]], dict[str, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.model.state_dict().values())


def held(model: torch.nn.Module) -> ModelWeights:
    """A model built whole: its own tensors."""
    state = model.state_dict()
    return ModelWeights(model, lambda names: {name: state[name] for name in names})


def built_when_written(build: Callable[[str], torch.nn.Module]) -> ModelWeights:
    """A model that ``build(device)`` makes whole: on the meta device to plan, on the CPU when its first shard is
    written (so planning a folder, and refusing it for want of disk, builds nothing)."""
    state = {}

    def tensors(names):
        if not state:
            state.update(build("cpu").state_dict())
        return {name: state[name] for name in names}

    return ModelWeights(build("meta"), tensors)


def drawn_transformer(config: dict, seed: int) -> ModelWeights:
    """A transformer of ``config`` (the release one) with the presets' init, each parameter drawn when its shard is
    written: what :func:`h3gate.model.factory.build_release` draws on a GPU, drawn on the CPU."""
    model = transformer_skeleton(config)
    shapes = dict(model.named_parameters())

    def tensors(names):
        return {name: drawn_parameter(name, shapes[name].shape, config["hidden_size"], seed, "cpu")
                .to(shapes[name].dtype) for name in names}

    return ModelWeights(model, tensors)


def library_initialised(model, seed: int, component: str) -> ModelWeights:
    """A transformers model on the meta device whose tensors are made one owning module at a time: the module is
    materialised on the CPU, filled with NaN, initialised by the model's own ``_init_weights`` under a seed of its
    name, and checked to hold no NaN (a module the library does not initialise is refused, never written as garbage)."""
    modules = dict(model.named_modules())

    def tensors(names):
        out, wanted = {}, set(names)
        for owner in dict.fromkeys(name.rpartition(".")[0] for name in names):
            module = modules[owner]
            module.to_empty(device="cpu", recurse=False)
            own = {key: value for key, value in module.state_dict(keep_vars=True).items() if "." not in key}
            with torch.no_grad():
                for tensor in own.values():
                    tensor.fill_(float("nan"))
                with component_rng(seed, f"{component}.{owner}"):
                    model._init_weights(module)
            for key, tensor in own.items():
                name = f"{owner}.{key}" if owner else key
                if name in wanted:
                    if torch.isnan(tensor).any():
                        raise CheckpointError(f"{component}: {type(module).__name__} {owner!r} is not initialised by "
                                              f"{type(model).__name__}._init_weights; its {key} would be garbage")
                    out[name] = tensor.detach().clone()
            module.to_empty(device="meta", recurse=False)
        return out

    return ModelWeights(model, tensors)


def _saved_dtype(module, dtype):
    """``module`` in ``dtype``, cast only where it is not: the VAEs are built in float32 already, and a ``to(dtype)``
    on a diffusers model with modules it keeps in float32 warns that casting could break them."""
    return module if all(parameter.dtype == dtype for parameter in module.parameters()) else module.to(dtype)


def _weights(preset: str, names: Sequence[str], seed: int, layers: int | None = None) -> dict[str, ModelWeights]:
    """The model components among ``names``, for ``preset`` (module docstring); the release transformers with their
    first ``layers`` blocks only when given."""
    models = [name for name in _MODELS if name in names]
    if preset != RELEASE:
        weights = {name: held(build_preset(preset, seed + offset).transformer)
                   for offset, name in enumerate(TRANSFORMERS) if name in models}
        built = build_components(preset, seed) if set(models) - set(TRANSFORMERS) else {}
        weights.update({name: held(_saved_dtype(built[name], SAVED_DTYPES[name])) for name in models if name not in weights})
        return weights
    config = {**RELEASE_CONFIG, "num_layers": layers or RELEASE_CONFIG["num_layers"]}
    weights = {name: drawn_transformer(config, seed + offset)
               for offset, name in enumerate(TRANSFORMERS) if name in models}
    for name in ("vae", "audio_vae"):
        if name in models:
            weights[name] = built_when_written(lambda device, name=name: build_vae(RELEASE, seed, name, device))
    if "text_encoder" in models:
        weights["text_encoder"] = library_initialised(text_encoder_skeleton(RELEASE), seed, "text_encoder")
    return weights


def write_model(weights: ModelWeights, folder: Path, max_shard_size: int | str = MAX_SHARD_SIZE,
                progress: tqdm | None = None) -> None:
    """``save_pretrained``'s files of ``weights.model`` in ``folder`` (module docstring), one shard in memory at a
    time."""
    model = weights.model
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(model, ModelMixin):
        model.save_config(folder)
        pattern, index_metadata = "diffusion_pytorch_model{suffix}.safetensors", {}
    else:
        model.config.dtype = str(model.dtype).split(".")[1]
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(folder)
        if model.can_generate():
            model.generation_config.save_pretrained(folder)
        pattern, index_metadata = "model{suffix}.safetensors", {"total_parameters": model.num_parameters()}
    planned = model.state_dict()
    split = split_torch_state_dict_into_shards(planned, filename_pattern=pattern, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        shard = weights.tensors(names)
        for name in names:
            if shard[name].dtype != planned[name].dtype or shard[name].shape != planned[name].shape:
                raise CheckpointError(f"{folder / filename}: {name} came as {shard[name].dtype} "
                                      f"{tuple(shard[name].shape)}, the model holds {planned[name].dtype} "
                                      f"{tuple(planned[name].shape)}")
        save_file({name: shard[name].contiguous() for name in names}, folder / filename, metadata={"format": "pt"})
        if progress is not None:
            progress.update(sum(shard[name].numel() * shard[name].element_size() for name in names))
        del shard
    if split.is_sharded:
        index = {"metadata": {**index_metadata, **split.metadata}, "weight_map": split.tensor_to_filename}
        index_file = folder / f"{pattern.format(suffix='')}.index.json"
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _component_entry(name: str, cls: type) -> list:
    """A component's loading spec in ``modular_model_index.json``, as the pipeline's ``save_pretrained`` writes it for
    a component it saved (pointed at the published repository: :func:`_index_components`)."""
    library = _library(cls)
    return [library, cls.__name__, {"pretrained_model_name_or_path": PUBLISHED_REPOSITORY, "revision": None,
                                    "subfolder": name, "type_hint": [library, cls.__name__], "variant": None}]


def _library(cls: type) -> str:
    return cls.__module__.split(".")[0]


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def _check_room(folder: Path, weights: dict[str, ModelWeights], preset: str) -> int:
    """The bytes ``weights`` take, refused when the disk under ``folder`` lacks them."""
    need = sum(model.nbytes for model in weights.values())
    free = shutil.disk_usage(folder.parent).free
    if need > free:
        raise CheckpointError(
            f"{folder.parent}: {_gigabytes(free)} free, and the {preset} preset's {', '.join(weights)} take "
            f"{_gigabytes(need)}: write to a disk with more room, or fewer --components")
    return need


def _shard_bytes(size: int | str) -> int:
    """``--max-shard-size`` in bytes (huggingface_hub's parsing), checked before anything is built: the library
    would refuse it only at the first shard, after the weights are made."""
    try:
        value = size if isinstance(size, int) else parse_size_to_int(size)
    except (ValueError, OverflowError):  # no unit, no number, inf or nan
        value = 0
    if value <= 0:
        raise CheckpointError(f"--max-shard-size {size}: not a positive size; give a number and a unit, e.g. 5GB or "
                              "500MB")
    return value


def make(preset: str, folder: str | os.PathLike, components: Sequence[str] | None = None, seed: int = 0,
         max_shard_size: int | str = MAX_SHARD_SIZE, progress=None, layers: int | None = None) -> Path:
    """Write the checkpoint folder of an embedded preset or of the release preset (all components, or
    ``components``) at ``folder``, which must not exist. Built in a hidden sibling folder and renamed into place, so
    no half-written checkpoint is left; refused before anything is written when the disk lacks room.

    The transformer carries the preset's weights of ``seed`` (an embedded preset's identity digest is the preset's),
    the ref2va partition those of ``seed + 1``, the other components those of ``seed``. ``layers`` keeps the release
    transformers' first blocks only (their weights are those blocks of the whole model's): a release-width folder
    small enough for a GPU machine's disk. ``progress`` is the stream of a progress bar over the bytes written
    (none when None)."""
    classes = component_classes()
    names = list(classes) if components is None else list(components)
    unknown = sorted(set(names) - set(classes))
    if unknown or not names:
        raise CheckpointError(f"unknown components {unknown or names}: choose among {', '.join(classes)}")
    if preset not in PRESETS:
        raise CheckpointError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    full = RELEASE_CONFIG["num_layers"]
    if layers is not None and (preset != RELEASE or not 1 <= layers <= full):
        raise CheckpointError(f"--layers {layers}: only the {RELEASE} preset's transformers are cut, to 1 to {full} "
                              f"blocks" + ("" if preset == RELEASE else f"; {preset!r} is written whole"))
    max_shard_size = _shard_bytes(max_shard_size)
    folder = Path(folder)
    if folder.exists():
        raise CheckpointError(f"{folder}: exists; a checkpoint is written into a new folder")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file where a parent folder should be; no permission
        raise CheckpointError(f"{folder}: cannot create its parent folder ({error.strerror}: {error.filename}); "
                              "give DIR under a folder you can write") from error
    weights = _weights(preset, names, seed, layers)
    need = _check_room(folder, weights, preset)
    partial = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".partial"))
    try:
        small = small_components(preset)
        canvas = {key: value for key, value in small.items() if key not in classes}
        pipe = MiniMaxH3Blocks().init_pipeline()
        pipe.update_components(**{name: small[name] for name in names if name not in weights})
        pipe.register_to_config(**canvas)
        pipe.save_pretrained(str(partial), overwrite_modular_index=True)
        with tqdm(total=need, unit="B", unit_scale=True,
                  disable=progress is None, file=progress, desc="checkpoint") as bar:
            for name in list(weights):
                bar.set_description(name)
                write_model(weights.pop(name), partial / name, max_shard_size, bar)  # freed once written
        _index_components(partial / MODULAR_INDEX, {name: classes[name] for name in names if name in _MODELS})
        write_json(partial / INDEX, {
            "_class_name": PIPELINE_CLASS,
            "_diffusers_version": pipe.config["_diffusers_version"],
            **{name: [_library(classes[name]), classes[name].__name__] for name in names},
            **canvas,
        })
        os.replace(partial, folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return folder


def _index_components(path: Path, written: dict[str, type]) -> None:
    """Name every component in the modular index: the written models, which the pipeline did not save, by the spec it
    writes for a saved component; and each saved component's spec pointed at the published repository, as in a local
    copy of it (diffusers loads from the folder the components whose files it holds, ``_is_local_component`` in
    modular_pipeline.py), so a folder that is moved or renamed stays valid."""
    index = json.loads(path.read_text())
    index.update({name: _component_entry(name, cls) for name, cls in written.items()})
    for value in index.values():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict) and value[2].get("subfolder"):
            value[2]["pretrained_model_name_or_path"] = PUBLISHED_REPOSITORY
    write_json(path, index)
