"""The attention backward's dK/dV at release shape: h3_triton's Gluon kernel against its Triton kernel.

Usage (GPU): python benchmarks/attention_dkdv_gluon.py [--stages 2,3,4]

The Gluon kernel (:func:`h3_triton.attention_hopper.dkdv`) has two consumer warp groups of 64 keys each and a
producer warp streaming query and dO tiles (with their row terms) through a ring of TMA stages; the Triton kernel
(:func:`h3_triton.attention.triton_dkdv`) is warp-specialised by Triton's compiler. Both form the same products
in the same order, so the script checks that each stage count's dK and dV are bitwise the Triton kernel's and
that two runs agree, then times them, with the whole backward of the provider (cuDNN) for scale.
"""

import argparse
import math

import torch

from h3_triton import attention, attention_hopper
from h3_triton.tma import set_scratch_allocator
from h3gate.bench import RELEASE, cases, median_ms


def backward_inputs():
    """q, k, v, dO of the release attention case, and the forward's saved terms with delta."""
    case = next(c for c in cases(RELEASE, "cuda") if c.op == "attention")
    q, k, v = (case.make()[name] for name in ("q", "k", "v"))
    do = torch.randn_like(q)
    o, row_max, row_log_sum = attention._forward_outputs(q)
    attention.triton_forward(q, k, v, o, row_max, row_log_sum)
    return case.label, (q, k, v, do, row_max, row_log_sum, attention.row_delta(o, do))


def gradients(q):
    """dk, dv as the backward allocates them: two tensors of one shape and strides."""
    return torch.empty_like(q), torch.empty_like(q)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default=str(attention_hopper.DKDV_STAGES),
                        help=f"comma-separated stage counts of the Gluon kernel's query ring (default "
                        f"{attention_hopper.DKDV_STAGES}, h3_triton's)")
    args = parser.parse_args()
    label, inputs = backward_inputs()
    q = inputs[0]
    D = q.shape[-1]
    scales = (1.0 / math.sqrt(D), attention._qk_scale(D))
    want = gradients(q)
    attention.triton_dkdv(*inputs, *want)
    set_scratch_allocator()
    runs = {"triton": lambda: attention.triton_dkdv(*inputs, *gradients(q))}
    for stages in (int(s) for s in args.stages.split(",")):
        got, again = gradients(q), gradients(q)
        attention_hopper.dkdv(*inputs, *got, *scales, stages=stages)
        attention_hopper.dkdv(*inputs, *again, *scales, stages=stages)
        differences = ", ".join(f"{name} {(g.float() - w.float()).abs().max().item():.2e}"
                                for name, g, w in zip(("dk", "dv"), got, want))
        print(f"{label} gluon, {stages} stages: max differences from the Triton kernel's: {differences}; bitwise "
              f"equal: {all(map(torch.equal, got, want))}; repeatable: {all(map(torch.equal, got, again))}",
              flush=True)
        runs[f"gluon-{stages}"] = lambda stages=stages: attention_hopper.dkdv(*inputs, *gradients(q), *scales,
                                                                               stages=stages)
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in inputs[:3]]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves)
    runs["sdpa-backward"] = lambda: torch.autograd.grad(out, leaves, inputs[3].transpose(1, 2), retain_graph=True)
    # dK/dV is four of the backward's S x S x D products: twice the forward's FLOPs.
    flops = 8.0 * q.shape[0] * q.shape[2] * q.shape[1] ** 2 * D
    for name, run in runs.items():
        ms = median_ms(run, "cuda")
        print(f"{label} dK/dV {name:16s} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
