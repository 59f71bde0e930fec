"""The default contracts of a model that has none yet: what ``h3gate contracts`` writes and locks.

- ``model-contract.json``: the transformer input of a 124-frame generation at the model's default canvas (the
  pipeline's ``canvas_short_edge`` / ``canvas_max_pixels`` from the folder's ``model_index.json`` resolved at 16:9 by
  diffusers' ``resolve_canvas_size``), divided by the video VAE's compression; latent frames and audio latents by
  diffusers' own helpers, or a canvas given (``--canvas FxHxW``). Text rows, keyframe, timesteps and seed as the
  embedded presets' contract.
- ``generation-contract.json``: what the MiniMax-H3 qualification pins: 124 frames at that canvas, 24 fps with the
  audio VAE's rate, seeds 42, 43, 44, fixed bounds PSNR >= 30 dB, SSIM >= 0.99, temporal RMSE <= 0.01, audio
  relative L2 <= 0.05; a model of the release width in t2va and fl2va, 49 steps, gated by the fixed rule, a narrower
  one as the tiny preset (:data:`TEST_SIZED`).
- ``generation-preflight-contract.json``: the same canvas in fewer steps (4; a narrower model 2), seed 42.

The geometry comes from the folder's VAE configs, built on the meta device (no weights read); the in-process
``release`` model and a folder holding a release-width transformer alone get the pipeline's own defaults, the release
geometry, and one holding a narrower transformer alone the tiny preset's. For the embedded tiny preset these are
its shipped contracts (a test holds them equal).
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
from h3gate.model.presets import RELEASE, RELEASE_CONFIG
from h3gate.model.spec import model_name, transformer_config

NUM_FRAMES = 124
ASPECT = (16, 9)
PROMPT = "a cat on a drum"
MODEL_INPUT = {"seed": 20261130, "text_tokens": 15, "keyframes": ["first"], "video_timestep": 0.5, "audio_timestep": 0.7}
GENERATIONS = {"generation": {"seeds": [42, 43, 44]}, "generation-preflight": {"seeds": [42]}}
# How a model generates, by its size. A model of the release width as MiniMax-H3 is released: t2va and fl2va, 49 steps
# (preflight 4), the fixed rule. A narrower one (a test or benchmark model) as the embedded tiny preset does: fl2va, 8
# steps (preflight 2), so its generation gate takes seconds on a CPU, not minutes; tiny's rules (README, "Bounds and
# contracts": its calibrated SSIM bound does not travel across CPU kinds, its preflight's does).
RELEASED = {"workflow": ["t2va", "fl2va"], "generation": (49, "fixed"), "generation-preflight": (4, "fixed")}
TEST_SIZED = {"workflow": "fl2va", "generation": (8, "fixed"), "generation-preflight": (2, "both")}
FIXED_BOUNDS = {"video_psnr_min_db": 30.0, "video_ssim_min": 0.99, "video_temporal_rmse": 0.01, "audio_relative_l2": 0.05}
VAES = {"vae": AutoencoderKLMiniMaxH3, "audio_vae": AutoencoderKLMiniMaxH3Audio}


def test_sized(spec: str) -> bool:
    """Whether ``spec``'s transformer is narrower than the release model's: a test or benchmark model."""
    return transformer_config(spec)["hidden_size"] < RELEASE_CONFIG["hidden_size"]


def _pipeline(spec: str):
    """A pipeline holding only the VAEs (on the meta device) and canvas configs of ``spec``, for its geometry. A
    folder holding a test-sized transformer alone takes the tiny preset's (the release VAEs' canvas would make its
    model contract release-sized: 37 x 48 x 84 latents, hours of a CPU for a model of seconds)."""
    pipe = MiniMaxH3Blocks().init_pipeline()
    alone = spec != RELEASE and spec not in COMPONENT_CONFIGS and not (Path(spec) / "vae" / "config.json").is_file()
    if spec in COMPONENT_CONFIGS or (alone and test_sized(spec)):
        configs = COMPONENT_CONFIGS.get(spec, COMPONENT_CONFIGS["tiny"])
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


def parse_canvas(text: str) -> tuple[int, int, int]:
    """``FxHxW`` (latent frames, height and width of the model contract) as three positive ints, or a ValueError."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"--canvas {text}: give latent frames, height and width as FxHxW, e.g. 3x8x10")
    return tuple(int(part) for part in parts)


