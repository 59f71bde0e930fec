"""The model gate's contract: the fixed, seeded transformer input every run of the gate uses.

The packed layout (positions, modality tags, row indices, per-row timesteps) is built by diffusers' own
static helpers of the modular pipeline (``MiniMaxH3PrepareLayoutStep.build_packed_sequence`` and
``MiniMaxH3SetTimestepsStep.build_row_timesteps``), so the gate runs the transformer on exactly the layout a
generation would give it. Latents, text states and the backward's upstream gradients are drawn from one
seeded CPU generator through :mod:`h3gate.seeded`, so the input is bitwise identical on every machine, whatever
its CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
)
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
    MINIMAX_H3_AUDIO_CHANNELS,
    MINIMAX_H3_AUDIO_TAG,
    MINIMAX_H3_TEXT_TAG,
    MINIMAX_H3_VIDEO_TAG,
)

from h3gate import seeded
from h3gate.files import FileFormatError, read_json, require

SCHEMA = "h3gate.model-contract/1"
_ANCHORS = ("first", "last")


@dataclass(frozen=True)
class ModelContract:
    seed: int
    text_tokens: int
    latent_frames: int
    latent_height: int
    latent_width: int
    audio_latents: int
    keyframes: tuple[str, ...]
    video_timestep: float
    audio_timestep: float
    batch: int = 1

    def to_json(self) -> dict:
        """The contract's fields; ``batch`` only where it is not 1, so contracts written before it existed keep
        their bytes (bounds record the contract they were frozen for)."""
        data = {"schema": SCHEMA, **asdict(self), "keyframes": list(self.keyframes)}
        if self.batch == 1:
            del data["batch"]
        return data


def load_model_contract(path: str | Path) -> ModelContract:
    data = read_json(path, "model contract")
    what = "model contract"
    if data.get("schema") != SCHEMA:
        raise FileFormatError(path, f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    ints = {
        key: require(path, data, key, int, what)
        for key in ("seed", "text_tokens", "latent_frames", "latent_height", "latent_width", "audio_latents")
    }
    if "batch" in data:  # optional: one sample unless the contract says otherwise
        ints["batch"] = require(path, data, "batch", int, what)
    for key, value in ints.items():
        if key != "seed" and value < 1:
            raise FileFormatError(path, f"{what} field {key!r} must be >= 1, found {value}")
    keyframes = require(path, data, "keyframes", list, what)
    if any(anchor not in _ANCHORS for anchor in keyframes):
        raise FileFormatError(path, f"keyframes must each be one of {_ANCHORS}, found {keyframes}")
    times = {key: float(require(path, data, key, (int, float), what)) for key in ("video_timestep", "audio_timestep")}
    for key, value in times.items():
        if not 0.0 <= value <= 1.0:
            raise FileFormatError(path, f"{what} field {key!r} must lie in [0, 1], found {value}")
    unknown = sorted(set(data) - {"schema", "keyframes", *ints, *times})
    if unknown:
        raise FileFormatError(path, f"{what} has unknown fields {unknown}")
    return ModelContract(keyframes=tuple(keyframes), **ints, **times)


def _packed(contract: ModelContract, config: dict) -> tuple:
    """The pipeline's packed layout of ``contract`` for a model config (diffusers' own helper)."""
    patch = tuple(config["patch_size"])
    if contract.latent_height % patch[1] or contract.latent_width % patch[2]:
        raise ValueError(
            f"contract latent canvas {contract.latent_height}x{contract.latent_width} is not a multiple of the "
            f"model's patch {patch[1:]}"
        )
    return MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.full((contract.text_tokens,), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
        contract.latent_frames,
        contract.latent_height,
        contract.latent_width,
        contract.audio_latents,
        patch,
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_VIDEO_TAG,
        contract.keyframes,
    )


def packed_rows(contract: ModelContract, config: dict) -> dict[str, int]:
    """The rows a sample of ``contract`` packs into, by modality: what the model and block gates' cost grows with."""
    _, _, video, audio, text, _, _ = _packed(contract, config)
    return {"text": text.numel(), "audio": audio.numel(), "video": video.numel()}


def pass_flops(contract: ModelContract, config: dict) -> float:
    """FLOPs of one forward and backward of the whole transformer at ``contract``: each block's projections (q, k, v,
    out: 4 x hidden x attention width; SwiGLU: 3 x hidden x ffn) at 2 FLOPs a multiply-add a row, 3x for forward and
    backward, and its attention, 4 x rows^2 x attention width, 3.5x (a backward of 2.5 forwards, as FlashAttention
    counts). The embeddings, norms and heads are left out: at any size worth predicting they are a rounding error."""
    rows = sum(packed_rows(contract, config).values())
    hidden, width = config["hidden_size"], config["num_attention_heads"] * config["attention_head_dim"]
    projections = 2 * rows * (4 * hidden * width + 3 * hidden * config["ffn_dim"])
    attention = 4 * rows * rows * width
    return contract.batch * config["num_layers"] * (3 * projections + 3.5 * attention)


def model_inputs(contract: ModelContract, config: dict) -> tuple[dict, dict]:
    """(transformer keyword inputs, upstream gradients of the two outputs) for ``contract`` and a model config."""
    patch = tuple(config["patch_size"])
    position_ids, token_tags, video_indices, audio_indices, text_indices, condition_rows, _ = _packed(contract, config)
    timestep, timestep_indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_indices,
        audio_indices,
        condition_rows,
        0,
        contract.text_tokens,
        contract.video_timestep,
        contract.audio_timestep,
        max(contract.video_timestep, 0.999),
        1.0,
    )
    generator = torch.Generator().manual_seed(contract.seed)
    video_width = config["in_channels"] * patch[0] * patch[1] * patch[2]
    audio_width = config["audio_in_channels"]

    def normal(*shape):
        return seeded.normal(shape, generator)

    batch = contract.batch  # every sample its own latents and text states on the one packed layout
    inputs = {
        "hidden_states": normal(batch, video_indices.numel(), video_width),
        "audio_hidden_states": normal(batch, audio_indices.numel(), audio_width),
        "encoder_hidden_states": normal(batch, contract.text_tokens, config["text_dim"]),
        "timestep": timestep,
        "timestep_indices": timestep_indices,
        "token_tags": token_tags,
        "position_ids": position_ids.to(torch.float32),
        "video_indices": video_indices,
        "audio_indices": audio_indices,
        "text_indices": text_indices,
    }
    upstream = {
        "video": normal(batch, video_indices.numel(), video_width),
        "audio": normal(batch, audio_indices.numel(), audio_width),
    }
    return inputs, upstream
