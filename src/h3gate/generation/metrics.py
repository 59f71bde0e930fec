"""Generation metrics and artifacts: how far a generated clip is from a reference clip, and the files that show it.

Metrics (video float in [0, 1], shape ``(frames, height, width, 3)``; audio ``(channels, samples)``), computed in
float64 by scikit-image, the reference implementation most papers and tools agree with:

- ``video_psnr_min_db`` / ``video_psnr_mean_db``: per-frame PSNR (``data_range=1``), worst frame and mean; a frame
  identical to its reference has PSNR +inf.
- ``video_ssim_min`` / ``video_ssim_mean``: per-frame SSIM with Wang et al.'s settings (Gaussian weights, sigma
  1.5, population covariance, ``data_range=1``, colour on ``channel_axis``). ``win_size`` is 11: with Gaussian
  weights scikit-image filters with the Gaussian's own extent (radius round(3.5 sigma) = 5) and uses ``win_size``
  only to crop the border that filter cannot see, so 11 is the one value that neither keeps reflected border
  pixels nor throws valid ones away; it fits the smallest canvas MiniMax-H3 makes (32, its canvas multiple).
- ``video_temporal_rmse``: RMSE between the two clips' frame-difference sequences (motion error, blind to a
  constant offset that PSNR sees).
- ``audio_relative_l2``: ``||audio - reference|| / ||reference||`` over every channel and sample.

``METRICS`` are the four a gate bounds (the worst frame, not the mean: a bound holds for every frame), one row
each holding everything the generation gate knows of a metric: which way is better, its value for bitwise-equal
generations, how calibration widens the worst variant's value, and the range of a fixed bound. The gate, its
bounds and the contract read that row, so a metric is described once. ``GATED`` are their names.

Artifacts (:func:`write_artifacts`): ``generation.safetensors`` holds video and audio exactly (safetensors: no
pickle, bytes fixed by the values, so equal generations give byte-equal files); ``audio.wav`` is a 24-bit PCM
listening copy (soundfile; libsndfile stamps float WAVs with the time, which would make equal generations
differ); ``video.mp4`` (H.264 through imageio-ffmpeg, which ships its own ffmpeg) is written when imageio-ffmpeg is
installed and otherwise skipped with a note, since it is for viewing only.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import soundfile
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from h3gate.files import sha256_bytes, write_atomic

SSIM_WINDOW = 11
ARRAYS_FILE = "generation.safetensors"
WAV_FILE = "audio.wav"
MP4_FILE = "video.mp4"


def _video(name: str, video) -> np.ndarray:
    video = np.asarray(video)
    if video.ndim != 4 or video.shape[-1] != 3 or len(video) < 2:
        raise ValueError(f"{name} must be (frames >= 2, height, width, 3) RGB frames, found shape {video.shape}")
    if not np.isfinite(video).all():
        raise ValueError(f"{name} holds {int((~np.isfinite(video)).sum())} non-finite values")
    if video.min() < 0 or video.max() > 1:
        raise ValueError(f"{name} must lie in [0, 1] (data_range 1), found [{video.min()}, {video.max()}]")
    if min(video.shape[1:3]) < SSIM_WINDOW:
        raise ValueError(f"{name} frames are {video.shape[1]}x{video.shape[2]}; SSIM needs at least {SSIM_WINDOW}x{SSIM_WINDOW}")
    return video.astype(np.float64)


def video_metrics(video, reference) -> dict:
    """PSNR and SSIM per frame (worst and mean, plus the per-frame lists) and temporal RMSE of ``video``."""
    video, reference = _video("video", video), _video("reference video", reference)
    if video.shape != reference.shape:
        raise ValueError(f"video shape {video.shape} differs from the reference's {reference.shape}")
    with np.errstate(divide="ignore"):  # an identical frame has PSNR +inf, which is the right answer
        psnr = [peak_signal_noise_ratio(ref, frame, data_range=1.0) for ref, frame in zip(reference, video)]
    # Frames in threads: scipy's filters under scikit-image's SSIM release the GIL for much of their work, and each
    # frame's value is computed alone, so the values are the same in any order.
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        ssim = list(pool.map(_ssim, reference, video))
    motion = np.diff(video, axis=0) - np.diff(reference, axis=0)
    return {
        "video_psnr_min_db": float(min(psnr)),
        "video_psnr_mean_db": float(np.mean(psnr)),
        "video_ssim_min": float(min(ssim)),
        "video_ssim_mean": float(np.mean(ssim)),
        "video_temporal_rmse": float(np.sqrt(np.mean(motion**2))),
        "per_frame": {"psnr_db": [float(v) for v in psnr], "ssim": [float(v) for v in ssim]},
    }


def _ssim(reference: np.ndarray, frame: np.ndarray) -> float:
    return structural_similarity(
        reference,
        frame,
        data_range=1.0,
        channel_axis=-1,
        gaussian_weights=True,
        sigma=1.5,
        use_sample_covariance=False,
        win_size=SSIM_WINDOW,
    )


def audio_relative_l2(audio, reference) -> float:
    """``||audio - reference|| / ||reference||``; a silent reference has no relative error and is refused."""
    audio, reference = np.asarray(audio, np.float64), np.asarray(reference, np.float64)
    if audio.shape != reference.shape:
        raise ValueError(f"audio shape {audio.shape} differs from the reference's {reference.shape}")
    for name, value in (("audio", audio), ("reference audio", reference)):
        if not np.isfinite(value).all():
            raise ValueError(f"{name} holds {int((~np.isfinite(value)).sum())} non-finite samples")
    norm = float(np.linalg.norm(reference))
    if norm == 0:
        raise ValueError("reference audio is silent (all zeros): its relative L2 error is undefined")
    return float(np.linalg.norm(audio - reference)) / norm


def compare(video, audio, reference_video, reference_audio) -> dict:
    """Every metric of a generation against a reference generation (see the module docstring)."""
    return {**video_metrics(video, reference_video), "audio_relative_l2": audio_relative_l2(audio, reference_audio)}


# The gated metrics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A gated metric. Calibration widens the worst provider variant's value by the margin ``m`` so that the
    candidate's error may exceed it by the factor ``1 + m``: for PSNR the RMSE grows by ``1 + m``, for SSIM the
    distance to 1, for the errors the value itself."""

    name: str
    label: str  # how the bounds file's rule text names it
    direction: str  # "min": the value must reach the bound (larger is better); "max": it must not exceed it
    identical: float  # its value when the generation equals its reference bitwise
    broken: float  # its value for a generation sharing nothing with its reference: a bound passing it cannot fail
    widen: Callable[[float, float], float]  # (worst variant value, margin m) -> calibrated bound
    formula: str  # ``widen`` as the bounds file's rule text writes it
    valid: tuple[float, float]  # a fixed bound is finite and lies in (low, high]

    def passes(self, value: float, bound: float) -> bool:
        return value >= bound if self.direction == "min" else value <= bound

    def worst(self, values):
        """The worst of ``values`` (or of ``(value, tag)`` pairs, ties broken by the tag)."""
        return (min if self.direction == "min" else max)(values)

    def discriminates(self, bound: float) -> bool:
        """Whether some generation can violate ``bound``: a PSNR or SSIM floor <= 0, an error ceiling >= 1 cannot."""
        return not self.passes(self.broken, bound)


