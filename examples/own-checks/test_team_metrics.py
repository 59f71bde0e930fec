"""A team's own check beside the gate suite: a metric the gates do not have, frozen from the provider variants and
checked for the candidate like a built-in gate (``h3_threshold``), on generations the run store resumes or reuses
(``h3_generation``).

The metric: the generated video's mean brightness and the audio's loudness (RMS in dB), for the preflight contract's
seed 42 (fl2va on tiny): a kernel that shifts either moves what a viewer sees or hears, even where PSNR stays
high. Freeze once (the provider and its variants generate), then check:

    pytest examples/own-checks -m gate --h3-freeze
    pytest examples/own-checks -m gate
"""

import numpy as np
import pytest

CONTRACT = "generation-preflight"


@pytest.mark.h3_gate("threshold")
def test_brightness_and_loudness(h3_threshold, h3_generation):
    def measure(role):
        generated = h3_generation(42, role, contract=CONTRACT)
        loudness = 20 * np.log10(np.sqrt(np.mean(np.square(generated.audio, dtype=np.float64))) + 1e-12)
        return {"video_mean": float(generated.video.mean(dtype=np.float64)), "audio_rms_db": float(loudness)}

    result = h3_threshold("brightness-loudness", measure)
    assert result.passed, result.report()
