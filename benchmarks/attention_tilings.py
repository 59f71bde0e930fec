"""The attention forward and backward at release shape per tiling of their main kernels (forward, dK/dV, dQ),
each forced in turn.

Usage (GPU): H3_TRITON_AUTOTUNE=0 python benchmarks/attention_tilings.py [--kernels fwd,dkdv,dq]
             TRITON_INTERPRET=1 python benchmarks/attention_tilings.py --shape small --device cpu   (checks itself)

``H3_TRITON_AUTOTUNE=0`` runs every kernel on the first tiling of its list, so that list's order matters: the
kernel gate on a GPU and ``benchmarks/gpu_profile.sh`` run that way. This sweep times one backward (the delta
pass, dK/dV and dQ; the forward is outside the timing) with one kernel's tiling forced and the other on its first,
and prints each tiling's time, the first marked, so the list can be ordered by measurement; the forward's
tilings are timed on one forward. Each tiling's outputs are compared with the first tiling's (max abs difference),
so a tiling that computes something else shows.
"""

import argparse

import torch

from h3_triton import attention
from h3gate.bench import SHAPES, cases, median_ms

# The bench's inputs are contiguous bfloat16, which take the warp-specialised dK/dV kernel.
KERNELS = {"fwd": attention._fwd, "dkdv": attention._dkdv_described, "dq": attention._dq}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"which to sweep (default: {','.join(KERNELS)})")
    args = parser.parse_args()
    unknown = set(args.kernels.split(",")) - set(KERNELS)
    if unknown:
        parser.error(f"--kernels: unknown {sorted(unknown)}; choose among {', '.join(KERNELS)}")
    case = next(c for c in cases(SHAPES[args.shape], args.device) if c.op == "attention")
    inputs = case.make()
    q, k, v = (inputs[name].detach().requires_grad_() for name in ("q", "k", "v"))
    out = attention.attention(q, k, v)
    grad = torch.ones_like(out)

    def backward():
        torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    def forward():
        with torch.no_grad():
            return attention.attention(q, k, v)

    steps = {"fwd": (forward, "forward"), "dkdv": (backward, "backward"), "dq": (backward, "backward")}
    for name in args.kernels.split(","):
        launcher = KERNELS[name]
        step, what = steps[name]
        reference = None
        for index, config in enumerate(launcher.tilings[q.element_size()]):
            with launcher.forcing(config):
                ms = median_ms(step, args.device)
                outputs = forward() if name == "fwd" else torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
            reference = reference or outputs
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(outputs, reference))
            tiles = ", ".join(f"{key} {value}" for key, value in config.kwargs.items())
            first = "  <- first" if index == 0 else ""
            print(f"{case.label} {what}, {name} at {tiles}, {config.num_warps} warps, {config.num_stages} stages: "
                  f"{ms:9.3f} ms, max abs diff from the first {diff:.3g}{first}", flush=True)


if __name__ == "__main__":
    main()
