"""The embedded MiniMax-H3 pipeline: diffusers' modular pipeline, as shipped, over in-process components.

``build_components`` makes everything but the transformer, ``make_pipeline`` assembles
``MiniMaxH3ModularPipeline(MiniMaxH3Blocks)`` around a given transformer, and ``generate`` runs a t2va or fl2va
request and returns decoded video and stereo audio as numpy arrays.

The request's encoders (the text encoder's prompt encoding, the keyframe's VAE encoding) depend on the request alone,
never on its seed or the transformer, so a gate can run them once: ``encoder_pipeline`` + ``encode`` give their
outputs (:data:`ENCODINGS`), and ``make_pipeline(..., encoders=False)`` is the same pipeline without those two blocks,
taking those outputs as inputs (diffusers' blocks, split where the modular pipeline splits them).

Facts a gate builds on (measured with the tiny preset):

- Sequence. One packed sequence per request: ``[text | keyframe conditions | audio | video]``. The byte-level
  tokenizer gives one text row per prompt byte; fl2va adds ``"<Picture 1>: "`` (13 rows) and a vision block
  (start, one image pad per merged 32x32 keyframe tile, end) in front of the prompt, and one condition row per
  keyframe. num_frames=124 gives 37 latent frames and round(124 / 24 * 40) = 207 audio latents; at 32x32 a latent
  frame is 2x2, i.e. one 2x2 patch, so t2va with a 15-byte prompt is 15 text + 414 audio (2 channels, channel-major)
  + 37 video = 466 rows, and fl2va with the same prompt 31 text + 1 condition + 414 + 37 = 483 rows.
- Transformer calls. ``num_inference_steps=N`` runs N - 1 forwards (the schedule's terminal sigma 0 is one of the
  N points), one per step, for every workflow (the checkpoint is guidance-distilled: no second pass).
- Time. A whole tiny generation at 124 frames, 32x32 (text encoder, N - 1 forwards, both decoders) is
  overhead-bound: it runs fastest on one intra-op thread; with 2 threads on a shared 2-core CPU, OpenMP spin-waits
  make it several times slower.
- Noise. The request's ``generator`` (a CPU ``torch.Generator`` seeded with ``seed``, so the draw is the same on
  every device) is consumed in this order by ``MiniMaxH3PrepareConditionLatentsStep`` (fl2va only) and
  ``MiniMaxH3PrepareLatentsStep``: one ``randn(1, C, 1, h, w)`` per keyframe, mixed into the keyframe latents at
  t = 0.999; then the video noise ``randn(1, C, F, h, w)`` (C = 4 latent channels, F latent frames, h x w latent
  size), patchified into the state's ``latents`` rows; then the audio noise ``randn(2 * A, C_a)`` (A audio latents,
  C_a = 8), drawn directly as the state's ``audio_latents`` rows. The keyframe's VAE posterior is sampled under its
  own generator seeded 42 (``keyframe_encode_seed``), independent of the request. The denoise loop then updates
  ``latents`` and ``audio_latents`` in place, so the initial noise does not survive in the final state: capture it
  from the first transformer call (below), or draw it and pass ``latents`` (1, C, F, h, w) / ``audio_latents``
  (2, C_a, A), which skips those draws.
- Hook. ``MiniMaxH3LoopDenoiser`` calls ``components.transformer(...)`` once per step with keyword arguments only
  (``hidden_states`` = video rows with conditions first, ``audio_hidden_states``, ``encoder_hidden_states``,
  ``timestep``, ``timestep_indices`` and the layout tensors) and reads ``(noise_pred, audio_noise_pred)``.
  ``transformer.register_forward_hook(fn, with_kwargs=True)`` sees every call's inputs and outputs and may replace
  the outputs (clone inputs: the loop writes into them afterwards). To skip calls, e.g. to resume from saved
  outputs, replace the instance's forward keeping its signature, ``transformer.forward =
  functools.wraps(transformer.forward)(replay)`` (replaying saved outputs this way reproduces a generation
  bitwise): the loop passes only the layout tensors that ``inspect.signature(transformer.forward)`` names, so a
  bare ``**kwargs`` wrapper receives none of them and the forward fails on missing ``token_tags``,
  ``position_ids`` and row indices.
"""

