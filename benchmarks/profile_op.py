"""One op of ``h3gate bench`` run once inside a CUDA profiler range, after warm-up, for Nsight Compute.

Usage (GPU): ncu --clock-control none --profile-from-start off --csv --page details \\
    python benchmarks/profile_op.py attention [--backward] [--provider [--sdpa cudnn]]

The warm-up runs (compilation, autotuning, allocator growth) happen outside the range, so ncu sees only the
kernels of one forward (or one forward+backward with ``--backward``) at the shape of ``h3gate bench``.
``--shape small --device cpu`` runs the same code path without a profiler, to check the script itself.
"""

import argparse

import torch

from h3gate import op_registry
from h3gate.bench import OUTPUT_GRADS, SDPA_VARIANTS, SHAPES, _forward_backward, _sdpa, cases
from h3gate.candidates import load


def profiled(fn, device: str, warmup: int = 3) -> None:
    """Runs ``fn`` ``warmup`` times, then once between cudaProfilerStart and cudaProfilerStop."""
    for _ in range(warmup):
        fn()
    if not device.startswith("cuda"):
        fn()
        return
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def add_op_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments that pick an op of ``h3gate bench``, its shape and what of it runs (shared with
    ``host_profile.py``)."""
    parser.add_argument("op", help="an op of h3gate bench: " + ", ".join(op_registry.provider_ops()))
    parser.add_argument("--backward", action="store_true", help="forward+backward (default: forward only)")
    parser.add_argument("--candidate", default="h3_triton", help="candidate spec (default: h3_triton)")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--case", type=int, default=0, help="which of the op's shapes (linear has four; default 0)")
    parser.add_argument("--output-grad", choices=OUTPUT_GRADS, default="random",
                        help="with --backward: the gradient it starts from, as h3gate bench's (default: random)")


def op_step(parser: argparse.ArgumentParser, args, provider: bool):
    """(case, step): the op's case from ``args`` and a function running its forward (+backward), the provider's or
    the candidate's; a bad op or case is a usage error."""
    if args.op not in op_registry.provider_ops():
        parser.error(f"unknown op {args.op!r}; choose one of {', '.join(op_registry.provider_ops())}")
    matching = [case for case in cases(SHAPES[args.shape], args.device) if case.op == args.op]
    if not 0 <= args.case < len(matching):
        parser.error(f"--case {args.case}: {args.op} has {len(matching)} shape(s), 0 to {len(matching) - 1}")
    case = matching[args.case]
    fn = op_registry.provider_ops()[args.op] if provider else load(args.candidate).kernel_ops()[args.op]
    inputs = case.make()
    if args.backward:
        return case, _forward_backward(fn, inputs, args.output_grad)

    def step():
        with torch.no_grad():
            fn(**inputs)
    return case, step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_op_arguments(parser)
    parser.add_argument("--provider", action="store_true", help="profile the provider's op instead of the candidate's")
    parser.add_argument("--sdpa", choices=tuple(SDPA_VARIANTS), help="with --provider and attention: the SDPA backend")
    args = parser.parse_args()
    if args.sdpa and not (args.provider and args.op == "attention"):
        parser.error("--sdpa picks the provider's attention backend: use it with --provider and the op attention")
    case, step = op_step(parser, args, args.provider)
    with _sdpa(args.sdpa):
        profiled(step, args.device)
    who = "provider" + (f" ({args.sdpa})" if args.sdpa else "") if args.provider else args.candidate
    print(f"profiled {case.label}, {who}, {'forward+backward' if args.backward else 'forward'}")


if __name__ == "__main__":
    main()
