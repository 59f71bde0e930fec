"""The embedded tiny pipeline: reproducible components, generations of the right form, and the noise contract a
generation gate relies on (same seed, bitwise the same initial noise and output)."""

import hashlib
import inspect
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from diffusers import MiniMaxH3Transformer3DModel
from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

from h3gate.generation.pipeline import (
    COMPONENT_CONFIGS,
    REFERENCE_IMAGE_SHA256,
    build_components,
    generate,
    load_reference_image,
    make_pipeline,
    reference_image_path,
)
from h3gate.model.presets import TRANSFORMER_CONFIGS

pytestmark = pytest.mark.usefixtures("one_thread")


PROMPT = "a cat on a drum"  # 15 bytes, so 15 text rows
FRAMES, SIZE, STEPS = 124, 32, 4
LATENT_FRAMES, AUDIO_LATENTS = 37, 207  # (124 - 5) / 17 * 5 + 2, round(124 / 24 * 40)
REQUEST = dict(prompt=PROMPT, num_frames=FRAMES, height=SIZE, width=SIZE, num_inference_steps=STEPS)


def fingerprint(components: dict) -> str:
    """sha256 over every weight, vocabulary and config of a components dict."""
    digest = hashlib.sha256()
    for name in sorted(components):
        value = components[name]
        digest.update(name.encode())
        if isinstance(value, torch.nn.Module):
            for key, tensor in value.state_dict().items():
                digest.update(key.encode())
                digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif hasattr(value, "get_vocab"):
            digest.update(json.dumps(value.get_vocab(), sort_keys=True).encode())
        elif hasattr(value, "to_json_string"):
            digest.update(value.to_json_string().encode())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def tiny_transformer() -> MiniMaxH3Transformer3DModel:
    torch.manual_seed(0)
    return MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIGS["tiny"]).eval()