import contextlib
import resource
import sys
import time

import numpy as np
import torch
from diffusers.modular_pipelines import MiniMaxH3Blocks, MiniMaxH3ModularPipeline, SequentialPipelineBlocks
from PIL import Image

from h3gate.generation.components import COMPONENT_CONFIGS, build_components
from h3gate.generation.keyframe import REFERENCE_IMAGE_SHA256, load_reference_image, reference_image_path

__all__ = [
    "COMPONENT_CONFIGS",
    "ENCODINGS",
    "REFERENCE_IMAGE_SHA256",
    "WORKFLOWS",
    "build_components",
    "decode_costs",
    "encode",
    "encoder_pipeline",
    "generate",
    "load_reference_image",
    "make_pipeline",
    "measured",
    "reference_image_path",
]

WORKFLOWS = ("t2va", "fl2va")

# The ref2va workflow runs against a second checkpoint partition that the embedded model does not build.
_UNBUILT_COMPONENTS = {"transformer_ref"}


# The blocks that encode the request, and what they hand the denoising blocks.
ENCODER_BLOCKS = ("before_encode", "text_encoder", "vae_encoder")
ENCODINGS = ("prompt_embeds", "text_token_tags", "condition_latents")


def _assemble(blocks, components: dict) -> MiniMaxH3ModularPipeline:
    pipe = blocks.init_pipeline()
    known = set(pipe.component_names) | {spec.name for spec in pipe.blocks.expected_configs}
    unknown = sorted(set(components) - known)
    if unknown:
        raise ValueError(f"make_pipeline: unknown components or configs {unknown}; known names are {sorted(known)}.")
    pipe.update_components(**components)
    missing = sorted(set(pipe.null_component_names) - _UNBUILT_COMPONENTS)
    if missing:
        raise ValueError(f"make_pipeline: components {missing} are missing; build them with build_components().")
    if getattr(pipe, "vae", None) is not None:
        pipe.vae.enable_tiling()  # the released decode is the tiled one (on by default; pinned here)
    return pipe


def make_pipeline(components: dict, transformer, *, encoders: bool = True) -> MiniMaxH3ModularPipeline:
    """``MiniMaxH3ModularPipeline`` with ``MiniMaxH3Blocks``, the given components and canvas configs (as
    ``build_components`` returns them) and ``transformer``, ready to call. ``encoders=False`` leaves out the text and
    keyframe encoder blocks (and needs neither the text encoder, tokenizer nor processor): ``generate`` then takes
    their outputs as ``encodings``.

    Refuses unknown names and any missing component: the pipeline would otherwise fall back silently to the
    release model's geometry (16x VAE, 24 latent channels, 32 kHz audio) for a missing VAE.
    """
    if "transformer" in components:
        raise ValueError("make_pipeline: pass the transformer as the `transformer` argument, not in `components`.")
    blocks = MiniMaxH3Blocks()
    if not encoders:
        for name in ENCODER_BLOCKS[1:]:
            blocks.sub_blocks.pop(name)
    needed = set(blocks.init_pipeline().component_names) | {spec.name for spec in blocks.expected_configs}
    return _assemble(blocks, {**{k: v for k, v in components.items() if encoders or k in needed}, "transformer": transformer})


def encoder_pipeline(components: dict) -> MiniMaxH3ModularPipeline:
    """The blocks of :data:`ENCODER_BLOCKS` alone, over the components they declare (the others are ignored)."""
    whole = MiniMaxH3Blocks()
    blocks = SequentialPipelineBlocks.from_blocks_dict({name: whole.sub_blocks[name] for name in ENCODER_BLOCKS})
    needed = set(blocks.init_pipeline().component_names) | {spec.name for spec in blocks.expected_configs}
    return _assemble(blocks, {name: value for name, value in components.items() if name in needed})


