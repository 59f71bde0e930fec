"""Generation metrics against hand-computed values, their input checks, and the artifacts of a generation."""

import hashlib
import json
import math
import sys

import numpy as np
import pytest
import soundfile

from conftest import ROOT
from h3gate.generation import metrics

FRAMES, SIZE = 6, 32
C1 = (0.01 * 1.0) ** 2  # SSIM's luminance constant at data_range 1


def clip(seed=0, low=0.2, high=0.8):
    return np.random.default_rng(seed).uniform(low, high, (FRAMES, SIZE, SIZE, 3)).astype(np.float32)


def flat(value, frames=FRAMES):
    return np.full((frames, SIZE, SIZE, 3), value, dtype=np.float64)


def test_identical_clips_are_perfect():
    video = clip()
    audio = np.random.default_rng(1).standard_normal((2, 100))
    values = metrics.compare(video, audio, video.copy(), audio.copy())
    assert values["video_psnr_min_db"] == math.inf and values["video_psnr_mean_db"] == math.inf
    assert values["video_ssim_min"] == 1.0 and values["video_ssim_mean"] == 1.0
    assert values["video_temporal_rmse"] == 0.0 and values["audio_relative_l2"] == 0.0
    assert values["per_frame"]["psnr_db"] == [math.inf] * FRAMES


def test_a_constant_offset_costs_psnr_but_no_motion():
    reference = clip().astype(np.float64)
    values = metrics.video_metrics(reference + 0.01, reference)
    assert values["video_psnr_min_db"] == pytest.approx(40.0, abs=1e-9)  # -20 log10(0.01)
    assert values["video_temporal_rmse"] == pytest.approx(0.0, abs=1e-12)


def test_ssim_of_flat_frames_is_the_luminance_term():
    values = metrics.video_metrics(flat(0.6), flat(0.5))
    expected = (2 * 0.5 * 0.6 + C1) / (0.5**2 + 0.6**2 + C1)  # variances vanish: the structure term is C2 / C2
    assert values["video_ssim_min"] == pytest.approx(expected, rel=1e-9)
    assert values["video_psnr_min_db"] == pytest.approx(20.0, abs=1e-9)


def test_temporal_rmse_is_the_error_of_the_frame_differences():
    reference = flat(0.5)
    drifting = reference + 0.001 * np.arange(FRAMES)[:, None, None, None]
    assert metrics.video_metrics(drifting, reference)["video_temporal_rmse"] == pytest.approx(0.001, rel=1e-9)


def test_the_worst_frame_decides_the_minimum():
    reference = flat(0.5)
    video = reference + 0.001  # 60 dB everywhere ...
    video[3] = 0.6  # ... but 20 dB on one frame
    values = metrics.video_metrics(video, reference)
    assert values["video_psnr_min_db"] == pytest.approx(20.0, abs=1e-9)
    assert values["video_psnr_mean_db"] == pytest.approx((5 * 60.0 + 20.0) / 6, abs=1e-6)
    assert values["video_ssim_min"] == pytest.approx(values["per_frame"]["ssim"][3])
    assert values["video_ssim_min"] < values["video_ssim_mean"]


def test_frames_measured_in_threads_keep_their_order_and_values():
    generator = np.random.default_rng(0)
    reference = generator.random((9, 32, 48, 3))
    video = np.clip(reference + generator.normal(0, 0.02, reference.shape) * np.arange(9)[:, None, None, None], 0, 1)
    measured = metrics.video_metrics(video, reference)["per_frame"]["ssim"]
    assert measured == [metrics._ssim(ref, frame) for ref, frame in zip(reference, video)]
    assert measured == sorted(measured, reverse=True), "noise grows frame by frame, SSIM falls"


def test_audio_relative_l2():
    reference = np.random.default_rng(2).standard_normal((2, 500))
    assert metrics.audio_relative_l2(reference * 1.01, reference) == pytest.approx(0.01, rel=1e-12)
    with pytest.raises(ValueError, match="silent"):
        metrics.audio_relative_l2(reference, np.zeros_like(reference))
    with pytest.raises(ValueError, match=r"audio shape \(2, 499\) differs"):
        metrics.audio_relative_l2(reference[:, 1:], reference)


