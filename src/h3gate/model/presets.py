"""Transformer configurations of the embedded models.

``tiny`` runs the whole suite on a laptop CPU under Triton's interpreter; ``edge`` is tiny at the kernels' edges
(widths that are not powers of two, batch 2, a one-row last tile), for the model and block gates; ``small`` is the
benchmark preset (four times the width, twice the depth). All keep the release model's structure: head_dim >= 6 x
rope_freq_dim so RoPE rotates a proper leading part of every head, hidden != heads x head_dim at release and in ``edge``.
"""

import os

TRANSFORMER_CONFIGS = {
    "tiny": dict(
        num_attention_heads=2,
        attention_head_dim=32,
        hidden_size=64,
        num_layers=2,
        num_refiner_layers=1,
        ffn_dim=128,
        in_channels=4,
        audio_in_channels=8,
        patch_size=(1, 2, 2),
        text_dim=32,
        freq_dim=32,
        time_embed_hidden_dim=64,
        time_embed_dim=32,
        rope_freq_dim=4,
    ),
    # tiny's structure where the kernels' edges are: widths that are not powers of two (hidden 80, attention
    # width 3 x 32 = 96 != hidden as at release, FFN 176), one block; its model contract adds batch 2 and a
    # sequence of 257 rows, a last tile of one row for every tile size in use (16 to 256).
    "edge": dict(
        num_attention_heads=3,
        attention_head_dim=32,
        hidden_size=80,
        num_layers=1,
        num_refiner_layers=1,
        ffn_dim=176,
        in_channels=4,
        audio_in_channels=8,
        patch_size=(1, 2, 2),
        text_dim=32,
        freq_dim=32,
        time_embed_hidden_dim=80,
        time_embed_dim=40,
        rope_freq_dim=4,
    ),
    "small": dict(
        num_attention_heads=4,
        attention_head_dim=64,
        hidden_size=256,
        num_layers=4,
        num_refiner_layers=1,
        ffn_dim=512,
        in_channels=4,
        audio_in_channels=8,
        patch_size=(1, 2, 2),
        text_dim=32,
        freq_dim=64,
        time_embed_hidden_dim=256,
        time_embed_dim=128,
        rope_freq_dim=8,
    ),
}

PRESETS = tuple(TRANSFORMER_CONFIGS)

# The release transformer (H3_FACTS): diffusers' MiniMaxH3Transformer3DModel defaults, which a test holds equal.
# Built in-process on a GPU with random weights by ``h3gate.model.factory.build_release``; not one of PRESETS, which the
# CPU suite and ``make gate`` iterate: it needs about 70 GiB of GPU memory.
RELEASE = "release"
RELEASE_CONFIG = dict(
    num_attention_heads=56,
    attention_head_dim=128,
    hidden_size=5376,
    num_layers=50,
    num_refiner_layers=2,
    ffn_dim=14336,
    in_channels=24,
    audio_in_channels=32,
    patch_size=(1, 2, 2),
    text_dim=5120,
    freq_dim=256,
    time_embed_hidden_dim=5376,
    time_embed_dim=2688,
    rope_freq_dim=16,
)
# A leading subset of the release blocks (a partial model, for measuring per-block cost): the number of blocks.
LAYERS_VARIABLE = "H3GATE_LAYERS"


def release_layers(layers: int | str | None = None) -> int:
    """The number of leading release blocks to build: ``layers``, else ``$H3GATE_LAYERS``, else all 50."""
    full = RELEASE_CONFIG["num_layers"]
    value = layers if layers is not None else os.environ.get(LAYERS_VARIABLE) or full
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= full:
        raise ValueError(f"the release model has 1 to {full} blocks; {LAYERS_VARIABLE}={value!r} is not one of them")
    return count


def release_name(layers: int | None) -> str:
    """The release model's name (its thresholds folder): ``release``, or ``release-layers<N>`` for a partial one."""
    return RELEASE if layers is None or layers == RELEASE_CONFIG["num_layers"] else f"{RELEASE}-layers{layers}"
