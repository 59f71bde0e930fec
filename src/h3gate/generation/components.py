"""Every MiniMax-H3 pipeline component except the transformer, built in-process with seeded random weights.

Nothing is downloaded: the video and audio VAEs, the two schedulers, a Qwen3-VL conditioner, a byte-level
tokenizer and the Qwen3-VL processor come from the small configs in ``COMPONENT_CONFIGS``. Each model is
constructed under its own seed, derived from ``(seed, component name)`` inside a forked RNG, so the weights are
bitwise identical across calls and processes and the caller's global RNG is left untouched.

Constraints the configs satisfy:

- The pipeline reads ``hidden_states[50]`` of the conditioner (``MiniMaxH3ModularPipeline.text_encoder_layer``),
  so the text stack has 51 thin layers; its hidden size is the transformer's ``text_dim``.
- The video VAE compresses 16x in space, so with the transformer's 2x2 patch a canvas is a multiple of 32; the
  canvas configs make a request without height/width generate at 32x32 instead of the release's 768x1344.
- ``int(0.75 x decoder head_dim)`` must divide by 6 (the decoder's 3-axis RoPE), and the audio VAE needs explicit
  ``latents_mean``/``latents_std`` (its decode step crashes on None).
"""

import contextlib
import hashlib
import inspect

import torch
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler
from transformers import Qwen2Tokenizer, Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers import Qwen3VLProcessor
from transformers.convert_slow_tokenizer import bytes_to_unicode

from h3gate import seeded
from h3gate.model.presets import RELEASE

_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

_TINY = {
    "vae": dict(
        latent_channels=4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        spatial_downsample_factors=(2, 2, 2, 2),
        temporal_downsample_factors=(1, 2, 2, 1),
        norm_num_groups=4,
        decoder_num_layers=1,
        decoder_num_attention_heads=1,
        decoder_attention_head_dim=16,
        clip_length=17,
        token_drop=3,
        latents_mean=(0.0,) * 4,
        latents_std=(1.0,) * 4,
    ),
    "audio_vae": dict(
        encoder_dim=4,
        encoder_rates=(2, 2),
        latent_dim=16,
        latent_channels=8,
        num_attention_heads=1,
        decoder_dim=16,
        decoder_rates=(2, 2),
        decoder_kernel_sizes=(4, 4),
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1,),),
        sampling_rate=160,
        latents_mean=[0.0] * 8,
        latents_std=[1.0] * 8,
    ),
    "scheduler": dict(shift=12.0),
    "audio_scheduler": dict(shift=3.0),
    "text_encoder": dict(
        text_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=51,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            rope_parameters=dict(
                rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2], mrope_interleaved=True
            ),
        ),
        vision_config=dict(
            depth=2,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=32,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        ),
    ),
    "tokenizer": dict(special_tokens=_SPECIAL_TOKENS),
    "processor": dict(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=32 * 32,
        max_pixels=128 * 128,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
    ),
    "pipeline": dict(canvas_short_edge=32, canvas_max_pixels=32 * 32),
}

COMPONENT_CONFIGS: dict[str, dict] = {"tiny": _TINY, "edge": _TINY, "small": _TINY}
"""Configs of every component but the transformer, per preset (the keys of ``presets.TRANSFORMER_CONFIGS``).
``small`` reuses the tiny VAEs, conditioner and tokenizer: the benchmark preset only widens the transformer, whose
``text_dim`` stays the conditioner's hidden size of 32."""

