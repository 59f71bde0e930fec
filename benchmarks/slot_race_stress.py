"""Stress of the row kernels' deterministic table sums (:mod:`h3_triton.rowreduce`) on a GPU: every freed block
of the caching allocator is filled with NaN before each call, so a read of a slot that no thread wrote shows as
NaN or as a gradient that differs bitwise from the first call's. Prints the failures per op and shape."""

import itertools
import json
import sys

import torch

from h3_triton.elementwise import gated_residual
from h3_triton.norm import rms_norm_modulate


def poison():
    torch.cuda.empty_cache()
    blocks = [torch.full((1 << 26,), float("nan"), device="cuda") for _ in range(8)]
    del blocks  # back to the allocator, NaN-filled


def grads(op, x, table_rows, width, seed, modulated):
    g = torch.Generator("cuda").manual_seed(seed)
    b, s = x
    xs = torch.randn((b, s, width), generator=g, device="cuda").requires_grad_()
    w = torch.randn((width,), generator=g, device="cuda").requires_grad_()
    tab = [torch.randn((table_rows, width), generator=g, device="cuda").requires_grad_() for _ in range(2)]
    idx = torch.randint(0, table_rows, (s,), generator=g, device="cuda").sort().values
    if op == "rms_norm_modulate":
        out = rms_norm_modulate(xs, w, 1e-5, *(tab + [idx] if modulated else [None, None, None]))
        leaves = [xs, w] + (tab if modulated else [])
    else:
        y = torch.randn((b, s, width), generator=g, device="cuda").requires_grad_()
        out = gated_residual(xs, y, tab[0] if modulated else None, idx if modulated else None)
        leaves = [xs, y] + ([tab[0]] if modulated else [])
    dy = torch.randn(out.shape, generator=g, device="cuda")
    return [t.clone() for t in torch.autograd.grad(out, leaves, dy)]


failures, total = {}, 0
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
for op, width, s, modulated in itertools.product(("rms_norm_modulate", "gated_residual"), (202, 3072, 5376),
                                                 (31, 467, 4097), (True, False)):
    first = grads(op, (1, s), 6, width, 0, modulated)
    bad = 0
    for _ in range(repeats):
        poison()
        again = grads(op, (1, s), 6, width, 0, modulated)
        total += 1
        bad += any(not torch.equal(a, b) for a, b in zip(first, again)) or any(a.isnan().any() for a in again)
    if bad:
        failures[f"{op} width={width} rows={s} modulated={modulated}"] = bad
print(json.dumps({"calls": total, "failing": failures}, indent=1))