@pytest.mark.parametrize(
    "video, message",
    [
        (flat(1.2), r"must lie in \[0, 1\]"),
        (flat(0.5)[..., :2], "RGB frames"),
        (flat(0.5, frames=1), "frames >= 2"),
        (np.full((FRAMES, 8, 8, 3), 0.5), "SSIM needs at least 11x11"),
        (np.where(flat(0.5) > 0, np.nan, 0.0), "non-finite"),
    ],
    ids=["range", "channels", "one-frame", "too-small", "nan"],
)
def test_bad_video_is_refused_with_the_reason(video, message):
    with pytest.raises(ValueError, match=message):
        metrics.video_metrics(video, video)


def test_artifacts_are_exact_deterministic_and_listed(tmp_path):
    video = clip()
    audio = (0.5 * np.random.default_rng(3).standard_normal((2, 400))).astype(np.float32)
    first, notes = metrics.write_artifacts(tmp_path / "a", video, audio, fps=24, sample_rate=160)
    second, _ = metrics.write_artifacts(tmp_path / "b", video, audio, fps=24, sample_rate=160)
    assert {name: a["sha256"] for name, a in first.items()} == {name: a["sha256"] for name, a in second.items()}
    for artifact in first.values():
        data = open(artifact["path"], "rb").read()
        assert hashlib.sha256(data).hexdigest() == artifact["sha256"]
    stored_video, stored_audio = metrics.read_arrays(first[metrics.ARRAYS_FILE]["path"])
    assert stored_video.tobytes() == video.tobytes() and stored_audio.tobytes() == audio.tobytes()
    wav, rate = soundfile.read(first[metrics.WAV_FILE]["path"], dtype="float64", always_2d=True)
    assert rate == 160 and wav.shape == (400, 2)
    np.testing.assert_allclose(wav.T, np.clip(audio, -1, 1), atol=2.0**-22)  # 24-bit PCM
    if metrics.MP4_FILE in first:
        assert notes == [] and open(first[metrics.MP4_FILE]["path"], "rb").read(12)[4:8] == b"ftyp"
    else:
        assert "imageio-ffmpeg" in notes[0]
    assert not list(tmp_path.rglob("*.partial"))


def test_without_a_video_encoder_the_mp4_is_skipped_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails as if not installed
    artifacts, notes = metrics.write_artifacts(tmp_path, clip(), np.zeros((2, 40), np.float32), fps=24, sample_rate=160)
    assert set(artifacts) == {metrics.ARRAYS_FILE, metrics.WAV_FILE}
    assert notes == ["video.mp4 not written: imageio-ffmpeg is not installed (pip install imageio-ffmpeg)"]
    assert not (tmp_path / metrics.MP4_FILE).exists()


# The metric table --------------------------------------------------------------------------------------


def test_each_metric_takes_its_identical_value_on_identical_generations():
    video, audio = clip(), np.random.default_rng(1).standard_normal((2, 100))
    values = metrics.compare(video, audio, video.copy(), audio.copy())
    assert {m.name: values[m.name] for m in metrics.METRICS} == {m.name: m.identical for m in metrics.METRICS}


@pytest.mark.parametrize("path", sorted((ROOT / "thresholds").glob("*/*/generation*-bounds.json")), ids=str)
def test_committed_generation_bounds_follow_from_their_errors_through_the_table(path):
    """Each frozen bound is the table's widening of the worst recorded variant value, bit for bit, and the
    file's rule text is the table's."""
    frozen = json.loads(path.read_text())
    margin = frozen["provenance"]["calibration_margin"]
    assert frozen["rule"]["bound"] == metrics.calibration_rule()
    for metric in metrics.METRICS:
        values = [v for errors in frozen["errors"].values() for k, v in errors.items() if k.endswith(f".{metric.name}")]
        assert metric.widen(metric.worst(values), margin) == frozen["bounds"][metric.name]
        assert metric.discriminates(frozen["bounds"][metric.name])
