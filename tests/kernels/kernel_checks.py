"""Checks the fused-kernel tests share: the error rule against float64, NaN-padded views, row tables, launch counts."""

import torch

from h3gate.compare import relative_l2


def assert_bounded(name, candidate, provided, reference):
    assert torch.isfinite(candidate).all(), f"{name}: non-finite values"
    floor = torch.finfo(candidate.dtype).eps / 2
    error, provider_error = relative_l2(candidate, reference), relative_l2(provided, reference)
    assert error <= 2 * provider_error + floor, f"{name}: {error:.3e} > 2 x provider {provider_error:.3e} + {floor:.1e}"


def nan_padded(values, requires_grad=False):
    """(buffer, view): ``values`` copied into the middle of a NaN buffer, and the view."""
    buffer = torch.full([n + 3 for n in values.shape], float("nan"), dtype=values.dtype)
    inner = tuple(slice(1, 1 + n) for n in values.shape)
    buffer[inner] = values
    buffer.requires_grad_(requires_grad)
    return buffer, buffer[inner]


def table_index(mode, seq_len, generator, table_rows, runs):
    """Row -> table row: random per row, or long ``runs`` that revisit rows (the packed-sequence layout); the
    table rows ``runs`` leaves out stay unreferenced, so their gradients must be exactly 0."""
    if mode == "random":
        return torch.randint(0, table_rows, (seq_len,), generator=generator)
    runs = torch.tensor(runs)
    return runs[torch.arange(seq_len) * len(runs) // seq_len]


def strided_index(idx, table_rows):
    """``idx`` as every other element of a buffer whose other elements name wrong (but valid) table rows."""
    return torch.stack([idx, (idx + 1) % table_rows], dim=1).flatten()[::2]


class CountingLaunches:
    """A jit kernel's stand-in that counts its launches (``kernel[grid](...)``), so a test can tell which path ran."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]