@pytest.fixture(scope="module", autouse=True)
def other_process():
    """A second interpreter fingerprinting its own build, started first so that its imports (the bulk of its time)
    overlap this module's generations; the last test reads it."""
    script = "\n".join(
        ["import hashlib, json, torch", "from h3gate.generation.pipeline import build_components", inspect.getsource(fingerprint)]
        + ["print(fingerprint(build_components('tiny', 0)))"]
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    yield process
    process.kill()
    process.communicate()


@pytest.fixture(scope="module")
def components():
    return build_components("tiny", 0)


@pytest.fixture(scope="module")
def pipe(components):
    return make_pipeline(components, tiny_transformer())


def record_calls(calls: list):
    """A forward pre-hook keeping clones of a call's tensor inputs: the denoise loop updates them in place later."""
    return lambda module, args, kwargs: calls.append({k: v.clone() for k, v in kwargs.items() if torch.is_tensor(v)})


def run(pipe, workflow, seed):
    """One 124-frame 32x32 generation, and the tensor inputs of every transformer call it made."""
    calls = []
    hook = pipe.transformer.register_forward_pre_hook(record_calls(calls), with_kwargs=True)
    try:
        image = load_reference_image() if workflow == "fl2va" else None
        return generate(pipe, workflow=workflow, seed=seed, image=image, **REQUEST), calls
    finally:
        hook.remove()


@pytest.fixture(scope="module", params=["t2va", "fl2va"])
def runs(request, pipe):
    """Seed 42 twice and seed 43, for one workflow."""
    workflow = request.param
    (first, calls), (again, _), (other, _) = (run(pipe, workflow, seed) for seed in (42, 42, 43))
    return dict(workflow=workflow, first=first, calls=calls, again=again, other=other)


def test_components_are_bitwise_identical_across_builds(components):
    assert fingerprint(build_components("tiny", 0)) == fingerprint(components)
    assert fingerprint(build_components("tiny", 1)) != fingerprint(components)


def test_every_preset_has_components_whose_text_width_fits_its_transformer():
    assert COMPONENT_CONFIGS.keys() == TRANSFORMER_CONFIGS.keys()
    for preset, configs in COMPONENT_CONFIGS.items():
        assert configs["text_encoder"]["text_config"]["hidden_size"] == TRANSFORMER_CONFIGS[preset]["text_dim"]
        # The pipeline conditions on hidden_states[50], which needs 51 decoder layers.
        assert configs["text_encoder"]["text_config"]["num_hidden_layers"] == 51


def test_make_pipeline_refuses_missing_and_unknown_components(components):
    transformer = tiny_transformer()
    with pytest.raises(ValueError, match=r"\['vae'\] are missing"):
        make_pipeline({name: value for name, value in components.items() if name != "vae"}, transformer)
    with pytest.raises(ValueError, match="unknown components or configs \\['vea'\\]"):
        make_pipeline(dict(components, vea=components["vae"]), transformer)
    with pytest.raises(ValueError, match="as the `transformer` argument"):
        make_pipeline(dict(components, transformer=transformer), transformer)


def test_generate_refuses_inconsistent_workflow_arguments(pipe):
    image = load_reference_image()
    with pytest.raises(ValueError, match="'fl2va' starts from a keyframe"):
        generate(pipe, workflow="fl2va", seed=0, **REQUEST)
    with pytest.raises(ValueError, match="'t2va' generates from the prompt alone"):
        generate(pipe, workflow="t2va", seed=0, image=image, **REQUEST)
    with pytest.raises(ValueError, match="Unknown workflow 'ref2va'"):
        generate(pipe, workflow="ref2va", seed=0, **REQUEST)


def test_generation_has_the_right_form(runs):
    video, audio = runs["first"]
    assert video.shape == (FRAMES, SIZE, SIZE, 3) and video.dtype == np.float32
    assert np.isfinite(video).all() and video.min() >= 0.0 and video.max() <= 1.0
    assert video.std() > 0.05, "video is (nearly) constant"
    assert video.std(axis=0).mean() > 0.05, "frames do not change over time"
    assert np.mean((video == 0.0) | (video == 1.0)) < 0.01, "video is saturated"
    # 4 samples per audio latent (the tiny audio VAE hops 4), stereo.
    assert audio.shape == (2, AUDIO_LATENTS * 4) and audio.dtype == np.float32
    assert np.isfinite(audio).all() and np.abs(audio).max() < 1.0
    assert audio.std(axis=1).min() > 0.01, "a channel is (nearly) silent"
    assert not np.array_equal(audio[0], audio[1]), "the two channels are the same"


def test_same_seed_gives_bitwise_the_same_output(runs):
    for first, again in zip(runs["first"], runs["again"]):
        assert np.array_equal(first, again)


def test_different_seed_gives_a_different_output(runs):
    (video, audio), (other_video, other_audio) = runs["first"], runs["other"]
    assert 10 * np.log10(1.0 / np.mean((video - other_video) ** 2)) < 30.0
    assert np.linalg.norm(audio - other_audio) > 0.1 * np.linalg.norm(audio)


def test_transformer_calls_and_sequence_layout(runs):
    calls = runs["calls"]
    assert len(calls) == STEPS - 1
    # fl2va puts "<Picture 1>: " (13 bytes) and a 3-row vision block before the prompt, and 1 keyframe row first.
    text_rows, condition_rows = (len(PROMPT), 0) if runs["workflow"] == "t2va" else (len(PROMPT) + 16, 1)
    layout = calls[0]
    assert layout["text_indices"].numel() == text_rows
    assert layout["audio_indices"].numel() == 2 * AUDIO_LATENTS
    assert layout["video_indices"].numel() == condition_rows + LATENT_FRAMES
    assert layout["token_tags"].numel() == text_rows + 2 * AUDIO_LATENTS + condition_rows + LATENT_FRAMES


def test_initial_noise_is_the_documented_draw(runs):
    """The seed's generator draws any keyframe noise first, then the video noise, then the audio noise in rows."""
    generator = torch.Generator().manual_seed(42)
    if runs["workflow"] == "fl2va":
        torch.randn((1, 4, 1, 2, 2), generator=generator)
    video_noise = torch.randn((1, 4, LATENT_FRAMES, 2, 2), generator=generator)
    audio_noise = torch.randn((2 * AUDIO_LATENTS, 8), generator=generator)
    first_call = runs["calls"][0]
    assert torch.equal(first_call["hidden_states"][0, -LATENT_FRAMES:], patchify_video_latents(video_noise, (1, 2, 2)))
    assert torch.equal(first_call["audio_hidden_states"][0], audio_noise)


def test_small_preset_generates():
    torch.manual_seed(0)
    transformer = MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIGS["small"]).eval()
    pipe = make_pipeline(build_components("small", 0), transformer)
    video, audio = generate(pipe, workflow="t2va", seed=42, **dict(REQUEST, num_inference_steps=2))
    assert video.shape == (FRAMES, SIZE, SIZE, 3) and audio.shape == (2, AUDIO_LATENTS * 4)
    assert np.isfinite(video).all() and np.isfinite(audio).all()


def draw_reference_image() -> np.ndarray:
    """How the committed keyframe was made: arithmetic only (no RNG, no libm), so it is exact everywhere."""
    y, x = np.mgrid[0:64, 0:64] / 63.0
    rgb = np.stack([x, y, np.abs((2 * (x + y)) % 1.0 * 2.0 - 1.0)], axis=-1)
    rgb[(x - 0.35) ** 2 + (y - 0.4) ** 2 < 0.2**2] = (0.95, 0.85, 0.1)
    rgb[(x > 0.6) & (x < 0.9) & (y > 0.55) & (y < 0.85)] = (0.1, 0.2, 0.8)
    return np.round(rgb * 255).astype(np.uint8)


def test_reference_image_is_its_recipe():
    image = load_reference_image()
    assert image.mode == "RGB" and image.size == (64, 64)
    assert np.array_equal(np.asarray(image), draw_reference_image())


def test_reference_image_digest_refuses_a_modified_copy(tmp_path):
    copy = tmp_path / "reference_keyframe.png"
    shutil.copyfile(reference_image_path(), copy)
    assert load_reference_image(copy).size == (64, 64)
    data = bytearray(copy.read_bytes())
    data[-20] ^= 0x01
    copy.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{re.escape(str(copy))}.*expected {REFERENCE_IMAGE_SHA256}"):
        load_reference_image(copy)


def test_components_are_bitwise_identical_across_processes(other_process, components):
    stdout, stderr = other_process.communicate(timeout=300)
    assert other_process.returncode == 0, stderr
    assert stdout.strip() == fingerprint(components)