RELEASE_COMPONENTS: dict = {
    # diffusers' defaults are the released VAE configs (H3_FACTS); the audio VAE's latent statistics are per checkpoint
    "vae": {},
    "audio_vae": dict(latents_mean=[0.0] * 32, latents_std=[1.0] * 32),
    "scheduler": dict(shift=12.0),
    "audio_scheduler": dict(shift=3.0),
    "text_encoder": dict(
        # Qwen3-VL-32B's text stack cut to the 51 layers the pipeline reads (hidden state 50); its width is the
        # release transformer's text_dim. The vision tower at transformers' defaults, projecting to that width.
        text_config=dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=51, num_attention_heads=64,
                         num_key_value_heads=8, head_dim=128),
        vision_config=dict(out_hidden_size=5120),
        dtype=torch.bfloat16,  # as published; about 47 GiB
    ),
    "tokenizer": dict(special_tokens=_SPECIAL_TOKENS),
    "processor": dict(patch_size=16, merge_size=2, temporal_patch_size=2),  # Qwen3-VL's
    "pipeline": {},  # the pipeline's own canvas: 768x1344
}
"""The release pipeline's components but the transformer, built with random weights directly on a CUDA device by
``build_components("release", seed, device)`` (about 48 GiB; no folder on disk)."""


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """``Qwen3VLProcessor`` without a video processor, saved and loaded as a ``Qwen3VLProcessor``.

    transformers' video processors need torchvision, which is not available beside this torch build, and
    ``ProcessorMixin`` checks, saves and loads every sub-processor its attributes list. The t2va and fl2va workflows
    process images only, so the video processor is left out of the attributes and stays None; the saved
    ``processor_config.json`` names ``Qwen3VLProcessor``, as the published one does.
    """

    video_processor = None

    @classmethod
    def get_attributes(cls):
        return [name for name in super().get_attributes() if name != "video_processor"]

    def to_dict(self):
        return {**super().to_dict(), "processor_class": Qwen3VLProcessor.__name__}


def _component_seed(seed: int, name: str) -> int:
    """One independent stream per component, so changing one component's config never shifts another's weights."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextlib.contextmanager
def component_rng(seed: int, name: str, device: str = "cpu"):
    """Inside the body, torch's global generators (the CPU's and ``device``'s) are seeded for component ``name``, in a
    forked RNG so the caller's global streams are left as they were."""
    device = torch.device(device)
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(_component_seed(seed, name))
        yield


def _seeded(seed: int, name: str, build, device: str = "cpu"):
    """``build()`` on ``device`` under the component's seed (:func:`component_rng`), with every CPU initialiser's draw
    the same bits on every CPU (:func:`h3gate.seeded.independent_of_machine`)."""
    with component_rng(seed, name, device), seeded.independent_of_machine(), torch.device(device):
        return build().eval()


def _byte_level_tokenizer(special_tokens: tuple[str, ...]) -> Qwen2Tokenizer:
    """One token per byte (token id = byte value, no merges) plus the Qwen special tokens the pipeline looks up."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab.update({token: 256 + index for index, token in enumerate(special_tokens)})
    return Qwen2Tokenizer(vocab=vocab, merges=[], extra_special_tokens=list(special_tokens[1:]))


def _video_vae(config: dict) -> AutoencoderKLMiniMaxH3:
    """diffusers initialises the decoder's layer scales and register tokens to zero, which makes every decoder block
    the identity; scales of one and N(0, 1) registers let the decoder mix latent voxels through attention as a
    trained one does."""
    vae = AutoencoderKLMiniMaxH3(**config)
    with torch.no_grad():
        for block in vae.decoder.transformer_blocks:
            block.scale1.fill_(1.0)
            block.scale2.fill_(1.0)
        vae.decoder.register_tokens.normal_()
    return vae


PRESETS = (*COMPONENT_CONFIGS, RELEASE)
"""Every preset whose components can be built: the embedded ones and the release one."""


def _configs(preset: str) -> dict:
    if preset == RELEASE:
        return RELEASE_COMPONENTS
    if preset in COMPONENT_CONFIGS:
        return COMPONENT_CONFIGS[preset]
    raise ValueError(f"Unknown preset {preset!r}: choose one of {sorted(COMPONENT_CONFIGS) + [RELEASE]}.")


def _text_encoder_config(configs: dict, tokenizer: Qwen2Tokenizer) -> Qwen3VLConfig:
    def token_id(name: str) -> int:
        return tokenizer.convert_tokens_to_ids(f"<|{name}|>")

    return Qwen3VLConfig(
        text_config=dict(configs["text_encoder"]["text_config"], vocab_size=len(tokenizer)),
        vision_config=configs["text_encoder"]["vision_config"],
        image_token_id=token_id("image_pad"),
        video_token_id=token_id("video_pad"),
        vision_start_token_id=token_id("vision_start"),
        vision_end_token_id=token_id("vision_end"),
    )


def _text_encoder(configs: dict, tokenizer: Qwen2Tokenizer) -> Qwen3VLForConditionalGeneration:
    """The conditioner on the current default device, initialised by transformers."""
    dtype = configs["text_encoder"].get("dtype", torch.float32)
    return Qwen3VLForConditionalGeneration._from_config(_text_encoder_config(configs, tokenizer), dtype=dtype)


def text_encoder_skeleton(preset: str) -> Qwen3VLForConditionalGeneration:
    """The preset's conditioner on the meta device (no memory): its config, parameter names, shapes and dtype, for a
    writer that draws the weights one module at a time."""
    configs = _configs(preset)
    with torch.device("meta"):
        return _text_encoder(configs, _byte_level_tokenizer(configs["tokenizer"]["special_tokens"]))


def small_components(preset: str) -> dict[str, object]:
    """The components without weights (schedulers, tokenizer, processor) and the pipeline's canvas configs."""
    configs = _configs(preset)
    tokenizer = _byte_level_tokenizer(configs["tokenizer"]["special_tokens"])
    return {
        "scheduler": MiniMaxH3Scheduler(**configs["scheduler"]),
        "audio_scheduler": MiniMaxH3Scheduler(**configs["audio_scheduler"]),
        "tokenizer": tokenizer,
        "processor": ImageOnlyQwen3VLProcessor(image_processor=Qwen2VLImageProcessorPil(**configs["processor"]),
                                               tokenizer=tokenizer),
        **configs["pipeline"],
    }


