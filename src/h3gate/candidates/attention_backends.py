"""diffusers' attention backends as candidates: ``attention-backend:name=<AttentionBackendName>`` replaces the
block's attention with ``dispatch_attention_fn(..., backend=name)``, so a new backend of diffusers' dispatcher is
qualified by the same gates as a kernel (the kernel gate's attention items, then the block, model and generation
gates around it)."""

from __future__ import annotations

from diffusers.models.attention_dispatch import (
    AttentionBackendName,
    _AttentionBackendRegistry,
    _check_attention_backend_requirements,
    _maybe_download_kernel_for_backend,
    dispatch_attention_fn,
)

from h3gate.candidates import CandidateError, Option, replace


def installed() -> list[str]:
    """The registered backends whose packages are present here (diffusers registers every backend it knows)."""
    names = []
    for backend in _AttentionBackendRegistry.list_backends():
        try:
            _check_attention_backend_requirements(backend)
        except (RuntimeError, ValueError):
            continue
        names.append(backend.value)
    return names


def _ops(name: str) -> dict:
    if name not in installed():
        raise CandidateError(f"attention backend {name!r} is not installed here; installed: {', '.join(installed())} "
                             "(give one as attention-backend:name=NAME)")
    backend = AttentionBackendName(name)
    _maybe_download_kernel_for_backend(backend)  # a hub backend fetches its kernel once, as diffusers' own context does

    def attention(q, k, v):
        return dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, backend=backend)

    attention.__wrapped__ = dispatch_attention_fn  # the identity pins diffusers, whose function this runs
    return {"attention": attention}


CANDIDATE = replace(
    "attention-backend",
    _ops,
    options={"name": Option(str, AttentionBackendName.NATIVE.value, "a backend of diffusers' attention dispatcher "
                            "(AttentionBackendName), e.g. native, _native_math, _native_flash, flash, sage")},
)
