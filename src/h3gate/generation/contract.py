"""The generation gate's contract: the pinned request every generation of the gate makes, and its bounds.

A contract file (``thresholds/<model>/<name>-contract.json``, locked in ``thresholds/LOCK.json`` like bounds)
fixes the workflow (``fl2va`` from the reference keyframe of :mod:`h3gate.generation.keyframe`, named by its
sha256, or ``t2va``; a list such as ``["t2va", "fl2va"]`` makes every seed generate each of them), prompt, seeds, frames, canvas, frame rate, steps and audio sample rate; the fixed bounds
(one per gated metric, in the range its row of :data:`h3gate.generation.metrics.METRICS` allows); which rule gates
(``fixed``, ``calibrated`` or ``both``, every bound of either rule; the other rule of the first two is reported
beside the verdict); and the calibration margin ``m``: the candidate's error may exceed the worst provider
variant's by the factor ``1 + m`` (see :mod:`h3gate.gates.generation`).

Its name is the file name without ``-contract.json`` (``generation``, ``generation-preflight``); it names the
bounds file frozen for it. Its digest is the sha256 of the file, so any edit changes every run identity. The
frozen bounds stay valid across an edit of the gating policy alone (:data:`POLICY`: the rule and the fixed bounds,
which measure nothing): they are the variants' measurements under everything else (:meth:`GenerationContract.measures_as`).

What depends on the model (canvas multiple, audio sample rate, frame alignment) is checked against the pipeline
by :meth:`GenerationContract.check_pipeline`; everything else when the file is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_FPS

from h3gate.files import FileFormatError, read_json, require, sha256_file
from h3gate.generation.metrics import GATED, METRIC
from h3gate.generation.pipeline import REFERENCE_IMAGE_SHA256, WORKFLOWS

SCHEMA = "h3gate.generation-contract/1"
SUFFIX = "-contract.json"
RULES = ("fixed", "calibrated", "both")
# What decides a verdict from measurements without changing what is generated or how bounds are calibrated.
POLICY = ("gating_rule", "fixed_bounds")
# MiniMax-H3 makes 5 to 15 s at 24 fps; the video VAE encodes 17 n + 5 frames: 124 .. 345.
FRAMES_MIN, FRAMES_MAX = 124, 345
_FIELDS = {
    "schema", "workflow", "prompt", "reference_image_sha256", "seeds", "num_frames", "height", "width", "fps",
    "num_inference_steps", "audio_sample_rate", "fixed_bounds", "gating_rule", "calibration_margin",
}


@dataclass(frozen=True)
class GenerationContract:
    path: Path
    digest: str  # sha256 of the contract file
    workflows: tuple[str, ...]
    prompt: str
    reference_image_sha256: str | None
    seeds: tuple[int, ...]
    num_frames: int
    height: int
    width: int
    fps: int
    num_inference_steps: int
    audio_sample_rate: int
    fixed_bounds: dict
    gating_rule: str
    calibration_margin: float

    @property
    def name(self) -> str:
        return self.path.name[: -len(SUFFIX)]

    @property
    def transformer_calls(self) -> int:
        """``num_inference_steps`` points of the schedule end at sigma 0: one transformer call fewer."""
        return self.num_inference_steps - 1

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "workflow": self.workflows[0] if len(self.workflows) == 1 else list(self.workflows),
            "prompt": self.prompt,
            "reference_image_sha256": self.reference_image_sha256,
            "seeds": list(self.seeds),
            "num_frames": self.num_frames,
            "height": self.height,
            "width": self.width,
            "fps": self.fps,
            "num_inference_steps": self.num_inference_steps,
            "audio_sample_rate": self.audio_sample_rate,
            "fixed_bounds": dict(self.fixed_bounds),
            "gating_rule": self.gating_rule,
            "calibration_margin": self.calibration_margin,
        }

    def measures_as(self, recorded: dict) -> bool:
        """Whether a contract recorded by a bounds file (its ``to_json``) asks for the same generations and the
        same calibration as this one: equal but for :data:`POLICY`."""
        def measured(contract: dict) -> dict:
            return {key: value for key, value in contract.items() if key not in POLICY}

        return measured(recorded) == measured(self.to_json())

    @property
    def gating_rules(self) -> tuple[str, ...]:
        """The rules whose checks decide the verdict."""
        return ("fixed", "calibrated") if self.gating_rule == "both" else (self.gating_rule,)

    def check_pipeline(self, pipe) -> None:
        """Refuse a contract the pipeline's model cannot make exactly as written (no silent rounding)."""
        multiple = pipe.canvas_multiple
        for key in ("height", "width"):
            if getattr(self, key) % multiple:
                raise FileFormatError(
                    self.path,
                    f"{key} {getattr(self, key)} is not a multiple of {multiple}, the canvas multiple of this model "
                    f"(VAE {pipe.vae_spatial_compression_ratio}x times patch {pipe.patch_size[2]}); the pipeline would "
                    f"round it",
                )
        chunk, latents = pipe.vae_frames_per_chunk, pipe.vae_latents_per_chunk
        if self.num_frames % chunk != latents:
            raise FileFormatError(
                self.path, f"num_frames {self.num_frames} is not {chunk} n + {latents}, which this model's VAE encodes"
            )
        if self.audio_sample_rate != pipe.audio_sampling_rate:
            raise FileFormatError(
                self.path,
                f"audio_sample_rate {self.audio_sample_rate} differs from this model's audio VAE rate "
                f"{pipe.audio_sampling_rate}",
            )


