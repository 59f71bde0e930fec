"""The model factory: the embedded presets built in-process, or a local diffusers MiniMax-H3 checkpoint.

Whatever the source, the result is a :class:`Model`: the transformer at the checkpoint's own mixed precision
(bf16 blocks, the fp32 modules diffusers keeps in float32), its config and its *identity* — a digest of
config and weights that bounds, contracts and evidence are keyed by.

The embedded presets are initialised so that every op visibly matters (H3_FACTS: with diffusers' default
init attention is nearly uniform and a broken attention hides in bf16 noise): Q/K RMSNorm weights of 1.5-3
make attention peaky, as in trained models; norm weights scatter around 1 so a missing weight shows; the
AdaLN projection yields shift/scale/gate tables of order 0.5 that differ per modality, so a modulation row
of the wrong modality shows. Weights are drawn in float32 from one seeded generator in sorted name order
(:mod:`h3gate.seeded`: bitwise identical across runs, processes and CPU kinds, so the identity travels), then
rounded to the checkpoint precision, so golden (the fp32 upcast of the checkpoint) and provider share exactly the
same weights.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path

import torch
from diffusers import MiniMaxH3Transformer3DModel

from h3gate.model.checkpoint import load_checkpoint
from h3gate.model.identity import Model, ModelError, model_identity, plain_config, tensor_digest
from h3gate.model.presets import PRESETS, RELEASE, RELEASE_CONFIG, TRANSFORMER_CONFIGS, release_layers, release_name
from h3gate.seeded import normal


def keeps_fp32(param_name: str, transformer_cls=MiniMaxH3Transformer3DModel) -> bool:
    """diffusers' own rule (model_loading_utils): a listed module name is one dotted component of the name."""
    return any(keep in param_name.split(".") for keep in transformer_cls._keep_in_fp32_modules)


def _initial_value(name: str, shape: torch.Size, hidden: int, normal, uniform) -> torch.Tensor:
    """The embedded presets' float32 value of parameter ``name`` (module docstring), from ``normal(shape)`` and
    ``uniform(shape)`` draws."""
    if name.endswith(("norm_q.weight", "norm_k.weight")):
        return 1.5 + 1.5 * uniform(shape)
    if len(shape) == 1 and "norm" in name.split(".")[-2]:
        return 1.0 + 0.25 * normal(shape)
    if name.endswith("adaln_proj.linear.weight") or name.endswith("norm_out.linear.weight"):
        return normal(shape) * (0.5 / shape[1] ** 0.5)
    if name.endswith("adaln_proj.linear.bias"):
        # shift, scale and gate for each modality: order 0.3 around zero, gates around 0.5.
        value = 0.3 * normal(shape)
        gates = value.view(-1, 6, hidden)[:, (2, 5)]
        value.view(-1, 6, hidden)[:, (2, 5)] = gates + 0.5
        return value
    if len(shape) == 1:
        return 0.1 * normal(shape)
    return normal(shape) / shape[1] ** 0.5


def _init_embedded(transformer: MiniMaxH3Transformer3DModel, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    hidden = transformer.config.hidden_size
    with torch.no_grad():
        for name, param in sorted(transformer.named_parameters()):
            param.copy_(_initial_value(
                name, param.shape, hidden,
                lambda shape: normal(shape, generator),
                lambda shape: torch.rand(shape, generator=generator),
            ))


def _to_checkpoint_precision(transformer: MiniMaxH3Transformer3DModel) -> None:
    for name, param in transformer.named_parameters():
        if not keeps_fp32(name):
            param.data = param.data.to(torch.bfloat16)


def build_preset(name: str, seed: int = 0) -> Model:
    """An embedded preset (``tiny`` or ``small``) at checkpoint precision."""
    if name not in TRANSFORMER_CONFIGS:
        raise ModelError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}, or a checkpoint folder path")
    transformer = MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIGS[name])
    _init_embedded(transformer, seed)
    _to_checkpoint_precision(transformer)
    transformer.eval()
    config = plain_config(transformer)
    identity = model_identity(config, tensor_digest(dict(transformer.named_parameters())))
    return Model(name=name, source=f"preset:{name}:seed={seed}", transformer=transformer, identity=identity, config=config)


def _parameter_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") >> 1


