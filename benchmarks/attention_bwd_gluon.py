"""The attention backward's kernels at release shape: h3_triton's Gluon kernels against its Triton kernels.

Usage (GPU): python benchmarks/attention_bwd_gluon.py [--kernel dkdv|dq] [--stages 2,3,4]

Each Gluon kernel (:func:`h3_triton.attention_hopper.dkdv`, :func:`~h3_triton.attention_hopper.dq`) has two
consumer warp groups of 64 keys (dK/dV) or 64 query rows (dQ) and a producer warp streaming the tiles the loop
runs over through a ring of TMA stages; the Triton kernels (:func:`h3_triton.attention.triton_dkdv`,
:func:`~h3_triton.attention.triton_dq`) are Triton's compiler's schedule of the same products in the same order.
So the script checks that each stage count's gradients are bitwise the Triton kernel's and that two runs agree,
then times them, with the provider's whole backward (default SDPA backends) for scale.
"""

import argparse

import torch

from h3_triton import attention, attention_hopper
from h3_triton.tma import set_scratch_allocator
from h3gate.bench import RELEASE, cases, median_ms

# Per kernel: its gradients, the Triton and Gluon launches, the default stages, and its S x S x D products
# (each a forward's half: Q K^T and P V are the forward's two).
KERNELS = {
    "dkdv": (("dk", "dv"), attention.triton_dkdv, attention_hopper.dkdv, attention_hopper.DKDV_STAGES, 4),
    "dq": (("dq",), attention.triton_dq, attention_hopper.dq, attention_hopper.DQ_STAGES, 3),
}


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
    parser.add_argument("--kernel", choices=KERNELS, default="dkdv", help="which backward kernel (default dkdv)")
    parser.add_argument("--stages", help="comma-separated stage counts of the Gluon kernel's ring (default: "
                        "h3_triton's)")
    args = parser.parse_args()
    names, triton_kernel, gluon_kernel, default_stages, products = KERNELS[args.kernel]
    label, saved = backward_inputs()
    q = saved[0]
    D = q.shape[-1]
    scales = attention.backward_scales(D)

    def grads():
        return [torch.empty_like(q) for _ in names]

    want = grads()
    triton_kernel(*saved, *want)
    set_scratch_allocator()
    runs = {"triton": lambda: triton_kernel(*saved, *grads())}
    for stages in (int(s) for s in (args.stages or str(default_stages)).split(",")):
        got, again = grads(), grads()
        gluon_kernel(*saved, *got, *scales, stages=stages)
        gluon_kernel(*saved, *again, *scales, stages=stages)
        differences = ", ".join(f"{name} {(g.float() - w.float()).abs().max().item():.2e}"
                                for name, g, w in zip(names, got, want))
        print(f"{label} {args.kernel} gluon, {stages} stages: max differences from the Triton kernel's: "
              f"{differences}; bitwise equal: {all(map(torch.equal, got, want))}; repeatable: "
              f"{all(map(torch.equal, got, again))}", flush=True)
        runs[f"gluon-{stages}"] = lambda stages=stages: gluon_kernel(*saved, *grads(), *scales, stages=stages)
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in saved[:3]]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves)
    runs["sdpa-backward"] = lambda: torch.autograd.grad(out, leaves, saved[3].transpose(1, 2), retain_graph=True)
    flops = 2.0 * products * q.shape[0] * q.shape[2] * q.shape[1] ** 2 * D
    for name, run in runs.items():
        ms = median_ms(run, "cuda")
        print(f"{label} {args.kernel} {name:16s} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