def _positive_int(path, data, key) -> int:
    value = require(path, data, key, int, "generation contract")
    if value < 1:
        raise FileFormatError(path, f"generation contract field {key!r} must be >= 1, found {value}")
    return value


def _seeds(path, data) -> tuple[int, ...]:
    seeds = require(path, data, "seeds", list, "generation contract")
    if not seeds:
        raise FileFormatError(path, "seeds is empty: list at least one seed, e.g. [42, 43, 44]")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise FileFormatError(path, f"seeds must be non-negative integers, found {seeds}")
    duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicates:
        raise FileFormatError(path, f"seeds lists {duplicates} more than once")
    return tuple(seeds)


def _workflows(path, data) -> tuple[str, ...]:
    """One workflow name, or a list of distinct ones (each seed generates every one)."""
    value = require(path, data, "workflow", (str, list), "generation contract")
    names = [value] if isinstance(value, str) else value
    if not names:
        raise FileFormatError(path, f"workflow is an empty list: name one or more of {', '.join(WORKFLOWS)}")
    unknown = [name for name in names if name not in WORKFLOWS]
    if unknown:
        raise FileFormatError(path, f"unknown workflow {unknown[0]!r}; the generation gate runs {', '.join(WORKFLOWS)}")
    if len(set(names)) != len(names):
        raise FileFormatError(path, f"workflow lists {sorted({n for n in names if names.count(n) > 1})} more than once")
    return tuple(names)


def _reference_image(path, data, workflows) -> str | None:
    digest = data.get("reference_image_sha256")
    if "fl2va" not in workflows:
        if digest is not None:
            raise FileFormatError(path, "workflow t2va generates from the prompt alone: set reference_image_sha256 to null")
        return None
    if digest != REFERENCE_IMAGE_SHA256:
        raise FileFormatError(
            path,
            f"workflow fl2va starts from the pinned reference keyframe, sha256 {REFERENCE_IMAGE_SHA256} "
            f"(h3gate.generation.keyframe); reference_image_sha256 is {digest!r}",
        )
    return digest


def _fixed_bounds(path, data) -> dict:
    bounds = require(path, data, "fixed_bounds", dict, "generation contract")
    if set(bounds) != set(GATED):
        raise FileFormatError(path, f"fixed_bounds must have exactly the keys {list(GATED)}, found {sorted(bounds)}")
    for key, value in bounds.items():
        metric = METRIC[key]
        low, high = metric.valid
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low:
            raise FileFormatError(path, f"fixed_bounds[{key!r}] must be a finite number above {low:g}, found {value!r}")
        if value > high:
            raise FileFormatError(
                path, f"fixed_bounds[{key!r}] must be at most {high:g} ({metric.label}'s maximum), found {value}"
            )
    return {key: float(bounds[key]) for key in GATED}


def load(path: str | Path) -> GenerationContract:
    """A generation contract from ``path``; any bad field is a :class:`FileFormatError` naming it."""
    path = Path(path)
    if not path.name.endswith(SUFFIX) or len(path.name) == len(SUFFIX):
        raise FileFormatError(path, f"a generation contract file is named <name>{SUFFIX}, e.g. generation{SUFFIX}")
    what = "generation contract"
    data = read_json(path, what)
    if data.get("schema") != SCHEMA:
        raise FileFormatError(path, f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise FileFormatError(path, f"{what} has unknown fields {unknown}")
    workflows = _workflows(path, data)
    prompt = require(path, data, "prompt", str, what)
    if not prompt.strip():
        raise FileFormatError(path, "prompt is empty")
    num_frames = _positive_int(path, data, "num_frames")
    if not FRAMES_MIN <= num_frames <= FRAMES_MAX:
        raise FileFormatError(
            path, f"num_frames {num_frames} is outside {FRAMES_MIN}..{FRAMES_MAX} (5 to 15 s at 24 fps, 17 n + 5 frames)"
        )
    fps = _positive_int(path, data, "fps")
    if fps != MINIMAX_H3_FPS:
        raise FileFormatError(path, f"fps {fps}: MiniMax-H3 generates at {MINIMAX_H3_FPS} fps")
    steps = _positive_int(path, data, "num_inference_steps")
    if steps < 2:
        raise FileFormatError(path, "num_inference_steps must be >= 2 (N steps make N - 1 transformer calls)")
    rule = require(path, data, "gating_rule", str, what)
    if rule not in RULES:
        raise FileFormatError(path, f"gating_rule {rule!r} is not one of {RULES}")
    margin = require(path, data, "calibration_margin", (int, float), what)
    if not math.isfinite(margin) or margin < 0:
        raise FileFormatError(path, f"calibration_margin must be a finite number >= 0, found {margin}")
    return GenerationContract(
        path=path,
        digest=sha256_file(path),
        workflows=workflows,
        prompt=prompt,
        reference_image_sha256=_reference_image(path, data, workflows),
        seeds=_seeds(path, data),
        num_frames=num_frames,
        height=_positive_int(path, data, "height"),
        width=_positive_int(path, data, "width"),
        fps=fps,
        num_inference_steps=steps,
        audio_sample_rate=_positive_int(path, data, "audio_sample_rate"),
        fixed_bounds=_fixed_bounds(path, data),
        gating_rule=rule,
        calibration_margin=float(margin),
    )

