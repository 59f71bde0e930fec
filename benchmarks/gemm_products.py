"""Each product of ``linear``'s forward+backward apart, ``h3_triton`` against cuBLAS, at the release shapes.

Usage (GPU): python benchmarks/gemm_products.py [--cases to_out,ff up] [--tilings 128x256x8x3,256x128x8x3g16]

``h3gate bench`` times a projection's forward+backward as one number; this splits it into its three products,
y = x W^T, dX = dY W and dW = dY^T x (the bench's linear cases have no bias), each called as ``linear``'s own
backward calls it (``gemm._matmul`` with the same views) and beside it the matrix product torch's autograd runs
for the provider. Each is timed alone with ``triton.testing.do_bench`` (median of CUDA-event timings, warm), it and
cuBLAS's in turn over ``--rounds`` (the medians printed, as ``h3gate bench`` takes them), from the same seeded random
inputs and output gradient as the bench. ``--tilings`` forces each tiling
(BLOCK_M x BLOCK_N x num_warps x num_stages, ``gG`` for GROUP_M) on the TMA kernel that runs these products and
prints every product again; the bits must not move with the tiling (the K order is fixed), and any that do are
printed as a defect. ``--profile dX`` runs that product once, h3_triton's then the provider's, in a CUDA
profiler range for Nsight Compute (``ncu --profile-from-start off``), after warm-up, instead of timing. ``--shape small --device cpu`` runs the same code under the interpreter, to check the script.
"""

import argparse
import contextlib

import torch
import triton

from h3_triton import gemm
from h3gate.bench import SHAPES, alternating, cases, median_ms, output_grad
from profile_op import profiled


def products(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor) -> dict:
    """{name: (h3_triton's call, the provider's call, its FLOPs)} for y = x W^T, dX = dY W, dW = dY^T x."""
    (n, k), m = weight.shape, x.shape[:-1].numel()
    rows, (dym, xm, ym, dxm) = gemm._row_split(dy, x, y := torch.empty_like(dy), dx := torch.empty_like(x))
    dw = torch.empty_like(weight)
    w = gemm._Mat.of_weight(weight)
    x2, dy2 = x.reshape(m, k), dy.reshape(m, n)
    flops = 2.0 * m * n * k
    return {
        "forward": (lambda: gemm._matmul(xm, w.T, ym, rows, n, gemm._Axis.flat(k)), lambda: x2 @ weight.T, y),
        "dX": (lambda: gemm._matmul(dym, w, dxm, rows, k, gemm._Axis.flat(n)), lambda: dy2 @ weight, dx),
        "dW": (lambda: gemm._matmul(xm.T, dym, gemm._Mat.of_weight(dw).T, gemm._Axis.flat(k), n, rows),
               lambda: dy2.T @ x2, dw),
    }, flops


def tiling(text: str) -> triton.Config:
    """BLOCK_M x BLOCK_N x num_warps x num_stages, optionally ``gG`` for GROUP_M, on the TMA kernel's fixed
    BLOCK_K and GROUP_M."""
    sizes, _, group = text.partition("g")
    block_m, block_n, warps, stages = (int(part) for part in sizes.split("x"))
    first = gemm._DESCRIBED.tilings[2][0]
    kwargs = {**first.kwargs, "BLOCK_M": block_m, "BLOCK_N": block_n}
    if group:
        kwargs["GROUP_M"] = int(group)
    return triton.Config(kwargs, num_warps=warps, num_stages=stages)


def forced(config: triton.Config | None):
    """The TMA kernel forced to ``config``, or left to its tuner (None)."""
    return contextlib.nullcontext() if config is None else gemm._DESCRIBED.forcing(config)


def _timed(fn, device: str, config: triton.Config | None) -> float:
    with forced(config):
        return median_ms(fn, device)


def run(label: str, case_products: dict, flops: float, device: str, config: triton.Config | None,
        reference: dict, rounds: int) -> None:
    """One line per product: h3_triton's and the provider's ms (medians of ``rounds`` rounds timed in turn,
    :func:`h3gate.bench.alternating`), TFLOP/s and ratio; bits against ``reference``."""
    for name, (candidate, provider, result) in case_products.items():
        with forced(config):
            candidate()
        bits = reference.setdefault(name, result.clone())
        same = "" if torch.equal(bits, result) else "  BITS DIFFER from the default tiling"
        medians, _ = alternating({"candidate": lambda: _timed(candidate, device, config),
                                  "provider": lambda: median_ms(provider, device)}, rounds)
        ms, provider_ms = medians["candidate"], medians["provider"]
        print(f"  {label} {name}: {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s), provider {provider_ms:.3f} ms "
              f"({flops / provider_ms / 1e9:.0f}), {provider_ms / ms:.2f}x{same}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="to_q/k/v,to_out,ff up,ff down",
                        help="comma-separated projections, as the bench labels them (default: all four)")
    parser.add_argument("--tilings", default="", help="comma-separated BLOCK_MxBLOCK_Nxwarpsxstages[gGROUP_M]")
    parser.add_argument("--profile", choices=("forward", "dX", "dW"),
                        help="run this product once in a profiler range for ncu instead of timing")
    parser.add_argument("--rounds", type=int, default=3,
                        help="time each product and cuBLAS's in turn this many times, and print the medians (default: 3)")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    wanted = args.cases.split(",")
    configs = [None] + [tiling(text) for text in args.tilings.split(",") if text]
    torch.manual_seed(0)
    for case in cases(SHAPES[args.shape], args.device):
        if case.op != "linear" or not any(f" {name} " in case.label for name in wanted):
            continue
        inputs = case.make()
        x, weight = inputs["x"], inputs["weight"]
        dy = output_grad(torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device), "random")
        case_products, flops = products(x, weight, dy)
        print(case.label, flush=True)
        if args.profile:
            candidate, provider, _ = case_products[args.profile]
            profiled(lambda: (candidate(), provider()), args.device)
            continue
        reference = {}
        for config in configs:
            label = "default" if config is None else f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']}" \
                f"x{config.num_warps}x{config.num_stages}g{config.kwargs['GROUP_M']}"
            run(label, case_products, flops, args.device, config, reference, args.rounds)


if __name__ == "__main__":
    main()