def transformer_skeleton(config: dict) -> MiniMaxH3Transformer3DModel:
    """``config``'s transformer on the meta device (no memory) at checkpoint precision: names, shapes and dtypes."""
    with torch.device("meta"):
        transformer = MiniMaxH3Transformer3DModel(**config)
    _to_checkpoint_precision(transformer)
    return transformer


def release_transformer(layers: int, seed: int, device: str) -> MiniMaxH3Transformer3DModel:
    """The release transformer's first ``layers`` blocks drawn on ``device`` (any device) at checkpoint precision."""
    return _materialised({**RELEASE_CONFIG, "num_layers": layers}, seed, device)


def _materialised(config: dict, seed: int, device: str) -> MiniMaxH3Transformer3DModel:
    """``config``'s transformer built on the meta device and materialised on ``device`` at checkpoint precision,
    each parameter drawn there in float32 (one at a time) by a generator seeded from ``seed`` and its name, so a
    model of fewer layers holds exactly the leading blocks of a deeper one."""
    transformer = transformer_skeleton(config)
    transformer.to_empty(device=device)
    # rope's inv_freq is a computed buffer, not a parameter: to_empty left it uninitialised.
    transformer.rope = type(transformer.rope)(config["rope_freq_dim"], transformer.config.rope_theta).to(device)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            param.copy_(drawn_parameter(name, param.shape, config["hidden_size"], seed, device))
    return transformer.eval()


def drawn_parameter(name: str, shape: torch.Size, hidden: int, seed: int, device: str) -> torch.Tensor:
    """Parameter ``name``'s float32 initial value, drawn on ``device`` by a generator seeded from ``seed`` and the name
    alone: one parameter at a time, in any order, so a release-size transformer is never whole in memory."""
    generator = torch.Generator(device=device).manual_seed(_parameter_seed(seed, name))
    return _initial_value(
        name, shape, hidden,
        lambda size: torch.randn(size, generator=generator, device=device),
        lambda size: torch.rand(size, generator=generator, device=device),
    )


def build_release(seed: int = 0, layers: int | None = None, device: str = "cuda") -> Model:
    """The release-size transformer (``presets.RELEASE_CONFIG``, or its first ``layers`` blocks) with the embedded
    presets' init scheme, built directly on a CUDA device.

    Its 33.1 B parameters would take 133 GB of float32 on the host; here the GPU holds them at checkpoint precision
    (61.7 GiB) and draws them with torch's Philox generator. The identity is the recipe, not a digest of 66 GB:
    config, seed, the init code, torch's version and the GPU (the CUDA generator's values depend on its
    multiprocessor count).
    """
    try:
        layers = release_layers(layers)
    except ValueError as error:
        raise ModelError(str(error)) from None
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        where = f"{device!r} is not one" if torch.cuda.is_available() else "torch sees none on this machine"
        raise ModelError(
            f"the {RELEASE} model is built on a CUDA GPU with about 70 GiB free (61.7 GiB of bfloat16 weights); {where}"
        )
    transformer = release_transformer(layers, seed, device)
    properties = torch.cuda.get_device_properties(device)
    init_code = "".join(inspect.getsource(function) for function in (_initial_value, transformer_skeleton, _materialised, drawn_parameter))
    recipe = {
        "seed": seed,
        "init": hashlib.sha256(init_code.encode()).hexdigest(),
        "torch": torch.__version__,
        "gpu": properties.name,
        "multiprocessors": properties.multi_processor_count,
    }
    config = plain_config(transformer)
    partial = "" if layers == RELEASE_CONFIG["num_layers"] else f":layers={layers}"
    return Model(
        name=release_name(layers),
        source=f"preset:{RELEASE}:seed={seed}{partial}",
        transformer=transformer,
        identity=model_identity(config, hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()),
        config=config,
    )


def load_model(spec: str, seed: int = 0) -> Model:
    """``tiny``/``small`` (embedded), ``release`` (built on the GPU, :func:`build_release`) or the path of a
    checkpoint folder."""
    if spec in TRANSFORMER_CONFIGS:
        return build_preset(spec, seed)
    if spec == RELEASE:
        return build_release(seed)
    if os.sep in spec or Path(spec).exists():
        return load_checkpoint(spec)
    raise ModelError(f"unknown model {spec!r}: use one of {', '.join(PRESETS)} or the path of a checkpoint folder")
