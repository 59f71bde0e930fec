"""The attention backward at release shape per tiling of its two main kernels (dK/dV, dQ), each forced in turn.

Usage (GPU): H3_TRITON_AUTOTUNE=0 python benchmarks/attention_tilings.py
             TRITON_INTERPRET=1 python benchmarks/attention_tilings.py --shape small --device cpu   (checks itself)

``H3_TRITON_AUTOTUNE=0`` runs every kernel on the first tiling of its list, so that list's order matters: the
kernel gate on a GPU and ``benchmarks/gpu_profile.sh`` run that way. This sweep times one backward (the delta
pass, dK/dV and dQ; the forward is outside the timing) with one kernel's tiling forced and the other on its first,
and prints each tiling's time, the first marked, so the list can be ordered by measurement.
"""

import argparse

import torch

from h3_triton import attention
from h3gate.bench import SHAPES, cases, median_ms

# The bench's inputs are contiguous bfloat16, which take the warp-specialised dK/dV kernel.
KERNELS = {"dkdv": attention._dkdv_described, "dq": attention._dq}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "attention")
    inputs = case.make()
    q, k, v = (inputs[name].detach().requires_grad_() for name in ("q", "k", "v"))
    out = attention.attention(q, k, v)
    grad = torch.ones_like(out)

    def backward():
        torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    for name, launcher in KERNELS.items():
        for index, config in enumerate(launcher.tilings[q.element_size()]):
            with launcher.forcing(config):
                ms = median_ms(backward, args.device)
            tiles = ", ".join(f"{key} {value}" for key, value in config.kwargs.items())
            first = "  <- first" if index == 0 else ""
            print(f"{case.label} backward, {name} at {tiles}, {config.num_warps} warps, {config.num_stages} stages: "
                  f"{ms:9.3f} ms{first}", flush=True)


if __name__ == "__main__":
    main()