def build_vae(preset: str, seed: int, name: str, device: str = "cpu"):
    """The preset's ``vae`` or ``audio_vae`` on ``device`` (``meta`` for its shapes alone)."""
    config = _configs(preset)[name]
    build = {"vae": lambda: _video_vae(config), "audio_vae": lambda: AutoencoderKLMiniMaxH3Audio(**config)}[name]
    return _seeded(seed, name, build, device)


def build_components(preset: str, seed: int, device: str = "cpu", text_encoder: bool = True) -> dict[str, object]:
    """Every component ``MiniMaxH3Blocks`` needs except the transformers, keyed as the pipeline names them, plus the
    pipeline's canvas configs (``update_components`` takes both), for ``make_pipeline``; the models built on
    ``device``. The release preset's text encoder alone is 47 GiB: it is built only on a CUDA device, and
    ``text_encoder=False`` leaves it out (for a caller whose prompt encodings are cached, or that writes it with
    :func:`text_encoder_skeleton`); its VAEs alone are about 10.6 GiB of float32.

    ``image_processor`` and ``video_processor`` are left to the pipeline, which creates them from its own config.
    """
    configs = _configs(preset)
    if preset == RELEASE and text_encoder and torch.device(device).type != "cuda":
        raise ValueError(f"the {RELEASE} pipeline's text encoder (about 47 GiB) is built on a CUDA device, not "
                         f"{device!r}: run with --h3-device=cuda")
    components = {name: build_vae(preset, seed, name, device) for name in ("vae", "audio_vae")}
    components.update(small_components(preset))
    if text_encoder:
        tokenizer = components["tokenizer"]
        components["text_encoder"] = _seeded(seed, "text_encoder", lambda: _text_encoder(configs, tokenizer), device)
    return components


def release_recipe(seed: int, device: str) -> dict:
    """What the release components' random weights follow from, their identity in place of a digest of 48 GiB: the
    configs, the seed, the code that builds them, torch's version and the GPU (the CUDA generator's values depend
    on its multiprocessor count)."""
    properties = torch.cuda.get_device_properties(device)
    code = "".join(inspect.getsource(function)
                   for function in (build_components, build_vae, _seeded, _component_seed, _video_vae, _text_encoder))
    return {"configs": repr(RELEASE_COMPONENTS), "seed": seed, "code": hashlib.sha256(code.encode()).hexdigest(),
            "torch": torch.__version__, "gpu": properties.name, "multiprocessors": properties.multi_processor_count}
