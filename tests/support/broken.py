"""Deliberately broken candidates, each one realistic bug, registered through the public candidate registry.

They are written over the block program's provider ops, so each differs from the provider in exactly one
place; the gates must reject every one of them.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from h3gate.block_program import PROVIDER_OPS, Installation
from h3gate.candidates import Candidate


class _OpsCandidate(Candidate):
    ops = PROVIDER_OPS

    def install(self, transformer):
        return Installation(transformer, self.ops)


def _attention_without_last_partial_tile(processor, q, k, v, tile=64):
    keep = k.shape[1] - k.shape[1] % tile
    return PROVIDER_OPS.attention(processor, q, k[:, :keep], v[:, :keep])


class DroppedKeyTile(_OpsCandidate):
    """Attention that forgets the last partial key tile (a classic flash-kernel masking bug)."""

    name = "broken-dropped-key-tile"
    ops = replace(PROVIDER_OPS, attention=_attention_without_last_partial_tile)


def _audio_reads_text_modulation(norm, x, scale, shift, idx):
    if idx is not None:
        idx = torch.where(idx % 3 == 2, idx - 1, idx)
    return PROVIDER_OPS.rms_norm_modulate(norm, x, scale, shift, idx)


class AudioTakesTextModulation(_OpsCandidate):
    """Audio rows modulated with the text rows' AdaLN parameters (wrong modality row)."""

    name = "broken-audio-text-modulation"
    ops = replace(PROVIDER_OPS, rms_norm_modulate=_audio_reads_text_modulation)


class _Hooks:
    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for handle in self.handles:
            handle.remove()


class ZeroedWeightGradient(Candidate):
    """The provider, except that one parameter's gradient comes back as zeros."""

    name = "broken-zeroed-gradient"
    parameter = "transformer_blocks.1.attn.to_k.weight"

    def install(self, transformer):
        param = dict(transformer.named_parameters())[self.parameter]
        return _Hooks([param.register_hook(torch.zeros_like)])


BROKEN = (DroppedKeyTile, AudioTakesTextModulation, ZeroedWeightGradient)


def _attention_without_deterministic_kernel(processor, q, k, v):
    """As cuDNN's SDPA on CUDA: the provider's arithmetic, and no kernel under torch's deterministic algorithms."""
    if torch.are_deterministic_algorithms_enabled():
        raise RuntimeError("No available kernel. Aborting execution.")
    return PROVIDER_OPS.attention(processor, q, k, v)


class NoDeterministicKernel(_OpsCandidate):
    """A legitimate backend without a deterministic kernel: right numbers, but no two runs held to the same bits."""

    name = "stand-in-no-deterministic-kernel"
    ops = replace(PROVIDER_OPS, attention=_attention_without_deterministic_kernel)


class RaisesOnce(_OpsCandidate):
    """The provider's ops, whose first attention call under torch's deterministic algorithms raises as a compiler
    killed mid-build does (a Ctrl-C's, or a timeout's): deterministic kernels, one failure."""

    name = "stand-in-raises-once"

    def __init__(self):
        self.raised = False

        def attention(processor, q, k, v):
            if torch.are_deterministic_algorithms_enabled() and not self.raised:
                self.raised = True
                raise RuntimeError("PTXAS error: `ptxas` failed with error code -15")
            return PROVIDER_OPS.attention(processor, q, k, v)

        self.ops = replace(PROVIDER_OPS, attention=attention)