def _error(worst: float, margin: float) -> float:
    return (1.0 + margin) * worst


METRICS = (
    Metric(
        "video_psnr_min_db", "PSNR", "min", identical=math.inf, broken=0.0,
        widen=lambda worst, margin: worst - 20.0 * math.log10(1.0 + margin), formula="worst - 20 log10(1 + m) dB",
        valid=(0.0, math.inf),
    ),
    Metric(
        "video_ssim_min", "SSIM", "min", identical=1.0, broken=0.0,
        widen=lambda worst, margin: 1.0 - (1.0 + margin) * (1.0 - worst), formula="1 - (1 + m)(1 - worst)",
        valid=(0.0, 1.0),
    ),
    Metric(
        "video_temporal_rmse", "temporal RMSE", "max", identical=0.0, broken=1.0,
        widen=_error, formula="(1 + m) worst", valid=(0.0, math.inf),
    ),
    Metric(
        "audio_relative_l2", "audio relative L2", "max", identical=0.0, broken=1.0,
        widen=_error, formula="(1 + m) worst", valid=(0.0, math.inf),
    ),
)
METRIC = {metric.name: metric for metric in METRICS}
GATED = tuple(METRIC)


def calibration_rule() -> str:
    """The calibrated rule as the bounds file states it, from the metrics' formulas (equal ones share a clause)."""
    labels: dict[str, list[str]] = {}
    for metric in METRICS:
        labels.setdefault(metric.formula, []).append(metric.label)
    clauses = [f"{' and '.join(names)}: {formula}" for formula, names in labels.items()]
    return "; ".join(["worst over kept variants and seeds", *clauses])


# Artifacts --------------------------------------------------------------------------------------------


def _wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, audio.T, sample_rate, subtype="PCM_24", format="WAV")  # soundfile clips to [-1, 1]
    return buffer.getvalue()


def _mp4_bytes(video: np.ndarray, fps: int, encoder) -> bytes:
    frames = np.round(np.clip(video, 0.0, 1.0) * 255).astype(np.uint8)
    with tempfile.TemporaryDirectory(prefix="h3gate-mp4-") as folder:
        path = Path(folder) / MP4_FILE
        writer = encoder.write_frames(
            str(path),
            (frames.shape[2], frames.shape[1]),
            fps=fps,
            codec="libx264",
            quality=None,
            bitrate=None,
            pix_fmt_out="yuv420p",
            output_params=["-crf", "17"],
            ffmpeg_log_level="error",
        )
        writer.send(None)
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
        writer.close()
        return path.read_bytes()


def write_artifacts(folder: str | Path, video: np.ndarray, audio: np.ndarray, fps: int, sample_rate: int) -> tuple[dict, list[str]]:
    """Write a generation's artifacts into ``folder``, each atomically.

    Returns ``({name: {"path": str, "sha256": str}}, notes)``; a note says why an optional artifact is missing.
    """
    folder = Path(folder)
    video = np.ascontiguousarray(video, dtype=np.float32)
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    contents = {
        ARRAYS_FILE: save_arrays({"video": video, "audio": audio}),
        WAV_FILE: _wav_bytes(audio, sample_rate),
    }
    notes = []
    try:
        import imageio_ffmpeg
    except ImportError:
        notes.append(f"{MP4_FILE} not written: imageio-ffmpeg is not installed (pip install imageio-ffmpeg)")
    else:
        contents[MP4_FILE] = _mp4_bytes(video, fps, imageio_ffmpeg)
    artifacts = {}
    for name, data in contents.items():
        write_atomic(folder / name, data)
        artifacts[name] = {"path": str(folder / name), "sha256": sha256_bytes(data)}
    return artifacts, notes


def read_arrays(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(video, audio)`` exactly as :func:`write_artifacts` stored them."""
    arrays = load_arrays(Path(path).read_bytes())
    return arrays["video"], arrays["audio"]
