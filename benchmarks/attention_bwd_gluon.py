"""The attention backward at release shape: h3_triton's Gluon kernel against its Triton kernels.

Usage (GPU): python benchmarks/attention_bwd_gluon.py [--stages 2] [--unordered] [--worker-registers 248]

:func:`h3_triton.attention_hopper.backward` forms dK, dV and dQ in one pass over each key block (five products)
and adds dQ's terms in the order of the key blocks; the Triton kernels (:func:`h3_triton.attention.triton_backward`)
take seven products in two kernels. The script checks each stage count's gradients (dK and dV bitwise the Triton
kernel's, dQ in bfloat16 ulps from the Triton kernel's) and that two runs agree bit for bit, then times them, with
the provider's whole backward (default SDPA backends) for scale.

``--unordered`` also times the kernel with the dQ writers' wait for their turn taken out (each key block's terms
added as they come, so dQ is no longer repeatable): what adding in the key blocks' order costs, the time a
scheduler of the ordered adds (such as DASH's shift scheduler for FlashAttention-3's deterministic backward) could
win back at most. ``--worker-registers 248,256`` also times the kernel with its second consumer warp group (a worker
partition, whose loop spills where the default partition's does not: ``attention_sass.py``) given that many
registers a thread instead of 240, the default partition taking what is left. Each variant is the module's own source
with that one line changed, loaded as a module of its own (Gluon compiles a kernel from its source file); the shipped
kernel is not touched.
"""

import argparse
import importlib.util
import itertools
import tempfile
from pathlib import Path

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


_TURN_WAIT = "        _acquire(locks + i, pid_n)\n"
_PARTITIONS = "    ], [4, 1, 1, 1], [240, 24, 24, 24])\n"  # warps and registers of the worker partitions


def variant_hopper(option: str, line: str, replacement: str, name: str):
    """:mod:`h3_triton.attention_hopper` with ``line`` replaced, loaded as module ``name``."""
    source = Path(attention_hopper.__file__).read_text()
    if source.count(line) != 1:
        raise SystemExit(f"{option}: the line {line.strip()!r} is not once in {attention_hopper.__file__}; "
                         "update this script to the kernel's source")
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source.replace(line, replacement))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker_registers_hopper(registers: int):
    """:mod:`h3_triton.attention_hopper` with its second consumer warp group given ``registers`` a thread."""
    return variant_hopper("--worker-registers", _PARTITIONS, _PARTITIONS.replace("[240,", f"[{registers},"),
                          f"attention_hopper_worker_{registers}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", help="comma-separated stage counts of the Gluon kernel's ring (default: "
                        "h3_triton's)")
    parser.add_argument("--unordered", action="store_true", help="also time the kernel adding dQ's terms in no set "
                        "order (not repeatable): the cost of the ordered adds")
    parser.add_argument("--worker-registers", help="comma-separated register counts of the second consumer warp group "
                        "to time beside the shipped 240")
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
    shipped = grads()
    attention_hopper.backward(*saved, *shipped, *scales)
    kernels = {"gluon": attention_hopper.backward}
    if args.unordered:
        kernels["unordered"] = variant_hopper("--unordered", _TURN_WAIT, "", "attention_hopper_unordered").backward
    for registers in filter(None, (args.worker_registers or "").split(",")):
        kernels[f"worker-{registers}"] = worker_registers_hopper(int(registers)).backward
    for (kind, backward), stages in itertools.product(
            kernels.items(), (int(s) for s in (args.stages or str(attention_hopper.BWD_STAGES)).split(","))):
        got, again = grads(), grads()
        backward(*saved, *got, *scales, stages=stages)
        backward(*saved, *again, *scales, stages=stages)
        differences = ", ".join(f"{name} {(g.float() - w.float()).abs().max().item():.2e}"
                                for name, g, w in zip(("dq", "dk", "dv"), got, want))
        ulps = ulp_distance(got[0], want[0])
        print(f"{label} backward {kind}, {stages} stages: max differences from the Triton kernels': {differences}; "
              f"dk, dv bitwise equal: {torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])}; dq bfloat16 "
              f"ulps: max {int(ulps.max())}, {(ulps == 0).double().mean().item():.4f} equal; repeatable: "
              f"{all(map(torch.equal, got, again))}; bitwise the shipped Gluon kernel's: "
              f"{all(map(torch.equal, got, shipped))}", flush=True)
        runs[f"{kind}-{stages}"] = lambda backward=backward, stages=stages: backward(*saved, *grads(), *scales,
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