def defaults(spec: str, canvas: tuple[int, int, int] | None = None) -> dict[str, dict]:
    """The default contracts of ``spec`` (a preset, ``release`` or a checkpoint folder), by file name; ``canvas``
    (latent frames, height, width) replaces the model contract's, which the model and block gates measure at."""
    pipe = _pipeline(spec)
    height, width = resolve_canvas_size(*ASPECT, pipe.canvas_multiple, pipe.config.canvas_short_edge,
                                        pipe.config.canvas_max_pixels)
    compression = pipe.vae_spatial_compression_ratio
    frames = video_latent_num_frames(NUM_FRAMES, pipe.vae_frames_per_chunk, pipe.vae_latents_per_chunk)
    frames, latent_height, latent_width = canvas or (frames, height // compression, width // compression)
    model = {
        "schema": contract.SCHEMA,
        **MODEL_INPUT,
        "latent_frames": frames,
        "latent_height": latent_height,
        "latent_width": latent_width,
        "audio_latents": audio_latent_num_frames(NUM_FRAMES),
    }
    files = {"model-contract.json": model}
    generates = TEST_SIZED if test_sized(spec) else RELEASED
    for name, varying in GENERATIONS.items():
        steps, rule = generates[name]
        files[f"{name}{generation_contract.SUFFIX}"] = {
            "schema": generation_contract.SCHEMA,
            "workflow": generates["workflow"],
            "prompt": PROMPT,
            "reference_image_sha256": REFERENCE_IMAGE_SHA256,
            **varying,
            "num_inference_steps": steps,
            "num_frames": NUM_FRAMES,
            "height": height,
            "width": width,
            "fps": MINIMAX_H3_FPS,
            "audio_sample_rate": pipe.audio_sampling_rate,
            "fixed_bounds": dict(FIXED_BOUNDS),
            "gating_rule": rule,
            "calibration_margin": 0.5,
        }
    return files


def paths(spec: str, thresholds: str | os.PathLike) -> list[Path]:
    """The contract files :func:`write` writes for ``spec`` under ``thresholds``."""
    names = ["model-contract.json", *(f"{name}{generation_contract.SUFFIX}" for name in GENERATIONS)]
    return [Path(thresholds) / model_name(spec) / name for name in names]


def write(spec: str, thresholds: str | os.PathLike, replace_reason: str | None = None,
          canvas: tuple[int, int, int] | None = None) -> list[Path]:
    """Write the default contracts of ``spec`` under ``thresholds/<model name>/`` and lock them; existing contracts
    are replaced only with a reason, and the lock must be readable (both checked before any is written). Each file is
    written atomically, and should writing or locking fail all are put back as they were: a contract left unlocked
    would block the rerun that fixes the failure."""
    thresholds = Path(thresholds)
    bounds.read_lock(thresholds)
    contents = defaults(spec, canvas)
    files = paths(spec, thresholds)
    existing = [path for path in files if path.exists()]
    if existing and not replace_reason:
        raise bounds.BoundsError(
            f"{existing[0]} exists: contracts are not overwritten (their bounds were frozen for them); pass "
            "--replace=REASON to write the defaults anyway"
        )
    previous = {path: path.read_bytes() for path in existing}
    try:
        for path in files:
            write_atomic(path, dumps(contents[path.name]))
        bounds.lock_files(thresholds, files)
    except BaseException:
        for path in files:
            if path in previous:
                write_atomic(path, previous[path])
            else:
                path.unlink(missing_ok=True)
        raise
    return files
