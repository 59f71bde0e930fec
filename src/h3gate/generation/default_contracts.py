"""The default contracts of a model that has none yet: what ``h3gate contracts`` writes and locks.

- ``model-contract.json``: the transformer input of a 124-frame generation at the model's default canvas (the
  pipeline's ``canvas_short_edge`` / ``canvas_max_pixels`` from the folder's ``model_index.json`` resolved at 16:9 by
  diffusers' ``resolve_canvas_size``), divided by the video VAE's compression; latent frames and audio latents by
  diffusers' own helpers. Text rows, keyframe, timesteps and seed as the embedded presets' contract.
- ``generation-contract.json``: what the MiniMax-H3 qualification pins: t2va and fl2va, 124 frames at that canvas,
  24 fps with the audio VAE's rate, 49 steps, seeds 42, 43, 44, fixed bounds PSNR >= 30 dB, SSIM >= 0.99, temporal
  RMSE <= 0.01, audio relative L2 <= 0.05, gated by the fixed rule.
- ``generation-preflight-contract.json``: the same canvas in 4 steps, seed 42.

The geometry comes from the folder's VAE configs, built on the meta device (no weights read); a folder without VAEs
(a transformer only) and the in-process ``release`` model get the pipeline's own defaults, the release geometry.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
from diffusers.modular_pipelines import MiniMaxH3Blocks
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
    MINIMAX_H3_FPS,
    audio_latent_num_frames,
    resolve_canvas_size,
    video_latent_num_frames,
)

from h3gate import bounds
from h3gate.files import dumps, write_atomic
from h3gate.generation import contract as generation_contract
from h3gate.generation.components import COMPONENT_CONFIGS
from h3gate.generation.pipeline import REFERENCE_IMAGE_SHA256
from h3gate.model import contract
from h3gate.model.presets import RELEASE
from h3gate.model.spec import model_name

NUM_FRAMES = 124
ASPECT = (16, 9)
PROMPT = "a cat on a drum"
MODEL_INPUT = {"seed": 20261130, "text_tokens": 15, "keyframes": ["first"], "video_timestep": 0.5, "audio_timestep": 0.7}
GENERATIONS = {"generation": {"seeds": [42, 43, 44], "num_inference_steps": 49},
               "generation-preflight": {"seeds": [42], "num_inference_steps": 4}}
FIXED_BOUNDS = {"video_psnr_min_db": 30.0, "video_ssim_min": 0.99, "video_temporal_rmse": 0.01, "audio_relative_l2": 0.05}
VAES = {"vae": AutoencoderKLMiniMaxH3, "audio_vae": AutoencoderKLMiniMaxH3Audio}


def _pipeline(spec: str):
    """A pipeline holding only the VAEs (on the meta device) and canvas configs of ``spec``, for its geometry."""
    pipe = MiniMaxH3Blocks().init_pipeline()
    if spec in COMPONENT_CONFIGS:
        configs = COMPONENT_CONFIGS[spec]
        vaes = {name: lambda cls, name=name: cls(**configs[name]) for name in VAES}
        canvas = configs["pipeline"]
    else:
        root = Path(spec)
        vaes = {name: lambda cls, name=name: cls.from_config(cls.load_config(root / name))
                for name in VAES if (root / name / "config.json").is_file()}
        canvas = {}
        if spec != RELEASE and (root / "model_index.json").is_file():
            from h3gate.model.checkpoint import read_index

            index = read_index(root)
            canvas = {c.name: index[c.name] for c in pipe.blocks.expected_configs if c.name in index}
    with torch.device("meta"):
        pipe.update_components(**{name: build(VAES[name]) for name, build in vaes.items()})
    pipe.register_to_config(**canvas)
    return pipe


def defaults(spec: str) -> dict[str, dict]:
    """The default contracts of ``spec`` (a preset, ``release`` or a checkpoint folder), by file name."""
    pipe = _pipeline(spec)
    height, width = resolve_canvas_size(*ASPECT, pipe.canvas_multiple, pipe.config.canvas_short_edge,
                                        pipe.config.canvas_max_pixels)
    compression = pipe.vae_spatial_compression_ratio
    model = {
        "schema": contract.SCHEMA,
        **MODEL_INPUT,
        "latent_frames": video_latent_num_frames(NUM_FRAMES, pipe.vae_frames_per_chunk, pipe.vae_latents_per_chunk),
        "latent_height": height // compression,
        "latent_width": width // compression,
        "audio_latents": audio_latent_num_frames(NUM_FRAMES),
    }
    files = {"model-contract.json": model}
    for name, varying in GENERATIONS.items():
        files[f"{name}{generation_contract.SUFFIX}"] = {
            "schema": generation_contract.SCHEMA,
            "workflow": ["t2va", "fl2va"],
            "prompt": PROMPT,
            "reference_image_sha256": REFERENCE_IMAGE_SHA256,
            **varying,
            "num_frames": NUM_FRAMES,
            "height": height,
            "width": width,
            "fps": MINIMAX_H3_FPS,
            "audio_sample_rate": pipe.audio_sampling_rate,
            "fixed_bounds": dict(FIXED_BOUNDS),
            "gating_rule": "fixed",
            "calibration_margin": 0.5,
        }
    return files


def write(spec: str, thresholds: str | os.PathLike, replace_reason: str | None = None) -> list[Path]:
    """Write the default contracts of ``spec`` under ``thresholds/<model name>/`` and lock them; existing contracts
    are replaced only with a reason, and the lock must be readable (both checked before any is written). Each file is
    written atomically, and should writing or locking fail all are put back as they were: a contract left unlocked
    would block the rerun that fixes the failure."""
    thresholds = Path(thresholds)
    folder = thresholds / model_name(spec)
    bounds.read_lock(thresholds)
    contents = defaults(spec)
    existing = [folder / name for name in contents if (folder / name).exists()]
    if existing and not replace_reason:
        raise bounds.BoundsError(
            f"{existing[0]} exists: contracts are not overwritten (their bounds were frozen for them); pass "
            "--replace='<reason>' to write the defaults anyway"
        )
    paths = [folder / name for name in contents]
    previous = {path: path.read_bytes() for path in existing}
    try:
        for path, content in zip(paths, contents.values()):
            write_atomic(path, dumps(content))
        bounds.lock_files(thresholds, paths)
    except BaseException:
        for path in paths:
            if path in previous:
                write_atomic(path, previous[path])
            else:
                path.unlink(missing_ok=True)
        raise
    return paths
