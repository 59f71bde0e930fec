"""The attention backward at release shape: h3_triton's Gluon kernel against its Triton kernels.

Usage (GPU): python benchmarks/attention_bwd_gluon.py [--stages 2]

:func:`h3_triton.attention_hopper.backward` forms dK, dV and dQ in one pass over each key block (five products)
and adds dQ's terms in the order of the key blocks; the Triton kernels (:func:`h3_triton.attention.triton_backward`)
take seven products in two kernels. The script checks each stage count's gradients (dK and dV bitwise the Triton
kernel's, dQ in bfloat16 ulps from the Triton kernel's) and that two runs agree bit for bit, then times them, with
the provider's whole backward (default SDPA backends) for scale.
"""

import argparse

import torch

from h3_triton import attention, attention_hopper
from h3_triton.tma import set_scratch_allocator
from h3gate.bench import RELEASE, cases, median_ms
from h3gate.compare import ulp_distance

PRODUCTS = 5  # S x S x D products the backward needs (a forward has two: Q K^T and P V)


def backward_inputs():
    """The release attention case's label, and q, k, v, dO with the forward's saved terms and delta."""
    case = next(c for c in cases(RELEASE, "cuda") if c.op == "attention")
    q, k, v = (case.make()[name] for name in ("q", "k", "v"))
    do = torch.randn_like(q)
    o, row_max, row_log_sum = attention._forward_outputs(q)
    attention.triton_forward(q, k, v, o, row_max, row_log_sum)
    return case.label, (q, k, v, do, row_max, row_log_sum, attention.row_delta(o, do))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", help="comma-separated stage counts of the Gluon kernel's ring (default: "
                        "h3_triton's)")
    args = parser.parse_args()
    label, saved = backward_inputs()
    q = saved[0]
    D = q.shape[-1]
    scales = attention.backward_scales(D)

    def grads():
        return [torch.empty_like(q) for _ in range(3)]  # dq, dk, dv

    want = grads()
    attention.triton_backward(*saved, *want)
    set_scratch_allocator()
    runs = {"triton": lambda: attention.triton_backward(*saved, *grads())}
    for stages in (int(s) for s in (args.stages or str(attention_hopper.BWD_STAGES)).split(",")):
        got, again = grads(), grads()
        attention_hopper.backward(*saved, *got, *scales, stages=stages)
        attention_hopper.backward(*saved, *again, *scales, stages=stages)
        differences = ", ".join(f"{name} {(g.float() - w.float()).abs().max().item():.2e}"
                                for name, g, w in zip(("dq", "dk", "dv"), got, want))
        ulps = ulp_distance(got[0], want[0])
        print(f"{label} backward gluon, {stages} stages: max differences from the Triton kernels': {differences}; "
              f"dk, dv bitwise equal: {torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])}; dq bfloat16 "
              f"ulps: max {int(ulps.max())}, {(ulps == 0).double().mean().item():.4f} equal; repeatable: "
              f"{all(map(torch.equal, got, again))}", flush=True)
        runs[f"gluon-{stages}"] = lambda stages=stages: attention_hopper.backward(*saved, *grads(), *scales,
                                                                                  stages=stages)
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in saved[:3]]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves)
    runs["sdpa-backward"] = lambda: torch.autograd.grad(out, leaves, saved[3].transpose(1, 2), retain_graph=True)
    flops = 2.0 * PRODUCTS * q.shape[0] * q.shape[2] * q.shape[1] ** 2 * D
    for name, run in runs.items():
        ms = median_ms(run, "cuda")
        print(f"{label} backward {name:16s} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
