"""Transformer configurations of the embedded models.

``tiny`` runs the whole suite on a laptop CPU under Triton's interpreter; ``small`` is the benchmark preset
(four times the width, twice the depth). Both keep the release model's structure: head_dim >= 6 x
rope_freq_dim so RoPE rotates a proper leading part of every head, hidden != heads x head_dim only at release.
"""

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