def _request(workflow: str, image: Image.Image | None) -> dict:
    if workflow not in WORKFLOWS:
        raise ValueError(f"Unknown workflow {workflow!r}: choose one of {WORKFLOWS}.")
    if workflow == "fl2va" and image is None:
        raise ValueError("Workflow 'fl2va' starts from a keyframe: pass image=, e.g. load_reference_image().")
    if workflow == "t2va" and image is not None:
        raise ValueError("Workflow 't2va' generates from the prompt alone: drop image= or use workflow='fl2va'.")
    return {} if image is None else {"image": image}


def encode(pipe, *, workflow: str, prompt: str, num_frames: int, height: int, width: int,
           image: Image.Image | None = None) -> dict:
    """The :data:`ENCODINGS` of one request by an :func:`encoder_pipeline` (``condition_latents`` is None for t2va)."""
    return pipe(prompt=prompt, num_frames=num_frames, height=height, width=width, output=list(ENCODINGS),
                **_request(workflow, image))


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


@contextlib.contextmanager
def measured(device):
    """Yield a dict that, after the body, holds its ``seconds`` and ``peak_memory_bytes``: torch's allocated-memory
    peak of the body on CUDA (the peak is reset on entry, so a caller measuring around the body must read its own
    parts' peaks), the process's peak RSS on CPU (which cannot be reset: the whole run's peak), and which of the
    two in ``memory``."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    costs = {}
    start = time.perf_counter()
    yield costs
    if cuda:
        torch.cuda.synchronize(device)
    costs.update(seconds=time.perf_counter() - start, peak_memory_bytes=_peak_memory(device),
                 memory="torch.cuda.max_memory_allocated" if cuda else "process peak RSS")


@contextlib.contextmanager
def decode_costs(pipe):
    """Yield a dict that each decode of the body fills: ``{"video"|"audio": costs of :func:`measured`}``. The VAEs'
    ``decode`` is wrapped on the instances for the body."""
    costs = {}
    wrapped = {"video": pipe.vae, "audio": pipe.audio_vae}

    def timing(name, module, decode):
        def timed_decode(*args, **kwargs):
            with measured(next(module.parameters()).device) as costs[name]:
                return decode(*args, **kwargs)

        return timed_decode

    for name, module in wrapped.items():
        module.decode = timing(name, module, module.decode)
    try:
        yield costs
    finally:
        for module in wrapped.values():
            del module.decode


def generate(
    pipe: MiniMaxH3ModularPipeline,
    *,
    workflow: str,
    prompt: str,
    seed: int,
    num_frames: int,
    height: int,
    width: int,
    num_inference_steps: int,
    image: Image.Image | None = None,
    encodings: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run one request and return ``(video, audio)``: video float32 ``(frames, height, width, 3)`` in [0, 1] and
    audio float32 ``(2, samples)``, stereo at ``pipe.audio_sampling_rate``.

    ``workflow`` is "t2va" (prompt only) or "fl2va" (``image`` is the first keyframe). All noise comes from a CPU
    generator seeded with ``seed``, so the same arguments give bitwise the same initial noise on any device.
    ``num_frames`` is rounded up to the next 17 n + 5 by the pipeline and must end up within 124..345.
    ``encodings`` (from :func:`encode`) are given to a pipeline made with ``encoders=False``.
    """
    keyframe = _request(workflow, image)
    encoded = {"prompt": prompt} if encodings is None else encodings  # the prompt is in its encoding
    outputs = pipe(
        num_frames=num_frames,
        height=height,
        width=width,
        num_inference_steps=num_inference_steps,
        generator=torch.Generator(device="cpu").manual_seed(seed),
        output_type="np",
        output=["videos", "audio"],
        **keyframe,
        **encoded,
    )
    video = np.asarray(outputs["videos"][0], dtype=np.float32)
    audio = outputs["audio"][0].float().cpu().numpy()
    return video, audio
